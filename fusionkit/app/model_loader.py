"""MODEL arguments of the CLI: a saved ``.pt2`` or ``package.module:factory``."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


#: the first bytes of what a MODEL file may be instead of a .pt2, and what to say of it
_PTE_MAGIC = b"ET"  # an ExecuTorch program: bytes 4..5 of its flatbuffer ("ET12", ...)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


@contextmanager
def _quiet_logging() -> Iterator[None]:
    """torch logs a traceback (a dozen ``W...`` lines) before it raises on a bad archive,
    and prints the graph it traced before an export error: the one line the user gets
    says it all, so nothing is logged or written to stderr while loading."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        logging.disable(before)


def _not_a_pt2(spec: str, path: Path, e: BaseException) -> ModelError:
    """Why a MODEL file is not a saved ExportedProgram, naming what it is instead."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as oe:
        return ModelError(f"{spec}: cannot read ({oe.strerror or oe})")
    want = "MODEL is a .pt2 (torch.export.save) or package.module:factory"
    if head[4:6] == _PTE_MAGIC:
        return ModelError(f"{spec}: an ExecuTorch .pte (a lowered program), not a MODEL; {want} "
                          "(`fusionkit check` and `fusionkit run` take a .pte)")
    if path.suffix == ".py":
        return ModelError(f"{spec}: a Python file, not a MODEL; {want}, e.g. "
                          f"{path.with_suffix('').as_posix().replace('/', '.')}:FACTORY")
    if not head.startswith(b"PK"):
        kind = "not a .pt2" if path.suffix == ".pt2" else f"a {path.suffix or 'plain'} file"
        return ModelError(f"{spec}: {kind}, not a zip archive; {want}")
    return ModelError(f"{spec}: not a saved ExportedProgram ({_first_line(e)})")


def load_model(spec: str) -> LoadedModel:
    """The exported program ``spec`` names; every way it can be wrong is a
    :class:`ModelError` of one line naming ``spec``."""
    if spec.endswith(".pt2") or Path(spec).exists():
        path = Path(spec)
        if path.is_dir():
            raise ModelError(f"{spec}: a directory; MODEL is a .pt2 file or package.module:factory")
        if not path.is_file():
            raise ModelError(f"{spec}: no such file")
        try:
            with _quiet_logging():
                ep = torch.export.load(str(path))
        except Exception as e:  # torch raises many kinds for a bad archive
            raise _not_a_pt2(spec, path, e) from None
        args = ep.example_inputs[0] if ep.example_inputs else ()
        return LoadedModel(path.name, ep, None, tuple(args))
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelError(f"{spec}: no such file, and not package.module:factory "
                         "(MODEL is a .pt2 file or package.module:factory)")
    from fusionkit.specs.trust import importable_here

    with importable_here():  # a module next to the user, as `python -c "import m"` finds it
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise ModelError(f"{spec}: cannot import ({e}; looked in the current directory "
                             f"({os.getcwd()}) and the installed packages)") from None
        except Exception as e:  # the module itself raised while being imported
            raise ModelError(f"{spec}: importing {module_name} raised {_first_line(e)}") from None
        if not callable(factory):
            raise ModelError(f"{spec}: {attr} is a {type(factory).__name__}, not a factory "
                             "(a function returning (module, example_inputs))")
        try:
            made = factory()
        except Exception as e:
            raise ModelError(f"{spec}: the factory raised {_first_line(e)}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
        raise ModelError(f"{spec}: the factory must return (module, example_inputs)")
    module, inputs = made
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    try:
        with _quiet_logging():
            ep = torch.export.export(module, inputs)
    except Exception as e:
        raise ModelError(f"{spec}: torch.export.export failed: {_first_line(e)}") from None
    return LoadedModel(spec, ep, module, inputs)
