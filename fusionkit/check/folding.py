"""Fold a constant expression into a new lifted constant of the program.

Used by :class:`~fusionkit.check.constraints.PrepackableConstant` with ``fold=True``:
a weight such as ``weight.to(fp32)`` or Gemma's ``1.0 + weight`` depends only on
constants, so it is evaluated once, here, with the real tensors, and the fused
op reads the result as an ordinary constant the backend can prepack. The
original expression is left in place for its other users; dead code is
removed later by the rewrite.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node

from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import (
    impurity,
    is_python_operator,
    memo_per_target,
    schema_of,
    target_name,
)

__all__ = [
    "FoldError",
    "constant_fold_sources",
    "evaluate_constant",
    "fold_to_constant",
    "new_constant_placeholder",
]


# ------------------------------------------------- what may be folded
def _fold_refusal(n: Node) -> str | None:
    """Why ``n`` cannot be part of a folded constant expression, or None if it can.

    Total over node kinds and targets: only pure, deterministic operators and
    Python's ``operator`` functions (``getitem`` of a ``chunk``/``split``, SymInt
    arithmetic) are evaluated at lowering time; a higher-order operator, any
    other Python callable, a module attribute or a call of a module is refused
    with a reason — never an exception.
    """
    if n.op != "call_function":
        what = {"get_attr": "a module attribute", "call_module": "a submodule call",
                "call_method": "a method call", "output": "the graph output"}.get(n.op, n.op)
        return f"it depends on `{n.name}`, {what}"
    why = memo_per_target(_TARGET_REFUSALS, n.target, _target_refusal)
    return None if why is None else f"it depends on `{n.name}` {why}"


#: target -> the reason (after the node's name) it is never folded, or None (foldable):
#: the verdict depends on the target only
_TARGET_REFUSALS: dict[Any, str | None] = {}


def _target_refusal(target: Any) -> str | None:
    if is_python_operator(target):
        return None
    if schema_of(target) is None:
        return f"({target_name(target)}), which fusionkit does not evaluate at lowering time"
    return impurity(target)


def constant_fold_sources(
    node: Node, inputs: ProgramInputs, limit: int = 64
) -> tuple[list[Node] | None, str]:
    """The constant placeholders ``node`` depends on, if it depends on nothing else.

    Returns ``(sources, "")`` when the value is a pure function of constants,
    else ``(None, why)``. The walk is bounded by ``limit`` nodes so a check stays
    constant-time on large graphs.
    """
    seen: set[Node] = set()
    sources: list[Node] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > limit:
            return None, f"its constant expression is larger than {limit} nodes"
        if n.op == "placeholder":
            if inputs.constant(n) is None:
                return None, f"it depends on {inputs.describe(n)} `{n.name}`"
            sources.append(n)
            continue
        refusal = _fold_refusal(n)
        if refusal is not None:
            return None, refusal
        stack.extend(n.all_input_nodes)  # every Node in args and kwargs, however nested
    return sources, ""


class FoldError(RuntimeError):
    """A planned fold could not be carried out (the program is left untouched)."""


def _ancestors_in_order(node: Node) -> list[Node]:
    """``node`` and everything it depends on, producers before consumers."""
    out: list[Node] = []
    done: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, expanded = stack.pop()
        if n in done:
            continue
        if expanded:
            done.add(n)
            out.append(n)
            continue
        stack.append((n, True))
        stack.extend((i, False) for i in n.all_input_nodes if i not in done)
    return out


def evaluate_constant(node: Node, inputs: ProgramInputs,
                      order: dict[Node, int] | None = None) -> torch.Tensor:
    """The real value of a node that depends only on constants.

    Raises :class:`FoldError` (never anything else) when the expression cannot be
    folded or evaluating it fails, or when the result does not have the dtype and
    shape the graph records for ``node``. ``order`` is accepted for callers that
    have it and is not needed.
    """
    sources, why = constant_fold_sources(node, inputs)
    if sources is None:
        raise FoldError(f"`{node.name}` cannot be folded: {why}")
    env: dict[Node, Any] = {}

    def load(a: Any) -> Any:
        return torch.fx.node.map_arg(a, env.__getitem__)

    try:
        with torch.no_grad():
            for n in _ancestors_in_order(node):
                if n.op == "placeholder":
                    ref = inputs.constant(n)
                    if ref is None:
                        raise FoldError(f"`{n.name}` is not a constant")
                    env[n] = ref.tensor.detach()
                else:
                    target: Any = getattr(n.target, "_op", n.target)  # run edge ops as ATen
                    env[n] = target(*load(n.args), **load(dict(n.kwargs)))
    except FoldError:
        raise
    except Exception as e:
        raise FoldError(f"evaluating `{node.name}` failed: {type(e).__name__}: {e}") from e
    value = env[node]
    if not isinstance(value, torch.Tensor):
        raise FoldError(f"`{node.name}` evaluates to {type(value).__name__}, not a tensor")
    expected = node.meta.get("val")
    if (isinstance(expected, torch.Tensor) and all(isinstance(d, int) for d in expected.shape)
            and (value.dtype != expected.dtype or tuple(value.shape) != tuple(expected.shape))):
        raise FoldError(f"`{node.name}` evaluates to {value.dtype}{tuple(value.shape)}, but the "
                        f"graph records {expected.dtype}{tuple(expected.shape)}")
    return value.detach().contiguous().clone()


def _first_user_input(ep: ExportedProgram) -> Node | None:
    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    for n in ep.graph_module.graph.nodes:
        if n.op != "placeholder":
            break
        if kinds.get(n.name) == InputKind.USER_INPUT:
            return n
    return None


def fold_to_constant(ep: ExportedProgram, node: Node, inputs: ProgramInputs,
                     order: dict[Node, int]) -> Node:
    """A new lifted-constant placeholder holding the value of ``node``."""
    value = evaluate_constant(node, inputs, order)
    new = new_constant_placeholder(ep, f"fk_folded_{node.name}", value)
    new.meta["fusionkit_folded_from"] = node.name
    return new


def new_constant_placeholder(ep: ExportedProgram, name: str, value: torch.Tensor) -> Node:
    """A lifted-constant placeholder ``name`` holding ``value``, placed before the user inputs.

    If a placeholder of that name exists already it is returned as is (the
    name stands for the content).
    """
    from executorch.backends.transforms.utils import create_constant_placeholder

    graph = ep.graph_module.graph
    anchor = _first_user_input(ep)
    if anchor is None:  # no user input: place after the last placeholder
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        ctx = graph.inserting_after(placeholders[-1]) if placeholders else graph.inserting_before()
    else:
        ctx = graph.inserting_before(anchor)
    with ctx:
        return create_constant_placeholder(ep, graph, name, InputKind.CONSTANT_TENSOR, value)
