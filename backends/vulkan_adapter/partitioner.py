"""The adapter's VulkanPartitioner and the fusion passes it pairs with.

Use::

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes
    prog = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()])

Fusion happens in ``transform_passes()`` (fusionkit rules, every match decided
with its constraints, declined ones left alone). The partitioner is ExecuTorch's
own, with the same constructor, except that it first calls :func:`install` so
that the stock detectors fusionkit reimplements are out of the registry: they
neither mark nodes as "fusable" (skipping the partitioner's support checks) nor
rewrite anything inside ``VulkanBackend.preprocess``. The nodes of a declined
match therefore stay ordinary ops, partitioned on their own merits, and the
fused ``et_vk.rms_norm`` nodes are delegated through the op registry's checks.
"""

from __future__ import annotations

from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
    VulkanPartitioner as _StockVulkanPartitioner,
)
from executorch.exir.backend.partitioner import PartitionResult
from executorch.exir.pass_base import ExportedProgramPassBase
from fusionkit.passes.rms_norm import VULKAN_DTYPES, rms_norm_rule
from torch.export import ExportedProgram

from fusionkit.fusion_pass import FusionPass
from fusionkit.rule import Rule

from .install import install

__all__ = ["VulkanPartitioner", "fusion_rules", "transform_passes"]

PASS_NAME = "fusionkit_vulkan"


def fusion_rules() -> list[Rule]:
    """The fusionkit rules that replace the stock Vulkan patterns (fresh objects)."""
    return [rms_norm_rule(dtypes=VULKAN_DTYPES)]


def transform_passes() -> list[ExportedProgramPassBase]:
    """A fresh list of passes for ``to_edge_transform_and_lower(transform_passes=...)``."""
    return [FusionPass(fusion_rules(), name=PASS_NAME)]


class VulkanPartitioner(_StockVulkanPartitioner):
    """ExecuTorch's VulkanPartitioner (same arguments) with fusionkit's patterns installed."""

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        install()
        return super().partition(exported_program)
