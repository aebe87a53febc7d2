"""Former module paths (``fusionkit.finder``, ...) and names, kept working for one release.

The core moved from one flat folder into phase sub-packages (``fusionkit.match``,
``.check``, ``.apply``, ``.authoring``). Code that imports an old path still works:
a meta-path finder maps it to the new module (the very same module object, so
monkeypatching either name patches both) and warns once with the new path.
A module whose names moved serves them from :func:`deprecated_names` (its ``__getattr__``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

#: old module name -> new module name
MOVED_MODULES: dict[str, str] = {
    f"fusionkit.{name}": f"fusionkit.{phase}.{name}"
    for phase, names in {
        "match": ("pattern", "matcher", "gates", "memo", "finder", "targets"),
        "check": ("constraints", "program_inputs", "folding"),
        "apply": ("rewrite", "builder", "journal", "lazy_code", "meta_cache"),
        "authoring": ("from_example", "python_source", "near_miss", "vocabulary"),
    }.items()
    for name in names
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new_name}; the old path goes away in 0.2",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new_name)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The new module is already executed."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED_MODULES.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new_name))


def install_module_aliases() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


def deprecated_names(module: str, names: Mapping[str, tuple[Callable[[], Any], str]]
                     ) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving former names: ``name -> (value, advice)``; reading
    one warns (DeprecationWarning: "<module>.<name> is deprecated: <advice>") and returns
    ``value()`` (called then: the value may live in a module that imports this one)."""

    def __getattr__(name: str) -> Any:
        entry = names.get(name)
        if entry is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value, advice = entry
        warnings.warn(f"{module}.{name} is deprecated: {advice}", DeprecationWarning,
                      stacklevel=2)
        return value()

    return __getattr__
