"""Synthetic transformer-like edge programs from ~100 to ~20,000 nodes, built cheaply.

A small unit (one Llama block with fusable RMSNorms and/or one DiT block with
AdaLN norms) is exported and lowered to the edge dialect once. Bigger programs
are made by replicating the unit's body with ``Graph.node_copy``, chaining each
copy's output into the next copy's ``x``; placeholders (parameters, lifted
constants, inputs) are shared. Node metadata (``val``) is copied, so every
consumer (fusionkit, the stock detectors, ExportPass retracing) sees a normal
edge program. Export happens once per unit kind; a fresh program of any size
takes milliseconds, so runs that mutate the graph each get their own copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, OutputSpec, TensorArgument

from benchmarks.models import MixedUnit, NormChainUnit

#: unit kinds: "mixed" (a Llama block with fusable norms, then a DiT block with
#: AdaLN norms) is exported; "adaln" (nothing may be fused) is the DiT half of
#: the same program, cut out by module path, so only one export is paid;
#: "norms" (one fusable norm block, one AdaLN norm block: ~29 nodes per fusion)
#: is the apply benchmark's unit
KINDS = ("mixed", "adaln", "norms")


@dataclass(frozen=True)
class Unit:
    ep: ExportedProgram
    placeholders: tuple[torch.fx.Node, ...]
    body: tuple[torch.fx.Node, ...]
    x: torch.fx.Node
    out: torch.fx.Node


@cache
def unit(kind: str) -> Unit:
    if kind == "adaln":
        return _adaln_half(unit("mixed"))
    from executorch.exir import to_edge

    torch.manual_seed(0)
    m = NormChainUnit().eval() if kind == "norms" else MixedUnit().eval()
    ep = torch.export.export(m, (torch.randn(2, 4, 16), torch.randn(2, 16)))
    edge = to_edge(ep).exported_program()
    g = edge.graph_module.graph
    ph = tuple(n for n in g.nodes if n.op == "placeholder")
    body = tuple(n for n in g.nodes if n.op == "call_function")
    (out_node,) = (n for n in g.nodes if n.op == "output")
    out = out_node.args[0][0]
    x = next(n for n in ph if n.name == "x")
    return Unit(edge, ph, body, x, out)


def _adaln_half(u: Unit) -> Unit:
    def in_adaln(n: torch.fx.Node) -> bool:
        stack = n.meta.get("nn_module_stack") or {}
        return any(str(path).startswith("adaln") for path, _ in stack.values())

    body = tuple(n for n in u.body if in_adaln(n))
    inside = set(body)
    outside = {a for n in body for a in n.all_input_nodes
               if a not in inside and a.op != "placeholder"}
    if len(outside) != 1 or u.out not in inside:
        raise RuntimeError(f"cannot cut the AdaLN block out of the unit: inputs {outside}")
    (x,) = outside
    return Unit(u.ep, u.placeholders, body, x, u.out)


def copies_for(kind: str, target_nodes: int) -> int:
    u = unit(kind)
    return max(1, round((target_nodes - len(u.placeholders) - 1) / len(u.body)))


def build(kind: str, copies: int) -> ExportedProgram:
    """A fresh edge program holding ``copies`` chained copies of the unit's body."""
    u = unit(kind)
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for p in u.placeholders:
        env[p] = g.node_copy(p, lambda n: env[n])
    prev = next(env[p] for p in u.placeholders if p.name == "x")  # the user input x
    for _ in range(copies):
        local = dict(env)
        local[u.x] = prev
        for n in u.body:
            local[n] = g.node_copy(n, lambda a, local=local: local[a])
        prev = local[u.out]
    g.output((prev,))
    src = u.ep
    sig = ExportGraphSignature(
        input_specs=list(src.graph_signature.input_specs),
        output_specs=[OutputSpec(src.graph_signature.output_specs[0].kind,
                                 TensorArgument(prev.name), None)],
    )
    # The unit was validated when it was exported, and every copy is the same
    # code: skip re-validation and Python codegen here (they would dominate the
    # set-up of a 20k-node graph). Codegen is deferred, not skipped: the passes
    # under test recompile whenever they change the graph, as they always do.
    with _no_validate_no_codegen():
        return ExportedProgram(
            root=src.graph_module,
            graph=g,
        graph_signature=sig,
            state_dict=dict(src.state_dict),
            range_constraints=dict(src.range_constraints),
            module_call_graph=src.module_call_graph,
            example_inputs=src.example_inputs,
            constants=dict(src.constants),
            verifiers=src.verifiers,
        )


@contextlib.contextmanager
def _no_validate_no_codegen() -> Iterator[None]:
    saved_validate = ExportedProgram.validate
    saved_recompile = torch.fx.GraphModule.recompile
    ExportedProgram.validate = lambda self: None  # type: ignore[method-assign]
    torch.fx.GraphModule.recompile = lambda self: None  # type: ignore[method-assign,assignment,return-value]
    try:
        yield
    finally:
        ExportedProgram.validate = saved_validate  # type: ignore[method-assign]
        torch.fx.GraphModule.recompile = saved_recompile  # type: ignore[method-assign]


def node_count(ep: ExportedProgram) -> int:
    return len(ep.graph_module.graph.nodes)
