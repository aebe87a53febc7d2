"""Grouped 2-D convolutions on the real Vulkan runtime (found while bisecting issue 24's OpMix).

With ``groups > 1``, not depthwise, and 1 or 2 input channels per group, the runtime's
sliding-window conv computes wrong values (fp32, lavapipe: 1.2-2.6 off eager); with 4 or 8
per group, and depthwise, it is right. The simulator said ok. It is now a garbage runtime
condition (``grouped_in_channels_4`` on ``aten.convolution`` / ``et_vk.conv_with_clamp``),
so the runtime-aware partitioner keeps such a conv on the CPU (which has the kernel): ours
equal to eager; stock's program is wrong on the runtime, as the simulator and ``check()``
now say. A conv with 4 input channels per group stays on the delegate, equal to eager.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import constant_serializer, decode_payload
from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates
from fusionkit.backends.vulkan_adapter.inspect.simulator import RuntimeConditionError, unload

pytestmark = pytest.mark.usefixtures("vulkan_ops")


class GroupedConv(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x * 0.5)) + 1.0


@dataclass
class Case:
    name: str
    cin: int
    cout: int
    groups: int
    #: the runtime computes it wrong on the delegate
    broken: bool
    runs: dict[str, Any] = field(default_factory=dict)

    def make(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(self.cin * 100 + self.cout * 10 + self.groups)
        return (GroupedConv(self.cin, self.cout, self.groups).eval(),
                (torch.randn(1, self.cin, 7, 6),))


CASES = (Case("g2_icg2", 4, 8, 2, True), Case("g3_icg1_x3", 3, 9, 3, True),
         Case("g2_icg4", 8, 8, 2, False))


def _convs(et: Any) -> int:
    return sum(call.name in ("aten.convolution.default", "et_vk.conv_with_clamp.default")
               for d in vulkan_delegates(et) for call in decode_payload(d.payload).graph.chain)


def _lower(case: Case, path: str) -> dict[str, Any]:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as StockVulkanPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower

    m, args = case.make()
    ep = torch.export.export(m, args)
    part: Any
    if path == "stock":
        vk.uninstall()
        constant_serializer.uninstall()
        part = StockVulkanPartitioner()
        edge = to_edge_transform_and_lower(ep, partitioner=[part])
    else:
        part = vk.VulkanPartitioner()
        edge = to_edge_transform_and_lower(
            ep, transform_passes=vk.transform_passes(partitioner=part), partitioner=[part])
    et = edge.to_executorch()
    with torch.no_grad():
        eager = pytree.tree_leaves(m(*args))
    try:
        simulated: Any = pytree.tree_leaves(vk.simulate(et, *args))
    except RuntimeConditionError as e:
        simulated = e
    finally:
        unload(et)
    return {"pte": bytes(et.buffer), "eager": eager, "simulated": simulated,
            "problems": list(vk.check(et)), "convs": _convs(et), "args": args,
            "kept_off": list(getattr(part, "kept_off_nodes", []))}


@pytest.fixture(scope="module")
def cases(vulkan_runtime: object) -> Iterator[list[Case]]:
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    if cached_inventory() is None:
        pytest.skip("the runtime is not probed: the partitioner judges no conditions")
    was_installed, serializer_was = vk.is_installed(), constant_serializer.is_installed()
    out = [Case(c.name, c.cin, c.cout, c.groups, c.broken) for c in CASES]
    try:
        for case in out:
            case.runs["ours"] = _lower(case, "ours")
            if case.broken:
                case.runs["stock"] = _lower(case, "stock")
    finally:
        vk.uninstall()
        (constant_serializer.install if serializer_was else constant_serializer.uninstall)()
        if was_installed:
            vk.install()
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
        assert _err(low["real"].outputs, low["eager"]) < 1e-4, case.name
        assert not isinstance(low["simulated"], Exception), (case.name, low["simulated"])
        assert _err(low["simulated"], low["eager"]) < 1e-4, case.name
        assert low["problems"] == [], (case.name, [str(p) for p in low["problems"]])
        kept = [k for k in low["kept_off"] if k.fact == "runtime_condition"
                and "grouped_in_channels_4" in k.reason]
        # the broken conv is kept off (none left in a payload), the other one is delegated
        assert (len(kept), low["convs"]) == ((1, 0) if case.broken else (0, 1)), (
            case.name, [str(k) for k in low["kept_off"]], low["convs"])


def test_stock_is_wrong_where_the_simulator_and_check_say(cases: list[Case]) -> None:
    broken = [c for c in cases if c.broken]
    assert len(broken) == 2
    for case in broken:
        low = case.runs["stock"]
        assert low["convs"] == 1, case.name
        assert low["real"].ok, (case.name, low["real"].message)
        assert _err(low["real"].outputs, low["eager"]) > 0.1, case.name
        e = low["simulated"]
        assert isinstance(e, RuntimeConditionError), (case.name, e)
        assert e.condition.name == "grouped_in_channels_4" and e.condition.effect == "garbage"
        named = [(p.kind, p.arg_name) for p in low["problems"]]
        assert named == [("runtime_condition", "weight")], [str(p) for p in low["problems"]]
