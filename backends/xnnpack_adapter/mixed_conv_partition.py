"""A float convolution XNNPACK would have to create with a quantized tensor stays on the CPU.

XNNPACK's partitioner takes a convolution whose weight is a float constant as an FP32 node
(``ConvolutionConfig``, ExecuTorch 1.5.1) without looking at what it reads or writes
besides: in a program quantized with XNNPACK's quantizer such a convolution can end up
next to quantized tensors, and three things in ``XnnpackBackend.preprocess`` then give it
one, a mixed convolution XNNPACK cannot create:

- **A 1-D convolution's input and output re-quantized.** XNNPACK convolves in 2-D only:
  ``Conv1dUnsqueezePass`` (and fusionkit's rule in its place, ``xnnpack_conv1d_as_conv2d``,
  which does the same) makes each convolution with a rank-3 weight an unsqueeze, a 2-D
  convolution and a squeeze, and gives the unsqueezed input an implicit quantize /
  dequantize pair when the convolution's input is a dequantize, and the convolution's
  output one when every user of it is a quantize -- never looking at the weight. A float
  1-D convolution with a dequantized input reads int8 with a float weight: ``Weight and
  Input should both be quantized`` at lowering (``QuantParams.from_bias``, when there is a
  bias; a batch norm fused into it makes one), or ``XNNCompiler: Failed to create squeeze
  node`` at load. One whose output only quantizes read writes int8 from float:
  ``Failed to create (depthwise) convolution node ... xnn_status_invalid_parameter`` at load.
- **A batch norm of a rank-3 tensor** is such a float 1-D convolution too: XNNPACK fuses it
  into the float convolution before it or decomposes it into a 1x1 depthwise one
  (``FuseBatchNormPass`` / ``DecomposeBatchNorm``, before the 1-D pass), whose users are the
  batch norm's. When only quantizes read its output, the same load failure. (A quantized
  convolution whose output feeds the batch norm instead of a quantize is not delegated, so
  the batch norm reads a float tensor; a batch norm *of a dequantized tensor* is
  :mod:`.batch_norm_partition`'s.)
- **A bias shared with a quantized convolution or linear.** XNNPACK's serializer defines a
  value once (``NodeVisitor.define_tensor`` returns when the node already has an id); the
  quantized op's bias is int32 (scale input x weight), the float convolution's float, and
  the one serialized second gets the other's tensor: ``Failed to create convolution node
  ... xnn_status_invalid_parameter`` at load.

Where they come from (the generated conv + batch-norm zoo, ``tests/conv_batch_norm_zoo.py``,
quantized with XNNPACK's quantizer, PTQ and QAT alike, stock's partitioner and fusionkit's
alike): two convolutions sharing one weight -- XNNPACK's quantizer quantizes the weight for
the first one only, the second reads the float parameter and a dequantized input
(``shared-conv1d``: the lowering error); a weight computed in the graph whose convolution
is quantized but feeds a batch norm the quantize step does not fold (``conv_weight_computed-
conv1d``: the batch norm's load failure); two convolutions sharing a weight and a bias with
no batch norm between (the shared bias, conv2d too).

What: ``ConvolutionConfig.check_constraints`` and ``BatchNormConfig.check_constraints``
refuse such a node, with the reason in the partitioner's log (``why``); it runs on the CPU
with the portable kernel, the quantize / dequantize around it as the program says. A
quantized convolution (its weight a dequantize) and a float one with none of these
neighbours are left as they are. A neighbour counts only when the partitioner at work takes
it (its own config accepts it; ``XnnpackPartitioner.generate_partitions`` makes the
partitioner known to the checks): an FP32-only partitioner takes no quantize / dequantize,
and in ``per_op_mode`` no neighbour shares the delegate, so nothing is refused there. Part
of the adapter's patch set (the adapter's partitioner installs it while it partitions;
``install()`` process-wide).
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch
from torch.fx import Node

from fusionkit.integration.hooks import PatchSet

__all__ = ["PATCHES", "mixed_conv_reason"]

_GEMM = "executorch.backends.xnnpack.partition.config.gemm_configs"
_NODES = "executorch.backends.xnnpack.partition.config.node_configs"
_PARTITIONER = "executorch.backends.xnnpack.partition.xnnpack_partitioner"
_QUANT_UTILS = "executorch.backends.xnnpack.utils.quant_utils"

CONV = "aten.convolution.default"
#: the ops whose bias XNNPACK quantizes to int32 when their weight is a dequantize
GEMMS = (CONV, "aten.linear.default")
BATCH_NORMS = ("aten._native_batch_norm_legit_no_training.default",
               "aten.native_batch_norm.default")
#: ``FuseActivationPass.FUSEABLE_ACTIVATIONS``: fused into the convolution before the
#: 1-D convolution pass runs, so the convolution's users become the activation's
FUSED_ACTIVATIONS = ("aten.relu.default", "aten.hardtanh.default")

#: the XNNPACK partitioner generating partitions (its configs say which neighbours it takes)
_partitioner: ContextVar[Any] = ContextVar("fusionkit_xnnpack_partitioner", default=None)

#: whether a node goes into the same delegate as the node being checked
Delegated = Callable[[Node], bool]


def _name(n: Any) -> str:
    target = getattr(n, "target", None)
    return str(getattr(target, "__name__", target))


def _calls(n: Any, names: tuple[str, ...]) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and _name(n) in names


def _rank(n: Any) -> int | None:
    val = n.meta.get("val") if isinstance(n, Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


def _is_quant(n: Any) -> bool:
    return isinstance(n, Node) and bool(importlib.import_module(_QUANT_UTILS).is_quant(n))


def _is_dequant(n: Any) -> bool:
    return isinstance(n, Node) and bool(importlib.import_module(_QUANT_UTILS).is_dequant(n))


def _always(_: Node) -> bool:
    return True


def _delegated_by(ep: Any) -> Delegated:
    """Whether the partitioner now generating partitions takes a neighbour: its own config
    accepts it (connected nodes it takes are merged into one delegate). In ``per_op_mode``
    no neighbour shares the node's delegate. Outside a partitioner (or without one known):
    every neighbour is assumed taken."""
    partitioner = _partitioner.get()
    if partitioner is None or ep is None:
        return _always
    if getattr(partitioner, "per_op_mode", False):
        return lambda n: False
    configs = getattr(partitioner, "target_partitioner_configs", {})
    from executorch.exir.backend.canonical_partitioners.config_partitioner import (
        format_target_name,
    )

    def delegated(n: Node) -> bool:
        if n.op != "call_function":
            return False
        config = configs.get(format_target_name(_name(n)))
        return config is not None and bool(config.check_constraints(n, ep))

    return delegated


def _readers(node: Node, delegated: Delegated) -> list[Node] | None:
    """The users of ``node``'s value in its delegate once XNNPACK fused a relu / hardtanh into
    it (that activation its only user, delegated with it, as ``FuseActivationPass``
    requires); None when one is outside the delegate (the delegate's output reads it)."""
    users = list(node.users)
    if len(users) == 1 and _calls(users[0], FUSED_ACTIVATIONS) and delegated(users[0]):
        users = list(users[0].users)
    return users if users and all(delegated(u) for u in users) else None


def _quantized_output(node: Node, delegated: Delegated) -> list[Node]:
    """The quantizes that read ``node``'s output when they are all its readers, all in its
    delegate; else []."""
    readers = _readers(node, delegated)
    return readers if readers and all(_is_quant(u) for u in readers) else []


def _batch_norm_output(bn: Node) -> Node | None:
    """The batch norm's ``getitem(., 0)`` when it is its only reader (else XNNPACK's
    partitioner does not take it)."""
    users = list(bn.users)
    if (len(users) == 1 and users[0].op == "call_function" and users[0].target is operator.getitem
            and users[0].args[1] == 0):
        return users[0]
    return None


def _bias_of_a_quantized_gemm(conv: Node, delegated: Delegated) -> str | None:
    """Why float convolution ``conv`` cannot share its bias: a quantized convolution or
    linear in its delegate reads the same constant as its bias, and XNNPACK's serializer
    defines a value once (``define_tensor`` returns when the node has an id), so the one
    serialized second gets the first one's tensor -- the int32 bias quantized for the
    quantized op, or the float one."""
    bias = conv.args[2] if len(conv.args) > 2 else None
    if not isinstance(bias, Node):
        return None
    for other in bias.users:
        if (other is not conv and _calls(other, GEMMS) and len(other.args) > 2
                and other.args[2] is bias and _is_dequant(other.args[1]) and delegated(other)):
            return (f"convolution `{conv.name}` has a float weight and shares its bias "
                    f"`{bias.name}` with quantized `{other.name}`: XNNPACK serializes the bias "
                    "once, quantized to int32 for the quantized op or float for this one, and "
                    "the other convolution cannot be created with it (kept on the CPU by "
                    "fusionkit)")
    return None


def mixed_conv_reason(node: Node, ep: Any = None) -> str | None:
    """Why ``node`` (a convolution or batch norm XNNPACK's partitioner would take) becomes a
    float convolution XNNPACK has to create with a quantized tensor; None when it does not.

    While an XNNPACK partitioner generates partitions (``ep`` given), a neighbour counts
    when that partitioner takes it; otherwise every neighbour is assumed delegated."""
    delegated = _delegated_by(ep)
    if _calls(node, (CONV,)):
        weight = node.args[1] if len(node.args) > 1 else None
        if not isinstance(weight, Node) or _is_dequant(weight):
            return None  # a quantized convolution
        shared = _bias_of_a_quantized_gemm(node, delegated)
        if shared is not None:
            return shared
        if _rank(weight) != 3:
            return None  # a 2-D convolution: XNNPACK's 1-D convolution pass leaves it
        x = node.args[0]
        if isinstance(x, Node) and _is_dequant(x) and delegated(x):
            return (f"1-D convolution `{node.name}` has a float weight `{weight.name}` "
                    f"and a dequantized input `{x.name}`: XNNPACK's 1-D convolution pass "
                    "re-quantizes the input and the convolution would read int8 with a float "
                    "weight (kept on the CPU by fusionkit)")
        qs = _quantized_output(node, delegated)
        if qs:
            return (f"1-D convolution `{node.name}` has a float weight `{weight.name}` "
                    f"and its output is read only by quantizes ({', '.join(q.name for q in qs)}): "
                    "XNNPACK's 1-D convolution pass quantizes the output and the float "
                    "convolution would write int8 (kept on the CPU by fusionkit)")
        return None
    if _calls(node, BATCH_NORMS):
        if _rank(node.args[0]) != 3:
            return None
        out = _batch_norm_output(node)
        qs = _quantized_output(out, delegated) if out is not None else []
        if qs:
            return (f"batch norm `{node.name}` of a rank-3 tensor has its output read only by "
                    f"quantizes ({', '.join(q.name for q in qs)}): XNNPACK computes it as a "
                    "float 1-D convolution (fused into the convolution before it, or a 1x1 "
                    "depthwise one), whose output its 1-D convolution pass quantizes: a float "
                    "convolution writing int8 (kept on the CPU by fusionkit)")
    return None


def _checked(module: str, cls_name: str) -> Any:
    def check_constraints(self: Any, node: Any, ep: Any) -> bool:
        mod = importlib.import_module(module)
        original = PATCHES.original(getattr(mod, cls_name), "check_constraints")
        if not original(self, node, ep):
            return False
        reason = mixed_conv_reason(node, ep) if isinstance(node, Node) else None
        if reason is not None:
            mod.why(node, reason)
            return False
        return True

    check_constraints.__qualname__ = f"{cls_name}.check_constraints"
    return check_constraints


def _generate_partitions(self: Any, ep: Any) -> Any:
    """``XnnpackPartitioner.generate_partitions`` with the partitioner known to the checks."""
    cls = importlib.import_module(_PARTITIONER).XnnpackPartitioner
    token = _partitioner.set(self)
    try:
        return PATCHES.original(cls, "generate_partitions")(self, ep)
    finally:
        _partitioner.reset(token)


def _patches() -> list[tuple[Any, str, Any]]:
    gemm, nodes = importlib.import_module(_GEMM), importlib.import_module(_NODES)
    partitioner = importlib.import_module(_PARTITIONER).XnnpackPartitioner
    return [(gemm.ConvolutionConfig, "check_constraints",
             _checked(_GEMM, "ConvolutionConfig")),
            (nodes.BatchNormConfig, "check_constraints", _checked(_NODES, "BatchNormConfig")),
            (partitioner, "generate_partitions", _generate_partitions)]


#: ``ConvolutionConfig`` / ``BatchNormConfig.check_constraints`` refuse a float convolution
#: XNNPACK would have to create with a quantized tensor (``XnnpackPartitioner.
#: generate_partitions`` tells them which neighbours the partitioner takes); part of the
#: adapter's patch set
PATCHES = PatchSet(f"fusionkit.backends.xnnpack_adapter.mixed_conv_partition ({_GEMM}."
                   f"ConvolutionConfig, {_NODES}.BatchNormConfig .check_constraints, "
                   f"{_PARTITIONER}.XnnpackPartitioner.generate_partitions)", _patches)
