"""RMSNorm as real model code writes it: the six multiplier rows and model re-creations.

Everything is tiny (hidden size 8-16). The re-creations are written from scratch
to follow the *shape* of each family's code (where the casts sit, which operand
comes first, how eps is added), not copied from any library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "DTYPES",
    "EPS",
    "ROWS",
    "AdaLNScale",
    "BufferWeight",
    "CastWeight",
    "D",
    "DiffusersRMSNorm",
    "GemmaPlusOne",
    "GemmaRMSNorm",
    "HFLlamaRMSNorm",
    "InputWeight",
    "LlamaRMSNorm",
    "ParamWeight",
    "QwenAttention",
    "Row",
    "SharedWeight",
    "T5LayerNorm",
    "TwoUsers",
    "VariantNorm",
    "edge_program",
    "rms",
    "row_case",
    "tolerance",
]

D = 8
EPS = 1e-6
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {
        torch.float32: {"atol": 1e-5, "rtol": 1e-5},
        torch.float16: {"atol": 1e-2, "rtol": 1e-2},
        torch.bfloat16: {"atol": 6e-2, "rtol": 6e-2},
    }[dtype]


def rms(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# ----------------------------------------------------------------- the six rows


class ParamWeight(nn.Module):
    """Row 1: a leaf parameter."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x) * self.weight


class BufferWeight(nn.Module):
    """Row 2: a leaf buffer."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(D, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x) * self.weight


class CastWeight(nn.Module):
    """Row 3: the weight is stored in another dtype and cast to the activations' one
    (``weight.type_as(x)``, as Llama-family code casts weights)."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        storage = torch.float16 if dtype == torch.float32 else torch.float32
        self.weight = nn.Parameter(torch.randn(D, dtype=storage))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x) * self.weight.type_as(x)


class GemmaPlusOne(nn.Module):
    """Row 4: Gemma's ``1.0 + weight``."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.1 * torch.randn(D, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms(x) * (1.0 + self.weight)


class InputWeight(nn.Module):
    """Row 5: the multiplier is a graph input (adaptive norm)."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms(x) * w


class AdaLNScale(nn.Module):
    """Row 6: DiT-style AdaLN, the scale is computed by a layer from a conditioning input."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.lin = nn.Linear(4, D).to(dtype)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return rms(x) * self.lin(cond)  # cond [1, 4] -> scale [1, D]: a per-channel vector


@dataclass(frozen=True)
class Row:
    name: str
    make: Callable[[torch.dtype], nn.Module]
    extra: Callable[[torch.dtype], tuple[torch.Tensor, ...]]
    #: what fusionkit must do with it
    fused: bool
    #: stock ExecuTorch 1.5.1 fuses it and the payload's weight is not a constant
    stock_aborts: bool


def _none(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return ()


ROWS: tuple[Row, ...] = (
    Row("param", ParamWeight, _none, True, False),
    Row("buffer", BufferWeight, _none, True, False),
    Row("cast", CastWeight, _none, True, True),
    Row("gemma", GemmaPlusOne, _none, True, True),
    Row("input", InputWeight, lambda dt: (torch.randn(D, dtype=dt),), False, True),
    Row("adaln", AdaLNScale, lambda dt: (torch.randn(1, 4, dtype=dt),), False, True),
)


# ------------------------------------------------------------ model re-creations


class LlamaRMSNorm(nn.Module):
    """Meta's reference Llama: norm in fp32, ``type_as`` back, then ``* weight``."""

    def __init__(self, dim: int = D, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


class HFLlamaRMSNorm(nn.Module):
    """Hugging Face Llama/Qwen2/Qwen3 style: ``weight * hidden.to(input_dtype)``."""

    def __init__(self, dim: int = D, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma: zero-centred weight, ``output * (1.0 + weight.float())``, cast back at the end."""

    def __init__(self, dim: int = D, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(0.1 * torch.randn(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class T5LayerNorm(nn.Module):
    """T5: variance of ``x.to(fp32)`` but the product uses the uncast ``x``; weight first."""

    def __init__(self, dim: int = D, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class DiffusersRMSNorm(nn.Module):
    """diffusers: like T5, but ``hidden * weight`` and an optional bias after."""

    def __init__(self, dim: int = D, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            hidden_states = hidden_states.to(self.weight.dtype)
        return hidden_states * self.weight


class QwenAttention(nn.Module):
    """Qwen3-style block: input norm, q/k projections with per-head q_norm/k_norm."""

    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.input_layernorm = HFLlamaRMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.q_norm = HFLlamaRMSNorm(self.head_dim)
        self.k_norm = HFLlamaRMSNorm(self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        shape = (b, s, self.heads, self.head_dim)
        q = self.q_norm(self.q_proj(h).view(shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(h).view(shape)).transpose(1, 2)
        v = self.v_proj(h).view(shape).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) * self.head_dim**-0.5, dim=-1)
        out = (att @ v).transpose(1, 2).reshape(b, s, -1)
        return x + self.o_proj(out)


class VariantNorm(nn.Module):
    """Operand-order and spelling variants: ``x*x``, ``eps + mean``, ``rsqrt * x``,
    weight on the left, eps as a 0-d buffer."""

    def __init__(self, square: str = "mul", eps: str = "scalar", weight_left: bool = True,
                 rsqrt_left: bool = True, eps_left: bool = True) -> None:
        super().__init__()
        self.square, self.eps_kind = square, eps
        self.weight_left, self.rsqrt_left, self.eps_left = weight_left, rsqrt_left, eps_left
        self.weight = nn.Parameter(torch.randn(D))
        self.register_buffer("eps_t", torch.tensor(1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sq = x * x if self.square == "mul" else x**2
        var = torch.mean(sq, dim=-1, keepdim=True)
        eps: Any = self.eps_t if self.eps_kind == "tensor" else 1e-5
        var = eps + var if self.eps_left else var + eps
        r = torch.rsqrt(var)
        n = r * x if self.rsqrt_left else x * r
        return self.weight * n if self.weight_left else n * self.weight


class TwoUsers(nn.Module):
    """The norm's output (before the weight) has a second user: must not fuse."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = rms(x)
        return n * self.weight, n + 1.0


class SharedWeight(nn.Module):
    """Two norms share one weight (plain, and Gemma-style ``1 + w`` computed twice)."""

    def __init__(self, gemma: bool = False) -> None:
        super().__init__()
        self.gemma = gemma
        self.weight = nn.Parameter(0.1 * torch.randn(D))

    def _w(self) -> torch.Tensor:
        return 1.0 + self.weight if self.gemma else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = rms(x) * self._w()
        return rms(h + x) * self._w()


# ------------------------------------------------------------- shared programs

_EDGE: dict[Any, tuple[Any, nn.Module, tuple[torch.Tensor, ...]]] = {}


def row_case(row: Row, dtype: torch.dtype) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model of a row in ``dtype`` and its example inputs (deterministic)."""
    torch.manual_seed(0)
    m = row.make(dtype)
    if row.name != "cast":  # the cast row keeps its weight in another dtype on purpose
        m = m.to(dtype)
    return m.eval(), (torch.randn(2, D, dtype=dtype), *row.extra(dtype))


def edge_program(key: Any, make: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
                 ) -> tuple[Any, nn.Module, tuple[torch.Tensor, ...]]:
    """``(to_edge(export(model)).exported_program(), model, inputs)``, built once per test run.

    Shared between test modules: deep-copy the program before running a pass on it.
    """
    if key not in _EDGE:
        from executorch.exir import to_edge

        m, args = make()
        _EDGE[key] = (to_edge(torch.export.export(m, args)).exported_program(), m, args)
    return _EDGE[key]
