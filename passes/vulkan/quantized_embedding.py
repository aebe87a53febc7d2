"""Ports of ExecuTorch 1.5.1 ``patterns/quantized_embedding.py``.

Two registry entries, two rules, one fused op ``et_vk.embedding_q4gsw(weight,
scales, group_size, indices, is_linear_weight=True)`` whose weight is 4-bit
packed in the *linear* nibble order (so a tied LM-head weight shares bytes):

* ``torchao_quantized_embedding``: ``embedding(torchao.dequantize_affine(w,
  [1, G], scales, zp, int8, -8, 7), indices)``; the int8 weight is packed.
* ``quantized_embedding``: ``quantized_decomposed.embedding_4bit(w, scales, zp,
  -8, 7, indices)``; the already packed uint8 weight is repacked.

Constraints stated: weight and scales are prepackable constants (the stock
detector only traced ``args[0]`` chains to *a* placeholder, user inputs
included); zero points None, literal 0 or an all-zero constant (the stock
torchao replacement asserted this mid-rewrite); quant range exactly [-8, 7];
int8 weight values really inside [-8, 7] (the stock packer asserted
mid-rewrite); per-row groups ``block_size == [1, G]`` tiling the row, G a multiple
of 4 (the shader reads 4 values per scale lookup); embed_dim a
multiple of 32 (the shader's load granularity); scales of shape [vocab,
embed_dim / G]; float32 output (the op's reference computes in float32).
Instead of overwriting the shared weight in the state dict (the stock pass
guards that with ``register_param_mutation``), the packed weight is a new
constant named after its source, so two lookups of one table share it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    DtypeIn,
    MatchResult,
    PrepackableConstant,
    PythonReplacement,
    Rank,
    Rewriter,
    Rule,
    capture,
    lit,
    one_of,
    op,
    per_row_block,
)
from fusionkit.passes.registry import OperandHint, Pick, register_rules

from ._common import constraint, et_vk, in_int_range, shape, zero_points_are_zero

EMBED_DIM_MULTIPLE = 32


def import_quant_ops() -> None:
    import torchao.quantization.quant_primitives  # noqa: F401  (torchao.dequantize_affine)
    from executorch.exir.passes import _quant_patterns_and_replacements  # noqa: F401


def pack_linear_q4(unpacked: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] -> uint8 pairs, linear convention (low nibble = even)."""
    from executorch.backends.vulkan.patterns.weight_packing_utils import (
        pack_4bit_weight_tensor,
    )

    return pack_4bit_weight_tensor(unpacked)


def _geometry(ctx: CheckContext, weight: Node, scales: Node, embed_dim: int, group: int
              ) -> str | MatchResult | None:
    if group <= 0 or embed_dim % group:
        return f"group size {group} does not tile embed_dim {embed_dim}"
    if group % 4:
        return (f"group size {group} is not a multiple of 4: the embedding_q4gsw shader gives "
                "4 consecutive values the scale of the first")
    if embed_dim % EMBED_DIM_MULTIPLE:
        return (f"embed_dim {embed_dim} is not a multiple of {EMBED_DIM_MULTIPLE} "
                "(the embedding_q4gsw shader's load granularity)")
    w, s = shape(weight), shape(scales)
    if s is None or w is None or s != (w[0], embed_dim // group):
        return ctx.fail(f"scales of shape {s} are not [vocab, embed_dim / group] = "
                        f"[{w and w[0]}, {embed_dim // group}]", at=scales)
    return None


def _torchao_embedding_zp(ctx: CheckContext, zero_point: Any) -> str | None:
    return zero_points_are_zero(ctx, zero_point)


def _torchao_embedding_int4(ctx: CheckContext, weight: Node) -> str | None:
    return in_int_range(ctx, weight, -8, 7, "weight")


def _torchao_embedding_geometry(ctx: CheckContext, weight: Node, scales: Node,
                                block_size: Any) -> str | MatchResult | None:
    w = shape(weight)
    return _geometry(ctx, weight, scales, int(w[1]) if w else 0, int(block_size[1]))


def _torchao_embedding_build(rw: Rewriter, weight: Node, scales: Node, block_size: Any,
                             indices: Node) -> Node:
    packed = rw.constant(f"{weight.name}_fk_q4_linear", pack_linear_q4(rw.tensor(weight)))
    return rw.call(et_vk("embedding_q4gsw"), packed, scales, int(block_size[1]), indices, True)


@register_rules("vulkan_patterns", "vulkan", takes_over="torchao_quantized_embedding",
                roots=("aten.embedding.default",))
def torchao_quantized_embedding_rule(name: str = "torchao_quantized_embedding") -> Rule:
    import_quant_ops()
    block = per_row_block("block_size")
    dq = op("torchao.dequantize_affine.default", capture("weight"), block, capture("scales"),
            capture("zero_point"), lit(torch.int8), -8, 7)
    root = op("aten.embedding.default", dq, capture("indices"))

    zp = constraint("zero_point_is_zero", hints={"zero_point": OperandHint(constant=True, fill="zeros")})(_torchao_embedding_zp)
    int4 = constraint("int4_values")(_torchao_embedding_int4)
    geometry = constraint("embedding_geometry", hints=embedding_operands)(_torchao_embedding_geometry)
    build = _torchao_embedding_build

    return Rule(
        name=name,
        pattern=root,
        constraints=[
            PrepackableConstant("weight", role="embedding_q4gsw prepacks the 4-bit weight"),
            PrepackableConstant("scales", role="embedding_q4gsw prepacks the scales"),
            DtypeIn("weight", frozenset({torch.int8})), Rank("weight", frozenset({2})),
            zp, geometry, int4,
        ],
        replacement=PythonReplacement(build),
        description="torchao 4-bit weight-only embedding into et_vk.embedding_q4gsw",
    )


def _embedding_4bit_zp(ctx: CheckContext, zero_point: Any) -> str | None:
    return zero_points_are_zero(ctx, zero_point)


def _embedding_4bit_geometry(ctx: CheckContext, weight: Node, scales: Node
                             ) -> str | MatchResult | None:
    w, s = shape(weight), shape(scales)
    if w is None or s is None:
        return "weight or scales has no shape"
    groups = s[1] if len(s) == 2 else 1
    embed_dim = int(w[1]) * 2  # packed: two values per byte
    return _geometry(ctx, weight, scales, embed_dim, embed_dim // groups if groups else 0)


def _embedding_4bit_build(rw: Rewriter, weight: Node, scales: Node, indices: Node) -> Node:
    w = weight
    packed = rw.tensor(w)
    vocab = packed.shape[0]
    high = (packed >> 4).to(torch.int8) - 8
    low = (packed & 0xF).to(torch.int8) - 8
    unpacked = torch.stack([high, low], dim=-1).reshape(vocab, -1)
    new = rw.constant(f"{w.name}_fk_q4_linear_from_e4", pack_linear_q4(unpacked))
    s = constant_tensor_shape(scales)
    embed_dim = packed.shape[1] * 2
    group = embed_dim // (s[1] if len(s) == 2 else 1)
    return rw.call(et_vk("embedding_q4gsw"), new, scales, group, indices, True)


@register_rules("vulkan_patterns", "vulkan", takes_over="quantized_embedding",
                roots=("quantized_decomposed.embedding_4bit.dtype",))
def quantized_embedding_rule(name: str = "quantized_embedding") -> Rule:
    import_quant_ops()
    root = op("quantized_decomposed.embedding_4bit.dtype", capture("weight"), capture("scales"),
              capture("zero_point"), -8, 7, capture("indices"),
              dtype=one_of([None, torch.float32]))

    zp = constraint("zero_point_is_zero", hints={"zero_point": OperandHint(constant=True, fill="zeros")})(_embedding_4bit_zp)
    geometry = constraint("embedding_4bit_geometry", hints=embedding_4bit_operands)(_embedding_4bit_geometry)
    build = _embedding_4bit_build

    return Rule(
        name=name,
        pattern=root,
        constraints=[
            PrepackableConstant("weight", role="embedding_q4gsw prepacks the 4-bit weight"),
            PrepackableConstant("scales", role="embedding_q4gsw prepacks the scales"),
            DtypeIn("weight", frozenset({torch.uint8})), Rank("weight", frozenset({2})),
            Rank("scales", frozenset({2})), zp, geometry,
        ],
        replacement=PythonReplacement(build),
        description="quantized_decomposed.embedding_4bit into et_vk.embedding_q4gsw",
    )


def _indices(pick: Pick, vocab: int) -> OperandHint:
    """Token ids below ``vocab``: a user input of rank 1 or 2."""
    return OperandHint(constant=False, dtype=torch.int64, int_range=(0, vocab - 1),
                       shapes=(pick(((2,), (1,), (2, 3))),))


def embedding_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: a torchao 4-bit table the geometry check accepts, drawn as
    the kernel tiles it (a group size G, a multiple of 4; embed_dim a multiple of 32 that G
    tiles; scales [vocab, embed_dim / G]) with its 4-bit values and token ids."""
    vocab, embed_dim, group = pick((1, 3)), pick((32, 64)), pick((4, 8, 32))
    groups = (vocab, embed_dim // group)
    return {"weight": OperandHint(shapes=((vocab, embed_dim),), int_range=(-8, 7)),
            "scales": OperandHint(shapes=(groups,), fill="positive", dtype=torch.float32),
            "zero_point": OperandHint(shapes=(groups,), dtype=torch.int8),
            "block_size": OperandHint(values=([1, group],)),
            "indices": _indices(pick, vocab)}


def embedding_4bit_operands(pick: Pick) -> dict[str, OperandHint]:
    """As :func:`embedding_operands` for ``embedding_4bit``: the table packed two values a
    byte ([vocab, embed_dim / 2] uint8), scales [vocab, groups]."""
    vocab, embed_dim, group = pick((1, 3)), pick((32, 64)), pick((4, 8, 32))
    groups = (vocab, embed_dim // group)
    return {"weight": OperandHint(shapes=((vocab, embed_dim // 2),), dtype=torch.uint8,
                                  int_range=(0, 255)),
            "scales": OperandHint(shapes=(groups,), fill="positive", dtype=torch.float32),
            "zero_point": OperandHint(shapes=(groups,), dtype=torch.float32),
            "indices": _indices(pick, vocab)}




def constant_tensor_shape(node: Node) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


__all__ = ["quantized_embedding_rule", "torchao_quantized_embedding_rule"]
