"""The built-in demo model: every RMSNorm variant the project exists for, plus view constants.

Six norms in a row, each followed by a different kind of multiplier — a leaf
parameter, a leaf buffer, a parameter through a dtype cast, Gemma's
``1.0 + weight``, a graph input, and a DiT-style AdaLN scale computed from a
conditioning input — then two linears whose weights are *views*: one at a
non-zero offset into a packed tensor, one a chunk of a packed projection.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DemoModel", "demo_factory"]

DIM = 16
COND = 8


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class DemoModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w_param = nn.Parameter(1.0 + 0.1 * torch.randn(DIM, generator=g))
        self.w_buffer: torch.Tensor
        self.proj_view: torch.Tensor
        self.v_proj: torch.Tensor
        self.register_buffer("w_buffer", 1.0 + 0.1 * torch.randn(DIM, generator=g))
        self.w_half = nn.Parameter((1.0 + 0.1 * torch.randn(DIM, generator=g)).half())
        self.w_gemma = nn.Parameter(0.1 * torch.randn(DIM, generator=g))
        self.ada = nn.Linear(COND, DIM)
        with torch.no_grad():  # deterministic: every process builds the same weights
            self.ada.weight.copy_(torch.randn(DIM, COND, generator=g) / COND**0.5)
            self.ada.bias.copy_(1.0 + 0.1 * torch.randn(DIM, generator=g))
        packed = torch.randn(3, DIM, DIM, generator=g) / DIM**0.5
        self.register_buffer("proj_view", packed[1])  # a view at a non-zero offset
        qkv = torch.randn(3 * DIM, DIM, generator=g) / DIM**0.5
        self.register_buffer("v_proj", qkv.chunk(3)[2])  # last chunk of a packed in_proj

    def forward(self, x: torch.Tensor, scale: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = rms(x) * self.w_param                 # leaf parameter
        h = rms(h) * self.w_buffer                # leaf buffer
        h = rms(h) * self.w_half.float()          # parameter through a dtype cast
        h = rms(h) * (1.0 + self.w_gemma)         # Gemma: 1.0 + weight
        h = rms(h) * scale                        # graph input (adaptive norm)
        h = rms(h) * self.ada(cond)               # DiT-style AdaLN scale
        h = torch.nn.functional.linear(h, self.proj_view)
        return torch.nn.functional.linear(h, self.v_proj)


def demo_factory() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``fusionkit.app.demo_model:demo_factory``: the module and example inputs."""
    g = torch.Generator().manual_seed(1)
    inputs = (torch.randn(2, DIM, generator=g), 1.0 + 0.1 * torch.randn(DIM, generator=g),
              torch.randn(2, COND, generator=g))
    return DemoModel().eval(), inputs
