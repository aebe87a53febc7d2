"""Vulkan adapter: fusionkit's fusions for ExecuTorch's Vulkan backend, drop-in.

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes, check
    prog = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()])
    assert check(prog) == []

* :func:`transform_passes` — fresh fusion passes (RMSNorm x constant weight into
  ``et_vk.rms_norm``; weights computed only from constants are folded);
* :class:`VulkanPartitioner` — ExecuTorch's partitioner (same arguments) that
  first calls :func:`install`, which takes the stock detectors fusionkit
  reimplements out of ExecuTorch's pattern registry (reversible with
  :func:`uninstall`; ``with install(): ...`` restores the previous state);
* :func:`check` — decodes every Vulkan delegate payload of a lowered program and
  lists what the runtime would abort on (:class:`Problem`).
"""

from .check import PREPACKED_ARGS, PrepackedArg, Problem, check
from .install import (
    NOT_TAKEN_OVER,
    TAKEN_OVER_PATTERNS,
    TESTED_EXECUTORCH_VERSIONS,
    Installation,
    UnsupportedExecuTorchError,
    install,
    is_installed,
    uninstall,
)
from .partitioner import (
    FusedOpNotDelegatedError,
    VulkanPartitioner,
    fusion_rules,
    transform_passes,
)
from .payload import PayloadError, VulkanPayload, decode_payload
from .simulator import simulate

__all__ = [
    "NOT_TAKEN_OVER",
    "PREPACKED_ARGS",
    "TAKEN_OVER_PATTERNS",
    "TESTED_EXECUTORCH_VERSIONS",
    "FusedOpNotDelegatedError",
    "Installation",
    "PayloadError",
    "PrepackedArg",
    "Problem",
    "UnsupportedExecuTorchError",
    "VulkanPartitioner",
    "VulkanPayload",
    "check",
    "decode_payload",
    "fusion_rules",
    "install",
    "is_installed",
    "simulate",
    "transform_passes",
    "uninstall",
]
