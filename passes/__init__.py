"""Ready-made fusion rules and YAML specs (installed as ``fusionkit.passes``).

* :mod:`fusionkit.passes.rms_norm` — RMSNorm x constant weight into ``et_vk.rms_norm``
  (also written as the spec ``specs/rms_norm.yaml``);
* :mod:`fusionkit.passes.vulkan` — ports of ExecuTorch's Vulkan pattern registry;
* :mod:`fusionkit.passes.registry` — where every rule set is discoverable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusionkit.rule import Rule

__all__ = ["builtin_rules"]


def builtin_rules() -> list[Rule]:
    """Fresh objects of every rule fusionkit ships (what the benchmarks call the full set)."""
    from fusionkit.passes.registry import rule_set

    return rule_set("builtin")
