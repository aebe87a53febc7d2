"""Consent to run code: a spec names Python (``package.module:attr``), it is imported only if allowed.

Specs are meant to be shared, and importing a module runs its top-level code.
So loading or validating a spec imports nothing it names unless the user
opted in, for everything (``trust=True``, ``--trust``) or for modules under
given prefixes (``allow_modules=["mypkg"]``, ``--allow-module mypkg``: ``mypkg``
and ``mypkg.*``, never ``mypkgx``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fusionkit.specs.codec import is_python_ref

__all__ = ["ImportPolicy", "import_ref", "importable_here"]


@dataclass(frozen=True)
class ImportPolicy:
    """Which Python references of a spec may be imported."""

    trust: bool = False
    allow_modules: tuple[str, ...] = ()

    @staticmethod
    def of(trust: bool = False, allow_modules: Iterable[str] = ()) -> ImportPolicy:
        if isinstance(allow_modules, str):
            allow_modules = [allow_modules]
        prefixes = tuple(m.strip().rstrip(".") for m in allow_modules)
        for m in prefixes:
            if not m or not is_python_ref(f"{m}:x"):
                raise ValueError(f"allowed module prefix {m!r} is not a dotted module name")
        return ImportPolicy(bool(trust), prefixes)

    def allows(self, ref: str) -> bool:
        if self.trust:
            return True
        module = ref.partition(":")[0]
        return any(module == p or module.startswith(p + ".") for p in self.allow_modules)

    def refusal(self, ref: str) -> str:
        module = ref.partition(":")[0]
        top = module.split(".")[0]
        return (f"`{ref}` is Python code; loading it would import `{module}` and run its code, "
                f"which needs your consent: pass --trust (trust=True) or --allow-module {top} "
                f"(allow_modules=[{top!r}])")


@contextmanager
def importable_here() -> Iterator[None]:
    """The current directory on ``sys.path`` for the block, as ``python -m`` would have it.

    The ``fusionkit`` command runs from its installed script, whose directory (not the
    user's) is ``sys.path[0]``: without this, ``mymodels:factory`` next to the user is
    not found. The directory goes last, so it never shadows an installed package.
    """
    here = os.getcwd()
    if here in sys.path or "" in sys.path:
        yield
        return
    sys.path.append(here)
    try:
        yield
    finally:
        try:
            sys.path.remove(here)
        except ValueError:  # the block removed it itself
            pass


def import_ref(ref: str) -> Any:
    """The object ``package.module:attr`` names (this imports the module; a module in
    the current directory is found too)."""
    module, _, attr = ref.partition(":")
    with importable_here():
        obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
