"""The Vulkan runtime's conditions are checked on every fused node before it is made (issue 12).

``runtime_conditions.CONDITIONS`` (read from the runtime's C++ and shaders) is the
simulator's list of what aborts or computes garbage. ``DelegatedByVulkan`` evaluates
the same list on the fused node the rule's replacement would build, both in
``transform_passes()`` and inside ``VulkanBackend.preprocess`` (the stand-in): a rule
that forgot a condition is still declined, with the runtime's own words.
"""

from __future__ import annotations

import dataclasses

import torch
from vulkan_pattern_helpers import I8, edge, qd

from fusionkit import find_matches
from fusionkit.backends.vulkan_adapter.delegation import (
    PartitionerSupport,
    runtime_condition_broken,
    with_delegation_check,
)
from fusionkit.backends.vulkan_adapter.inspect import runtime_conditions as RC
from fusionkit.passes.vulkan.quantized_pixel_shuffle import quantized_pixel_shuffle_rule


class Shuffle(torch.nn.Module):
    def __init__(self, r: int) -> None:
        super().__init__()
        self.r = r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.pixel_shuffle(
            qd.dequantize_per_tensor(x, 0.1, 0, -128, 127, I8), self.r)
        return qd.quantize_per_tensor(y, 0.05, 1, -128, 127, I8)


def _forgetful_rule() -> object:
    """The shipped rule without its hand-written 'r == 2' check (a rule author's slip)."""
    rule = quantized_pixel_shuffle_rule()
    kept = [c for c in rule.constraints if getattr(c, "name", "") != "channels_divisible"]
    assert len(kept) == len(rule.constraints) - 1
    return dataclasses.replace(rule, constraints=kept)


def test_a_forgotten_condition_is_still_declined_with_the_runtimes_words() -> None:
    x = torch.randint(-128, 127, (1, 18, 2, 3), dtype=I8)  # 18 channels: r = 3 fits
    keep = [torch.ops.aten.pixel_shuffle.default]
    bare = _forgetful_rule()
    ms = find_matches(edge(Shuffle(3), (x,), keep), [bare])
    assert len(ms.accepted) == 1  # without the backstop the runtime would abort on this

    (cond,) = [c for c in RC.conditions_for("et_vk.q8ta_pixel_shuffle.default")
               if c.name == "upscale_2"]
    for support in (PartitionerSupport(), None):  # transform_passes(), and preprocess
        guarded = with_delegation_check(bare, support)  # type: ignore[arg-type]
        ms = find_matches(edge(Shuffle(3), (x,), keep), [guarded])
        assert ms.accepted == []
        (d,) = ms.declined
        assert cond.condition in d.reason and "upscale_2" in d.reason, d.reason

    # the same rule still fuses what the runtime accepts
    x2 = torch.randint(-128, 127, (1, 16, 2, 3), dtype=I8)
    guarded = with_delegation_check(bare, None)  # type: ignore[arg-type]
    ms = find_matches(edge(Shuffle(2), (x2,), keep), [guarded])
    assert [m.rule.name for m in ms.accepted] == ["quantized_pixel_shuffle"]


def test_ops_without_conditions_are_not_judged() -> None:
    g = torch.fx.Graph()
    a = g.placeholder("a")
    n = g.call_function(torch.ops.aten.neg.default, (a,))
    assert runtime_condition_broken(n) is None
