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
    edge_ops,
    nodes,
    present,
    retracing,
    transform_patches,
    val_key,
)

__all__ = ["PASS_GATES", "PATCHES"]


# ----------------------------------------------------------------------------- triggers
# Each reads the pass's own detection code; the docstring names what the pass rewrites.


def _addmm_to_linear(ep: Any, p: Any) -> bool:
    """transforms/addmm_mm_to_linear.py: mm/addmm whose weight is t_copy/permute_copy
    become linear; a linear whose input is a view_copy chain from a dequantize gets it
    bypassed; a linear's single view_copy user of the same shape is bypassed."""
    from executorch.backends.transforms.addmm_mm_to_linear import get_dqlinear_input

    ops = edge_ops()
    transposes = (ops.aten.t_copy.default, ops.aten.permute_copy.default)
    weights = [*(arg(n, 1) for n in nodes(ep, ops.aten.mm.default)),
               *(arg(n, 2) for n in nodes(ep, ops.aten.addmm.default))]
    for w in weights:
        if not isinstance(w, Node) or w.target in transposes:
            return True
    for node in nodes(ep, ops.aten.linear.default):
        inp = arg(node, 0)
        dq = get_dqlinear_input(inp)  # type: ignore[arg-type]
        if dq is not None and dq != inp:
            return True
        if _view_bypassed(node, inp, arg(node, 1)):
            return True
    return False


def _view_bypassed(node: Node, inp: Any, weight: Any) -> bool:
    """Would ``replace_linear_view_copy_input_output`` bypass ``node``'s view_copy user
    (its single user, of the shape the linear computes)? True where the pass would raise."""
    from executorch.backends.transforms.addmm_mm_to_linear import get_shape

    if len(node.users) != 1:
        return False
    user = next(iter(node.users))
    if user.op != "call_function" or user.target != edge_ops().aten.view_copy.default:
        return False
    if not isinstance(weight, Node) or "val" not in weight.meta:
        return True  # the pass raises: let it
    out = list(get_shape(inp))
    out[-1] = weight.meta["val"].shape[0]
    return out == list(get_shape(user))


def _addmm_keeps_meta(ep: Any, p: Any) -> bool:
    """AddmmToLinearTransform leaves exact vals unless it bypasses a dequantize chain (the
    linear's input changes shape) or a view_copy; each linear it makes from mm/addmm gets
    the op's own val, which must equal the mm's (asked here with the same fake call)."""
    from executorch.backends.transforms.addmm_mm_to_linear import get_dqlinear_input

    ops = edge_ops()
    transposes = (ops.aten.t_copy.default, ops.aten.permute_copy.default)
    linear_inputs = [arg(n, 0) for n in nodes(ep, ops.aten.linear.default)]
    for mm, (i, w, b) in [*((n, (0, 1, None)) for n in nodes(ep, ops.aten.mm.default)),
                          *((n, (1, 2, 0)) for n in nodes(ep, ops.aten.addmm.default))]:
        weight_t = arg(mm, w)
        if weight_t.target not in transposes:
            continue
        vals = [arg(mm, i).meta["val"], arg(weight_t, 0).meta["val"]]
        if b is not None:
            vals.append(arg(mm, b).meta["val"])
        if val_key(ops.aten.linear.default(*vals)) != val_key(mm.meta["val"]):
            return False
        if _view_bypassed(mm, arg(mm, i), arg(weight_t, 0)):
            return False
        linear_inputs.append(arg(mm, i))
    for inp in linear_inputs:
        dq = get_dqlinear_input(inp)
        if dq is not None and dq != inp:
            return False
    return not any(_view_bypassed(n, arg(n, 0), arg(n, 1))
                   for n in nodes(ep, ops.aten.linear.default))


def _batch_norm(ep: Any, p: Any) -> bool:
    """FuseBatchNormPass: rewrites only batch-norm nodes."""
    ops = edge_ops()
    return present(ep, ops.aten.native_batch_norm.default,
                   ops.aten._native_batch_norm_legit_no_training.default)


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


def _fuse_clamp(ep: Any, p: Any) -> bool:
    """transforms/fuse_conv_with_clamp.py: relu/hardtanh right after a single-user conv."""
    for n in nodes(ep, *p.FUSEABLE_ACTIVATIONS):
        prev = arg(n, 0)
        if prev.op == "call_function" and prev.target in p.FUSEABLE_OPS and len(prev.users) == 1:
            return True
    return False


def _redundant_ops(ep: Any, p: Any) -> bool:
    """vulkan/_passes/remove_redundant_ops.py: its own ``_should_remove`` per node."""
    return any(p._should_remove(n) for n in nodes(ep, *p.redundant_ops))


def _redundant_ops_keep_meta(ep: Any, p: Any) -> bool:
    """RemoveRedundantOpsTransform keeps exact vals when every node it removes has the val
    of the input its users get instead (shape, dtype and strides)."""
    for n in nodes(ep, *p.redundant_ops):
        if p._should_remove(n):
            src = arg(n, 1 if n.target in p._src_arg1_ops else 0)
            if val_key(src.meta["val"]) != val_key(n.meta["val"]):
                return False
    return True


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


def _fuse_view_copy(ep: Any, p: Any) -> bool:
    """transforms/fuse_view_copy.py: a view_copy with a later view_copy in its chain
    (its own ``_find_view_copy_chain``)."""
    ops = [*p.UNARY_ELEMENTWISE_OPS, p.VIEW_OP]
    return any(len(p._find_view_copy_chain(n, ops)) > 0 for n in nodes(ep, p.VIEW_OP))


def _view_to_squeeze(ep: Any, p: Any) -> bool:
    """transforms/view_copy_to_squeeze_unsqueeze.py: a view_copy its own
    ``find_squeeze_dims`` / ``find_unsqueeze_dim`` turn into (un)squeeze (same truthiness)."""
    for n in nodes(ep, p.view_copy_op):
        shape, view = arg(n, 0).meta["val"].shape, arg(n, 1)
        if p.find_squeeze_dims(shape, view) or p.find_unsqueeze_dim(shape, view):
            return True
    return False


def _asserts(ep: Any, p: Any) -> bool:
    """vulkan/_passes/remove_asserts.py: erases assert ops."""
    return present(ep, *p.assert_ops)


# ----------------------------------------------------------------------------- the table

#: ``module.QualName`` of a pass class of ``vulkan_preprocess.apply_passes`` -> its gate
PASS_GATES: GateTable = {
    "executorch.backends.transforms.addmm_mm_to_linear.AddmmToLinearTransform":
        PassGate(_addmm_to_linear, always_modified=True, dce=True, keeps_meta=_addmm_keeps_meta),
    "executorch.backends.xnnpack._passes.fuse_batch_norm.FuseBatchNormPass":
        retracing(_batch_norm),
    "executorch.backends.vulkan._passes.insert_dtype_promotion.InsertDtypePromotionPass":
        PassGate(_dtype_promotion),
    # fusionkit's rules run inside it (the takeover): no cheap trigger
    "executorch.backends.vulkan._passes.fuse_patterns.FusePatternsPass":
        PassGate(None, retraces=True),
    "executorch.backends.transforms.fuse_conv_with_clamp.FuseClampPass":
        retracing(_fuse_clamp),
    "executorch.backends.vulkan._passes.remove_redundant_ops.RemoveRedundantOpsTransform":
        PassGate(_redundant_ops, always_modified=True, dce=True,
                 keeps_meta=_redundant_ops_keep_meta),
    "executorch.backends.vulkan._passes.fuse_quantized_ops.FuseQuantizedOpsTransform":
        retracing(_fuse_quantized, dce=True),
    "executorch.backends.vulkan._passes.fold_qdq.FoldQDQPass":
        retracing(_fold_qdq, dce=True),
    "executorch.backends.vulkan._passes.squeeze_unsqueeze_inputs.SqueezeUnsqueezeInputs":
        retracing(_squeeze_inputs),
    "executorch.backends.transforms.fuse_view_copy.FuseViewCopyTransform":
        PassGate(_fuse_view_copy, retraces=True),
    "executorch.backends.transforms.view_copy_to_squeeze_unsqueeze.ViewCopyToSqueezeUnsqueezePass":
        PassGate(_view_to_squeeze, retraces=True),
    "executorch.exir.passes.spec_prop_pass.SpecPropPass": PassGate(None, retraces=True),
    "executorch.backends.vulkan._passes.remove_asserts.RemoveAssertsTransform":
        PassGate(_asserts, always_modified=True, dce=True),
}

#: gating for ``vulkan_preprocess.apply_passes``
PATCHES = transform_patches("fusionkit.backends.vulkan_adapter.pass_gates (Vulkan preprocess passes)",
                            "executorch.backends.vulkan.vulkan_preprocess", PASS_GATES)
