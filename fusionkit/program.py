"""A program argument in any of the shapes a lowering hands out.

``torch.export.export`` returns an ``ExportedProgram``, ``to_edge`` and
``to_edge_transform_and_lower`` an ``EdgeProgramManager``, ``.to_executorch()``
an ``ExecutorchProgramManager``. A user holds whichever their last step
returned, so every fusionkit function that reads a program takes any of the
three (:func:`as_exported_program`), instead of failing three calls deep with
``AttributeError: ... has no attribute 'graph_module'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from torch.export import ExportedProgram

if TYPE_CHECKING:
    from executorch.exir import EdgeProgramManager, ExecutorchProgramManager

__all__ = ["PROGRAM_TYPES", "ProgramLike", "as_exported_program", "is_edge_dialect"]

#: a program argument: what export, to_edge(_transform_and_lower) or to_executorch returned
ProgramLike: TypeAlias = "ExportedProgram | EdgeProgramManager | ExecutorchProgramManager"

#: what a program argument may be (for messages)
PROGRAM_TYPES = "an ExportedProgram, an EdgeProgramManager or an ExecutorchProgramManager"


def _managers() -> tuple[type[EdgeProgramManager], type[ExecutorchProgramManager]]:
    from executorch.exir import EdgeProgramManager, ExecutorchProgramManager

    return EdgeProgramManager, ExecutorchProgramManager


def _hint(program: Any) -> str:
    import torch

    if isinstance(program, torch.fx.GraphModule):
        return ("; a graph module alone has no signature (which placeholders are weights): "
                "pass the ExportedProgram it belongs to")
    if isinstance(program, torch.nn.Module):
        return "; export it first: torch.export.export(module, example_inputs)"
    if isinstance(program, (str, bytes)):
        return "; load it first (torch.export.load for a .pt2)"
    return ""


def as_exported_program(program: ProgramLike | Any, method: str = "forward", *,
                        who: str = "this function",
                        rewrite: bool = False) -> ExportedProgram:
    """The ``ExportedProgram`` of ``method`` in ``program``.

    ``program``: an ``ExportedProgram`` (returned as is), an ``EdgeProgramManager``
    or an ``ExecutorchProgramManager`` (their program of ``method``; a manager
    with one method that is not ``forward`` gives that one). ``who`` names the
    caller in errors. ``rewrite``: the caller changes the program in place,
    which an ``ExecutorchProgramManager`` (already serialized) cannot take.

    Raises ``TypeError`` naming what was passed, ``ValueError`` for a method the
    program does not have.
    """
    if isinstance(program, ExportedProgram):
        return program
    edge_manager, executorch_manager = _managers()
    if isinstance(program, executorch_manager) and rewrite:
        raise TypeError(f"{who} changes the program, and an ExecutorchProgramManager is already "
                        "serialized; run it before .to_executorch(): on the EdgeProgramManager, "
                        "or in to_edge_transform_and_lower(transform_passes=[...])")
    if isinstance(program, (edge_manager, executorch_manager)):
        methods = sorted(program.methods)
        if method not in methods:
            if method == "forward" and len(methods) == 1:
                method = methods[0]
            else:
                raise ValueError(f"{who}: the {type(program).__name__} has no method {method!r} "
                                 f"(methods: {', '.join(methods) or 'none'})")
        return program.exported_program(method)
    raise TypeError(f"{who} takes {PROGRAM_TYPES}, not {_type_name(program)}{_hint(program)}")


def _type_name(program: Any) -> str:
    t = type(program)
    module = t.__module__
    return t.__qualname__ if module in ("builtins", None) else f"{module}.{t.__qualname__}"


def is_edge_dialect(ep: ExportedProgram) -> bool:
    """Whether ``ep`` is in ExecuTorch's edge dialect (``to_edge`` already ran)."""
    dialect = getattr(ep, "dialect", None)
    if isinstance(dialect, str):
        return dialect.upper() == "EDGE"
    from fusionkit.targets import is_edge_target

    return any(n.op == "call_function" and is_edge_target(n.target)
               for n in ep.graph_module.graph.nodes)
