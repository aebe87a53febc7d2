"""Quantized models lowered by the drop-in and run from their Vulkan payloads.

Each model is lowered with ``transform_passes()`` + ``VulkanPartitioner()``, run
by :func:`~fusionkit.backends.vulkan_adapter.simulate` from the serialized
payloads, and compared with the *quantized* eager model (the float model is not
the reference: quantization error is not what is measured). Tolerances per
family are in the README: 4-bit weight-only and 8da4w linears and the 4-bit
embedding compute what eager computes up to float summation order (1e-4); the
int8 convolutions re-quantize their output, so a value may land one int8 step
away (one output scale).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from torch import nn

pytest.importorskip("torchao")

from torchao.quantization import (
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerGroup
from vulkan_runtime_oracle import assert_real, session

from fusionkit import op_key

real_vulkan = session()  # the real runtime, one child for the module (simulator-only without)

#: torch's 4-bit dtype (missing from torch's type stubs)
INT4: Any = torch.int4  # type: ignore[attr-defined]

DIM, HEADS, HIDDEN, VOCAB = 128, 4, 256, 64
HEAD_DIM = DIM // HEADS


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    """A Llama decoder layer: RMSNorm, causal attention, RMSNorm, SwiGLU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(DIM), RMSNorm(DIM)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], HEADS, HEAD_DIM).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        q, k, v = self.heads(self.wq(h)), self.heads(self.wk(h)), self.heads(self.wv(h))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(x.shape))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Decoder(nn.Module):
    def __init__(self, layers: int = 1) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = RMSNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x))


def _is_linear(m: nn.Module, _: str) -> bool:
    return isinstance(m, nn.Linear)


def _is_embedding(m: nn.Module, _: str) -> bool:
    return isinstance(m, nn.Embedding)


def lower_exported(ep: Any) -> Any:
    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

    return to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()])


def lower(m: nn.Module, args: tuple[Any, ...]) -> Any:
    return lower_exported(torch.export.export(m, args))


def delegate_ops(prog: Any) -> list[str]:
    from fusionkit.backends.vulkan_adapter import decode_payload

    return [name for _, lm in prog.exported_program().graph_module.named_children()
            if hasattr(lm, "processed_bytes")
            for name in decode_payload(lm.processed_bytes).graph.op_names()]


def decoder(config: Any, embedding: bool = False, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = Decoder().eval()
    quantize_(m, config, filter_fn=_is_linear)
    if embedding:
        quantize_(m, IntxWeightOnlyConfig(weight_dtype=INT4, granularity=PerGroup(32)),
                  filter_fn=_is_embedding)
    return m


def check_decoder(m: nn.Module, fused: str, seqs: tuple[int, ...], real: Any = None,
                  real_tol: float = 1e-4) -> Any:
    """Lower for each sequence length, simulate, compare with the quantized eager model;
    ``check()`` finds nothing, and the real runtime (``real``) computes the same."""
    from fusionkit.backends.vulkan_adapter import check, simulate

    prog = None
    for s in seqs:
        tokens = torch.randint(0, VOCAB, (1, s), generator=torch.Generator().manual_seed(s))
        prog = lower(m, (tokens,))
        assert [n for n in prog.exported_program().graph.nodes
                if n.op == "call_function" and (op_key(n.target) or "").startswith("et_vk")] == []
        ops = delegate_ops(prog)
        # 7 linears in the layer + the output projection
        assert ops.count(fused) == 8, sorted(set(ops))
        with torch.no_grad():
            want = m(tokens)
        got = simulate(prog, tokens)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert check(prog) == []
        assert_real(real, prog, (tokens,), want, atol=real_tol, rtol=real_tol)
    return prog


@pytest.mark.slow
@pytest.mark.parametrize(("group", "seq"), [(32, 5), (128, 1)])
def test_llama_decoder_int4_weight_only(real_vulkan: Any, group: int, seq: int) -> None:
    m = decoder(IntxWeightOnlyConfig(weight_dtype=INT4, granularity=PerGroup(group)))
    check_decoder(m, "et_vk.linear_q4gsw.default", seqs=(seq,), real=real_vulkan)


@pytest.mark.slow
def test_llama_decoder_8da4w(real_vulkan: Any) -> None:
    m = decoder(Int8DynamicActivationIntxWeightConfig(weight_dtype=INT4,
                                                      weight_granularity=PerGroup(32)))
    # on the runtime the int8 activations' rounding may land one step away: 1e-3
    check_decoder(m, "et_vk.linear_dq8ca_q4gsw.default", seqs=(3,), real=real_vulkan,
                  real_tol=1e-3)


@pytest.mark.slow
def test_llama_decoder_with_quantized_embedding(real_vulkan: Any) -> None:
    m = decoder(IntxWeightOnlyConfig(weight_dtype=INT4, granularity=PerGroup(64)),
                embedding=True, seed=1)
    prog = check_decoder(m, "et_vk.linear_q4gsw.default", seqs=(4,), real=real_vulkan)
    assert delegate_ops(prog).count("et_vk.embedding_q4gsw.default") == 1


class KVDecoder(nn.Module):
    """One decode step of a Llama layer with a KV cache the caller carries between calls.

    ``forward(x, k_cache, v_cache, pos) -> (y, k_cache, v_cache)``: the new key and
    value are written at ``pos``, attention reads positions ``<= pos``.
    """

    def __init__(self, capacity: int = 8) -> None:
        super().__init__()
        self.block = Block()
        self.capacity = capacity

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = self.block
        h = b.attn_norm(x)
        q = b.heads(b.wq(h))
        k_cache = k_cache.index_copy(2, pos, b.heads(b.wk(h)))
        v_cache = v_cache.index_copy(2, pos, b.heads(b.wv(h)))
        mask = (torch.arange(self.capacity) <= pos).view(1, self.capacity)
        a = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        x = x + b.wo(a.transpose(1, 2).reshape(x.shape))
        h = b.mlp_norm(x)
        return x + b.w2(F.silu(b.w1(h)) * b.w3(h)), k_cache, v_cache


def unused_user_inputs(ep: Any) -> list[str]:
    """User-input placeholders the exported graph never reads.

    ``torch.export`` traces *one* tensor when the same tensor object is passed
    for two arguments: the graph reads only the last of them, and the program
    then ignores the other argument on every later call (pytorch/pytorch#144683,
    "expected behavior"; pinned in ``tests/test_export_aliased_inputs.py``).
    """
    names = set(ep.graph_signature.user_inputs)
    return [n.name for n in ep.graph.nodes
            if n.op == "placeholder" and n.name in names and not n.users]


@pytest.mark.slow
def test_kv_cache_decoder_several_steps(real_vulkan: Any) -> None:
    from fusionkit.backends.vulkan_adapter import simulate

    torch.manual_seed(3)
    m = KVDecoder().eval()
    quantize_(m, IntxWeightOnlyConfig(weight_dtype=INT4, granularity=PerGroup(32)),
              filter_fn=_is_linear)
    cache = torch.zeros(1, HEADS, m.capacity, HEAD_DIM)
    # two distinct cache tensors: the same object twice would make export read
    # v_cache for both caches (see unused_user_inputs)
    example = (torch.randn(1, 1, DIM), cache, cache.clone(), torch.tensor([0]))
    ep = torch.export.export(m, example)
    assert unused_user_inputs(ep) == []
    prog = lower_exported(ep)
    assert delegate_ops(prog).count("et_vk.linear_q4gsw.default") == 7
    et = prog.to_executorch()
    kc = vc = ek = ev = rk = rv = cache
    for step in range(5):
        x, pos = torch.randn(1, 1, DIM), torch.tensor([step])
        y, kc, vc = simulate(prog, x, kc, vc, pos)
        with torch.no_grad():
            want, ek, ev = m(x, ek, ev, pos)
        torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close((kc, vc), (ek, ev), atol=1e-4, rtol=1e-4)
        # the runtime carries its own caches from step to step
        real = assert_real(real_vulkan, et, (x, rk, rv, pos), (want, ek, ev), atol=1e-4,
                           rtol=1e-4)
        if real is not None:
            rk, rv = real[1], real[2]
    assert bool(kc[:, :, 4].abs().sum() > 0) and bool(kc[:, :, 5:].eq(0).all())


class ConvNet(nn.Module):
    """Every q8ta convolution route: im2col (3x3), pointwise (1x1), depthwise."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.pw = nn.Conv2d(8, 16, 1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.c2 = nn.Conv2d(16, 8, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c1(x))
        x = F.relu(self.pw(x))
        x = F.relu(self.dw(x))
        return self.c2(x)


@pytest.mark.slow
def test_pt2e_quantized_conv_net(real_vulkan: Any) -> None:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from fusionkit.backends.vulkan_adapter import simulate

    torch.manual_seed(4)
    x = torch.randn(1, 4, 8, 8)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(ConvNet().eval(), (x,)).module(), quantizer)
    for _ in range(4):
        prepared(torch.randn(1, 4, 8, 8))
    q = convert_pt2e(prepared)
    prog = lower(q, (x,))
    ops = delegate_ops(prog)
    for route in ("q8ta_conv2d", "q8ta_conv2d_pw", "q8ta_conv2d_dw"):
        assert f"et_vk.{route}.default" in ops, sorted(set(ops))
    with torch.no_grad():
        want = q(x)
    got = simulate(prog, x)
    # the last conv's output is dequantized from int8: one output step is the resolution
    step = float((want.abs().max() / 127).item())
    assert float((got - want).abs().max()) <= 1.01 * step
    assert_real(real_vulkan, prog, (x,), want, atol=1.01 * step, rtol=0.0)


class Conv1dResidualNet(nn.Module):
    """A held-out architecture: a pt2e-quantized conv1d, and a residual add + relu
    between two convs (RegNet's shape), whose output observer gives zero point -128."""

    def __init__(self) -> None:
        super().__init__()
        self.c1d = nn.Conv1d(8, 8, 3, padding=1)
        self.c1 = nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = F.relu(self.c1d(x.flatten(2))).reshape(x.shape)
        y = F.relu(self.c1(t) + t)
        return self.c2(y)


def _pt2e(m: nn.Module, x: torch.Tensor) -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(m.eval(), (x,)).module(), quantizer)
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        prepared(torch.randn(x.shape, generator=g))
    return convert_pt2e(prepared)


@pytest.mark.slow
def test_pt2e_quantized_conv1d_and_residual_relu(real_vulkan: Any) -> None:
    """Stock's quantized-convolution fusion unpacks every conv weight as 4-D: a quantized
    conv1d kills the lowering in FusePatternsPass ('not enough values to unpack (expected 4,
    got 3)'). Ours leaves the conv1d (whose weight the graph dequantizes) on the CPU and
    fuses the rest: the residual add + relu becomes et_vk.q8ta_add (the relu is the output
    quantization's clamp)."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as StockVulkanPartitioner,
    )
    from vulkan_runtime_oracle import adapter_state_restored

    import fusionkit.backends.vulkan_adapter as vk
    from fusionkit.backends.vulkan_adapter import constant_serializer, simulate

    torch.manual_seed(6)
    x = torch.randn(1, 8, 4, 4)
    q = _pt2e(Conv1dResidualNet(), x)
    with adapter_state_restored():
        vk.uninstall()
        constant_serializer.uninstall()
        with pytest.raises(Exception) as stock:
            to_edge_transform_and_lower(torch.export.export(q, (x,)),
                                        partitioner=[StockVulkanPartitioner()])
    root: BaseException = stock.value
    while root.__cause__ is not None:
        root = root.__cause__
    assert "not enough values to unpack (expected 4, got 3)" in str(root), root
    prog = lower(q, (x,))
    ops = delegate_ops(prog)
    assert {"et_vk.q8ta_add.default", "et_vk.q8ta_conv2d.default",
            "et_vk.q8ta_conv2d_pw.default"} <= set(ops), sorted(set(ops))
    # the conv1d's weight is dequantized by the graph: kept on the CPU (the runtime would
    # refuse conv_with_clamp's non-constant weight at load; before 6c32af9 ours was refused)
    assert not {"aten.convolution.default", "et_vk.conv_with_clamp.default"} & set(ops)
    with torch.no_grad():
        want = q(x)
    step = float((want.abs().max() / 127).item())
    got = simulate(prog, x)
    # three int8 layers, each may round an element one step off eager's: the last conv
    # carries its inputs' steps (measured: 2.8 output steps); the runtime equals the simulator
    assert float((got - want).abs().max()) <= 4 * step
    assert_real(real_vulkan, prog, (x,), got, atol=1.01 * step, rtol=0.0)
