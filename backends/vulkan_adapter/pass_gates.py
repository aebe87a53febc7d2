"""When each pass of ExecuTorch 1.5.1's ``VulkanBackend.preprocess`` has nothing to do.

Why here: each trigger reads one Vulkan preprocess pass's own detection code (the module
named by the table key; site-packages is the ground truth), so it is knowledge of this
backend and of this ExecuTorch release. The mechanism that uses the table is
backend-neutral and lives in :mod:`fusionkit.integration.pass_gating`.

:data:`PATCHES` gates ``vulkan_preprocess.apply_passes``; the takeover's patch set
includes it, so only the partitions a fusionkit partitioner made are gated.
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from fusionkit.integration.pass_gating import (
    GateTable,
    PassGate,
    arg,
    calls,
    nodes,
    present,
    retracing,
    transform_patches,
)

__all__ = ["PASS_GATES", "PATCHES"]


# ----------------------------------------------------------------------------- triggers
# Each reads the pass's own detection code; the docstring names what the pass rewrites.


def _dtype_promotion(ep: Any, p: Any) -> bool:
    """vulkan/_passes/insert_dtype_promotion.py: casts the operands of a binary op whose
    two tensor inputs differ in dtype."""
    from executorch.backends.vulkan._passes.insert_dtype_promotion import BINARY_OPS

    for n in nodes(ep, *BINARY_OPS):
        lhs, rhs = arg(n, 0), arg(n, 1)
        if not isinstance(lhs, Node) or not isinstance(rhs, Node):
            continue
        if "val" not in lhs.meta or "val" not in rhs.meta:
            continue
        if lhs.meta["val"].dtype != rhs.meta["val"].dtype:
            return True
    return False


def _fuse_quantized(ep: Any, p: Any) -> bool:
    """vulkan/_passes/fuse_quantized_ops.py: its own ``matches_linear_qcnw_pattern``."""
    from executorch.backends.vulkan._passes.fuse_quantized_ops import matches_linear_qcnw_pattern

    program = p._exported_program
    if program is None:
        return True  # the pass asserts: let it
    return any(matches_linear_qcnw_pattern(program, n) is not None for n in calls(ep))


def _fold_qdq(ep: Any, p: Any) -> bool:
    """vulkan/_passes/fold_qdq.py: a quantize node with a dequantize user."""
    import executorch.backends.vulkan.utils as vk_utils

    return any(vk_utils.is_quant_node(n) and any(vk_utils.is_dequant_node(u) for u in n.users)
               for n in calls(ep))


def _squeeze_inputs(ep: Any, p: Any) -> bool:
    """vulkan/_passes/squeeze_unsqueeze_inputs.py: relu/gelu whose input its own
    ``should_squeeze`` accepts."""
    return any(p.should_squeeze(n.target, arg(n, 0).meta["val"].shape)
               for n in nodes(ep, *p._squeezable_ops))


def _asserts(ep: Any, p: Any) -> bool:
    """vulkan/_passes/remove_asserts.py: erases assert ops."""
    return present(ep, *p.assert_ops)


# ----------------------------------------------------------------------------- the table

#: ``module.QualName`` of a pass class of ``vulkan_preprocess.apply_passes`` -> its gate.
#: ``AddmmToLinearTransform``, ``FuseBatchNormPass``, ``FuseClampPass``,
#: ``RemoveRedundantOpsTransform``, ``FuseViewCopyTransform`` and
#: ``ViewCopyToSqueezeUnsqueezePass`` have none: fusionkit rules run in their place
#: (:mod:`.preprocess_rules`), and a rule whose ops are absent costs nothing
PASS_GATES: GateTable = {
    "executorch.backends.vulkan._passes.insert_dtype_promotion.InsertDtypePromotionPass":
        PassGate(_dtype_promotion),
    # fusionkit's rules run inside it (the takeover): no cheap trigger
    "executorch.backends.vulkan._passes.fuse_patterns.FusePatternsPass":
        PassGate(None, retraces=True),
    "executorch.backends.vulkan._passes.fuse_quantized_ops.FuseQuantizedOpsTransform":
        retracing(_fuse_quantized, dce=True),
    "executorch.backends.vulkan._passes.fold_qdq.FoldQDQPass":
        retracing(_fold_qdq, dce=True),
    "executorch.backends.vulkan._passes.squeeze_unsqueeze_inputs.SqueezeUnsqueezeInputs":
        retracing(_squeeze_inputs),
    "executorch.exir.passes.spec_prop_pass.SpecPropPass": PassGate(None, retraces=True),
    "executorch.backends.vulkan._passes.remove_asserts.RemoveAssertsTransform":
        PassGate(_asserts, always_modified=True, dce=True),
}

#: gating for ``vulkan_preprocess.apply_passes``
PATCHES = transform_patches("fusionkit.backends.vulkan_adapter.pass_gates (Vulkan preprocess passes)",
                            "executorch.backends.vulkan.vulkan_preprocess", PASS_GATES)
