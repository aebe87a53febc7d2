"""A 1-D convolution -> unsqueeze, 2-D convolution, squeeze (XNNPACK convolves in 2-D only).

Takes over ``Conv1dUnsqueezePass`` (``_passes/conv1d_unsqueeze_pass.py``, ExecuTorch
1.5.1). ``convolution(x[N,C,L], w[O,C/g,K], ...)`` becomes
``squeeze(convolution(unsqueeze(x, -1), w[O,C/g,K,1], ..., stride + [1],
padding + [0], dilation + [1], output_padding + [0]), -1)``; in a quantized graph
(the input dequantized, every user a quantize) the unsqueezed input and the 2-D
result are re-quantized with the same parameters (implicit Q/DQ pairs), as the stock
pass does, and a weight behind a per-channel dequantize is unsqueezed under it.

Constraints: the weight (under its dequantize, if any) is a rank-3 constant; stride,
padding, dilation and output padding are 1-element lists (a 1-D convolution as
``torch.export`` writes it). What the stock pass forgets: it overwrote the weight's
state-dict entry in place with the 4-D tensor, so a weight shared with another node
(another convolution, or any reader) changed under it; the rule adds the 4-D weight
as a new constant and leaves the original alone. It raised ``AssertionError`` on a
non-constant weight; the rule declines it (with the reason).
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from fusionkit import CheckContext, MatchResult, PythonReplacement, Rewriter, Rule, capture, op
from fusionkit.passes.registry import OperandHint, register_rules

from ._common import (
    CONV,
    DQ_PER_TENSOR,
    Q_PER_TENSOR,
    constraint,
    is_dequantize,
    keep_provenance,
    rank_of,
)

UNSQUEEZE = "aten.unsqueeze_copy.default"
SQUEEZE = "aten.squeeze_copy.dim"
_GEOMETRY = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _is_quant(n: Any) -> bool:
    from executorch.backends.xnnpack.utils.quant_utils import is_quant

    return isinstance(n, Node) and is_quant(n)


def _weight_constant(w: Any) -> Any:
    """The weight the stock pass unsqueezes: under a dequantize of a constant, that constant."""
    if is_dequantize(w) and not _is_quant(w.args[0]):
        return w.args[0]
    return w


def _is_1d_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 1 and all(
        isinstance(i, int) and not isinstance(i, bool) for i in v)


def _conv1d(ctx: CheckContext, conv: Node, w: Any, stride: Any, padding: Any, dilation: Any,
            output_padding: Any) -> str | MatchResult | None:
    kernel = _weight_constant(w)
    # the weight's faults are blamed on the constant itself (under a dequantize: its input)
    at = kernel if isinstance(kernel, Node) else "w"
    if rank_of(kernel) != 3:
        return ctx.fail(f"the weight has rank {rank_of(kernel)}, not 3: not a 1-D convolution",
                        at=at)
    if not isinstance(kernel, Node) or ctx.inputs.constant(kernel) is None:
        name = getattr(kernel, "name", kernel)
        return ctx.fail(f"the weight `{name}` is not a constant: XNNPACK convolves with static "
                        "weights", at=at)
    geometry = {"stride": stride, "padding": padding, "dilation": dilation,
                "output_padding": output_padding}
    for name, v in geometry.items():
        if not _is_1d_list(v):
            # a literal argument of the convolution: blamed on it
            return ctx.fail(f"{name} {v!r} is not a 1-element list of ints", at=conv)
    return None


def _qdq(rw: Rewriter, x: Node, params: tuple[Any, ...], like: Node | None) -> Node:
    """An implicit quantize/dequantize pair after ``x`` (``insert_q_dq_pair`` of the stock
    pass, which gives both the metadata of the node they follow: ``like``, or none)."""
    from executorch.backends.xnnpack.utils.quant_utils import tag_as_implicit_q_dq

    q = rw.call(Q_PER_TENSOR, x, *params)
    dq = rw.call(DQ_PER_TENSOR, q, *params)
    for n in (q, dq):
        if like is not None:
            keep_provenance(n, like)
        else:
            n.meta.pop("debug_handle", None)
        tag_as_implicit_q_dq(n)
    return dq


def _conv2d(rw: Rewriter, conv: Node, x: Node, w: Node, b: Any, stride: Any, padding: Any,
            dilation: Any, transposed: Any, output_padding: Any, groups: Any) -> Node:
    kernel = _weight_constant(w)
    w4 = rw.constant(f"{kernel.name}_fk_conv1d_as_2d",
                     rw.tensor(kernel).contiguous().unsqueeze(-1))
    if w is not kernel:  # the per-channel dequantize, now of the 4-D weight
        w4 = rw.call(w.target, w4, *w.args[1:], **w.kwargs)
        # with its metadata: the partitioner tagged it implicit (folded into the conv)
        keep_provenance(w4, w)
    # the unsqueeze and squeeze the stock pass creates carry no debug handle; the
    # convolution keeps all its metadata (the stock pass rewrites it in place)
    ux = rw.call(UNSQUEEZE, x, -1)
    ux.meta.pop("debug_handle", None)
    if is_dequantize(x):
        ux = _qdq(rw, ux, tuple(x.args[1:]), None)
    conv2 = rw.call(CONV, ux, w4, b, [*stride, 1], [*padding, 0], [*dilation, 1], transposed,
                    [*output_padding, 0], groups)
    keep_provenance(conv2, conv)  # with the activation a fused relu left in its metadata
    users = list(conv.users)
    out = conv2
    if users and all(_is_quant(u) for u in users):
        out = _qdq(rw, conv2, tuple(users[0].args[1:]), conv)
    squeezed = rw.call(SQUEEZE, out, -1)
    squeezed.meta.pop("debug_handle", None)
    return squeezed


@register_rules("xnnpack", takes_over="Conv1dUnsqueezePass")
def conv1d_unsqueeze_rule() -> Rule:
    pattern = op(CONV, capture("x"), capture("w"), capture("b"),
                 *(capture(n) for n in _GEOMETRY)).bind("conv")
    return Rule(
        name="xnnpack_conv1d_as_conv2d",
        pattern=pattern,
        constraints=[constraint("conv1d_with_constant_weight", hints={"w": OperandHint(constant=True)})(_conv1d)],
        replacement=PythonReplacement(_conv2d),
        description="1-D convolution as unsqueeze, 2-D convolution, squeeze",
    )
