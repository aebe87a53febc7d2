"""Arm's ``FuseBatchNorm2dPass`` as rules of the conv + batch norm family.

``FuseBatchNorm2dPass`` (``executorch/backends/arm/_passes/fuse_batch_norm2d_pass.py``,
ExecuTorch 1.5.1) folds every inference batch norm into the convolution before it, and
where there is none (or the convolution has other users) inserts a 1x1 depthwise
convolution of ones to fold it into: TOSA has no batch norm. It never checks that what it
folds is a constant: a batch-norm weight or bias that is a graph input or computed in the
graph is read through ``get_param`` (None: "no weight", a wrong result) or kills the
lowering when the pass deletes it as a placeholder; a convolution bias that is a graph
input likewise; and its folded constants are named after the source weight, so two
convolutions sharing one weight both get the first one's folded weight.

Here it is the family's rules (:mod:`fusionkit.passes.families.conv_batch_norm`) with
Arm's needs: convolutions of rank-3 and rank-4 inputs, no linear (Arm's pass folds into
convolutions only), the batch norm's weight and bias optional (``affine=False``), float32
and float16 folded (the stock pass skips bfloat16, whose folded weight loses accuracy;
the dtypes and shapes of every folded operand checked), and the standalone batch norm as
a 1x1 depthwise convolution. The folded constants have the names stock gives them, at
the places stock puts them (the TOSA flatbuffer is stock's, byte for byte, where stock is
right), but each is new: where stock's name is taken (a second convolution sharing the
weight) it gets ``_1``. A declined batch norm stays as it is and
``DecomposeBatchNormNoStatsPass``, next in Arm's pipeline, computes it elementwise from
whatever its operands are -- right, if slower.
"""

from __future__ import annotations

import torch

from fusionkit import Rule
from fusionkit.passes.families.conv_batch_norm import Needs, rules

from ._common import register_rules  # (Arm's: its rules carry what the TOSA ops compute)

#: the stock Arm pass these rules take over
STOCK_PASS = "FuseBatchNorm2dPass"

#: what Arm's replacement needs of the family
ARM = Needs(prefix="arm_", linear=False, optional_affine=True,
            dtypes=frozenset({torch.float32, torch.float16}), standalone=True)


@register_rules("arm", takes_over=STOCK_PASS)
def batch_norm_rules() -> list[Rule]:
    """conv -> batch norm folded into the conv; any other inference batch norm of rank 3
    or 4 as a 1x1 depthwise convolution."""
    return rules(ARM)


__all__ = ["ARM", "STOCK_PASS", "batch_norm_rules"]
