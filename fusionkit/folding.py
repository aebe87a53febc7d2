"""Fold a constant expression into a new lifted constant of the program.

Used by :class:`~fusionkit.constraints.PrepackableConstant` with ``fold=True``:
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

from fusionkit.constraints import constant_fold_sources
from fusionkit.program_inputs import ProgramInputs

__all__ = ["FoldError", "evaluate_constant", "fold_to_constant", "new_constant_placeholder"]


class FoldError(RuntimeError):
    """A planned fold could not be carried out (the program is left untouched)."""


def _topo(nodes: set[Node], order: dict[Node, int]) -> list[Node]:
    return sorted(nodes, key=order.__getitem__)


def _ancestors(node: Node) -> set[Node]:
    out: set[Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in out:
            continue
        out.add(n)
        stack.extend(n.all_input_nodes)
    return out


def evaluate_constant(node: Node, inputs: ProgramInputs, order: dict[Node, int]) -> torch.Tensor:
    """The real value of a node that depends only on constants."""
    sources, why = constant_fold_sources(node, inputs)
    if sources is None:
        raise FoldError(f"`{node.name}` cannot be folded: {why}")
    env: dict[Node, Any] = {}

    def load(a: Any) -> Any:
        if isinstance(a, Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(load(x) for x in a)
        return a

    with torch.no_grad():
        for n in _topo(_ancestors(node), order):
            if n.op == "placeholder":
                ref = inputs.constant(n)
                assert ref is not None
                env[n] = ref.tensor.detach()
            else:
                target: Any = getattr(n.target, "_op", n.target)  # run edge ops as ATen
                env[n] = target(*load(n.args), **load(dict(n.kwargs)))
    value = env[node]
    if not isinstance(value, torch.Tensor):
        raise FoldError(f"`{node.name}` evaluates to {type(value).__name__}, not a tensor")
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
