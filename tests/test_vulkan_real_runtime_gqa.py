"""The GQA rotary condition on ExecuTorch's real Vulkan runtime.

A small grouped-query attention block written the HuggingFace way (q and k as
``[batch, heads, seq, head_dim]``, k with half of q's heads, Phi3's partial
``rotate_half`` RoPE) is what stock 1.5.1's ``hf_rope`` pattern fuses into
``et_vk.apply_rotary_emb_hf`` — and the runtime's ``add_rotary_embedding_hf_node``
requires ``size_at(-3, xq) == size_at(-3, xk)``, i.e. as many heads in k as in q.
Stock's program is refused for real with that message; fusionkit's ``hf_rope`` rule
declines the match (its geometry wants ``[batch, seq, heads, head_dim]``) so its program
runs equal to eager. The simulator and ``check()`` must say what the runtime did on both.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vulkan_real_programs import Program, lower, run_all

ROTARY_CONDITION = "(graph.size_at<int>(-3, xq) == graph.size_at<int>(-3, xk)) is false!"


class GQAttention(torch.nn.Module):
    """q: 4 heads, k/v: 2 heads (repeated for attention), head_dim 16, rotary dim 8."""

    def __init__(self, hidden: int = 32, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                 rotary_dim: int = 8, seq: int = 6) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = torch.nn.Linear(hidden, heads * head_dim)
        self.k_proj = torch.nn.Linear(hidden, kv_heads * head_dim)
        self.v_proj = torch.nn.Linear(hidden, kv_heads * head_dim)
        self.o_proj = torch.nn.Linear(heads * head_dim, hidden)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
        freqs = torch.outer(torch.arange(seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)[None]  # [1, seq, rotary_dim], as HF's
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' Phi3 ``apply_rotary_pos_emb`` (partial rotation, unsqueeze_dim=1)."""
        cos, sin = self.cos.unsqueeze(1), self.sin.unsqueeze(1)
        rd = cos.shape[-1]
        q_rot, q_pass = q[..., :rd], q[..., rd:]
        k_rot, k_pass = k[..., :rd], k[..., rd:]
        q = torch.cat([(q_rot * cos) + (self.rotate_half(q_rot) * sin), q_pass], dim=-1)
        k = torch.cat([(k_rot * cos) + (self.rotate_half(k_rot) * sin), k_pass], dim=-1)
        return q, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, k)
        rep = self.heads // self.kv_heads  # transformers' repeat_kv
        k = k[:, :, None].expand(b, self.kv_heads, rep, n, self.head_dim).reshape(
            b, self.heads, n, self.head_dim)
        v = v[:, :, None].expand(b, self.kv_heads, rep, n, self.head_dim).reshape(
            b, self.heads, n, self.head_dim)
        att = torch.softmax(q @ k.transpose(2, 3) * self.head_dim ** -0.5, dim=-1) @ v
        return self.o_proj(att.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


def gqa_programs() -> list[Program]:
    """The block lowered both ways (shared with tests/vulkan_real_programs.py's table)."""
    torch.manual_seed(0)
    model = GQAttention().eval()
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model(x)
    ep = torch.export.export(model, (x,))
    return [lower("gqa_rotary", "rotary", path, ep, (x,), eager)
            for path in ("fusionkit", "stock")]


@pytest.fixture(scope="module")
def programs(vulkan_runtime: Any) -> dict[str, Program]:
    progs = gqa_programs()
    run_all(progs)
    return {p.path: p for p in progs}


def _ops(p: Program) -> set[str]:
    from fusionkit.backends.vulkan_adapter.inspect.payload import decode_payload
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates

    assert p.pte is not None, p.describe()
    return {c.name for d in vulkan_delegates(p.pte) for c in decode_payload(d.payload).graph.chain}


def test_stock_fuses_the_gqa_rope_and_the_runtime_refuses_it(programs: dict[str, Program]
                                                             ) -> None:
    stock = programs["stock"]
    assert stock.lower_error is None, stock.describe()
    assert "et_vk.apply_rotary_emb_hf.default" in _ops(stock)
    assert stock.outcome == "refused", stock.describe()
    assert stock.real is not None and stock.real.message
    assert "add_rotary_embedding_hf_node" in stock.real.message, stock.real.message
    assert ROTARY_CONDITION in stock.real.message, stock.real.message


def test_fusionkit_declines_it_and_runs_equal_to_eager(programs: dict[str, Program]) -> None:
    ours = programs["fusionkit"]
    assert ours.lower_error is None, ours.describe()
    assert "et_vk.apply_rotary_emb_hf.default" not in _ops(ours)
    assert ours.outcome == "ok", ours.describe()


def test_simulator_and_check_agree_with_the_runtime(programs: dict[str, Program]) -> None:
    for p in programs.values():
        assert p.simulator_agrees and p.simulator_probed_agrees, p.describe()
        assert p.check_agrees and p.check_probed_agrees, (p.describe(), p.check_problems)
    stock = programs["stock"]
    assert ROTARY_CONDITION in stock.simulator, stock.simulator
    assert any("runtime_condition" in s or ROTARY_CONDITION in s for s in stock.check_problems)
