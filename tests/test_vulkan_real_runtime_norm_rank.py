"""Held-out architectures on the real Vulkan runtime: what unseen transformers models
(LeViT, wav2vec2, MobileNetV2, RegNet, SegFormer, MobileViT, Whisper's encoder, through
both adapters and stock) showed that the simulator and ``check()`` had passed.

* LeViT's ``MLPLayerWithBN`` is a Linear followed by a ``BatchNorm1d`` over the flattened
  (tokens, channels) output: a 2-D ``_native_batch_norm_legit_no_training``, which
  ``BatchNorm.cpp`` refuses at load ("BatchNorm only support 4d tensor"). No conv absorbs
  it (the Vulkan ``FuseBatchNormPass`` fuses conv + BN only).
* wav2vec2's feature encoder normalizes its first conv1d's (N, C, L) output with
  ``GroupNorm(C, C)``: a 3-D ``native_group_norm``, which the runtime computes as NaN
  everywhere (nothing checks the rank; the same norm over (N, C, L, 1) is right).
* wav2vec2's positional conv has ``weight_norm``: its weight ``g * v / |v|`` is computed by
  the graph, and every convolution path prepacks its weight (``prepack_standard`` /
  ``PrepackNode``): refused at load, "(graph.val_is_tref(tensor_data)) is false!".

The first two are runtime conditions (``batch_norm_4d``, abort; ``group_norm_4d``,
garbage), the third a prepacked argument (``PREPACKED_ARGS``: convolution's weight), so
the simulator and ``check()`` predict stock's failures and the runtime-aware partitioner
keeps such a node on the CPU: ours equal to eager on the runtime.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from held_out_models import norm_rank_case
from torch.utils import _pytree as pytree
from vulkan_runtime_oracle import adapter_state_restored, lower_one_way, simulated_or_condition

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect.simulator import (
    NotConstantError,
    RuntimeConditionError,
)

pytestmark = pytest.mark.usefixtures("vulkan_ops")


#: name (held_out_models.NORM_RANK's) -> (what stock's program does on the runtime, the fact
#: that says so)
CASES: dict[str, tuple[str, str]] = {
    "linear_bn1d": ("abort", "batch_norm_4d"),
    "groupnorm_3d_16": ("garbage", "group_norm_4d"),
    "groupnorm_3d_4": ("garbage", "group_norm_4d"),
    "weight_norm_conv": ("abort", "not_constant"),
}


@pytest.fixture(scope="module")
def runs(vulkan_runtime: object) -> Iterator[dict[str, dict[str, Any]]]:
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    if cached_inventory() is None:
        pytest.skip("the runtime is not probed: the partitioner judges no conditions")
    out: dict[str, dict[str, Any]] = {}
    with adapter_state_restored():
        for name in CASES:
            m, (x,) = norm_rank_case(name)
            with torch.no_grad():
                eager = pytree.tree_leaves(m(x))
            for path in ("ours", "stock"):
                et, part = lower_one_way(m, (x,), path)
                out[f"{name}/{path}"] = {
                    "pte": bytes(et.buffer), "args": (x,), "eager": eager,
                    "simulated": simulated_or_condition(et, (x,)),
                    "problems": list(vk.check(et)),
                    "kept_off": list(getattr(part, "kept_off_nodes", []))}
    todo = list(out.values())
    for low, res in zip(todo, rt.run_many_in_child(
            [rt.Job(low["pte"], list(low["args"])) for low in todo], timeout=300), strict=True):
        low["real"] = res
    yield out


def _err(got: Any, want: list[torch.Tensor]) -> float:
    return max(float((g.double() - w.double()).abs().max())
               for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_ours_runs_the_node_where_it_can_and_equals_eager(runs: dict[str, Any], name: str) -> None:
    low, fact = runs[f"{name}/ours"], CASES[name][1]
    assert low["real"].ok, low["real"].message
    assert _err(low["real"].outputs, low["eager"]) < 1e-4
    assert not isinstance(low["simulated"], Exception), low["simulated"]
    assert _err(low["simulated"], low["eager"]) < 1e-4
    assert low["problems"] == [], [str(p) for p in low["problems"]]
    kept = [str(k) for k in low["kept_off"]
            if (k.fact == fact if fact == "not_constant" else fact in k.reason)]
    # weight_norm's g * v / |v| is computed from parameters alone: transform_passes() folds
    # it (FoldParameterSubgraphsPass), so the convolution is delegated, nothing kept off
    assert len(kept) == (0 if name == "weight_norm_conv" else 1), [
        str(k) for k in low["kept_off"]]


@pytest.mark.parametrize("name", sorted(CASES))
def test_stock_fails_on_the_runtime_as_the_simulator_and_check_say(
        runs: dict[str, Any], name: str) -> None:
    low, (effect, fact) = runs[f"{name}/stock"], CASES[name]
    real, sim = low["real"], low["simulated"]
    if effect == "abort":
        assert not real.ok, "stock's program ran"
    else:  # runs, computes garbage
        assert real.ok, real.message
        nans = sum(int(torch.isnan(t).sum()) for t in real.outputs)
        err = _err([torch.nan_to_num(t) for t in real.outputs], low["eager"])
        assert nans or err > 0.1, (nans, err)
    kinds = {(p.kind, p.arg_name) for p in low["problems"]}
    if fact == "not_constant":
        assert "val_is_tref" in (real.message or ""), real.message
        assert isinstance(sim, NotConstantError) and sim.arg_name == "weight", sim
        assert kinds == {("not_constant", "weight")}, kinds
    else:
        assert isinstance(sim, RuntimeConditionError), sim
        assert (sim.condition.name, sim.condition.effect) == (fact, effect)
        assert kinds == {("runtime_condition", "input")}, [str(p) for p in low["problems"]]
        if effect == "abort":
            assert "BatchNorm only support 4d tensor" in (real.message or ""), real.message
