"""Reproducers of upstream fusion-pass reports (2026), each through both adapters.

* pytorch/executorch#17430 — Vulkan ``FuseClampPass`` fused ``conv -> relu`` into
  ``conv_with_clamp`` when the convolution also fed a skip connection, clamping the skip
  (MetaNet GreenScreen). A conv with two users must keep its relu separate.
* pytorch/executorch#17166 — XNNPACK serialized a multiply with a fused ReLU wrongly
  (Parakeet's numerical deviation): ``relu(a * b)``.
* pytorch/executorch#20601 — NXP's batch-norm fusion checked the batch norm's user count
  instead of the convolution's, so a conv read by a batch norm and something else was
  folded (output 76 off). The same shape through the Vulkan and XNNPACK batch-norm rules.
* pytorch/executorch#19152 — XNNPACK lowering failed when a permute's result had two
  consumers ("pass-through arguments are not supported"): ``y = x.permute(0, 2, 1)``
  returned reshaped and summed.

Each program is judged against eager: XNNPACK's ``.pte`` on ``portable_lib``, Vulkan's on
the simulator and on the real runtime (when present), and ``check()`` must be clean.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
from torch import nn
from torch.utils import _pytree as pytree
from vulkan_runtime_oracle import assert_real, session

import fusionkit.backends.vulkan_adapter as vk
import fusionkit.backends.xnnpack_adapter as xa
from fusionkit.backends.vulkan_adapter import runtime as rt

pytestmark = pytest.mark.usefixtures("vulkan_ops")

real_vulkan = session()
ATOL = 1e-5


class ConvReluSkip(nn.Module):
    """#17430: ``relu(conv(x)) + conv(x)`` (the conv has two users)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.proj = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.proj(torch.relu(y)) + y


class MulRelu(nn.Module):
    """#17166: a multiply with a ReLU after it."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a * b) + a


class ConvBnTwoUsers(nn.Module):
    """#20601: a conv read by a batch norm and by an add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) + y


class PermuteTwoUsers(nn.Module):
    """#19152: a permute read by a reshape and a sum, both returned."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.permute(0, 2, 1)
        return y.reshape(x.shape[0], -1), y.sum(dim=1)


def _case(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "17430_conv_relu_skip":
        return ConvReluSkip().eval(), (torch.randn(1, 4, 8, 8, generator=g),)
    if name == "19152_permute_two_users":
        return PermuteTwoUsers().eval(), (torch.randn(2, 3, 5, generator=g),)
    if name == "17166_mul_relu":
        return MulRelu().eval(), (torch.randn(2, 16, generator=g), torch.randn(2, 16, generator=g))
    m = ConvBnTwoUsers().eval()
    with torch.no_grad():
        m.bn.running_mean.copy_(torch.randn(4, generator=g))
        m.bn.running_var.copy_(torch.rand(4, generator=g) + 0.5)
        m.bn.weight.copy_(torch.rand(4, generator=g) + 0.5)
        m.bn.bias.copy_(torch.randn(4, generator=g))
    return m, (torch.randn(1, 4, 8, 8, generator=g),)


CASES = ["17430_conv_relu_skip", "17166_mul_relu", "20601_conv_bn_two_users",
         "19152_permute_two_users"]


def _lower(m: nn.Module, args: tuple[torch.Tensor, ...], backend: str) -> Any:
    ep = torch.export.export(m, args)
    if backend == "vulkan":
        part: Any = vk.VulkanPartitioner()
        passes = vk.transform_passes(partitioner=part)
    else:
        part, passes = xa.XnnpackPartitioner(), xa.transform_passes()
    edge = to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[part])
    return edge.to_executorch()


@pytest.mark.parametrize("name", CASES)
def test_xnnpack_equals_eager(name: str) -> None:
    m, args = _case(name)
    with torch.no_grad():
        want = m(*args)
    et = _lower(m, args, "xnnpack")
    pte = bytes(et.buffer)  # held while it runs: the runtime does not copy it
    got = _load_for_executorch_from_buffer(pte).forward(args)
    torch.testing.assert_close(list(got), pytree.tree_leaves(want), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("name", CASES)
def test_vulkan_equals_eager(name: str, real_vulkan: rt.RuntimeSession | None) -> None:
    m, args = _case(name)
    with torch.no_grad():
        want = m(*args)
    et = _lower(m, args, "vulkan")
    assert vk.check(et) == []
    torch.testing.assert_close(pytree.tree_leaves(vk.simulate(et, *args)), pytree.tree_leaves(want),
                               atol=ATOL, rtol=1e-5)
    assert_real(real_vulkan, et, args, want, atol=ATOL, rtol=1e-5)
