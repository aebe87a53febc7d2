"""Explicit, reversible hooks into ExecuTorch — one mechanism for every adapter.

An adapter that replaces ExecuTorch internals (a serializer method, a pattern
registry entry) describes the replacements as a :class:`PatchSet`. Installing
is idempotent, refuses an ExecuTorch outside the supported range
(:mod:`fusionkit.integration.versions`), and records the exact original objects so
that uninstalling restores them identically. ``with patch_set.install(): ...`` undoes only what that
``install`` did.

One install story: every adapter declares its patch set as ``PATCHES`` (its
``install`` module), including the sets of its parts, and its ``install`` /
``uninstall`` / ``is_installed`` are that set's own methods.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

# the version facts live in .versions; re-exported here, where the patch sets use them
from fusionkit.integration.versions import (
    TESTED_EXECUTORCH,
    UnsupportedExecuTorchError,
    installed_executorch_version,
    require_supported,
)

__all__ = [
    "REMOVE",
    "TESTED_EXECUTORCH",
    "Installation",
    "PatchSet",
    "UnsupportedExecuTorchError",
    "check_executorch_version",
    "installed_executorch_version",
]

Patch = tuple[Any, str, Any]  # (owner object, attribute name, replacement)


def check_executorch_version(component: str, found: str | None = None) -> None:
    """Raise :class:`UnsupportedExecuTorchError` unless the installed ExecuTorch is one
    fusionkit supports (:data:`fusionkit.integration.versions.SUPPORTED_EXECUTORCH`)."""
    require_supported(component, installed_executorch_version() if found is None else found)


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


#: a patch's replacement that removes a dict entry instead of replacing it
REMOVE: Any = type("Remove", (), {"__repr__": lambda self: "REMOVE"})()
_MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()


class PatchSet:
    """A named set of replacements, installed and removed as one.

    A patch is ``(owner, name, replacement)``: an attribute of a module or class,
    or — when ``owner`` is a dict, like ExecuTorch's pattern registry — an entry,
    which :data:`REMOVE` takes out. ``includes`` are other sets installed with this
    one. Several sets may include the same one (two adapters share a serde patch): an
    included set counts the sets holding it and stays in place until the last of them is
    uninstalled (or until it is uninstalled directly). Uninstalling puts back the
    identical original objects, dict entries in their original order.
    """

    def __init__(self, component: str, patches: Callable[[], list[Patch]], *,
                 before_install: Callable[[], None] | None = None,
                 after_uninstall: Callable[[], None] | None = None,
                 includes: tuple[PatchSet, ...] = ()) -> None:
        self.component = component
        self._patches = patches  # resolved lazily: importing ExecuTorch modules is slow
        self._before_install = before_install
        self._after_uninstall = after_uninstall
        self._includes = includes
        #: the including sets that hold this one in place, and whether a direct
        #: ``install()`` put it in (it then stays when they let go)
        self._holders: list[PatchSet] = []
        self._direct = False
        self._saved: list[Patch] = []
        self._dict_orders: list[tuple[dict[Any, Any], list[Any]]] = []
        self._installed = False
        self._lock = threading.RLock()

    def is_installed(self) -> bool:
        """Whether the patches are in place (by any ``install`` not undone yet)."""
        return self._installed

    def original(self, owner: Any, name: str) -> Any:
        """The object a patch replaced (the attribute itself when not installed)."""
        with self._lock:
            for o, n, orig in self._saved:
                if o is owner and n == name:
                    return orig
        return owner.get(name) if isinstance(owner, dict) else getattr(owner, name)

    def install(self) -> Installation:
        """Apply every patch and the included sets (no-op if already applied); all or nothing.

        Raises :class:`UnsupportedExecuTorchError` on an ExecuTorch outside the supported
        range. ``with install(): ...`` undoes only what this call installed.
        """
        return self._acquire(None)

    def _acquire(self, holder: PatchSet | None) -> Installation:
        """Install for ``holder`` (an including set) or, with ``None``, directly."""
        with self._lock:
            if self._installed:
                if holder is not None and not any(h is holder for h in self._holders):
                    self._holders.append(holder)
                return Installation(self.uninstall, False)
            check_executorch_version(self.component)
            patches = self._patches()
            if self._before_install is not None:
                self._before_install()
            try:
                for inc in self._includes:
                    inc._acquire(self)
                for owner, name, new in patches:
                    self._apply(owner, name, new)
            except BaseException:
                self._installed = True
                self.uninstall()
                raise
            self._installed = True
            if holder is None:
                self._direct = True
            else:
                self._holders.append(holder)
            return Installation(self.uninstall, True)

    def _release(self, holder: PatchSet) -> None:
        """``holder`` lets go; the last holder out uninstalls (unless installed directly)."""
        with self._lock:
            self._holders = [h for h in self._holders if h is not holder]
            if self._installed and not self._holders and not self._direct:
                self.uninstall()

    def _apply(self, owner: Any, name: str, new: Any) -> None:
        if isinstance(owner, dict):
            if not any(d is owner for d, _ in self._dict_orders):
                self._dict_orders.append((owner, list(owner)))
            self._saved.append((owner, name, owner.get(name, _MISSING)))
            if new is REMOVE:
                owner.pop(name, None)
            else:
                owner[name] = new
            return
        original = owner.__dict__[name] if name in vars(owner) else getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, new)

    def uninstall(self) -> None:
        """Put back the exact original objects now, and let go of the included sets, each
        uninstalled unless another set still holds it (no-op if not installed)."""
        with self._lock:
            if not self._installed:
                return
            while self._saved:
                owner, name, original = self._saved.pop()
                if isinstance(owner, dict):
                    if original is _MISSING:
                        owner.pop(name, None)
                    else:
                        owner[name] = original
                else:
                    setattr(owner, name, original)
            for d, order in self._dict_orders:  # restore iteration order
                rank = {k: i for i, k in enumerate(order)}
                items = sorted(d.items(), key=lambda kv: rank.get(kv[0], len(rank)))
                d.clear()
                d.update(items)
            self._dict_orders.clear()
            self._installed = False
            self._holders.clear()
            self._direct = False
            for inc in reversed(self._includes):
                inc._release(self)
            if self._after_uninstall is not None:
                self._after_uninstall()
