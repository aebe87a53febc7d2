"""What the Arm rules share: the op names of ExecuTorch 1.5.1's TOSA pipeline and the
metadata its passes read (``input_qparams`` / ``output_qparams``, set by
``FoldAndAnnotateQParamsPass``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch.fx import Node

from fusionkit.passes import registry
from fusionkit.passes._constraint import constraint as constraint  # (shared)
from fusionkit.passes._provenance import keep_provenance as keep_provenance  # (shared)
from fusionkit.targets import register_op_library

# the TOSA dialect's ops (tosa.RESCALE, tosa.SLICE, ...) register when it is imported
register_op_library("tosa", "executorch.backends.arm.tosa.dialect")

# what fusionkit.verify needs to run them (their context, the ops with only fake kernels)
from . import tosa_semantics as tosa_semantics  # noqa: E402

F = TypeVar("F", bound=Callable[..., Any])


def register_rules(*sets: str, **options: Any) -> Callable[[F], F]:
    """:func:`fusionkit.passes.registry.register_rules` for an Arm rule factory: its rules carry
    what the TOSA dialect's ops compute (:data:`tosa_semantics.SEMANTICS`)."""
    return registry.register_rules(*sets, semantics=tosa_semantics.SEMANTICS, **options)

CONV = "aten.convolution.default"
LINEAR = "aten.linear.default"
RELU = "aten.relu.default"
HARDTANH = "aten.hardtanh.default"
CLAMP = "aten.clamp.default"
Q_PER_TENSOR = "quantized_decomposed.quantize_per_tensor.default"
RESCALE = "tosa.RESCALE.default"
SLICE = "tosa.SLICE.default"
CONST_SHAPE = "tosa.CONST_SHAPE.default"
CONCAT_SHAPE = "tosa.CONCAT_SHAPE.default"

#: the node metadata Arm's q/dq folding writes and its later passes read
QPARAM_KEYS = ("input_qparams", "output_qparams")


def keep_node_meta(new: Node, old: Node) -> None:
    """``new`` takes every piece of ``old``'s metadata but its own value: a stock pass that
    edits ``old`` in place leaves it all there (qparams, debug handle, stack trace)."""
    keep_provenance(new, old)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
