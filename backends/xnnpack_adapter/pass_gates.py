"""When each pass of ExecuTorch 1.5.1's ``XNNPACKPassManager`` has nothing to do.

Only the passes fusionkit still runs as ExecuTorch wrote them have a gate: those whose
rewrites are fusionkit rules (:data:`.preprocess_rules.TAKEN_OVER_PASSES`) never run in
a fusionkit partition, and a rule whose ops are absent costs nothing.

Why here: each trigger reads one XNNPACK pass's own detection code (the module named by
the table key; site-packages is the ground truth), so it is knowledge of this backend
and of this ExecuTorch release. The mechanism that uses the table -- skipping, settled
graphs, :func:`~fusionkit.integration.pass_gating.checking` -- is backend-neutral and
lives in :mod:`fusionkit.integration.pass_gating`.

:data:`PATCHES` gates ``XNNPACKPassManager.transform`` (module
``executorch.backends.xnnpack._passes``); the serializer's patch set includes it, so only
the partitions a fusionkit partitioner made are gated.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

from fusionkit.integration.pass_gating import (
    GateTable,
    PassGate,
    arg,
    calls,
    edge_ops,
    nodes,
    present,
    retracing,
    transform_patches,
)

__all__ = ["PASS_GATES", "PATCHES"]


# ----------------------------------------------------------------------------- triggers
# Each reads the pass's own detection code; the docstring names what the pass rewrites.


def _clone_ops(ep: Any, p: Any) -> bool:
    """transforms/remove_clone_ops.py: an identity clone it does not preserve."""
    for n in nodes(ep, *p.clone_ops):
        if p._is_non_identity_clone(n):
            continue
        if p._is_input_output_copy(n) and p._preserve_input_output_copies:
            continue
        return True
    return False


def _dim_order_revert(ep: Any, p: Any) -> bool:
    """exir/passes/memory_format_ops_pass.py: replaces dim-order ops."""
    from executorch.exir.passes.dim_order_ops_registry import MemoryFormatOpsMap

    return present(ep, *MemoryFormatOpsMap)


def _custom_meta(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/propagate_custom_meta_pass.py: q/dq whose input has meta 'custom'."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    for n in calls(ep):
        if (is_quant(n) or is_dequant(n)) and n.all_input_nodes:
            parent = arg(n, 0)
            if isinstance(parent, Node) and "custom" in parent.meta:
                return True
    return False


def _const_prop(ep: Any, p: Any) -> bool:
    """exir/passes/const_prop_pass.py: folds an op whose arguments are all constants. In
    the retrace placeholders are fake (never constant), so a fold needs a get_attr or an
    op without node inputs (q/dq excluded unless ``propogate_quant``) to start from."""
    if ep.graph_module.graph.find_nodes(op="get_attr"):
        return True
    from executorch.exir.dialects._ops import ops

    qdq = {
        torch.ops.quantized_decomposed.quantize_per_tensor.default,
        torch.ops.quantized_decomposed.dequantize_per_tensor.default,
        torch.ops.quantized_decomposed.quantize_per_channel.default,
        torch.ops.quantized_decomposed.dequantize_per_channel.default,
        ops.edge.quantized_decomposed.quantize_per_tensor.default,
        ops.edge.quantized_decomposed.dequantize_per_tensor.default,
        ops.edge.quantized_decomposed.quantize_per_channel.default,
        ops.edge.quantized_decomposed.dequantize_per_channel.default,
    }
    for n in calls(ep):
        if n.target is operator.getitem or n.all_input_nodes:
            continue
        if (n.target in qdq) == bool(p.propogate_quant):
            return True
    return False


def _redundant_copy(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/remove_redundant_copy_pass.py: _to_copy nodes with an input."""
    return any(n.all_input_nodes for n in nodes(ep, edge_ops().aten._to_copy.default))


def _rules_keep_meta(ep: Any, p: Any) -> bool:
    """A fusionkit rule pass: every value it leaves is exact (see the table)."""
    return True


# ----------------------------------------------------------------------------- the table

#: ``module.QualName`` of a pass class of ``XNNPACKPassManager.transform`` -> its gate
PASS_GATES: GateTable = {
    # fusionkit's own passes in this preprocess (.preprocess_rules): never skipped. The
    # rules' nodes get their values by fake-tensor propagation, exact as a re-trace's
    # (checking() proves each skip after them), so a rule pass leaves a settled graph
    # settled; the adapter's one re-trace is a plain ExportPass
    "fusionkit.backends.xnnpack_adapter.preprocess_rules.RulePass":
        PassGate(None, keeps_meta=_rules_keep_meta),
    "executorch.exir.pass_base.ExportPass": PassGate(None, retraces=True),
    "executorch.backends.transforms.remove_clone_ops.RemoveCloneOpsTransform": PassGate(_clone_ops),
    "executorch.exir.passes.memory_format_ops_pass.DimOrderOpsRevertPass":
        retracing(_dim_order_revert),
    "executorch.backends.xnnpack._passes.propagate_custom_meta_pass.PropagateCustomMetaPass":
        retracing(_custom_meta),
    "executorch.exir.passes.const_prop_pass.ConstPropPass": retracing(_const_prop),
    # tags every node's memory format: always does work
    "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass":
        PassGate(None, retraces=True),
    "executorch.backends.xnnpack._passes.remove_redundant_copy_pass.RemoveRedundantCopyPass":
        retracing(_redundant_copy),
}

#: gating for ``XNNPACKPassManager.transform``
PATCHES = transform_patches("fusionkit.backends.xnnpack_adapter.pass_gates (XNNPACK preprocess passes)",
                            "executorch.backends.xnnpack._passes", PASS_GATES)
