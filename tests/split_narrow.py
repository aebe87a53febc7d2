"""A program ExecuTorch's Vulkan partitioner splits in two with an ``.item()``'s assertions
on the wrong side (``tests/test_runtime_assertions.py``, ``tests/test_exec_launcher.py``)."""

from __future__ import annotations

import torch


class SplitNarrow(torch.nn.Module):
    """A table read at a data-dependent row (a rope's ``freqs.narrow(0, pos, seq)``),
    mixed with values that pass through a 5-D ``cat`` (no Vulkan support: it stays on the
    CPU and splits the graph into two partitions)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(32, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        p = pos[-1].item()
        torch._check_is_size(p)
        torch._check(p < 16)
        rows = self.table.narrow(0, p, x.shape[0])
        wide = rows[None, :, :, None, None]
        wide = torch.cat([wide, wide], dim=-1).sum(-1)[0, :, :, 0]
        return (x * 2.0) + wide * rows


INPUTS = (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([3]))
