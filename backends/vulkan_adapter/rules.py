"""The Vulkan adapter's rule set and the transform passes built from it.

:func:`fusion_rules` is the set of fusionkit rules that replace ExecuTorch's
stock Vulkan patterns (the rule-set registry, :mod:`fusionkit.passes.registry`,
lists it as ``"vulkan"``); :func:`transform_passes` is what a user hands to
``to_edge_transform_and_lower``. Rules in :data:`PREPROCESS_ONLY_RULES` run only
inside ``VulkanBackend.preprocess`` (through the takeover in :mod:`.install`).
"""

from __future__ import annotations

from executorch.exir.pass_base import ExportedProgramPassBase

from fusionkit import FusionPass, Rule
from fusionkit.passes.registry import rule_set

__all__ = ["PASS_NAME", "PREPROCESS_ONLY_RULES", "fusion_rules", "transform_passes"]

PASS_NAME = "fusionkit_vulkan"


def fusion_rules() -> list[Rule]:
    """The fusionkit rules that replace the stock Vulkan patterns (fresh objects).

    One or more rules per entry of :data:`~.install.TAKEN_OVER_PATTERNS`.
    """
    return rule_set("vulkan")

#: rules applied only inside ``VulkanBackend.preprocess`` (the FusePatternsPass stand-in),
#: not in :func:`transform_passes`: ExecuTorch 1.5.1's op registry declares every input of
#: ``et_vk.linear_dq8ca_q4gsw`` floating point, so the partitioner rejects the fused node
#: (its int8 input zero point); the unfused ops are each delegated and fused in preprocess,
#: as the stock pattern does
#: ``et_vk.select_as_symint`` likewise: the partitioner does not delegate it on its own (a
#: fused node left on the CPU has no kernel), so it is fused only where the stock pattern
#: fused it, inside preprocess, when its select/item nodes were delegated
PREPROCESS_ONLY_RULES: frozenset[str] = frozenset(
    {"quantized_linear_dq8ca_q4gsw", "select_as_symint"})


def transform_passes() -> list[ExportedProgramPassBase]:
    """A fresh list of passes for ``to_edge_transform_and_lower(transform_passes=...)``."""
    rules = [r for r in fusion_rules() if r.name not in PREPROCESS_ONLY_RULES]
    return [FusionPass(rules, name=PASS_NAME)]
