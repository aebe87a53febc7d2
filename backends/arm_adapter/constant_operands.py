"""A partition condition: the operands Arm's TOSA lowering reads as constants are constants.

Arm's ``RewriteConvPass`` (``executorch/backends/arm/_passes/rewrite_conv_pass.py``) reads a
convolution's weight and bias (convolution, depthwise, transposed) with
``get_param_tensor``, which raises on anything that is not a parameter, buffer or lifted
constant (``get_param_tensor: unsupported param type, placeholder``); integer programs
reach it through the weight's and bias's dequantize, whose scale and zero point
``FoldAndAnnotateQParamsPass`` reads the same way. Arm's partitioner does not check this:
a convolution whose weight is a graph input (or computed in the graph) is delegated, and
the lowering crashes in ``preprocess``. :class:`ConstantOperands` is the condition the
adapter's partitioners add: such a convolution stays on the CPU, with the reason in the
partitioner's report (``WhyNoPartitionReporter``).

The other ``get_param_tensor`` readers need no condition: ``FoldAndAnnotateQParamsPass``
and ``FuseConstantOpsPass`` check that a node is a constant first,
``FuseEqualPlaceholdersPass`` reads constant placeholders only, and the DyT folds (which a
user inserts) are fusionkit rules whose constraints decline non-constant operands.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase

from fusionkit import ProgramInputs

__all__ = ["ConstantOperands", "non_constant_operand"]

_CONVOLUTION = "aten.convolution.default"
#: (what a dequantize's scale and zero point are read for by Arm's qparams fold)
_DEQUANTIZE = ("quantized_decomposed.dequantize_per_tensor.default",
               "quantized_decomposed.dequantize_per_channel.default",
               "quantized_decomposed.dequantize_per_tensor.tensor")


def _name(target: Any) -> str:
    from fusionkit import op_key

    return op_key(target) or str(target)


def _why_not_constant(inputs: ProgramInputs, node: Node, label: str) -> str | None:
    """None when ``node`` is a constant (through a dequantize of constants); else why not."""
    if node.op == "call_function" and _name(node.target) in _DEQUANTIZE:
        for i, arg in enumerate(node.args[:3]):
            if isinstance(arg, Node):
                part = label if i == 0 else f"{label}'s quantization {('scale', 'zero point')[i - 1]}"
                why = _why_not_constant(inputs, arg, part)
                if why is not None:
                    return why
        return None
    if node.op == "placeholder" and inputs.constant(node) is not None:
        return None
    if node.op == "get_attr":
        return None
    return f"{label} `{node.name}` is {inputs.describe(node)}, not a constant"


def non_constant_operand(inputs: ProgramInputs, node: Node) -> str | None:
    """Why ``node`` cannot be lowered by Arm's TOSA passes (None: it can, as far as the
    constant operands go)."""
    if node.op != "call_function" or _name(node.target) != _CONVOLUTION:
        return None
    for i, label in ((1, "weight"), (2, "bias")):
        arg = node.args[i] if len(node.args) > i else None
        if isinstance(arg, Node):
            why = _why_not_constant(inputs, arg, label)
            if why is not None:
                return (f"{why}: Arm's RewriteConvPass reads a convolution's {label} as a "
                        "constant (get_param_tensor)")
    return None


class ConstantOperands(OperatorSupportBase):  # type: ignore[misc]
    """Rejects a node whose operands Arm's lowering reads as constants and are not."""

    def __init__(self, exported_program: torch.export.ExportedProgram, reporter: Any) -> None:
        self.inputs = ProgramInputs(exported_program)
        self.reporter = reporter

    def is_node_supported(self, submodules: Any, node: Node) -> bool:
        why = non_constant_operand(self.inputs, node)
        if why is None:
            return True
        self.reporter.report_reject(node, why)
        return False
