"""Fold a weight computed from parameters alone into a constant, before partitioning.

``torch.nn.utils.parametrizations.weight_norm`` makes a convolution's weight
``g * v / |v|``: computed in the graph from two parameters. A backend that needs the
weight as a constant (Vulkan prepacks it, XNNPACK packs it at init) cannot take
such a convolution: stock ExecuTorch 1.5.1's Vulkan program is refused at load
(``(graph.val_is_tref(tensor_data)) is false!``) and its XNNPACK partitioner leaves
the convolution on the portable CPU kernels.

The value depends on nothing the program's caller passes, so it is computed once
here, with the real tensors, by the folder the fusion rules use for fused weights
(:func:`fusionkit.check.folding.evaluate_constant`: the graph's own ops, run in
PyTorch), and the consumer reads it as an ordinary constant. Only arguments the
backend needs as constants are folded (``constant_args``: op name -> argument
indices), so every other parameter expression — Gemma's ``1 + w`` into a multiply,
which the fusion rules judge — stays as it is. Refused, with the reason kept in
:attr:`FoldParameterSubgraphsPass.declined`: a subgraph that reads a user input, a
mutable buffer or a symbolic size; an op outside ``aten`` (a quantize / dequantize
keeps a quantized weight quantized, a backend's own op is its business); a mutating
or random op; more than ``max_nodes`` nodes. Parameters no other node reads any
more are dropped from the lowered program (the caller's program and module keep
theirs: ``to_edge`` works on a copy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.check.folding import (
    FoldError,
    constant_fold_sources,
    evaluate_constant,
    new_constant_placeholder,
)
from fusionkit.edit import signature
from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import op_key

__all__ = ["DeclinedFold", "FoldParameterSubgraphsPass", "FoldedWeight"]


@dataclass(frozen=True)
class FoldedWeight:
    """One computed argument the pass replaced by a constant."""

    consumer: str  # the node whose argument it was
    op: str  # the consumer's op
    arg_index: int
    node: str  # the node that computed the value
    constant: str  # the new constant's placeholder
    sources: tuple[str, ...]  # the placeholders the value was computed from
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class DeclinedFold:
    """A computed argument the backend needs as a constant, left in the graph: why."""

    consumer: str
    op: str
    arg_index: int
    node: str
    reason: str

    def __str__(self) -> str:
        return (f"`{self.consumer}` ({self.op}) argument {self.arg_index}: `{self.node}` "
                f"not folded: {self.reason}")


#: the operator namespaces a folded expression may use: ATen and the edge dialect's
#: dim-order casts (``weight.to(float32)``); never a quantize / dequantize, whose integer
#: weight a backend's quantized rules take as it is
_FOLDED_NAMESPACES = ("aten.", "dim_order_ops.")


def _refusal(node: Node, limit: int) -> str | None:
    """Why the subgraph computing ``node`` is not folded here (beyond what
    :func:`constant_fold_sources` refuses), or None."""
    seen: set[Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function":
            continue
        seen.add(n)
        if len(seen) > limit:
            return f"its expression is larger than {limit} nodes"
        key = op_key(n.target)
        if key is not None and not key.startswith(_FOLDED_NAMESPACES):
            return (f"it depends on `{n.name}` ({key}), an op outside aten that fusionkit "
                    "does not evaluate at lowering time")
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
            return f"`{n.name}` has a symbolic size {tuple(val.shape)}"
        stack.extend(n.all_input_nodes)
    return None


class FoldParameterSubgraphsPass(ExportedProgramPassBase):
    """Replaces each argument a backend needs as a constant, when the graph computes it
    from parameters, buffers and lifted constants alone, by its value.

    ``constant_args``: op name (``aten.convolution.default``) -> the positional argument
    indices the backend requires to be constants. The folded constant holds exactly the
    value the graph's ops compute in PyTorch (bytes equal).
    """

    def __init__(self, constant_args: Mapping[str, Sequence[int]], max_nodes: int = 64) -> None:
        self.constant_args = {k: tuple(v) for k, v in constant_args.items()}
        self.max_nodes = max_nodes
        #: what the most recent run folded, and what it declined with the reason
        self.folded: list[FoldedWeight] = []
        self.declined: list[DeclinedFold] = []

    def _candidates(self, ep: ExportedProgram) -> list[tuple[Node, str, int, Node]]:
        out = []
        for n in ep.graph.nodes:
            if n.op != "call_function":
                continue
            name = op_key(n.target)
            indices = self.constant_args.get(name) if name is not None else None
            if not indices:
                continue
            for i in indices:
                a = n.args[i] if i < len(n.args) else None
                if isinstance(a, Node) and a.op == "call_function":
                    out.append((n, str(name), i, a))
        return out

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        ep = exported_program
        self.folded, self.declined = [], []
        candidates = self._candidates(ep)
        if not candidates:
            return ExportedProgramPassResult(ep, False)
        inputs = ProgramInputs(ep)
        # plan first (every value computed before the graph changes), then rewrite
        plan: list[tuple[Node, str, int, Node, torch.Tensor, list[Node]]] = []
        values: dict[Node, torch.Tensor] = {}
        for consumer, name, i, arg in candidates:
            sources, why = constant_fold_sources(arg, inputs, self.max_nodes)
            if sources is None:
                # a value computed from the program's inputs is not ours to fold; the
                # backend's partitioner judges it (reported for the other reasons only)
                if "user input" not in why:
                    self.declined.append(DeclinedFold(consumer.name, name, i, arg.name, why))
                continue
            why2 = _refusal(arg, self.max_nodes)
            if why2 is not None:
                self.declined.append(DeclinedFold(consumer.name, name, i, arg.name, why2))
                continue
            if arg not in values:
                try:
                    values[arg] = evaluate_constant(arg, inputs)
                except FoldError as e:
                    self.declined.append(DeclinedFold(consumer.name, name, i, arg.name, str(e)))
                    continue
            plan.append((consumer, name, i, arg, values[arg], sources))
        if not plan:
            return ExportedProgramPassResult(ep, False)
        # to_edge hands the passes a program whose state dict and constants may be the
        # caller's own dicts (torch.export shares them): write only to copies
        ep._state_dict = dict(ep.state_dict)  # the setters refuse (torch 2.13)
        ep._constants = dict(ep.constants)
        made: dict[Node, Node] = {}
        touched: set[Node] = set()
        for consumer, name, i, arg, value, sources in plan:
            new = made.get(arg)
            if new is None:
                new = made[arg] = new_constant_placeholder(ep, f"fk_folded_{arg.name}", value)
                new.meta["fusionkit_folded_from"] = arg.name
            args = list(consumer.args)
            args[i] = new
            consumer.args = tuple(args)
            touched.update(sources)
            self.folded.append(FoldedWeight(
                consumer.name, name, i, arg.name, new.name,
                tuple(sorted(s.name for s in sources)), tuple(value.shape), value.dtype))
        ep.graph.eliminate_dead_code()
        self._drop_unused(ep, touched)
        ep.graph_module.recompile()
        return ExportedProgramPassResult(ep, True)

    @staticmethod
    def _drop_unused(ep: ExportedProgram, sources: set[Node]) -> None:
        """Remove the source placeholders nothing reads any more, with their entries in
        the signature and the lowered program's state dict / constants."""
        dead = {s.name for s in sources if not s.users}
        if not dead:
            return
        sig = ep.graph_signature
        kept = [s for s in sig.input_specs if s.arg.name not in dead]
        still_read = {s.target for s in kept}  # a tied tensor another placeholder reads
        for spec in sig.input_specs:
            if spec.arg.name in dead and spec.target is not None and spec.target not in still_read:
                ep.state_dict.pop(spec.target, None)
                ep.constants.pop(spec.target, None)
        signature.set_specs(ep, kept)
        for s in sources:
            if s.name in dead:
                ep.graph.erase_node(s)
