"""Hooks that act only on the lowering a fusionkit partitioner is part of.

A backend's ``preprocess`` runs after the partitioner returns, inside ExecuTorch's
``to_backend``: nothing fusionkit calls surrounds it. To apply fusionkit's fixes
(pattern takeover, constant serializer) there without rewiring ExecuTorch for the
rest of the process, a fusionkit partitioner *marks* its delegation spec with a
compile spec (:data:`MARKER_KEY`), and :class:`PreprocessScope` puts a dispatcher
in place of the backend's ``preprocess`` while marked partitions are pending:

* a marked call runs the stock ``preprocess`` with the adapter's
  :class:`~fusionkit.integration.hooks.PatchSet` installed for that call only;
* an unmarked call (a stock partitioner's) runs the stock ``preprocess`` untouched;
* when the last pending marked partition has been preprocessed, the dispatcher
  removes itself: ExecuTorch is left exactly as it was (the same objects).

The marker is a compile spec both runtimes ignore (they read only keys they know);
it stays in the ``.pte`` and says which adapter lowered a delegate.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from fusionkit.integration.hooks import PatchSet, check_executorch_version

__all__ = ["MARKER_KEY", "PreprocessScope", "is_marked"]

#: the compile-spec key a fusionkit partitioner adds to its delegation spec
MARKER_KEY = "fusionkit_adapter"


def is_marked(compile_specs: Any, value: bytes | None = None) -> bool:
    """Whether a list of ``CompileSpec`` carries fusionkit's marker (with ``value``)."""
    return any(getattr(s, "key", None) == MARKER_KEY and (value is None or s.value == value)
               for s in compile_specs or ())


class PreprocessScope:
    """Runs one backend's ``preprocess`` under ``patches`` for marked partitions only."""

    def __init__(self, backend_module: str, backend_class: str, marker: bytes,
                 patches: PatchSet) -> None:
        self._backend_module = backend_module
        self._backend_class = backend_class
        self.marker = marker
        self.patches = patches
        self._pending = 0
        self._lock = threading.RLock()
        self._dispatch = PatchSet(f"{patches.component} (preprocess dispatch)", self._patches)

    def mark(self, delegation_spec: Any) -> None:
        """Add the marker to a partitioner's delegation spec (once).

        Refuses (:class:`~fusionkit.integration.hooks.UnsupportedExecuTorchError`) an
        ExecuTorch the hooks were not tested with, when the partitioner is created.
        """
        from executorch.exir.backend.compile_spec_schema import CompileSpec

        check_executorch_version(self.patches.component)
        specs = delegation_spec.compile_specs
        if not is_marked(specs, self.marker):
            specs.append(CompileSpec(MARKER_KEY, self.marker))

    def expect(self, partitions: int) -> None:
        """``partitions`` marked partitions will be preprocessed: dispatch until they are."""
        with self._lock:
            self._pending += partitions
            if self._pending > 0:
                self._dispatch.install()

    @property
    def pending(self) -> int:
        return self._pending

    def is_dispatching(self) -> bool:
        return self._dispatch.is_installed()

    def reset(self) -> None:
        """Forget pending partitions (a lowering that failed) and remove the dispatcher."""
        with self._lock:
            self._pending = 0
            self._dispatch.uninstall()

    def _backend(self) -> Any:
        return getattr(importlib.import_module(self._backend_module), self._backend_class)

    def _patches(self) -> list[tuple[Any, str, Any]]:
        backend = self._backend()
        raw = backend.__dict__["preprocess"]  # classmethod or staticmethod object
        stock: Callable[..., Any] = raw.__func__
        takes_cls = isinstance(raw, classmethod)
        scope = self

        def preprocess(*args: Any, **kwargs: Any) -> Any:
            specs = kwargs.get("compile_specs", kwargs.get("module_compile_spec"))
            if specs is None and len(args) >= (3 if takes_cls else 2):
                specs = args[2 if takes_cls else 1]
            if not is_marked(specs, scope.marker):
                return stock(*args, **kwargs)
            try:
                with scope.patches.install():
                    return stock(*args, **kwargs)
            finally:
                with scope._lock:
                    scope._pending = max(0, scope._pending - 1)
                    if scope._pending == 0:
                        scope._dispatch.uninstall()

        preprocess.__wrapped__ = stock  # type: ignore[attr-defined]
        replacement = classmethod(preprocess) if takes_cls else staticmethod(preprocess)
        return [(backend, "preprocess", replacement)]
