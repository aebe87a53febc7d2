"""A fusion into an op the probed Vulkan runtime lacks is declined, with the op and the
runtime named, before the program changes: in the transform passes and inside preprocess.

The runtimes here are synthetic inventories (one op marked missing), so these run with
and without the real runtime; tests/test_vulkan_real_runtime_probe.py probes the real one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")

from kv_cache_models import KVAttention
from vulkan_pattern_helpers import edge
from vulkan_runtime_oracle import assert_real, session

from fusionkit import find_matches
from fusionkit.apply.rewrite import apply_matches
from fusionkit.backends.vulkan_adapter.delegation import (
    PartitionerSupport,
    preprocess_fusions,
    use_runtime,
    with_delegation_check,
)
from fusionkit.backends.vulkan_adapter.rule_ops import created_operators
from fusionkit.backends.vulkan_adapter.runtime_probe import RuntimeInventory, candidate_operators
from fusionkit.passes import rule_set
from fusionkit.targets import op_key

# the unfused KV-cache program also runs on the real runtime (one child for the module)
real_vulkan = session()


def lacking(*names: str) -> RuntimeInventory:
    """A runtime that has every op but ``names``."""
    return RuntimeInventory("f" * 64, {n: n not in names for n in candidate_operators()},
                            frozenset())


class RMSNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


KV_ARGS = (torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8),
           torch.tensor([2]))


def _in_place_kv() -> Any:
    """The KV-cache program as VulkanBackend.preprocess sees it (in-place cache updates)."""
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from torch.export._remove_auto_functionalized_pass import (
        unsafe_remove_auto_functionalized_pass,
    )

    return unsafe_remove_auto_functionalized_pass(edge(KVAttention(), KV_ARGS))


def _targets(ep: Any) -> list[str]:
    return [op_key(n.target) or "" for n in ep.graph.nodes if n.op == "call_function"]


def test_a_transform_pass_rule_whose_op_is_missing_is_declined_with_the_reason() -> None:
    x = torch.randn(2, 16)
    rules = [with_delegation_check(r, PartitionerSupport(), runtime=lacking())
             for r in rule_set("vulkan") if r.name == "rms_norm"]
    ep = edge(RMSNorm(), (x,))
    assert [m.rule.name for m in find_matches(ep, rules).accepted] == ["rms_norm"]

    rules = [with_delegation_check(r, PartitionerSupport(), runtime=lacking("et_vk.rms_norm.default"))
             for r in rule_set("vulkan") if r.name == "rms_norm"]
    before = _targets(ep)
    ms = find_matches(ep, rules)
    assert ms.accepted == []
    (d,) = [d for d in ms.declined if d.rule == "rms_norm"]
    assert "has no operator et_vk.rms_norm.default" in d.reason
    assert "the Vulkan runtime probed (library sha256 ffffffffffff)" in d.reason
    assert "Missing operator: et_vk.rms_norm.default" in d.reason
    assert _targets(ep) == before  # declined before the program changed


def test_transform_passes_judge_against_the_runtime_in_effect() -> None:
    from fusionkit.backends.vulkan_adapter import transform_passes

    x, model = torch.randn(2, 16), RMSNorm()
    with torch.no_grad():
        want = model(x)
    for runtime, fused in ((lacking("et_vk.rms_norm.default"), False), (lacking(), True)):
        ep = edge(model, (x,))
        with use_runtime(runtime):
            for p in transform_passes():
                p(ep)
        assert ("et_vk.rms_norm.default" in _targets(ep)) is fused
        if not fused:  # left as it was: still the eager computation
            torch.testing.assert_close(ep.module()(x), want, atol=1e-5, rtol=1e-5)


def test_preprocess_declines_the_sdpa_fusion_when_the_runtime_lacks_its_op() -> None:
    ep = _in_place_kv()
    # the fused node is stock's ATen overload: serialized "sdpa_with_kv_cache.default"
    ms = preprocess_fusions(ep, lacking("sdpa_with_kv_cache.default"))
    assert "causal_sdpa" not in [m.rule.name for m in ms.accepted]
    (d,) = [d for d in ms.declined if d.rule == "causal_sdpa"]
    assert "has no operator sdpa_with_kv_cache.default" in d.reason
    assert "ffffffffffff" in d.reason
    # the public runtime's gap is the edge op's name only: that one fuses
    ms = preprocess_fusions(ep, lacking("llama.sdpa_with_kv_cache.default"))
    assert "causal_sdpa" in [m.rule.name for m in ms.accepted]
    assert not [d for d in ms.declined if d.rule == "causal_sdpa"]


def test_the_drop_in_lowering_declines_in_preprocess_and_the_unfused_ops_run(
        real_vulkan: Any) -> None:
    """A runtime without sdpa_with_kv_cache: the fusion is declined inside preprocess, so
    the payload keeps the cache updates and the sdpa, under the names preprocess's
    in-place form gives them (``update_cache.default``: the ATen op), which the runtime
    has: the program runs, equal to eager (on the real runtime too). Were an unfused op
    missing as well, check() given the runtime says so before load."""
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import (
        VulkanPartitioner,
        check,
        simulate,
        transform_passes,
    )
    from fusionkit.backends.vulkan_adapter.inspect.simulator import DelegateRun

    m = KVAttention()
    with torch.no_grad():
        want = m(*KV_ARGS)
    inv = lacking("sdpa_with_kv_cache.default")
    with use_runtime(inv):
        prog = to_edge_transform_and_lower(torch.export.export(m, KV_ARGS),
                                           transform_passes=transform_passes(),
                                           partitioner=[VulkanPartitioner(runtime=None)])
    et = prog.to_executorch()
    runs: list[DelegateRun] = []
    torch.testing.assert_close(simulate(et, *KV_ARGS, trace=runs), want, atol=1e-5, rtol=1e-5)
    names = [op for r in runs for op in r.ops]
    assert "sdpa_with_kv_cache.default" not in names
    assert names.count("update_cache.default") == 2 and "llama.custom_sdpa.default" in names
    assert check(et, runtime=inv) == []
    without_updates = lacking("sdpa_with_kv_cache.default", "update_cache.default")
    problems = check(et, runtime=without_updates)
    assert problems and all("update_cache.default" in str(p) for p in problems), problems
    assert_real(real_vulkan, et, KV_ARGS, want, atol=1e-4, rtol=1e-4)


def test_what_the_rules_create_is_what_the_probe_asks_about() -> None:
    """Every node Vulkan rules build while fusing real programs (in transform passes and
    preprocess; a built node carries ``fusionkit_rule``) has a payload name the probe asks
    about, derived from the rules' replacements."""
    made: set[str] = set()

    def record(ep: Any) -> None:
        made.update(n.target.__name__ for n in ep.graph.nodes
                    if n.op == "call_function" and "fusionkit_rule" in n.meta)

    ep = edge(RMSNorm(), (torch.randn(2, 16),))
    apply_matches(ep, find_matches(ep, rule_set("vulkan")).accepted)
    record(ep)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4).eval(),
                               torch.nn.ReLU()).eval()
    lin = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Unflatten(1, (2, 2))).eval()
    for ep in (_in_place_kv(), edge(conv, (torch.randn(1, 3, 6, 6),)),
               edge(lin, (torch.randn(3, 8),))):
        for _ in range(3):  # a fusion can make the next one possible
            apply_matches(ep, preprocess_fusions(ep, None).accepted)
        record(ep)
    assert {"et_vk.rms_norm.default", "sdpa_with_kv_cache.default",
            "et_vk.conv_with_clamp.default", "aten.linear.default"} <= made, made
    assert made <= set(candidate_operators()), made - set(candidate_operators())
    assert made <= set(created_operators())
