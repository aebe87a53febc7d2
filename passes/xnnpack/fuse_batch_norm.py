"""Convolution or linear -> inference batch norm, folded into the weight and bias (XNNPACK).

Takes over ``FuseBatchNormPass`` (``_passes/fuse_batch_norm.py``, ExecuTorch 1.5.1), which
XNNPACK's preprocess runs as Vulkan's does: the same stock class, so the same rules, those
of the conv + batch norm family (:mod:`fusionkit.passes.families.conv_batch_norm`: every
folded operand a constant, training-mode batch norm declined, each fold its own new
constants so two convolutions sharing a weight keep their own) with Vulkan's needs.
XNNPACK's payload carries each node's debug handle: the folded op keeps the conv /
linear's metadata (the stock pass rewrites it in place), as every backend's fold does.
"""

from __future__ import annotations

import dataclasses

from fusionkit import Rule
from fusionkit.passes.families.conv_batch_norm import rules
from fusionkit.passes.registry import register_rules
from fusionkit.passes.vulkan.batch_norm import STOCK_PASS, VULKAN


@register_rules("xnnpack", takes_over=STOCK_PASS)
def fuse_batch_norm_rules() -> list[Rule]:
    """conv -> batch norm and linear -> batch norm (Vulkan's needs, ``xnnpack_`` names)."""
    return rules(dataclasses.replace(VULKAN, prefix="xnnpack_"))
