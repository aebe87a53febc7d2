"""Small PyTorch modules the benchmark exports: transformer blocks and view constants.

Everything here is deliberately tiny (dims of 16-64) so that export and
lowering stay cheap; the benchmark scales graphs by replicating nodes, not by
growing tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-6


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class RMSNorm(nn.Module):
    """Llama-style RMSNorm with a constant weight: fusable."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x.float()).type_as(x) * self.weight


class AdaLNNorm(nn.Module):
    """DiT-style adaptive norm: the 'weight' is computed from an input, so not fusable."""

    def __init__(self, dim: int, cond_dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(cond_dim, dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return _rms(x) * (1.0 + self.lin(cond)).unsqueeze(1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        freqs = torch.outer(torch.arange(seq).float(), torch.rand(self.hd // 2))
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.wq(x).view(b, s, self.heads, self.hd)
        k = self.wk(x).view(b, s, self.heads, self.hd)
        v = self.wv(x).view(b, s, self.heads, self.hd)
        cos, sin = self.cos[:s].unsqueeze(1), self.sin[:s].unsqueeze(1)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (self.hd**-0.5)
        out = att.softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, seq: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, seq)
        self.ffn_norm = RMSNorm(dim)
        self.ffn = FeedForward(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))
        return h + self.ffn(self.ffn_norm(h))


class AdaLNBlock(nn.Module):
    """The same block with both norms conditioned on ``cond`` (never fusable)."""

    def __init__(self, dim: int, heads: int, seq: int, cond_dim: int) -> None:
        super().__init__()
        self.attn_norm = AdaLNNorm(dim, cond_dim)
        self.attn = Attention(dim, heads, seq)
        self.ffn_norm = AdaLNNorm(dim, cond_dim)
        self.ffn = FeedForward(dim, 2 * dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x, cond))
        return h + self.ffn(self.ffn_norm(h, cond))


class MixedUnit(nn.Module):
    """One fusable Llama block followed by one AdaLN block: the replication unit."""

    def __init__(self, dim: int = 16, heads: int = 2, seq: int = 4, adaln: bool = True,
                 fusable: bool = True) -> None:
        super().__init__()
        self.fusable = LlamaBlock(dim, heads, seq) if fusable else None
        self.adaln = AdaLNBlock(dim, heads, seq, dim) if adaln else None

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        if self.fusable is not None:
            x = self.fusable(x)
        if self.adaln is not None:
            x = self.adaln(x, cond)
        return x


class NormChainUnit(nn.Module):
    """One Llama-style norm block (fusable RMSNorm) and one with an AdaLN multiplier (declined).

    The replication unit of the apply benchmark: few nodes per fusion, so the
    cost of applying is not hidden behind matching a large block.
    """

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.lin1 = nn.Linear(dim, dim, bias=False)
        self.norm2 = AdaLNNorm(dim, dim)
        self.lin2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x = x + self.lin1(self.norm1(x))
        return x + self.lin2(self.norm2(x, cond))


class TinyLlama(nn.Module):
    """A Llama-style stack for end-to-end lowering."""

    def __init__(self, layers: int, dim: int = 64, heads: int = 4, seq: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LlamaBlock(dim, heads, seq) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x))


class ViewConstant(nn.Module):
    """A linear whose weight buffer is a view into a 3x larger storage, at an offset."""

    def __init__(self, dim: int = 32, compact: bool = False) -> None:
        super().__init__()
        base = torch.randn(3, dim, dim)
        w = base[1]
        self.register_buffer("w", w.clone() if compact else w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w)
