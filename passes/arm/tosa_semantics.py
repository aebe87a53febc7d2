"""What ``fusionkit.verify`` must know to run the TOSA dialect's ops: the context they run in
and what the ops with no eager kernel compute.

ExecuTorch 1.5.1's TOSA dialect ops (``exir_ops.backend.tosa.*``) check their operands
against the active TOSA specification, which only a ``TosaLoweringContext`` sets: the
verifier opens one (``TOSA-1.0+INT+FP``, so float and integer operands are both legal)
around a rule whose pattern has ``tosa.*`` ops. ``tosa.RESCALE`` has an eager kernel that
runs a one-op flatbuffer on the TOSA reference model; ``tosa.SLICE``, ``tosa.TABLE`` and
``tosa.CONST_SHAPE`` have only fake kernels, so their results are computed here from the
TOSA 1.0 specification (``tests/test_tosa_semantics.py`` runs each against the reference
model).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from fusionkit.passes.registry import (
    register_kernel_reference,
    register_metadata_semantics,
    register_op_context,
)

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


register_op_context("tosa", lowering_context)
register_metadata_semantics(SPECIAL_DTYPE_KEY, _shape_typed)
register_kernel_reference("tosa.SLICE.default", slice_reference)
register_kernel_reference("tosa.TABLE.default", table_reference)
register_kernel_reference("tosa.CONST_SHAPE.default", const_shape_reference)

__all__ = ["SPECIAL_DTYPE_KEY", "VERIFY_SPEC", "const_shape_reference", "lowering_context", "slice_reference",
           "table_reference"]
