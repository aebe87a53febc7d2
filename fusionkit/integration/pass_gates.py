"""Skip an ExecuTorch backend pass when the graph holds nothing it could act on.

Why: inside ``VulkanBackend.preprocess`` and ``XNNPACKPassManager.transform`` every pass
goes through ``executorch.exir.program._program._transform`` -- the pass manager's checks
before and after (recompile, lint, ``validate``), usually an ExportPass retrace, the
signature rebuild -- 10-40 ms a call even when the pass finds nothing, and on a float
transformer almost every pass finds nothing (17 passes x every partition for XNNPACK).

A :class:`PassGate` says, for one pass class of ExecuTorch 1.5.1, what must be in the
graph for the pass to possibly change it (its *trigger*), read from that pass's source
(the module named by the table key; site-packages is the ground truth). When the
trigger is absent, the pass's own rewrite does nothing and all that is left is what the
gate's flags describe:

* ``retraces`` -- the pass ends with an ExportPass retrace: the same nodes with their
  ``val`` re-derived. Skipped only when the graph is *settled*: nothing has changed it in
  place since it was given or last retraced (tracked per graph module; an in-place pass
  that reported a change unsettles it, unless its ``keeps_meta`` shows beforehand that
  every value it leaves is exact), so re-deriving gives back the same metadata.
* ``always_modified`` -- the pass reports a change even when it made none, so the pass
  manager would also de-duplicate equal ``getitem`` nodes and rebuild the signature and
  range constraints: skipped only without duplicate getitems and without range
  constraints (static shapes).
* ``dce`` -- the pass eliminates dead code even when it rewrote nothing: skipped only
  when no node (placeholders and the output aside) is unused.

A graph with sub-graphs (control flow) is never gated. A pass class not in the table, or
one whose gate is ``None``, always runs; so does any pass whose gate raises.

:func:`gated_transform` wraps ``_transform``: a skipped pass returns the program itself,
which is what ExecuTorch's ``_transform`` returns when a pass reports no change.
:data:`XNNPACK_PATCHES` and :data:`VULKAN_PATCHES` put it in place of the module-level
``_transform`` name the XNNPACK pass manager and ``vulkan_preprocess.apply_passes`` call;
the adapters include them in the patch sets their scoped preprocess installs, so only
the partitions a fusionkit partitioner made are gated. :func:`disabled` turns gating
off; :func:`checking` also runs every skipped pass on a deep copy and raises
:class:`GateViolation` if it changed anything (nodes, targets, arguments, output
metadata, selected node metadata, signature, constants).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import importlib
import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from fusionkit.integration.hooks import PatchSet
from fusionkit.integration.tensor_bytes import tensor_bytes

__all__ = [
    "PASS_GATES",
    "VULKAN_PATCHES",
    "XNNPACK_PATCHES",
    "GateViolation",
    "PassGate",
    "checking",
    "counts",
    "disabled",
    "gate_for",
    "gated_transform",
    "is_enabled",
    "reset_counts",
    "structure",
]

Trigger = Callable[[Any, Any], bool]  # (ExportedProgram, pass instance) -> may act


@dataclass(frozen=True)
class PassGate:
    """What one pass class needs in the graph to possibly change it, and what it does
    when it finds nothing (see the module docstring)."""

    trigger: Trigger | None  # None: never skipped (the entry only records ``retraces``)
    retraces: bool = False
    always_modified: bool = False
    dce: bool = False
    #: for a pass that changes the graph in place: True when, run on this (settled)
    #: graph, every ``val`` it leaves is what a retrace would derive (asked before it runs)
    keeps_meta: Trigger | None = None


class GateViolation(AssertionError):
    """A skipped pass, run on a copy under :func:`checking`, changed the program."""


# ----------------------------------------------------------------------------- helpers


def _edge() -> Any:
    from executorch.exir.dialects._ops import ops as exir_ops

    return exir_ops.edge


def _graph(ep: Any) -> torch.fx.Graph:
    return ep.graph_module.graph  # type: ignore[no-any-return]


def _nodes(ep: Any, *targets: Any) -> Iterator[Node]:
    """call_function nodes with one of ``targets`` (FX's own (op, target) index)."""
    g = _graph(ep)
    for t in targets:
        yield from g.find_nodes(op="call_function", target=t)


def _arg(n: Node, i: int) -> Any:
    """An argument, untyped: the passes read them as nodes or lists without checks."""
    return n.args[i]


def _present(ep: Any, *targets: Any) -> bool:
    return any(True for _ in _nodes(ep, *targets))


def _calls(ep: Any) -> Iterator[Node]:
    return (n for n in _graph(ep).nodes if n.op == "call_function")


_NO_NAME = object()


def _target_names(ep: Any) -> set[Any]:
    """``target.__name__`` of every call (``_NO_NAME`` when one has none: the passes that
    read every call's ``__name__`` would raise on it, so they must run)."""
    return {getattr(n.target, "__name__", _NO_NAME) for n in _calls(ep)}


# ----------------------------------------------------------------------------- triggers
# Each reads the pass's own detection code; the comment names what the pass rewrites.


def _addmm_to_linear(ep: Any, p: Any) -> bool:
    """transforms/addmm_mm_to_linear.py: mm/addmm whose weight is t_copy/permute_copy
    become linear; a linear whose input is a view_copy chain from a dequantize gets it
    bypassed; a linear's single view_copy user of the same shape is bypassed."""
    from executorch.backends.transforms.addmm_mm_to_linear import get_dqlinear_input

    ops = _edge()
    transposes = (ops.aten.t_copy.default, ops.aten.permute_copy.default)
    weights = [*(_arg(n, 1) for n in _nodes(ep, ops.aten.mm.default)),
               *(_arg(n, 2) for n in _nodes(ep, ops.aten.addmm.default))]
    for w in weights:
        if not isinstance(w, Node) or w.target in transposes:
            return True
    for node in _nodes(ep, ops.aten.linear.default):
        inp = _arg(node, 0)
        dq = get_dqlinear_input(inp)  # type: ignore[arg-type]
        if dq is not None and dq != inp:
            return True
        if _view_bypassed(node, inp, _arg(node, 1)):
            return True
    return False


def _view_bypassed(node: Node, inp: Any, weight: Any) -> bool:
    """Would ``replace_linear_view_copy_input_output`` bypass ``node``'s view_copy user
    (its single user, of the shape the linear computes)? True where the pass would raise."""
    from executorch.backends.transforms.addmm_mm_to_linear import get_shape

    if len(node.users) != 1:
        return False
    user = next(iter(node.users))
    if user.op != "call_function" or user.target != _edge().aten.view_copy.default:
        return False
    if not isinstance(weight, Node) or "val" not in weight.meta:
        return True  # the pass raises: let it
    out = list(get_shape(inp))
    out[-1] = weight.meta["val"].shape[0]
    return out == list(get_shape(user))


def _convert_to_linear(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/convert_to_linear.py: mm/addmm/bmm inside a Linear source
    partition become linear; then the addmm->linear transform runs."""
    if _present(ep, *p.targets):
        from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

        parts = get_source_partitions(_graph(ep), p.linear_modules)
        if any(n.target in p.targets for ps in parts.values() for sp in ps for n in sp.nodes):
            return True
    return _addmm_to_linear(ep, p)


def _batch_norm(ep: Any, p: Any) -> bool:
    """FuseBatchNormPass / DecomposeBatchNorm: rewrite only batch-norm nodes."""
    ops = _edge()
    return _present(ep, ops.aten.native_batch_norm.default,
                    ops.aten._native_batch_norm_legit_no_training.default)


def _dtype_promotion(ep: Any, p: Any) -> bool:
    """vulkan/_passes/insert_dtype_promotion.py: casts the operands of a binary op whose
    two tensor inputs differ in dtype."""
    from executorch.backends.vulkan._passes.insert_dtype_promotion import BINARY_OPS

    for n in _nodes(ep, *BINARY_OPS):
        lhs, rhs = _arg(n, 0), _arg(n, 1)
        if not isinstance(lhs, Node) or not isinstance(rhs, Node):
            continue
        if "val" not in lhs.meta or "val" not in rhs.meta:
            continue
        if lhs.meta["val"].dtype != rhs.meta["val"].dtype:
            return True
    return False


def _fuse_clamp(ep: Any, p: Any) -> bool:
    """transforms/fuse_conv_with_clamp.py: relu/hardtanh right after a single-user conv."""
    for n in _nodes(ep, *p.FUSEABLE_ACTIVATIONS):
        prev = _arg(n, 0)
        if prev.op == "call_function" and prev.target in p.FUSEABLE_OPS and len(prev.users) == 1:
            return True
    return False


def _redundant_ops(ep: Any, p: Any) -> bool:
    """vulkan/_passes/remove_redundant_ops.py: its own ``_should_remove`` per node."""
    return any(p._should_remove(n) for n in _nodes(ep, *p.redundant_ops))


def _fuse_quantized(ep: Any, p: Any) -> bool:
    """vulkan/_passes/fuse_quantized_ops.py: its own ``matches_linear_qcnw_pattern``."""
    from executorch.backends.vulkan._passes.fuse_quantized_ops import matches_linear_qcnw_pattern

    program = p._exported_program
    if program is None:
        return True  # the pass asserts: let it
    return any(matches_linear_qcnw_pattern(program, n) is not None for n in _calls(ep))


def _fold_qdq(ep: Any, p: Any) -> bool:
    """vulkan/_passes/fold_qdq.py: a quantize node with a dequantize user."""
    import executorch.backends.vulkan.utils as vk_utils

    return any(vk_utils.is_quant_node(n) and any(vk_utils.is_dequant_node(u) for u in n.users)
               for n in _calls(ep))


def _squeeze_inputs(ep: Any, p: Any) -> bool:
    """vulkan/_passes/squeeze_unsqueeze_inputs.py: relu/gelu whose input its own
    ``should_squeeze`` accepts."""
    return any(p.should_squeeze(n.target, _arg(n, 0).meta["val"].shape)
               for n in _nodes(ep, *p._squeezable_ops))


def _fuse_view_copy(ep: Any, p: Any) -> bool:
    """transforms/fuse_view_copy.py: a view_copy with a later view_copy in its chain
    (its own ``_find_view_copy_chain``)."""
    ops = [*p.UNARY_ELEMENTWISE_OPS, p.VIEW_OP]
    return any(len(p._find_view_copy_chain(n, ops)) > 0 for n in _nodes(ep, p.VIEW_OP))


def _view_to_squeeze(ep: Any, p: Any) -> bool:
    """transforms/view_copy_to_squeeze_unsqueeze.py: a view_copy its own
    ``find_squeeze_dims`` / ``find_unsqueeze_dim`` turn into (un)squeeze (same truthiness)."""
    for n in _nodes(ep, p.view_copy_op):
        shape, view = _arg(n, 0).meta["val"].shape, _arg(n, 1)
        if p.find_squeeze_dims(shape, view) or p.find_unsqueeze_dim(shape, view):
            return True
    return False


def _asserts(ep: Any, p: Any) -> bool:
    """vulkan/_passes/remove_asserts.py: erases assert ops."""
    return _present(ep, *p.assert_ops)


def _clone_ops(ep: Any, p: Any) -> bool:
    """transforms/remove_clone_ops.py: an identity clone it does not preserve."""
    for n in _nodes(ep, *p.clone_ops):
        if p._is_non_identity_clone(n):
            continue
        if p._is_input_output_copy(n) and p._preserve_input_output_copies:
            continue
        return True
    return False


def _dim_order_revert(ep: Any, p: Any) -> bool:
    """exir/passes/memory_format_ops_pass.py: replaces dim-order ops."""
    from executorch.exir.passes.dim_order_ops_registry import MemoryFormatOpsMap

    return _present(ep, *MemoryFormatOpsMap)


def _upsample_bilinear(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/convert_to_upsample_bilinear2d.py: matches its pattern graphs, which
    in 1.5.1 are the one op ``upsample_bilinear2d.vec`` (tests check the graphs)."""
    return _present(ep, _edge().aten.upsample_bilinear2d.vec)


def sdpa_required_targets() -> list[Any]:
    """Ops every 1.5.1 SDPA pattern graph contains (tests check the graphs): a pattern can
    match (``SubgraphMatcher`` compares targets) only where all are present."""
    ops = _edge()
    return [ops.aten._softmax.default, ops.aten.add.Tensor, ops.aten.any.dim,
            ops.aten.bmm.default, ops.aten.eq.Scalar, ops.aten.expand_copy.default,
            ops.aten.full_like.default, ops.aten.logical_not.default, ops.aten.mul.Scalar,
            ops.aten.permute_copy.default, ops.aten.view_copy.default, ops.aten.where.self,
            ops.dim_order_ops._clone_dim_order.default]


def _sdpa(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/convert_to_sdpa.py: matches its SDPA pattern graphs."""
    return all(_present(ep, t) for t in sdpa_required_targets())


def _custom_meta(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/propagate_custom_meta_pass.py: q/dq whose input has meta 'custom'."""
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    for n in _calls(ep):
        if (is_quant(n) or is_dequant(n)) and n.all_input_nodes:
            parent = _arg(n, 0)
            if isinstance(parent, Node) and "custom" in parent.meta:
                return True
    return False


def _const_prop(ep: Any, p: Any) -> bool:
    """exir/passes/const_prop_pass.py: folds an op whose arguments are all constants. In
    the retrace placeholders are fake (never constant), so a fold needs a get_attr or an
    op without node inputs (q/dq excluded unless ``propogate_quant``) to start from."""
    if _graph(ep).find_nodes(op="get_attr"):
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
    for n in _calls(ep):
        if n.target is operator.getitem or n.all_input_nodes:
            continue
        if (n.target in qdq) == bool(p.propogate_quant):
            return True
    return False


def _fuse_activation(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/fuse_activation_pass.py: relu/hardtanh after a fusable op that has
    no other user."""
    for n in _nodes(ep, *p.FUSEABLE_ACTIVATIONS):
        prev = _arg(n, 0)
        if prev.op == "call_function" and prev.target in p.FUSEABLE_OPS and len(prev.users) <= 1:
            return True
    return False


def _decompose_cat(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/decompose_cat.py: a cat of more than 5 tensors."""
    if _NO_NAME in _target_names(ep):
        return True
    return any(n.target.__name__ == "aten.cat.default" and len(_arg(n, 0)) > 5  # type: ignore[union-attr, arg-type]
               for n in _calls(ep))


def _named(*names: str) -> Trigger:
    """Passes that select nodes by ``target.__name__``."""
    wanted = frozenset(names)

    def trigger(ep: Any, p: Any) -> bool:
        found = _target_names(ep)
        return _NO_NAME in found or bool(found & wanted)

    trigger.__doc__ = f"calls named {sorted(wanted)}"
    return trigger


def _pad_qdq(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/insert_pad_qdq.py: constant_pad_nd nodes."""
    return _present(ep, _edge().aten.constant_pad_nd.default)


def _prelu(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/prelu_reshape_pass.py: _prelu_kernel nodes."""
    return _present(ep, _edge().aten._prelu_kernel.default)


def _redundant_copy(ep: Any, p: Any) -> bool:
    """xnnpack/_passes/remove_redundant_copy_pass.py: _to_copy nodes with an input."""
    return any(n.all_input_nodes for n in _nodes(ep, _edge().aten._to_copy.default))


def _addmm_keeps_meta(ep: Any, p: Any) -> bool:
    """AddmmToLinearTransform leaves exact vals unless it bypasses a dequantize chain (the
    linear's input changes shape) or a view_copy; each linear it makes from mm/addmm gets
    the op's own val, which must equal the mm's (asked here with the same fake call)."""
    from executorch.backends.transforms.addmm_mm_to_linear import get_dqlinear_input

    ops = _edge()
    transposes = (ops.aten.t_copy.default, ops.aten.permute_copy.default)
    linear_inputs = [_arg(n, 0) for n in _nodes(ep, ops.aten.linear.default)]
    for mm, (i, w, b) in [*((n, (0, 1, None)) for n in _nodes(ep, ops.aten.mm.default)),
                          *((n, (1, 2, 0)) for n in _nodes(ep, ops.aten.addmm.default))]:
        weight_t = _arg(mm, w)
        if weight_t.target not in transposes:
            continue
        vals = [_arg(mm, i).meta["val"], _arg(weight_t, 0).meta["val"]]
        if b is not None:
            vals.append(_arg(mm, b).meta["val"])
        if _val_key(ops.aten.linear.default(*vals)) != _val_key(mm.meta["val"]):
            return False
        if _view_bypassed(mm, _arg(mm, i), _arg(weight_t, 0)):
            return False
        linear_inputs.append(_arg(mm, i))
    for inp in linear_inputs:
        dq = get_dqlinear_input(inp)
        if dq is not None and dq != inp:
            return False
    return not any(_view_bypassed(n, _arg(n, 0), _arg(n, 1))
                   for n in _nodes(ep, ops.aten.linear.default))


def _redundant_ops_keep_meta(ep: Any, p: Any) -> bool:
    """RemoveRedundantOpsTransform keeps exact vals when every node it removes has the val
    of the input its users get instead (shape, dtype and strides)."""
    for n in _nodes(ep, *p.redundant_ops):
        if p._should_remove(n):
            src = _arg(n, 1 if n.target in p._src_arg1_ops else 0)
            if _val_key(src.meta["val"]) != _val_key(n.meta["val"]):
                return False
    return True


# ----------------------------------------------------------------------------- the table

def _retracing(trigger: Trigger, dce: bool = False) -> PassGate:
    """An ExportPass that rewrites, then retraces and reports a change even with nothing found."""
    return PassGate(trigger, retraces=True, always_modified=True, dce=dce)


#: ``module.QualName`` of a pass class (exactly; a subclass is a different pass) -> gate
PASS_GATES: dict[str, PassGate] = {
    # --- VulkanBackend.preprocess (vulkan_preprocess.apply_passes)
    "executorch.backends.transforms.addmm_mm_to_linear.AddmmToLinearTransform":
        PassGate(_addmm_to_linear, always_modified=True, dce=True, keeps_meta=_addmm_keeps_meta),
    "executorch.backends.xnnpack._passes.fuse_batch_norm.FuseBatchNormPass":
        _retracing(_batch_norm),
    "executorch.backends.vulkan._passes.insert_dtype_promotion.InsertDtypePromotionPass":
        PassGate(_dtype_promotion),
    # fusionkit's rules run inside it (the takeover): no cheap trigger
    "executorch.backends.vulkan._passes.fuse_patterns.FusePatternsPass":
        PassGate(None, retraces=True),
    "executorch.backends.transforms.fuse_conv_with_clamp.FuseClampPass":
        _retracing(_fuse_clamp),
    "executorch.backends.vulkan._passes.remove_redundant_ops.RemoveRedundantOpsTransform":
        PassGate(_redundant_ops, always_modified=True, dce=True,
                 keeps_meta=_redundant_ops_keep_meta),
    "executorch.backends.vulkan._passes.fuse_quantized_ops.FuseQuantizedOpsTransform":
        _retracing(_fuse_quantized, dce=True),
    "executorch.backends.vulkan._passes.fold_qdq.FoldQDQPass":
        _retracing(_fold_qdq, dce=True),
    "executorch.backends.vulkan._passes.squeeze_unsqueeze_inputs.SqueezeUnsqueezeInputs":
        _retracing(_squeeze_inputs),
    "executorch.backends.transforms.fuse_view_copy.FuseViewCopyTransform":
        PassGate(_fuse_view_copy, retraces=True),
    "executorch.backends.transforms.view_copy_to_squeeze_unsqueeze.ViewCopyToSqueezeUnsqueezePass":
        PassGate(_view_to_squeeze, retraces=True),
    "executorch.exir.passes.spec_prop_pass.SpecPropPass": PassGate(None, retraces=True),
    "executorch.backends.vulkan._passes.remove_asserts.RemoveAssertsTransform":
        PassGate(_asserts, always_modified=True, dce=True),
    # --- XNNPACKPassManager.transform (XnnpackBackend.preprocess)
    "executorch.backends.xnnpack._passes.XNNPACKRemoveCloneOpsTransform": PassGate(_clone_ops),
    "executorch.backends.transforms.remove_clone_ops.RemoveCloneOpsTransform": PassGate(_clone_ops),
    "executorch.exir.passes.memory_format_ops_pass.DimOrderOpsRevertPass":
        _retracing(_dim_order_revert),
    "executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d.ConvertToUpsampleBilinear2d":
        _retracing(_upsample_bilinear),
    "executorch.backends.xnnpack._passes.convert_to_linear.ConvertToLinearPass":
        _retracing(_convert_to_linear, dce=True),
    "executorch.backends.xnnpack._passes.propagate_custom_meta_pass.PropagateCustomMetaPass":
        _retracing(_custom_meta),
    "executorch.backends.xnnpack._passes.convert_to_sdpa.ConvertToSDPAPass": _retracing(_sdpa),
    "executorch.exir.passes.const_prop_pass.ConstPropPass": _retracing(_const_prop),
    "executorch.backends.xnnpack._passes.decompose_batch_norm.DecomposeBatchNorm":
        _retracing(_batch_norm),
    "executorch.backends.xnnpack._passes.fuse_activation_pass.FuseActivationPass":
        _retracing(_fuse_activation),
    "executorch.backends.xnnpack._passes.decompose_cat.DecomposeConcatenate":
        _retracing(_decompose_cat),
    "executorch.backends.transforms.remove_getitem_op.RemoveGetItemPass":
        _retracing(_named("aten.max_pool2d_with_indices.default", "aten.max.dim")),
    "executorch.backends.xnnpack._passes.insert_pad_qdq.InsertPadQDQPass": PassGate(_pad_qdq),
    "executorch.backends.xnnpack._passes.conv1d_unsqueeze_pass.Conv1dUnsqueezePass":
        _retracing(_named("aten.convolution.default")),
    "executorch.backends.xnnpack._passes.prelu_reshape_pass.PReLUReshapePass":
        _retracing(_prelu),
    # tags every node's memory format: always does work
    "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass":
        PassGate(None, retraces=True),
    "executorch.backends.xnnpack._passes.remove_redundant_copy_pass.RemoveRedundantCopyPass":
        _retracing(_redundant_copy),
}


def gate_for(pass_obj: Any) -> PassGate | None:
    """The gate of a pass instance's exact class, or None (always runs)."""
    cls = type(pass_obj)
    return PASS_GATES.get(f"{cls.__module__}.{cls.__qualname__}")


# ----------------------------------------------------------------------------- state

_state = threading.local()
_lock = threading.Lock()
_counts: collections.Counter[tuple[str, str]] = collections.Counter()
#: graph modules changed in place (not retraced) by a pass that ran
_unsettled: weakref.WeakSet[GraphModule] = weakref.WeakSet()


def is_enabled() -> bool:
    return getattr(_state, "enabled", True)  # type: ignore[no-any-return]


def _is_checking() -> bool:
    return getattr(_state, "checking", False)  # type: ignore[no-any-return]


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Every pass runs (in this thread) while the block runs."""
    before = is_enabled()
    _state.enabled = False
    try:
        yield
    finally:
        _state.enabled = before


@contextlib.contextmanager
def checking() -> Iterator[None]:
    """Every skip is verified: the pass runs on a deep copy and must change nothing."""
    before = _is_checking()
    _state.checking = True
    try:
        yield
    finally:
        _state.checking = before


def counts() -> dict[str, dict[str, int]]:
    """Pass class name -> {"skipped": n, "ran": n} since the last :func:`reset_counts`."""
    out: dict[str, dict[str, int]] = {}
    with _lock:
        for (name, outcome), n in _counts.items():
            out.setdefault(name, {"skipped": 0, "ran": 0})[outcome] = n
    return out


def reset_counts() -> None:
    with _lock:
        _counts.clear()


def _count(pass_obj: Any, outcome: str) -> None:
    with _lock:
        _counts[(type(pass_obj).__name__, outcome)] += 1


# ----------------------------------------------------------------------------- deciding


def _has_subgraphs(gm: GraphModule) -> bool:
    return any(m is not gm and isinstance(m, GraphModule) for m in gm.modules())


def _has_dead_code(gm: GraphModule) -> bool:
    """Any unused node but placeholders and the output (what DCE might erase; impure
    unused nodes count too: conservative)."""
    return any(not n.users and n.op not in ("placeholder", "output") for n in gm.graph.nodes)


def _has_duplicate_getitems(gm: GraphModule) -> bool:
    """What ``_common_getitem_elimination_pass`` would merge (or cannot index)."""
    seen: set[tuple[Node, Any]] = set()
    for n in gm.graph.find_nodes(op="call_function", target=operator.getitem):
        source, idx = n.args
        if not isinstance(source, Node) or (source, idx) in seen:
            return True
        seen.add((source, idx))
    return False


def _skippable(gate: PassGate, program: Any, pass_obj: Any) -> bool:
    if gate.trigger is None:
        return False
    gm = program.graph_module
    if _has_subgraphs(gm):
        return False
    if gate.retraces and gm in _unsettled:
        return False
    if gate.always_modified and (program.range_constraints or _has_duplicate_getitems(gm)):
        return False
    if gate.dce and _has_dead_code(gm):
        return False
    return not gate.trigger(program, pass_obj)


def _keeps_meta(gate: PassGate | None, program: Any, pass_obj: Any) -> bool:
    """Asked before an in-place pass runs: will the graph still be settled after it?"""
    if gate is None or gate.keeps_meta is None or program.graph_module in _unsettled:
        return False
    try:
        return bool(gate.keeps_meta(program, pass_obj))
    except Exception:
        return False


def _after_run(gate: PassGate | None, program: Any, result: Any, keeps_meta: bool) -> None:
    if result is program:
        return  # reported no change: the program is as it was
    gm = result.graph_module
    if (gate is not None and gate.retraces) or (keeps_meta and gm is program.graph_module):
        _unsettled.discard(gm)
    else:
        _unsettled.add(gm)


def gated_transform(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``_transform`` that returns the program unchanged for a pass with nothing to do."""

    def _transform(program: Any, *passes: Any, **kwargs: Any) -> Any:
        if not is_enabled() or len(passes) != 1:
            return orig(program, *passes, **kwargs)
        pass_obj = passes[0]
        gate = gate_for(pass_obj)
        try:
            skip = gate is not None and _skippable(gate, program, pass_obj)
        except Exception:
            skip = False  # a gate that cannot decide lets the pass run
        if skip:
            _count(pass_obj, "skipped")
            if _is_checking():
                _check_unchanged(orig, program, pass_obj, kwargs)
            return program
        keeps_meta = _keeps_meta(gate, program, pass_obj)
        result = orig(program, pass_obj, **kwargs)
        _count(pass_obj, "ran")
        with contextlib.suppress(Exception):
            _after_run(gate, program, result, keeps_meta)
        return result

    _transform.__wrapped__ = orig  # type: ignore[attr-defined]
    return _transform


# ----------------------------------------------------------------------------- checking

#: node metadata the check ignores: provenance and debugging aids that a retrace
#: rewrites or that never reach a backend ("val" is compared on its own)
VOLATILE_META = frozenset({
    "val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack", "from_node",
    "seq_nr", "torch_fn", "debug_handle", "original_aten", "unbacked_bindings",
    "partitioner_tag", "delegation_tag", "custom_op_name", "is_wrapped_scalar",
})


def _val_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        stride = tuple(v.stride()) if v.layout == torch.strided else None
        return ("T", tuple(v.shape), v.dtype, stride)
    if isinstance(v, (list, tuple)):
        return tuple(_val_key(x) for x in v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return (type(v).__name__, str(v))


def _meta_value_key(v: Any, index: dict[Node, int]) -> Any:
    if isinstance(v, Node):
        return ("N", index.get(v))
    if isinstance(v, torch.Tensor):
        return _val_key(v)
    if isinstance(v, (list, tuple)):
        return tuple(_meta_value_key(x, index) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _meta_value_key(x, index)) for k, x in v.items()))
    return repr(v)


def structure(program: Any, values: bool = True) -> list[Any]:
    """A name-free description of a program: every node (op, target, arguments with
    nodes as positions, output metadata, non-volatile metadata), the signature and the
    constants (name, shape, dtype, a hash of the exact bytes; with ``values=False`` the
    tensor object's identity instead). Node names are left out: a retrace renames nodes
    from their ops, and the serializers do not read names."""
    gm = program.graph_module
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}

    def ref(a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: f"%{index[n]}")  # type: ignore[arg-type,return-value]

    rows: list[Any] = []
    for n in nodes:
        meta = tuple(sorted((k, _meta_value_key(v, index)) for k, v in n.meta.items()
                            if k not in VOLATILE_META))
        target = n.target if n.op in ("placeholder", "get_attr", "output") else str(n.target)
        # the output node's val only repeats its arguments' (a retrace adds it)
        val = None if n.op == "output" else _val_key(n.meta.get("val"))
        rows.append((n.op, target, repr(ref(n.args)), repr(ref(n.kwargs)), val, meta))
    sig = program.graph_signature
    rows.append(("inputs", [(str(s.kind), s.target, getattr(s, "persistent", None))
                            for s in sig.input_specs]))
    rows.append(("outputs", [(str(s.kind), s.target) for s in sig.output_specs]))
    for label, tensors in (("state_dict", program.state_dict), ("constants", program.constants)):
        for name in sorted(tensors):
            t = tensors[name]
            if isinstance(t, torch.Tensor):
                data = (hashlib.sha256(tensor_bytes(t.detach())).hexdigest() if values
                        else id(t))
                rows.append((label, name, _val_key(t), data))
            else:
                rows.append((label, name, type(t).__name__))
    return rows


def _check_unchanged(orig: Callable[..., Any], program: Any, pass_obj: Any,
                     kwargs: dict[str, Any]) -> None:
    twin = copy.deepcopy(program)
    twin_pass = copy.copy(pass_obj)
    if hasattr(twin_pass, "_exported_program"):
        twin_pass._exported_program = twin
    before = structure(program)
    after = structure(orig(twin, twin_pass, **kwargs))
    if before != after:
        diff = next((i, b, a) for i, (b, a) in enumerate(zip(before, after, strict=False))
                    if b != a) if len(before) == len(after) else ("length", len(before), len(after))
        raise GateViolation(
            f"{type(pass_obj).__name__} was skipped but changes the program: {diff}")


# ----------------------------------------------------------------------------- patches

_VULKAN_MODULE = "executorch.backends.vulkan.vulkan_preprocess"
_XNNPACK_MODULE = "executorch.backends.xnnpack._passes"


def _patch_for(module_name: str) -> Callable[[], list[tuple[Any, str, Any]]]:
    def patches() -> list[tuple[Any, str, Any]]:
        module = importlib.import_module(module_name)
        return [(module, "_transform", gated_transform(module._transform))]

    return patches


#: gating for ``XNNPACKPassManager.transform`` (module ``executorch.backends.xnnpack._passes``)
XNNPACK_PATCHES = PatchSet("fusionkit.integration.pass_gates (XNNPACK preprocess passes)",
                           _patch_for(_XNNPACK_MODULE))
#: gating for ``vulkan_preprocess.apply_passes``
VULKAN_PATCHES = PatchSet("fusionkit.integration.pass_gates (Vulkan preprocess passes)",
                          _patch_for(_VULKAN_MODULE))
