"""Runtime-aware lowering: what the real runtime has is probed, and the partitioner keeps
what it lacks off the delegate (a program stock ExecuTorch lowers is refused at load)."""

from __future__ import annotations

import torch
from vulkan_real_programs import lower, run_all

from fusionkit.backends.vulkan_adapter import VulkanPartitioner
from fusionkit.backends.vulkan_adapter.rule_ops import created_operators
from fusionkit.backends.vulkan_adapter.runtime_probe import RuntimeInventory


def test_the_probe_finds_what_the_runtime_lacks_and_has(probed: RuntimeInventory) -> None:
    assert len(probed.operators) > 100
    missing = probed.missing_operators()
    assert "aten.logical_not.default" in missing  # the public tree's gap
    assert probed.has_operator("aten.add.Tensor") and probed.has_operator("aten.logical_and.default")
    # of the names the partitioner's graphs carry (edge ops: ns.name.overload) few are missing
    # (the ATen forms, "linear.default", are asked about too: a node of preprocess's
    # in-place form can carry one, and nothing registers most of them)
    edge_names = [n for n in probed.operators if n.count(".") == 2]
    assert len([n for n in missing if n in edge_names]) < len(edge_names) / 4
    # the int32 eq shader exists under one name only (BinaryOp.cpp composes the other)
    assert "binary_eq_int32_texture3d" in probed.shaders
    assert "binary_eq_texture3d_int32" not in probed.shaders
    assert "binary_add_texture3d_float" in probed.shaders


def test_the_probe_asks_about_what_the_rules_create(probed: RuntimeInventory) -> None:
    """The ops Vulkan preprocess creates (fusionkit's rules) are asked about too, by the
    name the payload gives them: the public runtime registers stock's KV-cache fusion as
    the ATen overload's ``sdpa_with_kv_cache.default``, not the edge op's name."""
    created = created_operators()
    assert set(created) <= set(probed.operators)
    assert "causal_sdpa" in created["sdpa_with_kv_cache.default"]
    assert probed.has_operator("sdpa_with_kv_cache.default")
    assert not probed.has_operator("llama.sdpa_with_kv_cache.default")
    # the registry's "llama::update_cache" key: the edge form is missing, the ATen one not
    assert not probed.has_operator("llama.update_cache.default")
    assert probed.has_operator("update_cache.default")
    assert probed.has_operator("llama.custom_sdpa.default")
    # every et_vk op a shipped rule creates is in this runtime
    made = [n for n in created if n.startswith("et_vk.")]
    assert len(made) >= 15 and all(probed.has_operator(n) for n in made), made


class MaskedFill(torch.nn.Module):
    """An attention-mask shape of code: logical_not of a comparison, then where."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.logical_not(x > 0.5)
        return torch.where(keep, x * 2.0, torch.zeros_like(x)) + 1.0


def test_ops_the_runtime_lacks_are_kept_off_with_a_reason(probed: RuntimeInventory) -> None:
    part = VulkanPartitioner(runtime=probed)
    assert "aten.logical_not.default" in part.kept_off
    assert "has no aten.logical_not.default" in part.kept_off["aten.logical_not.default"]
    # with no probe, what the wheel and the runtime's registered-operator list imply: the
    # probe's very set, each named as inferred
    wheel = VulkanPartitioner(runtime=None).kept_off
    assert set(wheel) == set(part.kept_off), sorted(set(wheel) ^ set(part.kept_off))
    assert all("wheel implies" in why for why in wheel.values()), wheel

    x = torch.randn(4, 8)
    model = MaskedFill().eval()
    ep = torch.export.export(model, (x,))
    eager = model(x)
    ours = lower("masked_fill", "runtime ops", "fusionkit", ep, (x,), eager,
                 partitioner=lambda: VulkanPartitioner(runtime=probed))
    stock = lower("masked_fill", "runtime ops", "stock", ep, (x,), eager)
    run_all([ours, stock])
    assert ours.outcome == "ok", ours.describe()
    assert stock.outcome == "refused", stock.describe()
    assert "Missing operator: aten.logical_not.default" in (stock.real.message or "")
    # given the probe, the static tools predict it; ours has nothing to report
    assert any("Missing operator: aten.logical_not.default" in p for p in stock.check_probed)
    assert stock.simulator_probed_agrees and ours.simulator_probed_agrees
    assert ours.check_probed == [] and ours.check_problems == []


def test_under_install_executorch_own_partitioner_keeps_them_off() -> None:
    """A pipeline that builds ExecuTorch's own VulkanPartitioner, run under ``install()``
    (``fusionkit exec``: export_llm's llama without KV cache has this ``logical_not``): the
    same blocklist for its partition() only, so the program loads and runs; the caller's
    blocklist is as it gave it afterwards."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as StockVulkanPartitioner,
    )

    from fusionkit.backends.vulkan_adapter import missing_operators

    made: list[StockVulkanPartitioner] = []

    def stock_partitioner() -> StockVulkanPartitioner:
        made.append(StockVulkanPartitioner(operator_blocklist=set()))
        return made[-1]

    x = torch.randn(4, 8)
    model = MaskedFill().eval()
    ep = torch.export.export(model, (x,))
    missing_operators.KEPT_OFF.clear()
    ours = lower("masked_fill", "runtime ops", "installed", ep, (x,), model(x),
                 partitioner=stock_partitioner)
    run_all([ours])
    assert ours.outcome == "ok", ours.describe()
    assert ours.check_problems == []
    assert made[0].operator_blocklist == set()
    assert "has no aten.logical_not.default" in missing_operators.KEPT_OFF[
        "aten.logical_not.default"]
