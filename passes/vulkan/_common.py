"""Building blocks shared by the ported Vulkan patterns: quantize/dequantize chains.

ExecuTorch 1.5.1's detectors recognise Q/DQ nodes by name
(``utils.is_quant_node``/``is_dequant_node``) and pass their scale and zero
point straight into the fused ``et_vk.q8ta_*`` op, whose schema wants a
``float`` scale and an ``int`` zero point. Here a Q/DQ chain is a pattern, so
what the fused op needs is stated: the per-tensor ``.default`` overloads
(literal scale and zero point; the ``.tensor`` overloads hold tensors the
kernel cannot take), int8 with the full [-128, 127] range the kernels assume.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    Custom,
    DtypeIn,
    MatchResult,
    Pattern,
    PythonReplacement,
    Rank,
    Rule,
    integer,
    op,
    positive,
)
from fusionkit.passes._constraint import constraint as constraint  # (shared)
from fusionkit.passes.rms_norm import VULKAN_DTYPES

#: the float dtypes of ExecuTorch 1.5.1's Vulkan kernels (``utils.FP_T``)
FP_T: frozenset[torch.dtype] = VULKAN_DTYPES

Q_PER_TENSOR = "quantized_decomposed.quantize_per_tensor.default"
DQ_PER_TENSOR = "quantized_decomposed.dequantize_per_tensor.default"
DQ_PER_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
#: ops that only copy a value (the pixel-shuffle detector walks through them)
CLONES: tuple[str, ...] = ("aten.clone.default", "dim_order_ops._clone_dim_order.default")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_last_dim(v: Any, rank: int) -> bool:
    """``v`` is an int naming the last of ``rank`` dims (``-1`` or ``rank - 1``)."""
    return _is_int(v) and v % rank == rank - 1


def int8_dq(x: Pattern | Any, prefix: str) -> Pattern:
    """``dequantize_per_tensor(x, scale, zp, -128, 127, int8)`` binding ``{prefix}_scale/_zp``.

    The q8ta schemas take a ``float`` scale and an ``int`` zero point: literals only.
    """
    return op(DQ_PER_TENSOR, x, positive(f"{prefix}_scale"), integer(f"{prefix}_zp"),
              -128, 127, torch.int8)


def int8_q(x: Pattern | Any, prefix: str) -> Pattern:
    """``quantize_per_tensor(x, scale, zp, -128, 127, int8)`` binding ``{prefix}_scale/_zp``."""
    return op(Q_PER_TENSOR, x, positive(f"{prefix}_scale"), integer(f"{prefix}_zp"),
              -128, 127, torch.int8)


class _Absent:
    """The default of a capture parameter that must tell "not bound" from a bound ``None``."""

    def __repr__(self) -> str:
        return "ABSENT"


#: ``def check(ctx, x, rd=ABSENT)``: ``rd is ABSENT`` when the match did not bind ``rd``
ABSENT: Any = _Absent()


def constant_tensor(ctx: CheckContext, v: Any) -> torch.Tensor | None:
    """The real tensor of a constant placeholder (a capture parameter's value), else None."""
    if not isinstance(v, Node):
        return None
    ref = ctx.inputs.constant(v)
    return None if ref is None else ref.tensor


def optional_constant(ctx: CheckContext, v: Any, label: str, role: str) -> MatchResult | None:
    """None when ``v`` (a capture parameter's value, ``label`` in messages) is absent (None) or
    a constant tensor; else why not, blamed on ``v`` itself (a literal, which has no node of its
    own: on the root).

    ``role`` says why it must be a constant (what the fused op does with it).
    """
    if v is None or constant_tensor(ctx, v) is not None:
        return None
    if isinstance(v, Node):
        return ctx.fail(f"{label} `{v.name}` is {ctx.inputs.describe(v)}, not a constant: {role}",
                        at=v)
    return ctx.fail(f"{label} is the literal {v!r}, not a constant tensor: {role}", at=ctx.root)


def shape(v: Any) -> tuple[Any, ...] | None:
    """The shape of a captured node's example value, else None."""
    t = v.meta.get("val") if isinstance(v, Node) else v
    return tuple(t.shape) if isinstance(t, torch.Tensor) else None


def et_vk(name: str) -> str:
    """Qualified name of an ``et_vk`` custom op (registers the library on first use)."""
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401

    return f"et_vk.{name}.default"


def zero_points_are_zero(ctx: CheckContext, v: Any) -> str | None:
    """None when the zero point (a capture parameter's value) is None, a literal 0 (or list of
    0s), or an all-zero constant."""
    if v is None:
        return None
    if isinstance(v, Node):
        t = constant_tensor(ctx, v)
        if t is None:
            return f"zero point `{v.name}` is not a constant, so it cannot be shown to be 0"
        if bool((t == 0).all()):
            return None
        return f"zero point `{v.name}` is not all zeros (the kernel assumes symmetric quantization)"
    values = v if isinstance(v, (list, tuple)) else [v]
    if all(x == 0 for x in values):
        return None
    return f"zero point {v!r} is not 0 (the kernel assumes symmetric quantization)"


def in_int_range(ctx: CheckContext, v: Any, lo: int, hi: int, label: str | None = None
                 ) -> str | None:
    """None when ``v`` (a capture parameter's value, ``label`` in messages) is an int8/uint8
    constant with every value in [lo, hi]."""
    label = label or "the tensor"
    t = constant_tensor(ctx, v)
    if t is None:
        return f"`{label}` is not a constant tensor"
    if t.dtype not in (torch.int8, torch.uint8):
        return f"`{label}` has dtype {t.dtype}, not int8"
    if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
        return f"`{label}` holds values in [{int(t.min())}, {int(t.max())}], outside [{lo}, {hi}]"
    return None


ROPE_READS = ("xq", "xk", "freqs_cos", "freqs_sin")


def qk_rope_rule(name: str, pattern: Pattern, geometry: Custom,
                 build: Callable[..., Any], description: str,
                 extra: Sequence[Custom] = ()) -> Rule:
    """A RoPE fusion over q and k: fp32 rank-4 operands plus the rule's own geometry check
    (and ``extra`` checks after it)."""
    return Rule(
        name=name,
        pattern=pattern,
        constraints=[Rank("xq", frozenset({4})), Rank("xk", frozenset({4})),
                     *(DtypeIn(n, frozenset({torch.float32})) for n in ROPE_READS), geometry,
                     *extra],
        replacement=PythonReplacement(build),
        description=description,
    )
