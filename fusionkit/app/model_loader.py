"""MODEL arguments of the CLI: a saved ``.pt2`` or ``package.module:factory``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

__all__ = ["LoadedModel", "ModelError", "load_model"]


class ModelError(ValueError):
    """The MODEL argument cannot be turned into an exported program."""


@dataclass
class LoadedModel:
    name: str
    exported: ExportedProgram
    module: torch.nn.Module | None  # the eager module, when the factory gave one
    example_inputs: tuple[Any, ...]


def load_model(spec: str) -> LoadedModel:
    if spec.endswith(".pt2") or Path(spec).is_file():
        path = Path(spec)
        if not path.is_file():
            raise ModelError(f"{spec}: no such file")
        try:
            ep = torch.export.load(str(path))
        except Exception as e:  # torch raises many kinds for a bad archive
            raise ModelError(f"{spec}: not a saved ExportedProgram ({type(e).__name__}: {e})") from None
        args = ep.example_inputs[0] if ep.example_inputs else ()
        return LoadedModel(path.name, ep, None, tuple(args))
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelError(f"{spec!r}: expected a .pt2 file or package.module:factory")
    from fusionkit.specs.trust import importable_here

    with importable_here():  # a module next to the user, as `python -c "import m"` finds it
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ModelError(f"{spec}: cannot import ({e}; looked in the current directory "
                             "and the installed packages)") from None
        made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
        raise ModelError(f"{spec}: the factory must return (module, example_inputs)")
    module, inputs = made
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    ep = torch.export.export(module, inputs)
    return LoadedModel(spec, ep, module, inputs)
