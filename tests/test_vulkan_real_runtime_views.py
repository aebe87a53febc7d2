"""View constants on ExecuTorch's real Vulkan runtime: weights that are views into packed
tensors (a non-zero offset, a chunk of a packed projection). Stock 1.5.1 serializes each
from the start of its storage, so the runtime computes with the wrong bytes; fusionkit's
program equals eager. ``check()`` and the simulator must say so too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from vulkan_real_programs import Program, lower, run_all

D = 16


class PackedViews(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        packed = torch.randn(3, D, D, generator=g) / D**0.5
        self.register_buffer("proj_view", packed[1])  # a view at a non-zero offset
        qkv = torch.randn(3 * D, D, generator=g) / D**0.5
        self.register_buffer("v_proj", qkv.chunk(3)[2])  # the last chunk of a packed in_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(torch.relu(nn.functional.linear(x, self.proj_view)),
                                    self.v_proj)


@pytest.fixture(scope="module")
def programs(vulkan_runtime: Any) -> list[Program]:
    model = PackedViews().eval()
    x = torch.randn(2, D, generator=torch.Generator().manual_seed(0))
    ep = torch.export.export(model, (x,))
    out = [lower("packed views", "view constants", path, ep, (x,), model(x))
           for path in ("fusionkit", "stock")]
    run_all(out)
    return out


def test_view_constants_on_the_real_runtime(programs: list[Program]) -> None:
    ours, stock = programs
    assert ours.outcome == "ok", ours.describe()
    assert stock.outcome == "wrong", stock.describe()  # ran on the wrong bytes
    assert ours.check_problems == [] and any("bytes" in p for p in stock.check_problems)
    assert ours.simulator_agrees and stock.simulator_agrees, [p.describe() for p in programs]
