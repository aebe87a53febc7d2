"""The Vulkan patterns ported last (hf_rope, causal_sdpa, quantized_convolution,
the dynamic-activation and bmm routes of quantized_linear): positive match,
declined near miss (with its reason), numerics against eager through the et_vk
reference implementations."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
pytest.importorskip("torchao")

from executorch.exir import EdgeCompileConfig, to_edge
from fusionkit.passes.vulkan import vulkan_rules

from fusionkit import find_matches
from fusionkit.rewrite import apply_matches
from fusionkit.targets import op_key

qd = torch.ops.quantized_decomposed
I8 = torch.int8


def edge(m: torch.nn.Module, args: tuple[Any, ...], preserve: list[Any] | None = None) -> Any:
    cfg = EdgeCompileConfig(_check_ir_validity=False, preserve_ops=preserve or [])
    return to_edge(torch.export.export(m, args, strict=True), compile_config=cfg).exported_program()


def fuse(ep: Any) -> Any:
    ms = find_matches(ep, vulkan_rules())
    apply_matches(ep, ms.accepted)
    return ms


def ops(ep: Any) -> list[str]:
    return [op_key(n.target) or str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def declined(ms: Any, rule: str) -> list[str]:
    return [f"{d.step}: {d.reason}" for d in ms.declined if d.rule == rule]


# ----------------------------------------------------------------------------- hf_rope


def _hf(xq: torch.Tensor, xk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        split: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rd = cos.shape[-1]

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2 if split is None else split
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def emb(x: torch.Tensor) -> torch.Tensor:
        r, p = x[..., :rd], x[..., rd:]
        return torch.cat([r * cos + rotate_half(r) * sin, p], dim=-1)

    return emb(xq), emb(xk)


class HfRope(torch.nn.Module):
    def __init__(self, split: int | None = None) -> None:
        super().__init__()
        self.split = split

    def forward(self, xq, xk, cos, sin):  # type: ignore[no-untyped-def]
        return _hf(xq, xk, cos, sin, self.split)


class HfRopeTable(torch.nn.Module):
    """freqs sliced from a [max_seq_len, rotary_dim] table at a start position."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos", torch.randn(16, 24))
        self.register_buffer("sin", torch.randn(16, 24))

    def forward(self, xq, xk):  # type: ignore[no-untyped-def]
        return _hf(xq, xk, self.cos[3:8], self.sin[3:8])


@pytest.mark.parametrize("rd", [32, 24])
def test_hf_rope_full_and_partial(rd: int) -> None:
    a = (torch.randn(1, 5, 4, 32), torch.randn(1, 5, 2, 32), torch.randn(5, rd), torch.randn(5, rd))
    ep = edge(HfRope(), a)
    ms = fuse(ep)
    assert [x.rule.name for x in ms.accepted] == ["hf_rope"]
    assert ops(ep).count("et_vk.apply_rotary_emb_hf.default") == 1
    assert "aten.neg.default" not in ops(ep)
    for got, want in zip(ep.module()(*a), HfRope()(*a), strict=True):
        assert torch.allclose(got, want, atol=1e-5)


def test_hf_rope_sliced_table_passes_table_and_start() -> None:
    a = (torch.randn(1, 5, 4, 32), torch.randn(1, 5, 2, 32))
    m = HfRopeTable()
    ep = edge(m, a)
    ms = fuse(ep)
    assert [x.rule.name for x in ms.accepted] == ["hf_rope"]
    (node,) = [n for n in ep.graph.nodes if op_key(n.target) == "et_vk.apply_rotary_emb_hf.default"]
    assert node.args[4] == 3 and tuple(node.args[2].meta["val"].shape) == (16, 24)
    for got, want in zip(ep.module()(*a), m(*a), strict=True):
        assert torch.allclose(got, want, atol=1e-5)


def test_hf_rope_near_miss_rotate_half_split_elsewhere() -> None:
    a = (torch.randn(1, 5, 4, 32), torch.randn(1, 5, 2, 32), torch.randn(5, 32), torch.randn(5, 32))
    ms = fuse(edge(HfRope(split=8), a))
    assert not any(x.rule.name == "hf_rope" for x in ms.accepted)
    assert any("splits at 8, not at rotary_dim / 2 = 16" in r for r in declined(ms, "hf_rope"))
