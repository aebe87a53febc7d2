"""Fold subgraphs computed from lifted constants alone, before partitioning.

HF decoders build their attention masks and position ids from ``arange`` and Python
scalars (``past_seen_tokens = 0``); ``to_edge`` lifts each scalar into a constant
tensor whose fake carries its value (``FakeTensor.constant``). No user input,
parameter or buffer reaches that subgraph, and where an op the Vulkan backend lacks
(``cumsum``, ``index.Tensor``) cuts it off, the partitioner delegates it on its own.
Inside Vulkan preprocess, ``FuseBatchNormPass`` re-traces each delegate
(``ExportPass.call``): ``ExportPass.inputs`` hands it the *real* values of such
constants, finds no fake input, opens a fresh ``FakeTensorMode``, and the retraced
nodes' fakes no longer match the placeholders' ("fake mode ... from fake tensor
input 0 doesn't match mode ... from fake tensor input N"). Stock ExecuTorch 1.5.1
dies this way on a small ``Gemma2ForCausalLM``, and on ``arange(n) + 1`` feeding
ops split by a ``cumsum``.

Computing those values once at lowering time, as ExecuTorch's
``constant_prop_pass`` does, removes the failing delegate and the work it would do
on every run. Unlike ``constant_prop_pass`` this pass leaves parameters and real
buffers alone (their uses, such as Gemma's ``1 + w``, are what the fusion rules
judge), and it keeps impure ops, values the program returns and results larger
than ``max_bytes`` in the graph.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from executorch.exir.passes.constant_prop_pass import create_constant_nodes_and_return_specs
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from fusionkit.edit import signature

__all__ = ["FoldConstantSubgraphsPass", "FoldedValue"]

#: results larger than this stay in the graph (a mask for a long static sequence)
DEFAULT_MAX_BYTES = 1 << 20

_LEAF_TYPES = (bool, int, float, str, torch.dtype, torch.device, torch.layout,
               torch.memory_format, type(None))


@dataclass(frozen=True)
class FoldedValue:
    """One node whose value the pass computed and stored as a lifted constant."""

    node: str
    target: str  # the op that computed it
    shape: tuple[int, ...]
    dtype: torch.dtype


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    return str(getattr(target, "_op", target)) if not isinstance(target, str) else target


def _is_leaf_constant(x: object, known: dict[torch.fx.Node, torch.Tensor]) -> bool:
    return (x in known) if isinstance(x, torch.fx.Node) else isinstance(x, _LEAF_TYPES)


class FoldConstantSubgraphsPass(ExportedProgramPassBase):
    """Replaces each value computed only from lifted tensor constants by a constant.

    A lifted tensor constant is a placeholder whose fake tensor carries its value
    (``FakeTensor.constant``): what ``torch.export`` makes of ``torch.tensor(0)`` in
    model code. Parameters and buffers are never folded.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        #: values folded by the most recent run
        self.folded: list[FoldedValue] = []

    def _values(self, ep: ExportedProgram) -> OrderedDict[torch.fx.Node, torch.Tensor]:
        """Lifted constants and every value computable from them alone, in graph order."""
        sig = ep.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        # the signature's mappings are rebuilt on every access: read them once
        lifted, buffers = sig.inputs_to_lifted_tensor_constants, sig.inputs_to_buffers
        known: OrderedDict[torch.fx.Node, torch.Tensor] = OrderedDict()
        for node in ep.graph.nodes:
            if node.op == "placeholder":
                target = lifted.get(node.name)
                if target is None and getattr(node.meta.get("val"), "constant", None) is not None:
                    # a scalar that to_edge lifted into a tensor: listed as a buffer, its
                    # fake carries the value (what trips ExportPass's re-trace)
                    target = buffers.get(node.name)
                if target is None or target in mutated:
                    continue
                value = ep.constants.get(target, ep.state_dict.get(target))
                if isinstance(value, torch.Tensor):
                    known[node] = value
                continue
            if node.op != "call_function" or not callable(node.target):
                continue
            # cheap test first: most nodes read a value that is not constant (and with no
            # constant known yet, any node that reads a value at all); ``_input_nodes`` is
            # the dict ``all_input_nodes`` copies into a list for every call
            inputs = getattr(node, "_input_nodes", None)
            if inputs is None:
                inputs = dict.fromkeys(node.all_input_nodes)
            if inputs and (not known or not inputs.keys() <= known.keys()):
                continue
            if node.is_impure():
                continue
            leaves = pytree.tree_leaves((node.args, node.kwargs))
            if not all(_is_leaf_constant(x, known) for x in leaves):
                continue
            if not any(isinstance(x, torch.fx.Node) for x in leaves) and not isinstance(
                node.meta.get("val"), torch.Tensor
            ):
                continue  # a symbolic-int or non-tensor call with no constant input
            args, kwargs = pytree.tree_map(
                lambda x: known[x] if isinstance(x, torch.fx.Node) else x, (node.args, node.kwargs)
            )
            try:
                with torch.no_grad():
                    value = node.target(*args, **kwargs)
            except Exception:  # an op that cannot run eagerly here stays in the graph
                continue
            if not isinstance(value, torch.Tensor) or value.untyped_storage().nbytes() > self.max_bytes:
                continue
            if 0 in value.stride():  # ExecuTorch constants have no zero strides
                value = value.contiguous()
            known[node] = value
        # a value the program returns stays computed (its inputs are folded instead)
        for node in [n for n in known if any(u.op == "output" for u in n.users)]:
            if node.op == "call_function":
                del known[node]
        return known

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        ep = exported_program
        self.folded = []
        known = self._values(ep)
        computed = [n for n in known if n.op == "call_function"]
        user_inputs = set(ep.graph_signature.user_inputs)
        if not computed or not any(n.name in user_inputs for n in ep.graph.find_nodes(op="placeholder")):
            return ExportedProgramPassResult(ep, False)
        for node in computed:
            if not all(u in known for u in node.users):
                v = known[node]
                self.folded.append(FoldedValue(node.name, _op_name(node), tuple(v.shape), v.dtype))
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        specs.update(create_constant_nodes_and_return_specs(known, ep))
        signature.set_specs(ep, [specs[n.name] for n in ep.graph.find_nodes(op="placeholder")])
        ep.graph.eliminate_dead_code()
        ep.graph_module.recompile()
        return ExportedProgramPassResult(ep, True)
