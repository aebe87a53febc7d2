"""Explicit, reversible hooks into ExecuTorch — one mechanism for every adapter.

An adapter that replaces ExecuTorch internals (a serializer method, a pattern
registry entry) describes the replacements as a :class:`PatchSet`. Installing
is idempotent, refuses an ExecuTorch version the replacements were not tested
against, and records the exact original objects so that uninstalling restores
them identically. ``with patch_set.install(): ...`` undoes only what that
``install`` did.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = [
    "TESTED_EXECUTORCH",
    "Installation",
    "PatchSet",
    "UnsupportedExecuTorchError",
    "check_executorch_version",
    "installed_executorch_version",
]

#: the ExecuTorch releases fusionkit's hooks were written and tested against
TESTED_EXECUTORCH: frozenset[str] = frozenset({"1.5.1"})

Patch = tuple[Any, str, Any]  # (owner object, attribute name, replacement)


class UnsupportedExecuTorchError(RuntimeError):
    """The installed ExecuTorch is not a version fusionkit's hooks were tested with."""


def installed_executorch_version() -> str:
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def check_executorch_version(component: str, found: str | None = None) -> None:
    """Raise :class:`UnsupportedExecuTorchError` unless ExecuTorch is a tested release."""
    found = installed_executorch_version() if found is None else found
    if found not in TESTED_EXECUTORCH:
        tested = ", ".join(sorted(TESTED_EXECUTORCH))
        raise UnsupportedExecuTorchError(
            f"{component}: refusing to hook into ExecuTorch {found}; its replacements were "
            f"written and tested against ExecuTorch {tested} only. Install "
            f"executorch=={max(TESTED_EXECUTORCH)}, or lower with ExecuTorch's own partitioner "
            "(without fusionkit's fixes)."
        )


class Installation:
    """What an ``install()`` returns; as a context manager it undoes only its own install."""

    def __init__(self, undo: Callable[[], None], installed_here: bool) -> None:
        self._undo = undo
        #: True when this call did the installing (False: it was already in place)
        self.installed_here = installed_here

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.installed_here:
            self._undo()

    def __repr__(self) -> str:
        return f"Installation(installed_here={self.installed_here})"


class PatchSet:
    """A named set of attribute replacements, installed and removed as one."""

    def __init__(self, component: str, patches: Callable[[], list[Patch]], *,
                 before_install: Callable[[], None] | None = None,
                 after_uninstall: Callable[[], None] | None = None) -> None:
        self.component = component
        self._patches = patches  # resolved lazily: importing ExecuTorch modules is slow
        self._before_install = before_install
        self._after_uninstall = after_uninstall
        self._saved: list[Patch] = []
        self._lock = threading.RLock()

    def is_installed(self) -> bool:
        return bool(self._saved)

    def install(self) -> Installation:
        """Apply every patch (no-op if already applied)."""
        with self._lock:
            if self._saved:
                return Installation(self.uninstall, False)
            check_executorch_version(self.component)
            patches = self._patches()
            if self._before_install is not None:
                self._before_install()
            for owner, name, new in patches:
                original = owner.__dict__[name] if name in vars(owner) else getattr(owner, name)
                self._saved.append((owner, name, original))
                setattr(owner, name, new)
            return Installation(self.uninstall, True)

    def uninstall(self) -> None:
        """Put back the exact original objects (no-op if not installed)."""
        with self._lock:
            if not self._saved:
                return
            while self._saved:
                owner, name, original = self._saved.pop()
                setattr(owner, name, original)
            if self._after_uninstall is not None:
                self._after_uninstall()
