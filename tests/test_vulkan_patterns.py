"""The ported Vulkan patterns: positive match, declined near miss (with its reason),
and numerics of the fused graph (et_vk reference kernels) against eager."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
pytest.importorskip("torchao")

from vulkan_pattern_helpers import I8, declined, edge, fuse, ops, qd

from fusionkit.targets import op_key


class Unary(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = I8) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = (-128, 127) if self.dtype == I8 else (0, 255)
        y = torch.relu(qd.dequantize_per_tensor(x, 0.1, 2, lo, hi, self.dtype))
        return qd.quantize_per_tensor(y, 0.05, -3, lo, hi, self.dtype)


def test_quantized_unary() -> None:
    x = torch.randint(-128, 127, (1, 8, 4, 4), dtype=I8)
    ep = edge(Unary(), (x,))
    ms = fuse(ep)
    assert [m.rule.name for m in ms.accepted] == ["quantized_unary"]
    assert "et_vk.q8ta_relu.default" in ops(ep) and "aten.relu.default" not in ops(ep)
    assert torch.equal(ep.module()(x), Unary()(x))
    xu = torch.randint(0, 255, (1, 8, 4, 4), dtype=torch.uint8)
    ms = fuse(edge(Unary(torch.uint8), (xu,)))
    assert not ms.accepted
    assert any("expected == -128, got 0" in r for r in declined(ms, "quantized_unary"))


class Binary(torch.nn.Module):
    def __init__(self, relu: bool = False, out_zp: int = 0) -> None:
        super().__init__()
        self.relu, self.out_zp = relu, out_zp

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.add(qd.dequantize_per_tensor(a, 0.1, 1, -128, 127, I8),
                      qd.dequantize_per_tensor(b, 0.2, -1, -128, 127, I8), alpha=2)
        if self.relu:
            y = torch.relu(y)
        return qd.quantize_per_tensor(y, 0.3, self.out_zp, -128, 127, I8)


def test_quantized_binary_alpha_and_relu_near_miss() -> None:
    a, b = (torch.randint(-128, 127, (2, 16), dtype=I8) for _ in range(2))
    ep = edge(Binary(), (a, b))
    ms = fuse(ep)
    assert [m.rule.name for m in ms.accepted] == ["quantized_binary"]
    assert ms.accepted[0].captures["alpha"] == 2  # read by name, not dropped
    diff = (ep.module()(a, b).int() - Binary()(a, b).int()).abs().max()
    assert diff <= 1
    ms = fuse(edge(Binary(relu=True), (a, b)))
    assert not any(m.rule.name == "quantized_binary" for m in ms.accepted)
    assert any("drop the relu" in r for r in declined(ms, "quantized_binary"))


def test_quantized_binary_relu_absorbed_by_the_output_zero_point() -> None:
    """A pt2e relu output is quantized with zero point -128: ``quantize`` clamps a negative
    sum to -128 as relu would (held-out RegNet: stock fuses it, as do we now, exactly)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-128, 127, (4, 64), dtype=I8, generator=g) for _ in range(2))
    ep = edge(Binary(relu=True, out_zp=-128), (a, b))
    ms = fuse(ep)
    assert [m.rule.name for m in ms.accepted] == ["quantized_binary"]
    assert "aten.relu.default" not in ops(ep)
    want = Binary(relu=True, out_zp=-128)(a, b)
    assert (want == -128).sum() > 16  # negative sums are there, clamped
    assert (ep.module()(a, b).int() - want.int()).abs().max() <= 1
    # the same add without the relu gives the same bytes: the relu is the clamp
    assert torch.equal(Binary(out_zp=-128)(a, b), want)


class Shuffle(torch.nn.Module):
    def __init__(self, leak: bool = False) -> None:
        super().__init__()
        self.leak = leak

    def forward(self, x: torch.Tensor) -> Any:
        y = torch.nn.functional.pixel_shuffle(qd.dequantize_per_tensor(x, 0.1, 0, -128, 127, I8), 2)
        q = qd.quantize_per_tensor(y, 0.05, 1, -128, 127, I8)
        return (q, y) if self.leak else q


def test_quantized_pixel_shuffle() -> None:
    x = torch.randint(-128, 127, (1, 16, 4, 5), dtype=I8)
    keep = [torch.ops.aten.pixel_shuffle.default]
    ep = edge(Shuffle(), (x,), keep)
    ms = fuse(ep)
    assert [m.rule.name for m in ms.accepted] == ["quantized_pixel_shuffle"]
    (node,) = [n for n in ep.graph.nodes if op_key(n.target) == "et_vk.q8ta_pixel_shuffle.default"]
    assert node.args[3] == 20.0
    assert (ep.module()(x).int() - Shuffle()(x).int()).abs().max() <= 1
    ms = fuse(edge(Shuffle(leak=True), (x,), keep))
    assert not ms.accepted
    assert any(r.startswith("escape") for r in declined(ms, "quantized_pixel_shuffle"))


def _q4_weight(n: int, k: int, zp: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-8, 8, (n, k), dtype=I8, generator=g)
    s = torch.rand(n, k // 32, generator=g) * 0.1 + 0.01
    return w, s, torch.full((n, k // 32), zp, dtype=I8)


class TorchaoEmb(torch.nn.Module):
    def __init__(self, zp: int = 0) -> None:
        super().__init__()
        w, s, z = _q4_weight(64, 128, zp)
        self.register_buffer("w", w)
        self.register_buffer("s", s)
        self.register_buffer("z", z)

    def forward(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        def table() -> torch.Tensor:
            return torch.ops.torchao.dequantize_affine(self.w, [1, 32], self.s, self.z, I8, -8, 7)
        return torch.nn.functional.embedding(i, table()) + torch.nn.functional.embedding(j, table())


def test_torchao_quantized_embedding_shared_weight_and_zero_point_near_miss() -> None:
    i, j = torch.tensor([0, 5, 63]), torch.tensor([1, 2, 3])
    m = TorchaoEmb()
    ep = edge(m, (i, j))
    ms = fuse(ep)
    assert [x.rule.name for x in ms.accepted] == ["torchao_quantized_embedding"] * 2
    fused = [n for n in ep.graph.nodes if op_key(n.target) == "et_vk.embedding_q4gsw.default"]
    assert fused[0].args[0] is fused[1].args[0]  # one packed constant for both lookups
    assert fused[0].args[0].meta["val"].dtype == torch.uint8
    assert torch.allclose(ep.module()(i, j), m(i, j), atol=1e-5)
    ms = fuse(edge(TorchaoEmb(zp=1), (i, j)))
    assert not ms.accepted
    assert any("not all zeros" in r for r in declined(ms, "torchao_quantized_embedding"))


class QLinear(torch.nn.Module):
    def __init__(self, k: int = 64, n: int = 9, requant: bool = True) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randint(-127, 128, (n, k), dtype=I8, generator=g))
        self.register_buffer("s", torch.rand(n, generator=g) * 0.01 + 0.001)
        self.register_buffer("z", torch.zeros(n, dtype=torch.int64))
        self.requant = requant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xd = qd.dequantize_per_tensor(x, 0.05, 3, -128, 127, I8)
        w = qd.dequantize_per_channel(self.w, self.s, self.z, 0, -127, 127, I8)
        y = torch.nn.functional.linear(xd, w)
        return qd.quantize_per_tensor(y, 0.1, -2, -128, 127, I8) if self.requant else y


@pytest.mark.parametrize("rows,target", [(4, "et_vk.q8ta_linear.default"),
                                         (1, "et_vk.q8ta_linear_gemv.default")])
def test_quantized_linear_q8ta(rows: int, target: str) -> None:
    x = torch.randint(-128, 127, (rows, 64), dtype=I8)
    # N=12: with N % 4 != 0 the fused op gets padded scales, which ExecuTorch's CPU
    # reference of q8ta_linear cannot run (it dequantizes the [N, K] weight with them)
    m = QLinear(n=12)
    ep = edge(m, (x,))
    ms = fuse(ep)
    assert [a.rule.name for a in ms.accepted] == ["quantized_linear_q8ta"]
    assert target in ops(ep) and "aten.mm.default" not in ops(ep)
    assert (ep.module()(x).int() - m(x).int()).abs().max() <= 1
    assert any("re-quantized" in r for r in declined(ms, "quantized_linear_q8csw"))


def test_quantized_linear_q8csw_and_in_channels_near_miss() -> None:
    x = torch.randint(-128, 127, (4, 64), dtype=I8)
    m = QLinear(requant=False)
    ep = edge(m, (x,))
    ms = fuse(ep)
    # an int8 graph input: the runtime's linear_q8ta_q8csw takes the float activation (it
    # quantizes it itself), so the Vulkan delegate's operand dtypes decline the fusion;
    # a float input quantized in the graph is fused (tests/test_bug_class_dtypes.py)
    assert not ms.accepted
    assert any("takes 'x' as float16 / float32 only" in r
               for r in declined(ms, "quantized_linear_q8csw"))
    x6 = torch.randint(-128, 127, (4, 6), dtype=I8)
    ms = fuse(edge(QLinear(k=6, requant=False), (x6,)))
    assert not ms.accepted
    assert any("multiple of 4" in r for r in declined(ms, "quantized_linear_q8csw"))


class Q4Linear(torch.nn.Module):
    def __init__(self, bad: bool = False) -> None:
        super().__init__()
        w, s, z = _q4_weight(16, 64)
        if bad:
            w[0, 0] = 9  # outside the 4-bit range
        self.register_buffer("w", w)
        self.register_buffer("s", s)
        self.register_buffer("z", z)
        self.b = torch.nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.ops.torchao.dequantize_affine(self.w, [1, 32], self.s, self.z, I8, -8, 7)
        return torch.nn.functional.linear(x, w, self.b)


def test_quantized_linear_q4gsw_and_range_near_miss() -> None:
    x = torch.randn(3, 64)
    m = Q4Linear()
    ep = edge(m, (x,))
    ms = fuse(ep)
    assert [a.rule.name for a in ms.accepted] == ["quantized_linear_q4gsw"]
    assert torch.allclose(ep.module()(x), m(x), atol=1e-4)
    ms = fuse(edge(Q4Linear(bad=True), (x,)))
    assert not ms.accepted
    assert any("outside [-8, 7]" in r for r in declined(ms, "quantized_linear_q4gsw"))


def test_rope_tables_shared_by_many_layers_fuse_in_every_layer() -> None:
    """A deep model's layers all read one pair of tables: every earlier layer's outputs
    are downstream of them too, and must not use up a later layer's search."""
    from executorch.backends.vulkan.patterns.rope import RotaryEmbeddingPattern

    class Stack(torch.nn.Module):
        def __init__(self, layers: int) -> None:
            super().__init__()
            self.rope, self.layers = RotaryEmbeddingPattern(), layers

        def forward(self, xq, xk, c, s):  # type: ignore[no-untyped-def]
            for _ in range(self.layers):
                q, k = self.rope(xq, xk, c, s)
                xq, xk = q * 0.5 + xq, k * 0.5 + xk
            return xq, xk

    layers = 20  # > MAX_BINDINGS_PER_ROOT / 2: two candidate outputs per earlier layer
    a = (torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8), torch.randn(3, 4), torch.randn(3, 4))
    m = Stack(layers)
    ep = edge(m, a)
    ms = fuse(ep)
    assert [x.rule.name for x in ms.accepted] == ["export_llama_rope"] * layers
    assert ops(ep).count("et_vk.apply_rotary_emb.default") == layers
    for got, want in zip(ep.module()(*a), m(*a), strict=True):
        assert torch.allclose(got, want, atol=1e-4)


def test_rope_multi_output_and_escape_near_miss() -> None:
    from executorch.backends.vulkan.patterns.rope import RotaryEmbeddingPattern

    a = (torch.randn(1, 5, 4, 32), torch.randn(1, 5, 2, 32), torch.randn(5, 16), torch.randn(5, 16))
    m = RotaryEmbeddingPattern()
    ep = edge(m, a)
    ms = fuse(ep)
    assert [x.rule.name for x in ms.accepted] == ["export_llama_rope"]
    assert ops(ep).count("et_vk.apply_rotary_emb.default") == 1
    for got, want in zip(ep.module()(*a), m(*a), strict=True):
        assert torch.allclose(got, want, atol=1e-5)

    class Leaky(RotaryEmbeddingPattern):
        def forward(self, xq, xk, c, s):  # type: ignore[no-untyped-def]
            q, k = super().forward(xq, xk, c, s)
            return q, k, q.reshape(1, 5, 4, 16, 2)[..., 0]  # fine: uses an output only

    ms = fuse(edge(Leaky(), a))
    assert [x.rule.name for x in ms.accepted] == ["export_llama_rope"]
    b = (a[0], a[1], torch.randn(5, 8), torch.randn(5, 8))  # freqs too short for head_dim 32

    class Short(torch.nn.Module):
        def forward(self, xq, xk, c, s):  # type: ignore[no-untyped-def]
            c2, s2 = torch.cat([c, c], -1), torch.cat([s, s], -1)
            return RotaryEmbeddingPattern()(xq, xk, c2, s2)

    ms = fuse(edge(Short(), b))
    assert [x.rule.name for x in ms.accepted] == ["export_llama_rope"]  # cat output is [5, 16]
