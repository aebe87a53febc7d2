"""What ``fusionkit.verify`` must know to run the TOSA dialect's ops: the context they run in
and what the ops with no eager kernel compute.

ExecuTorch 1.5.1's TOSA dialect ops (``exir_ops.backend.tosa.*``) check their operands
against the active TOSA specification, which only a ``TosaLoweringContext`` sets: the
verifier opens one (``TOSA-1.0+INT+FP``, so float and integer operands are both legal)
around a rule whose pattern has ``tosa.*`` ops. ``tosa.SLICE``, ``tosa.TABLE`` and
``tosa.CONST_SHAPE`` have only fake kernels; ``tosa.RESCALE``'s eager kernel serializes a
one-op flatbuffer for the TOSA reference model on every call (slow, and the reference
model aborts with a backtrace on a float operand the fake kernel lets through). Their
results are computed here from the TOSA 1.0 specification, and
``tests/test_tosa_semantics.py`` runs each against the reference model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from fusionkit.passes.registry import OpSemantics

#: the TOSA specification the verifier runs the dialect's ops under
VERIFY_SPEC = "TOSA-1.0+INT+FP"


def lowering_context() -> AbstractContextManager[Any]:
    """The ``TosaLoweringContext`` the dialect's fake and eager kernels read their spec from."""
    from executorch.backends.arm.tosa.specification import TosaLoweringContext, TosaSpecification

    return TosaLoweringContext(TosaSpecification.create_from_string(VERIFY_SPEC))  # type: ignore[no-any-return]


def slice_reference(x: torch.Tensor, start: Sequence[int], size: Sequence[int]) -> torch.Tensor:
    """TOSA SLICE: ``output[i] = input[start + i]`` for ``0 <= i < size`` on every dim."""
    window = tuple(slice(int(s), int(s) + int(z)) for s, z in zip(start, size, strict=True))
    return x[window].clone()


def multiplier_and_shift(scale: float) -> tuple[int, int]:
    """A scale as TOSA's 32-bit ``multiplier * 2**-shift`` (``frexp``'s mantissa over 31
    bits, ``2 <= shift <= 62``; a scale too small for that shift loses multiplier bits)."""
    mantissa, exponent = math.frexp(scale)
    multiplier = round(mantissa * (1 << 31))
    if multiplier == 1 << 31:
        multiplier, exponent = multiplier // 2, exponent + 1
    shift = 31 - exponent
    if shift > 62:
        multiplier >>= min(31, shift - 62)
        shift = 62
    if multiplier < 0 or not 2 <= shift <= 62:
        raise ValueError(f"scale {scale} has no 32-bit multiplier and shift in [2, 62]")
    return multiplier, shift


_BITS = {torch.int8: 8, torch.int16: 16, torch.int32: 32}


def rescale_reference(x: torch.Tensor, dtype: torch.dtype, scale: Sequence[float], in_zp: int,
                      out_zp: int, *, input_unsigned: bool = False,
                      output_unsigned: bool = False) -> torch.Tensor:
    """TOSA RESCALE as ExecuTorch serializes it (32-bit multipliers, SINGLE_ROUND; one scale
    per tensor, or one per channel of the last dim): ``(value - in_zp) * multiplier``
    rounded half up by ``>> shift`` (``apply_scale_32``), plus ``out_zp``, clamped to the
    output type; ``input_unsigned`` / ``output_unsigned`` read / write the 8/16-bit values
    as unsigned."""
    if x.dtype not in _BITS or dtype not in _BITS:
        raise ValueError(f"RESCALE of {x.dtype} to {dtype}: TOSA rescales int8/int16/int32")
    bits_in, bits_out = _BITS[x.dtype], _BITS[dtype]
    value = x.to(torch.int64)
    if input_unsigned:
        value = value % (1 << bits_in)
    value = value - int(in_zp)
    pairs = [multiplier_and_shift(float(s)) for s in scale]
    multiplier = torch.tensor([m for m, _ in pairs], dtype=torch.int64)
    shift = torch.tensor([sh for _, sh in pairs], dtype=torch.int64)
    bound = torch.ones_like(shift) << (shift - 1)
    if bool(((value < -bound) | (value >= bound)).any()):
        raise ValueError("RESCALE: a value beyond the shift's range (apply_scale_32 REQUIRE)")
    result = (value * multiplier + bound) >> shift
    if bool(((result < -(1 << 31)) | (result >= 1 << 31)).any()):
        raise ValueError("RESCALE: a scaled value beyond int32 (apply_scale_32 REQUIRE)")
    result = result + int(out_zp)
    if output_unsigned:
        result = result.clamp(0, (1 << bits_out) - 1)
        result = torch.where(result >= 1 << (bits_out - 1), result - (1 << bits_out), result)
    else:
        result = result.clamp(-(1 << (bits_out - 1)), (1 << (bits_out - 1)) - 1)
    return result.to(dtype)


def table_reference(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """TOSA TABLE for int8: ``output = table[input + 128]`` (a 256-entry int8 table)."""
    if x.dtype != torch.int8 or table.dtype != torch.int8 or tuple(table.shape) != (256,):
        raise ValueError(f"TABLE of {x.dtype} through a {table.dtype}{tuple(table.shape)} table: "
                         "only the int8 256-entry form is stated here")
    return table[x.to(torch.int64) + 128]


def const_shape_reference(shape: Sequence[int]) -> list[int]:
    """TOSA CONST_SHAPE: the shape value itself."""
    return [int(d) for d in shape]


#: ``TosaSpecialDtype.meta_key()`` (``executorch.backends.arm.tosa.mapping``), spelt out so
#: importing the rules does not import the TOSA mapping
SPECIAL_DTYPE_KEY = "tosa_special_dtype"


def _shape_typed(recorded: Any, out: Any) -> Any:
    """``tosa_special_dtype``: the serialized type of a value (SHAPE for a CONST_SHAPE's
    list); it does not change the value."""
    return out


#: what every Arm rule carries (``passes/arm/_common.register_rules``): the context the TOSA
#: ops run in, what their metadata means, what the ops with no eager kernel compute
SEMANTICS = OpSemantics(
    kernel_references={"tosa.RESCALE.default": rescale_reference, "tosa.SLICE.default": slice_reference,
                       "tosa.TABLE.default": table_reference,
                       "tosa.CONST_SHAPE.default": const_shape_reference},
    metadata={SPECIAL_DTYPE_KEY: _shape_typed},
    op_contexts={"tosa": lowering_context})

__all__ = ["SPECIAL_DTYPE_KEY", "VERIFY_SPEC", "const_shape_reference", "lowering_context",
           "multiplier_and_shift", "rescale_reference", "slice_reference", "table_reference"]
