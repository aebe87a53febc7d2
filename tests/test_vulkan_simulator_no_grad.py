"""The simulator runs a program as a runtime does: with no autograd.

A module's parameters require grad; the CPU part of a ``to_executorch`` program calls
``out=`` kernels (``aten.mul.out``), which torch refuses under autograd. Found when
simulating a program whose CPU ``mean.out`` took a parameter-derived value.
"""

from __future__ import annotations

import torch
from executorch.exir import to_edge

from fusionkit.backends.vulkan_adapter.inspect.simulator import simulate


class _ScaledMean(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.w).mean(-1)


def test_simulate_runs_out_kernels_with_grad_enabled() -> None:
    torch.manual_seed(0)
    model = _ScaledMean()
    x = torch.randn(2, 4)
    assert torch.is_grad_enabled() and model.w.requires_grad
    program = to_edge(torch.export.export(model, (x,))).to_executorch()
    out = simulate(program, x)
    got = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(got, model(x).detach())
    assert torch.is_grad_enabled()  # the caller's mode is left as it was
