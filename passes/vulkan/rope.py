"""Port of ExecuTorch 1.5.1 ``patterns/rope.py`` (registry: ``export_llama_rope``).

The Llama ``apply_rotary_emb`` (interleaved real/imaginary halves), for q and
k at once, as it appears in an edge graph::

    xr, xi = squeeze(slice(view(x, [..., -1, 2]), -1, 0, 1)), ... (1, 2)
    out = view(cat([unsqueeze(xr*cos - xi*sin), unsqueeze(xr*sin + xi*cos)], -1))

-> ``et_vk.apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)`` (a tuple; two
``getitem`` nodes replace the two outputs). The stock pattern is a traced
graph matched by ``SubgraphMatcher(ignore_literals=True)``: any slice, any
view shape, any dims matched. This is a multi-output fusionkit pattern
(``outputs(q_chain, also("xk_out", k_chain, near="freqs_cos"))``).

Constraints stated: xq and xk rank 4 fp32 with the same head_dim (even), the
slices split the last dim into [0:1] and [1:2], the output shapes equal the
inputs' shapes, freqs_cos/freqs_sin of shape [seq_len, head_dim / 2] (what the
kernel indexes) and the same for both; every intermediate used only inside.
"""

from __future__ import annotations

from typing import Any

from torch.fx import Node

from fusionkit import CheckContext, Pattern, Rewriter, Rule, also, any_value, capture, op, outputs
from fusionkit.passes.registry import OperandHint, Pick, register_rules

from ._common import constraint, et_vk, is_last_dim, qk_rope_rule, shape

VIEW = "aten.view_copy.default"


def _half(x: Pattern, start: int, tag: str) -> Pattern:
    sl = op("aten.slice_copy.Tensor", x, any_value(f"{tag}_sdim"), start, start + 1)
    return op("aten.squeeze_copy.dims", sl, any_value(f"{tag}_qdim"))


def _rotary(x: str, p: str) -> Pattern:
    xv = op(VIEW, capture(x), any_value(f"{p}_pairs_shape"))
    xr, xi = _half(xv, 0, f"{p}r"), _half(xv, 1, f"{p}i")
    cos = op(VIEW, capture("freqs_cos"), any_value(f"{p}_cos_shape"))
    sin = op(VIEW, capture("freqs_sin"), any_value(f"{p}_sin_shape"))
    out_r = op("aten.sub.Tensor", op("aten.mul.Tensor", xr, cos), op("aten.mul.Tensor", xi, sin))
    out_i = op("aten.add.Tensor", op("aten.mul.Tensor", xr, sin), op("aten.mul.Tensor", xi, cos))
    cat = op("aten.cat.default",
             [op("aten.unsqueeze_copy.default", out_r, any_value(f"{p}u0")),
              op("aten.unsqueeze_copy.default", out_i, any_value(f"{p}u1"))],
             any_value(f"{p}cat_dim"))
    return op(VIEW, cat, any_value(f"{p}_out_shape"))


def _rope_geometry(ctx: CheckContext, xq: Node, xk: Node, freqs_cos: Node, freqs_sin: Node,
                   xq_out: Node, xk_out: Node,
                   qr_sdim: Any, qr_qdim: Any, qi_sdim: Any, qi_qdim: Any,
                   qu0: Any, qu1: Any, qcat_dim: Any,
                   kr_sdim: Any, kr_qdim: Any, ki_sdim: Any, ki_qdim: Any,
                   ku0: Any, ku1: Any, kcat_dim: Any) -> str | None:
    q, k = shape(xq), shape(xk)
    c, s = shape(freqs_cos), shape(freqs_sin)
    if q is None or k is None or q[-1] != k[-1] or q[-1] % 2:
        return f"xq {q} and xk {k} do not share an even head_dim"
    if shape(xq_out) != q or shape(xk_out) != k:
        return "the outputs do not have the inputs' shapes"
    if c != s or c is None or len(c) != 2 or c[0] != q[1] or c[1] != q[-1] // 2:
        return (f"freqs_cos {c} / freqs_sin {s} are not [seq_len, head_dim / 2] = "
                f"[{q[1]}, {q[-1] // 2}]")
    heads = {"q": ([qr_sdim, qr_qdim, qi_sdim, qi_qdim], [qu0, qu1, qcat_dim]),
             "k": ([kr_sdim, kr_qdim, ki_sdim, ki_qdim], [ku0, ku1, kcat_dim])}
    for p, (dims, joins) in heads.items():
        rank = 5  # the [..., head_dim / 2, 2] view
        flat = [d[0] if isinstance(d, (list, tuple)) and len(d) == 1 else d for d in dims]
        if not all(is_last_dim(d, rank) for d in flat):
            return f"the {p} halves are not slices of the last dim (dims {dims})"
        if not all(is_last_dim(d, rank) for d in joins):
            return f"the {p} halves are not re-interleaved along the last dim"
    return None


def _rope_build(rw: Rewriter, xq: Node, xk: Node, freqs_cos: Node, freqs_sin: Node
                ) -> tuple[Node, Node]:
    fused = rw.call(et_vk("apply_rotary_emb"), xq, xk, freqs_cos, freqs_sin)
    return rw.getitem(fused, 0), rw.getitem(fused, 1)


def rope_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: q and k of [batch, seq_len, heads, head_dim] (head_dim even),
    tables [seq_len, head_dim / 2], and the literals Llama's ``apply_rotary_emb`` writes:
    the [..., head_dim / 2, 2] view, halves sliced and squeezed on its last dim, the tables
    viewed [1, seq_len, 1, head_dim / 2], the halves re-joined on the last dim and viewed
    back."""
    batch, seq, half = pick((1, 2)), pick((1, 3)), pick((1, 2, 4))
    tables = OperandHint(shapes=((seq, half),))
    hints = {"freqs_cos": tables, "freqs_sin": tables}
    for p, x in (("q", "xq"), ("k", "xk")):
        heads = pick((1, 2))
        hints[x] = OperandHint(shapes=((batch, seq, heads, 2 * half),))
        hints[f"{p}_pairs_shape"] = OperandHint(values=([batch, seq, heads, half, 2],))
        hints[f"{p}_cos_shape"] = hints[f"{p}_sin_shape"] = OperandHint(values=([1, seq, 1, half],))
        hints[f"{p}_out_shape"] = OperandHint(values=([batch, seq, heads, 2 * half],))
        for part in ("r", "i"):
            hints[f"{p}{part}_sdim"] = OperandHint(values=(-1, 4))
            hints[f"{p}{part}_qdim"] = OperandHint(values=([-1], [4]))
        for join in ("u0", "u1", "cat_dim"):
            hints[f"{p}{join}"] = OperandHint(values=(-1, 4))
    return hints




@register_rules("vulkan_patterns", "vulkan", takes_over="export_llama_rope",
                roots=("aten.view_copy.default",))
def rope_rule(name: str = "export_llama_rope") -> Rule:
    pattern = outputs(_rotary("xq", "q").bind("xq_out"),
                      also("xk_out", _rotary("xk", "k"), near="freqs_cos"))

    geometry = constraint("rope_geometry", hints=rope_operands)(_rope_geometry)
    build = _rope_build

    return qk_rope_rule(name, pattern, geometry, build,
                     "Llama interleaved RoPE on q and k into et_vk.apply_rotary_emb")
