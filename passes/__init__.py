"""Ready-made fusion rules and YAML specs (installed as ``fusionkit.passes``).

* :mod:`fusionkit.passes.rms_norm` — RMSNorm x constant weight into ``et_vk.rms_norm``
  (also written as the spec ``specs/rms_norm.yaml``);
* :mod:`fusionkit.passes.vulkan` — ports of ExecuTorch's Vulkan patterns and preprocess passes;
* :mod:`fusionkit.passes.xnnpack` — rules replacing XNNPACK's preprocess rewrites;
* :mod:`fusionkit.passes.registry` — where every rule set is discoverable.

One way to get a rule set: ``rule_set(name)`` (names: ``rule_set_names()``; ``"shipped"`` is
every rule fusionkit ships). Each call returns fresh rule objects.
"""

from __future__ import annotations

from fusionkit.passes.registry import rule_set, rule_set_names

__all__ = ["rule_set", "rule_set_names"]
