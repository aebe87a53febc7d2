"""Arm's ``FoldScalarMulIntoConvPass`` as rules of the conv-scale family.

``FoldScalarMulIntoConvPass`` (``executorch/backends/arm/_passes/
fold_scalar_mul_into_conv_pass.py``, ExecuTorch 1.5.1) folds ``conv(x, w, b) * s`` into
the convolution's weight and bias. Its scaled constants are named
``<weight>_folded_mul`` and ExecuTorch's ``create_constant_placeholder`` returns an
existing node of that name, so two convolutions sharing a weight, each with its own
scale, both get the first one's scaled weight; run on a graph module (the Arm quantizer's
``transform_for_annotation``, ``tfa_pass=True``) it writes the scaled weight into the
module's own parameter in place -- the user's ``nn.Module``, since an exported program's
``module()`` shares its tensors.

Here it is the family's rules (:mod:`fusionkit.passes.families.conv_scale`): every
operand checked before anything changes, each fold its own new constants (stock's names
and places, ``_1`` where the name is taken; the convolution edited in place, so the TOSA
flatbuffer is stock's byte for byte where stock is right), and only ever on the exported
program's constants.
"""

from __future__ import annotations

from fusionkit import Rule
from fusionkit.passes.families.conv_scale import rules

from ._common import register_rules  # (Arm's: its rules carry what the TOSA ops compute)

#: the stock Arm pass these rules take over
STOCK_PASS = "FoldScalarMulIntoConvPass"


@register_rules("arm", takes_over=STOCK_PASS)
def scalar_mul_conv_rules() -> list[Rule]:
    """conv * constant scale (a tensor broadcasting over channels, or a number), folded."""
    return rules("arm_")


__all__ = ["STOCK_PASS", "scalar_mul_conv_rules"]
