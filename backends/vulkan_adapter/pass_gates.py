"""When each pass of ExecuTorch 1.5.1's ``VulkanBackend.preprocess`` has nothing to do.

Why here: each trigger reads one Vulkan preprocess pass's own detection code (the module
named by the table key; site-packages is the ground truth), so it is knowledge of this
backend and of this ExecuTorch release. The mechanism that uses the table is
backend-neutral and lives in :mod:`fusionkit.integration.pass_gating`.

:data:`PATCHES` gates ``vulkan_preprocess.apply_passes``; the takeover's patch set
includes it, so only the partitions a fusionkit partitioner made are gated.
"""

from __future__ import annotations

from typing import Any

from fusionkit.integration.pass_gating import (
    GateTable,
    PassGate,
    present,
    transform_patches,
)

__all__ = ["PASS_GATES", "PATCHES"]


# ----------------------------------------------------------------------------- triggers
# Each reads the pass's own detection code; the docstring names what the pass rewrites.


def _asserts(ep: Any, p: Any) -> bool:
    """vulkan/_passes/remove_asserts.py: erases assert ops."""
    return present(ep, *p.assert_ops)


# ----------------------------------------------------------------------------- the table

#: ``module.QualName`` of a pass class of ``vulkan_preprocess.apply_passes`` -> its gate.
#: ``AddmmToLinearTransform``, ``FuseBatchNormPass``, ``InsertDtypePromotionPass``,
#: ``FuseClampPass``, ``RemoveRedundantOpsTransform``, ``FuseQuantizedOpsTransform``,
#: ``FoldQDQPass``, ``SqueezeUnsqueezeInputs``, ``FuseViewCopyTransform`` and
#: ``ViewCopyToSqueezeUnsqueezePass`` have none: fusionkit rules run in their place
#: (:mod:`.preprocess_rules`), and a rule whose ops are absent costs nothing
PASS_GATES: GateTable = {
    # fusionkit's rules run inside it (the takeover): no cheap trigger
    "executorch.backends.vulkan._passes.fuse_patterns.FusePatternsPass":
        PassGate(None, retraces=True),
    "executorch.exir.passes.spec_prop_pass.SpecPropPass": PassGate(None, retraces=True),
    "executorch.backends.vulkan._passes.remove_asserts.RemoveAssertsTransform":
        PassGate(_asserts, always_modified=True, dce=True),
}

#: gating for ``vulkan_preprocess.apply_passes``
PATCHES = transform_patches("fusionkit.backends.vulkan_adapter.pass_gates (Vulkan preprocess passes)",
                            "executorch.backends.vulkan.vulkan_preprocess", PASS_GATES)
