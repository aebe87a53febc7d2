"""Fold an inference batch norm into the convolution or linear before it (Vulkan).

Replaces ``FuseBatchNormPass`` (``executorch/backends/xnnpack/_passes/fuse_batch_norm.py``,
which ``VulkanBackend.preprocess`` of ExecuTorch 1.5.1 runs) with the rules of the
conv + batch norm family (:mod:`fusionkit.passes.families.conv_batch_norm`: the pattern,
what is checked and what the stock pass forgot are stated there). What Vulkan's
replacement needs: convolutions of rank-3 or rank-4 inputs and linears; the batch norm's
weight and bias present (constants); the folded constants placed where the source weight
was (graph and signature), as the stock pass places them, since the Vulkan serializer
numbers values in placeholder order: the payload stays byte-identical. (The source
constants stay in the program, unused, as the stock pass leaves them: the adapter's
``RulePass`` keeps dead constants for this pass.)

The stock pass ends with an ExportPass retrace (which fails on a partition without
fake-tensor inputs: mixed fake modes); the rules rewrite in place, with exact metadata,
so that failure is no longer in this step (the later retracing passes still have it; the
adapter's constant folding before partitioning is what avoids it).
"""

from __future__ import annotations

from fusionkit import Rule
from fusionkit.passes.families.conv_batch_norm import FOLD_ROLE, Needs, rules
from fusionkit.passes.registry import register_rules

#: stock pass -> the rules replacing it (``takes_over`` of the factory below)
STOCK_PASS = "FuseBatchNormPass"

#: what the Vulkan (and XNNPACK) replacement needs of the family
VULKAN = Needs()


@register_rules("vulkan_preprocess", takes_over=STOCK_PASS)
def batch_norm_rules() -> list[Rule]:
    """conv -> batch norm and linear -> batch norm, folded into the conv / linear."""
    return rules(VULKAN)


__all__ = ["FOLD_ROLE", "STOCK_PASS", "VULKAN", "batch_norm_rules"]
