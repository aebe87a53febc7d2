"""Port of ExecuTorch 1.5.1 ``patterns/rope_hf.py`` (registry: ``hf_rope``).

The HuggingFace ``rotate_half`` RoPE on q and k at once, full or partial
rotary dim, as it appears in an edge graph::

    cos, sin = unsqueeze(freqs_cos, 1), unsqueeze(freqs_sin, 1)
    rot = alias(x)                     # full: rotary_dim == head_dim
        | slice(x, -1, 0, rotary_dim)  # partial
    rh = cat([neg(slice(rot, -1, half, end)), slice(rot, -1, 0, half)], -1)
    out = cat([rot * cos + rh * sin (, slice(x, -1, rotary_dim, end))], -1)

-> ``et_vk.apply_rotary_emb_hf(xq, xk, freqs_cos, freqs_sin, start_pos)`` (a
tuple; two ``getitem`` nodes replace the two outputs). When the freqs are a
``slice_copy`` of a table, the table and the slice start are passed instead
(as the stock replacement does), so the kernel indexes the table at
``start_pos``.

Constraints stated (the stock detector is a ``SubgraphMatcher`` with
``ignore_literals=True``: any slice bounds, any dims): xq and xk rank 4 fp32
with the same batch, seq_len and head_dim; every slice/cat on the last dim and
the freqs unsqueezed at dim 1; the halves split the rotary dim exactly
(``half * 2 == rotary_dim``), the pass-through part starts at ``rotary_dim``
and runs to the end; freqs_cos/freqs_sin fp32 of the same shape
``[seq_len, rotary_dim]``; a sliced table is sliced on dim 0, step 1, with the
same start for cos and sin and ``seq_len`` rows (what the kernel reads).

Found on the real runtime (not in the stock detector): its shader reads only the first
half of cos/sin, for both halves, so the tables must provably have two equal halves
(transformers' ``cat((freqs, freqs), -1)``, or constants that compare equal:
:mod:`.rope_tables`); graph-input tables are declined.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    MatchResult,
    Pattern,
    Rewriter,
    Rule,
    also,
    any_value,
    capture,
    op,
    op_key,
    outputs,
)
from fusionkit.passes.registry import OperandHint, Pick, register_rules

from ._common import ABSENT, constraint, et_vk, is_last_dim, qk_rope_rule, shape
from .rope_tables import not_duplicated

SLICE = "aten.slice_copy.Tensor"


def _rotary(x: str, p: str) -> Pattern:
    cos = op("aten.unsqueeze_copy.default", capture("freqs_cos"), any_value("cos_udim"))
    sin = op("aten.unsqueeze_copy.default", capture("freqs_sin"), any_value("sin_udim"))
    full = op("aten.alias_copy.default", capture(x))
    part = op(SLICE, capture(x), any_value(f"{p}_rot_dim"), 0, any_value(f"{p}_rd"))
    rot_full, rot_part = full.bind(f"{p}_rot"), part.bind(f"{p}_rot")

    def body(rot: Pattern) -> Pattern:
        x1 = op(SLICE, rot, any_value(f"{p}_x1_dim"), 0, any_value(f"{p}_half"))
        x2 = op(SLICE, rot, any_value(f"{p}_x2_dim"), any_value(f"{p}_half"),
                any_value(f"{p}_x2_end"))
        rh = op("aten.cat.default", [op("aten.neg.default", x2), x1], any_value(f"{p}_rh_dim"))
        return op("aten.add.Tensor", op("aten.mul.Tensor", rot, cos),
                  op("aten.mul.Tensor", rh, sin))

    passthrough = op(SLICE, capture(x), any_value(f"{p}_pass_dim"), any_value(f"{p}_rd"),
                     any_value(f"{p}_pass_end"))
    return (op("aten.cat.default", [body(rot_full)], any_value(f"{p}_cat_dim"))
            | op("aten.cat.default", [body(rot_part), passthrough], any_value(f"{p}_cat_dim")))


def _freqs_source(n: Any) -> tuple[Any, Any, Node | None]:
    """(table, start, slice node) for a ``slice_copy`` of a table, else (n, 0, None)."""
    if isinstance(n, Node) and n.op == "call_function" and op_key(n.target) == SLICE:
        return n.args[0], (n.args[2] if len(n.args) > 2 else None), n
    return n, 0, None


def _hf_rope_geometry(ctx: CheckContext, xq: Node, xk: Node, xq_out: Node, xk_out: Node,
                      freqs_cos: Node, freqs_sin: Node, cos_udim: Any, sin_udim: Any,
                      q_x1_dim: Any, q_x2_dim: Any, q_rh_dim: Any, q_cat_dim: Any,
                      q_half: Any, q_x2_end: Any,
                      k_x1_dim: Any, k_x2_dim: Any, k_rh_dim: Any, k_cat_dim: Any,
                      k_half: Any, k_x2_end: Any,
                      # bound by the partial-rotation alternative only
                      q_rot_dim: Any = None, q_pass_dim: Any = None, q_rd: Any = ABSENT,
                      q_pass_end: Any = ABSENT,
                      k_rot_dim: Any = None, k_pass_dim: Any = None, k_rd: Any = ABSENT,
                      k_pass_end: Any = ABSENT) -> str | None:
    q, k = shape(xq), shape(xk)
    if q is None or k is None or q[:2] != k[:2] or q[-1] != k[-1]:
        return f"xq {q} and xk {k} do not share batch, seq_len and head_dim"
    if shape(xq_out) != q or shape(xk_out) != k:
        return "the outputs do not have the inputs' shapes"
    c, s = shape(freqs_cos), shape(freqs_sin)
    if c is None or c != s or len(c) != 2 or c[0] != q[1]:
        return f"freqs_cos {c} / freqs_sin {s} are not both [seq_len={q[1]}, rotary_dim]"
    rd = c[1]
    if not isinstance(rd, int) or rd % 2 or rd > q[-1] or rd <= 0:
        return f"rotary_dim {rd} is not an even size <= head_dim {q[-1]}"
    if cos_udim != 1 or sin_udim != 1:
        return "the freqs are not unsqueezed at dim 1 (broadcast over heads)"
    heads = {
        "q": ([q_rot_dim, q_x1_dim, q_x2_dim, q_rh_dim, q_pass_dim, q_cat_dim], q_half,
              q_x2_end, q_rd, q_pass_end),
        "k": ([k_rot_dim, k_x1_dim, k_x2_dim, k_rh_dim, k_pass_dim, k_cat_dim], k_half,
              k_x2_end, k_rd, k_pass_end),
    }
    for p, (dims, half, x2_end, p_rd, pass_end) in heads.items():
        if not all(is_last_dim(d, 4) for d in dims if d is not None):
            return f"the {p} slices/cats are not all on the last dim (dims {dims})"
        if half * 2 != rd or x2_end < rd:
            return f"rotate_half of {p} splits at {half}, not at rotary_dim / 2 = {rd // 2}"
        if p_rd is not ABSENT:  # partial rotation
            if p_rd != rd or pass_end < q[-1]:
                return (f"the {p} rotated part [0:{p_rd}] and pass-through "
                        f"part do not split head_dim at rotary_dim {rd}")
            if rd >= q[-1]:
                return f"partial rotation of {p} with rotary_dim {rd} == head_dim"
        elif rd != q[-1]:
            return f"{p} is rotated whole, but rotary_dim {rd} != head_dim {q[-1]}"
    (_, cstart, cs), (_, sstart, ss) = _freqs_source(freqs_cos), _freqs_source(freqs_sin)
    if (cs is None) != (ss is None):
        return "only one of freqs_cos/freqs_sin is a slice of a table"
    if cs is not None and ss is not None:
        for sl in (cs, ss):
            step = sl.args[4] if len(sl.args) > 4 else 1
            if len(sl.args) < 3 or sl.args[1] != 0 or step != 1:
                return f"`{sl.name}` is not a step-1 slice of the table's rows (dim 0)"
        if cstart is not sstart and cstart != sstart:
            return f"freqs_cos starts at {cstart}, freqs_sin at {sstart}"
        for t in (cs.args[0], ss.args[0]):
            tv = t.meta.get("val") if isinstance(t, Node) else None
            if not isinstance(tv, torch.Tensor) or tv.dim() != 2 or tv.shape[1] != rd:
                return f"the freqs table `{getattr(t, 'name', t)}` is not [max_seq_len, {rd}]"
    return None


def _hf_rope_tables(ctx: CheckContext, freqs_cos: Node, freqs_sin: Node) -> MatchResult | None:
    """The runtime's apply_rotary_emb_hf reads only the first half of each table (for both
    halves): fuse only tables whose halves are provably equal (:mod:`.rope_tables`)."""
    for label, n in (("freqs_cos", freqs_cos), ("freqs_sin", freqs_sin)):
        why = not_duplicated(ctx, n)
        if why is not None:
            return ctx.fail(f"{label} `{n.name}` is not provably two equal halves ({why}): "
                            "the runtime's apply_rotary_emb_hf reads only the first half of "
                            "the table", at=n)
    return None


def _hf_rope_build(rw: Rewriter, xq: Node, xk: Node, freqs_cos: Node, freqs_sin: Node
                   ) -> tuple[Node, Node]:
    cos, start, _ = _freqs_source(freqs_cos)
    sin, _, _ = _freqs_source(freqs_sin)
    fused = rw.call(et_vk("apply_rotary_emb_hf"), xq, xk, cos, sin, start)
    return rw.getitem(fused, 0), rw.getitem(fused, 1)


@register_rules("vulkan_patterns", "vulkan", takes_over="hf_rope", roots=("aten.cat.default",))
def hf_rope_rule(name: str = "hf_rope") -> Rule:
    pattern = outputs(_rotary("xq", "q").bind("xq_out"),
                      also("xk_out", _rotary("xk", "k"), near="freqs_cos"))

    geometry = constraint("hf_rope_geometry", hints=hf_rope_operands)(_hf_rope_geometry)
    tables = constraint("hf_rope_tables_duplicated")(_hf_rope_tables)
    build = _hf_rope_build

    return qk_rope_rule(name, pattern, geometry, build,
                        "HuggingFace rotate_half RoPE on q and k into et_vk.apply_rotary_emb_hf",
                        extra=(tables,))


#: how an exported ``x[..., n:]`` ends its slice
_TO_THE_END = 9223372036854775807


def _duplicated_table(rows: int, half: int) -> Any:
    """A cos/sin table as transformers builds it: ``cat([f, f], -1)`` of a [rows, half] input."""

    def make_it(make: Any) -> Any:
        f = make.input("half", (rows, half), torch.float32)
        return make.call("aten.cat.default", [f, f], -1)

    return make_it


def hf_rope_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: q and k of [batch, seq_len, heads, head_dim] rotated over
    rotary_dim (all of head_dim, or its first part with the rest passed through), tables
    [seq_len, rotary_dim] of two equal halves, and the slice/cat literals rotate_half
    writes (the last dim; the split at rotary_dim / 2; ends at the size or past it)."""
    batch, seq, head_dim = pick((1, 2)), pick((1, 3)), pick((4, 8))
    rotary = pick((head_dim, head_dim // 2))
    hints = {"xq": OperandHint(shapes=((batch, seq, pick((1, 2)), head_dim),)),
             "xk": OperandHint(shapes=((batch, seq, pick((1, 2)), head_dim),)),
             "freqs_cos": OperandHint(producer=_duplicated_table(seq, rotary // 2)),
             "freqs_sin": OperandHint(producer=_duplicated_table(seq, rotary // 2)),
             "cos_udim": OperandHint(values=(1,)), "sin_udim": OperandHint(values=(1,))}
    for p in ("q", "k"):
        for dim in ("rot_dim", "x1_dim", "x2_dim", "rh_dim", "pass_dim", "cat_dim"):
            hints[f"{p}_{dim}"] = OperandHint(values=(-1, 3))
        hints[f"{p}_half"] = OperandHint(values=(rotary // 2,))
        hints[f"{p}_x2_end"] = OperandHint(values=(rotary, _TO_THE_END))
        hints[f"{p}_rd"] = OperandHint(values=(rotary,))
        hints[f"{p}_pass_end"] = OperandHint(values=(head_dim, _TO_THE_END))
    return hints



__all__ = ["hf_rope_rule"]
