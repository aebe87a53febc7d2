"""Ready-made fusion rules and YAML specs (installed as ``fusionkit.passes``).

* :mod:`fusionkit.passes.rms_norm` — RMSNorm x constant weight into ``et_vk.rms_norm``
  (also written as the spec ``specs/rms_norm.yaml``);
* :mod:`fusionkit.passes.vulkan` — ports of ExecuTorch's Vulkan patterns and preprocess passes;
* :mod:`fusionkit.passes.xnnpack` — rules replacing XNNPACK's preprocess rewrites;
* :mod:`fusionkit.passes.registry` — where every rule set is discoverable.

One way to get a rule set: ``rule_set(name)`` (names: ``rule_set_names()``; ``"builtin"`` is
every rule fusionkit ships). Each call returns fresh rule objects.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from fusionkit.passes.registry import rule_set, rule_set_names

if TYPE_CHECKING:
    from fusionkit.rule import Rule

__all__ = ["builtin_rules", "rule_set", "rule_set_names"]


def builtin_rules() -> list[Rule]:
    """Deprecated: ``rule_set("builtin")``."""
    warnings.warn('fusionkit.passes.builtin_rules() is deprecated: use rule_set("builtin")',
                  DeprecationWarning, stacklevel=2)
    return rule_set("builtin")
