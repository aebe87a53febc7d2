"""Grouped convolutions on the real Vulkan runtime (found while bisecting issue 24's OpMix).

Measured on lavapipe with the condition removed (so the conv is delegated), against eager:

* 3x3 2-D, ``groups > 1``, not depthwise: 1, 2, 3 or 6 input channels per group compute
  wrong values (fp32 0.7-2.6 off eager, fp16 0.59), 4 or 8 per group and depthwise are
  right (fp32 and fp16).
* 1x1 2-D, ``groups > 1``, not depthwise: wrong whatever the group size (4->8 g2, 8->8 g2,
  16->16 g2/g4, 8->16 g2, 12->12 g3 stride 2; fp16 too: 0.8-1.3 off eager), since
  ``Conv2dPW.cpp: conv2d_pw_impl`` is not given ``groups`` and every output channel reads
  the first ``in_channels / groups`` input channels (the runtime's output equals eager's
  conv of group 0's channels). A depthwise 1x1 goes through ``conv2d_dw``: right.
* conv1d with kernel > 1 (the channels-packed ``conv1d`` shader has ``in_group_size``):
  right. A kernel-1 conv1d is height-packed and runs as ``et_vk.conv1d_pw``, which aborts
  at load with ``groups > 1`` (``conv1d_pw only supports groups=1``; depthwise too).

Both are runtime conditions (``grouped_in_channels_4``, garbage; ``conv1d_pw_groups_1``,
abort; on ``aten.convolution`` / ``et_vk.conv_with_clamp``), so the runtime-aware
partitioner keeps such a conv on the CPU (which has the kernel): ours equal to eager;
stock's program is wrong on the runtime or refused, as the simulator and ``check()`` say.
The convs the runtime computes right stay on the delegate, equal to eager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from held_out_models import grouped_conv
from torch import nn
from torch.utils import _pytree as pytree
from vulkan_runtime_oracle import adapter_state_restored, lower_one_way, simulated_or_condition

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import decode_payload
from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates
from fusionkit.backends.vulkan_adapter.inspect.simulator import RuntimeConditionError

pytestmark = pytest.mark.usefixtures("vulkan_ops")


@dataclass
class Case:
    name: str
    cin: int
    cout: int
    groups: int
    #: on the delegate the runtime computes it wrong ("garbage"), refuses it at load
    #: ("abort", the condition's effect) or runs it right (None)
    broken: str | None
    kernel: int = 3
    dim: int = 2
    stride: int = 1
    dtype: torch.dtype = torch.float32
    #: lower it with stock's partitioner too
    stock: bool = False
    runs: dict[str, Any] = field(default_factory=dict)

    @property
    def condition(self) -> str:
        return "conv1d_pw_groups_1" if self.broken == "abort" else "grouped_in_channels_4"

    @property
    def tol(self) -> float:
        return 1e-4 if self.dtype == torch.float32 else 1e-2

    def make(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        return grouped_conv(self.cin, self.cout, self.groups, self.kernel, self.dim,
                            self.stride, self.dtype)


CASES = (
    Case("g2_icg2", 4, 8, 2, "garbage", stock=True),
    Case("g3_icg1_x3", 3, 9, 3, "garbage", stock=True),
    Case("g2_icg4", 8, 8, 2, None),
    Case("g2_icg6", 12, 12, 2, "garbage"),
    Case("fp16_g2_icg2", 4, 8, 2, "garbage", dtype=torch.float16, stock=True),
    Case("fp16_g2_icg4", 8, 8, 2, None, dtype=torch.float16),
    # 1x1: conv2d_pw_impl ignores groups
    Case("pw_g2_icg4", 8, 8, 2, "garbage", kernel=1, stock=True),
    Case("pw_g3_icg4_s2", 12, 12, 3, "garbage", kernel=1, stride=2),
    Case("fp16_pw_g2_icg4", 8, 8, 2, "garbage", kernel=1, dtype=torch.float16),
    Case("pw_depthwise", 8, 8, 8, None, kernel=1),
    # conv1d
    Case("conv1d_g2_icg2", 4, 8, 2, None, dim=1),
    Case("conv1d_g3_icg2", 6, 6, 3, None, dim=1),
    Case("conv1d_pw_g2", 16, 16, 2, "abort", kernel=1, dim=1, stock=True),
    Case("conv1d_pw_depthwise", 8, 8, 8, "abort", kernel=1, dim=1),
)


def _convs(et: Any) -> int:
    return sum(call.name in ("aten.convolution.default", "et_vk.conv_with_clamp.default")
               for d in vulkan_delegates(et) for call in decode_payload(d.payload).graph.chain)


def _lower(case: Case, path: str) -> dict[str, Any]:
    m, args = case.make()
    et, part = lower_one_way(m, args, path)
    with torch.no_grad():
        eager = pytree.tree_leaves(m(*args))
    return {"pte": bytes(et.buffer), "eager": eager,
            "simulated": simulated_or_condition(et, args),
            "problems": list(vk.check(et)), "convs": _convs(et), "args": args,
            "kept_off": list(getattr(part, "kept_off_nodes", []))}


@pytest.fixture(scope="module")
def cases(vulkan_runtime: object) -> Iterator[list[Case]]:
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    if cached_inventory() is None:
        pytest.skip("the runtime is not probed: the partitioner judges no conditions")
    out = [dataclasses.replace(c, runs={}) for c in CASES]
    with adapter_state_restored():
        for case in out:
            case.runs["ours"] = _lower(case, "ours")
            if case.stock:
                case.runs["stock"] = _lower(case, "stock")
    todo = [low for case in out for low in case.runs.values()]
    results = rt.run_many_in_child([rt.Job(low["pte"], list(low["args"])) for low in todo],
                                   timeout=300)
    for low, res in zip(todo, results, strict=True):
        low["real"] = res
    yield out


def _err(got: Any, want: list[torch.Tensor]) -> float:
    return max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want, strict=True))


def test_ours_keeps_the_broken_grouped_conv_on_the_cpu(cases: list[Case]) -> None:
    for case in cases:
        low = case.runs["ours"]
        assert low["real"].ok, (case.name, low["real"].message)
        assert _err(low["real"].outputs, low["eager"]) < case.tol, case.name
        assert not isinstance(low["simulated"], Exception), (case.name, low["simulated"])
        assert _err(low["simulated"], low["eager"]) < case.tol, case.name
        assert low["problems"] == [], (case.name, [str(p) for p in low["problems"]])
        kept = [k for k in low["kept_off"] if k.fact == "runtime_condition"
                and case.condition in k.reason]
        # the broken conv is kept off (none left in a payload), the other one is delegated
        assert (len(kept), low["convs"]) == ((1, 0) if case.broken else (0, 1)), (
            case.name, [str(k) for k in low["kept_off"]], low["convs"])


def test_stock_is_wrong_where_the_simulator_and_check_say(cases: list[Case]) -> None:
    stocked = [c for c in cases if c.stock]
    assert {c.broken for c in stocked} == {"garbage", "abort"}
    for case in stocked:
        low = case.runs["stock"]
        assert low["convs"] == 1, case.name
        if case.broken == "abort":
            assert not low["real"].ok, case.name
            assert "conv1d_pw only supports groups=1" in (low["real"].message or ""), (
                case.name, low["real"].message)
        else:
            assert low["real"].ok, (case.name, low["real"].message)
            assert _err(low["real"].outputs, low["eager"]) > 0.1, case.name
        e = low["simulated"]
        assert isinstance(e, RuntimeConditionError), (case.name, e)
        assert (e.condition.name, e.condition.effect) == (case.condition, case.broken)
        named = [(p.kind, p.arg_name) for p in low["problems"]]
        arg = "groups" if case.broken == "abort" else "weight"
        assert named == [("runtime_condition", arg)], [str(p) for p in low["problems"]]


def test_a_grouped_pointwise_conv_reads_group_0_on_the_runtime(cases: list[Case]) -> None:
    """Why 1x1 is wrong at any group size: the runtime's output is eager's conv of the first
    ``in_channels / groups`` input channels with every output channel's weights."""
    (case,) = [c for c in cases if c.name == "pw_g2_icg4"]
    m, (x,) = case.make()
    conv = m.conv
    assert isinstance(conv, nn.Conv2d)
    k = case.cin // case.groups
    with torch.no_grad():
        group0 = torch.tanh(torch.nn.functional.conv2d(x[:, :k] * 0.5, conv.weight,
                                                       conv.bias)) + 1.0
    real = case.runs["stock"]["real"]
    assert real.ok, real.message
    assert _err(real.outputs, [group0]) < 1e-4
    assert _err(real.outputs, case.runs["stock"]["eager"]) > 0.1
