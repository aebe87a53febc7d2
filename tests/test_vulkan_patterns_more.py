"""The Vulkan patterns ported last (hf_rope, causal_sdpa, quantized_convolution,
the dynamic-activation and bmm routes of quantized_linear): positive match,
declined near miss (with its reason), numerics against eager through the et_vk
reference implementations. The hf_rope programs and the two drop-in lowerings also
run on ExecuTorch's real Vulkan runtime (one child for the module; the simulator is
the oracle without one)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
pytest.importorskip("torchao")

from executorch.exir import EdgeCompileConfig
from kv_cache_models import KVAttention
from vulkan_pattern_helpers import I8, declined, edge, fuse, ops, qd
from vulkan_real_programs import Program, lower
from vulkan_runtime_oracle import assert_real, session

from fusionkit.targets import op_key

# the hf_rope programs and the two drop-in lowerings below also run on the real runtime
real_vulkan = session()

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
        cos, sin = _hf_freqs(16, 24)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, xq, xk):  # type: ignore[no-untyped-def]
        return _hf(xq, xk, self.cos[3:8], self.sin[3:8])


def _hf_freqs(seq: int, rd: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [seq, rd] as transformers builds them: ``cat((freqs, freqs), -1)``, so the
    two halves are equal (the real runtime's shader reads the first half only)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rd, 2).float() / rd))
    emb = torch.outer(torch.arange(seq).float(), inv_freq).repeat(1, 2)
    return emb.cos(), emb.sin()


#: (name, path) -> the program lowered for the real runtime: once per module
_LOWERED: dict[tuple[str, str], Program] = {}


def _vulkan(name: str, path: str, model: torch.nn.Module, args: tuple[Any, ...]) -> Program:
    """``model`` lowered for Vulkan (fusionkit's drop-in, or stock 1.5.1), judged by
    check() and the simulator on ``args``."""
    if (name, path) not in _LOWERED:
        with torch.no_grad():
            eager = model(*args)
        _LOWERED[name, path] = lower(name, "hf_rope", path, torch.export.export(model, args),
                                     args, eager)
    return _LOWERED[name, path]


def _delegated_ops(p: Program) -> set[str]:
    from fusionkit.backends.vulkan_adapter.inspect.payload import decode_payload
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates

    assert p.pte is not None and p.lower_error is None, p.describe()
    return {c.name for d in vulkan_delegates(p.pte) for c in decode_payload(d.payload).graph.chain}


def _on_runtime(real: Any, p: Program) -> str:
    """What the real runtime did (ok / wrong / refused); the simulator's verdict without one."""
    if real is None:
        return p.simulator_outcome
    assert p.pte is not None
    p.real = real.run(p.pte, list(p.inputs))
    return p.outcome


HF = "et_vk.apply_rotary_emb_hf.default"


def test_hf_rope_sliced_table_passes_table_and_start(real_vulkan: Any) -> None:
    a = (torch.randn(1, 5, 4, 32), torch.randn(1, 5, 2, 32))
    m = HfRopeTable()
    ep = edge(m, a)
    ms = fuse(ep)
    assert [x.rule.name for x in ms.accepted] == ["hf_rope"]
    (node,) = [n for n in ep.graph.nodes if op_key(n.target) == "et_vk.apply_rotary_emb_hf.default"]
    assert node.args[4] == 3 and tuple(node.args[2].meta["val"].shape) == (16, 24)
    for got, want in zip(ep.module()(*a), m(*a), strict=True):
        assert torch.allclose(got, want, atol=1e-5)
    p = _vulkan("hf_rope table", "fusionkit", m, a)  # the table is a prepacked constant
    assert HF in _delegated_ops(p) and p.check_problems == []
    assert p.simulator == "ok" and _on_runtime(real_vulkan, p) == "ok", p.describe()


def test_hf_rope_near_miss_rotate_half_split_elsewhere(real_vulkan: Any) -> None:
    a = (torch.randn(1, 5, 4, 32), torch.randn(1, 5, 2, 32), torch.randn(5, 32), torch.randn(5, 32))
    ms = fuse(edge(HfRope(split=8), a))
    assert not any(x.rule.name == "hf_rope" for x in ms.accepted)
    assert any("splits at 8, not at rotary_dim / 2 = 16" in r for r in declined(ms, "hf_rope"))
    # on the runtime: ours (not fused) equals eager; stock's hf_rope pattern fuses this
    # rotate_half too, and its program computes a rotation the model does not do
    args = (*a[:2], *_hf_freqs(5, 32))
    ours = _vulkan("hf_rope split=8", "fusionkit", HfRope(split=8), args)
    stock = _vulkan("hf_rope split=8", "stock", HfRope(split=8), args)
    assert HF not in _delegated_ops(ours) and HF in _delegated_ops(stock)
    assert ours.simulator == "ok" and _on_runtime(real_vulkan, ours) == "ok", ours.describe()
    assert stock.simulator == "wrong" and _on_runtime(real_vulkan, stock) == "wrong", \
        stock.describe()


# ------------------------------------------------------- quantized_linear: dq8ca and bmm


def _q4(n: int = 12, k: int = 64, g: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return (torch.randint(-8, 8, (n, k), dtype=I8, generator=gen),
            torch.rand(n, k // g, generator=gen) * 0.1 + 0.01, torch.zeros(n, k // g, dtype=I8))


class DynActQ4Linear(torch.nn.Module):
    """What torchao's Int8DynamicActivationIntxWeightConfig(int4, PerGroup(32)) exports to."""

    def __init__(self, act_block: int = 64, quantize_act: bool = True) -> None:
        super().__init__()
        w, s, z = _q4()
        self.register_buffer("w", w)
        self.register_buffer("s", s)
        self.register_buffer("z", z)
        self.b = torch.nn.Parameter(torch.randn(12, generator=torch.Generator().manual_seed(3)))
        self.act_block, self.quantize_act = act_block, quantize_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ta = torch.ops.torchao
        if self.quantize_act:
            blk = [1, self.act_block]
            s, z = ta.choose_qparams_affine(x, "ASYMMETRIC", blk, I8, -128, 127, None, None, I8)
            x = ta.dequantize_affine(ta.quantize_affine(x, blk, s, z, I8, -128, 127),
                                     blk, s, z, I8, -128, 127)
        w = ta.dequantize_affine(self.w, [1, 32], self.s, self.z, I8, -8, 7)
        return torch.nn.functional.linear(x, w, self.b)


def test_quantized_linear_dq8ca_q4gsw_and_per_group_activation_near_miss() -> None:
    x = torch.randn(3, 64)
    m = DynActQ4Linear()
    ep = edge(m, (x,))
    ms = fuse(ep)
    assert [a.rule.name for a in ms.accepted] == ["quantized_linear_dq8ca_q4gsw"]
    (node,) = [n for n in ep.graph.nodes if op_key(n.target) == "et_vk.linear_dq8ca_q4gsw.default"]
    assert op_key(node.args[1].args[0].target) == "torchao.choose_qparams_affine.default"
    # sums [K/G, N] with N padded to 4, the row stride the runtime reads (12 -> 12)
    assert node.args[6] == 32 and tuple(node.args[4].meta["val"].shape) == (2, 12)
    # ExecuTorch's reference of linear_dq8ca_q4gsw computes in float (linear_q4gsw):
    # exact against the float-activation model, within the int8 rounding of eager
    assert torch.allclose(ep.module()(x), DynActQ4Linear(quantize_act=False)(x), atol=1e-4)
    assert torch.allclose(ep.module()(x), m(x), atol=0.1)
    ms = fuse(edge(DynActQ4Linear(act_block=32), (x,)))
    assert not any(a.rule.name == "quantized_linear_dq8ca_q4gsw" for a in ms.accepted)
    assert any("is not per token" in r for r in declined(ms, "quantized_linear_dq8ca_q4gsw"))


class BmmQ4(torch.nn.Module):
    def __init__(self, batch: int = 1) -> None:
        super().__init__()
        w, s, z = _q4(n=16)
        self.register_buffer("w", w)
        self.register_buffer("s", s)
        self.register_buffer("z", z)
        self.batch = batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.ops.torchao.dequantize_affine(self.w, [1, 32], self.s, self.z, I8, -8, 7)
        return torch.bmm(x, w.t().unsqueeze(0).expand(self.batch, -1, -1))


def test_quantized_linear_bmm_anchor_and_batch_near_miss() -> None:
    x = torch.randn(1, 3, 64)
    m = BmmQ4()
    ep = edge(m, (x,))
    ms = fuse(ep)
    assert [a.rule.name for a in ms.accepted] == ["quantized_linear_q4gsw"]
    assert "aten.bmm.default" not in ops(ep) and "et_vk.linear_q4gsw.default" in ops(ep)
    assert torch.allclose(ep.module()(x), m(x), atol=1e-4)
    x2 = torch.randn(2, 3, 64)
    ms = fuse(edge(BmmQ4(batch=2), (x2,)))
    assert not ms.accepted
    assert any("bmm with batch 2" in r for r in declined(ms, "quantized_linear_q4gsw"))


# ------------------------------------------------------------------------- causal_sdpa


def _in_place_edge(m: torch.nn.Module, a: tuple[Any, ...]) -> Any:
    """The program as VulkanBackend.preprocess sees it: in-place cache updates."""
    from torch.export._remove_auto_functionalized_pass import unsafe_remove_auto_functionalized_pass

    return unsafe_remove_auto_functionalized_pass(edge(m, a))


def test_causal_sdpa_and_start_pos_near_miss() -> None:
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    a = (torch.randn(1, 3, 4, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), torch.tensor([2]))
    from fusionkit.passes.vulkan.sdpa import causal_sdpa_rule

    def sdpa_fused(ms: Any) -> list[str]:
        return [x.rule.name for x in ms.accepted if x.rule.name == "causal_sdpa"]

    assert not sdpa_fused(fuse(edge(KVAttention(), a)))  # functional form: nothing to fuse
    ep = _in_place_edge(KVAttention(), a)
    # only this rule: select_as_symint (pos[0].item()) has no CPU reference to run
    ms = fuse(ep, [causal_sdpa_rule()])
    assert sdpa_fused(ms) == ["causal_sdpa"]
    assert "llama.update_cache.default" not in ops(ep) and "llama.custom_sdpa.default" not in ops(ep)
    (node,) = [n for n in ep.graph.nodes if op_key(n.target) == "llama.sdpa_with_kv_cache.default"]
    assert node.args[6] == 1 and node.args[9] is True
    assert torch.allclose(ep.module()(*a), KVAttention()(*a), atol=1e-5)
    ms = fuse(_in_place_edge(KVAttention(read_pos=0), a))
    assert not sdpa_fused(ms)
    assert any("the sdpa reads at 0" in r for r in declined(ms, "causal_sdpa"))


def test_causal_sdpa_position_read_once_per_op() -> None:
    """ExecuTorch's llama attention reads ``input_pos[0].item()`` once per op: three
    ``_local_scalar_dense`` nodes of one unwritten input are one position (fused); a read of
    the same input written in between is not."""
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from fusionkit.passes.vulkan.sdpa import causal_sdpa_rule

    a = (torch.randn(1, 3, 4, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), torch.tensor([2]))
    m = KVAttention(read_per_op=True)
    ep = _in_place_edge(m, a)
    reads = [n for n in ep.graph.nodes if op_key(n.target) == "aten._local_scalar_dense.default"]
    assert len(reads) == 3, [n.name for n in reads]
    ms = fuse(ep, [causal_sdpa_rule()])
    assert [x.rule.name for x in ms.accepted] == ["causal_sdpa"], declined(ms, "causal_sdpa")
    assert "llama.update_cache.default" not in ops(ep)
    torch.testing.assert_close(ep.module()(*a), KVAttention(read_per_op=True)(*a), atol=1e-5, rtol=1e-5)

    class WrittenBetween(KVAttention):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    pos: torch.Tensor) -> torch.Tensor:
            start = self._start(pos)
            torch.ops.llama.update_cache(k, self.kc, start)
            torch.ops.llama.update_cache(v, self.vc, start)
            pos.add_(1)
            return torch.ops.llama.custom_sdpa(q, self.kc, self.vc, self._start(pos), None, 0.0, True)

    ms = fuse(_in_place_edge(WrittenBetween(), tuple(x.clone() for x in a)), [causal_sdpa_rule()])
    assert not ms.accepted
    assert any("the sdpa reads at" in r for r in declined(ms, "causal_sdpa")), declined(ms, "causal_sdpa")


# ---------------------------------------------------------------- quantized_convolution


class QConv(torch.nn.Module):
    def __init__(self, oc: int = 8, ic: int = 4, k: int = 1, groups: int = 1,
                 transposed: bool = False, stride: int = 1, padding: int = 0,
                 relu: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4)
        shape = (ic, oc // groups, k, k) if transposed else (oc, ic // groups, k, k)
        self.register_buffer("w", torch.randint(-127, 128, shape, dtype=I8, generator=g))
        self.register_buffer("s", torch.rand(oc, generator=g) * 0.01 + 0.001)
        self.register_buffer("z", torch.zeros(oc, dtype=torch.int64))
        self.b = torch.nn.Parameter(torch.randn(oc, generator=g))
        self.cfg = (groups, transposed, stride, padding, relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups, transposed, stride, padding, relu = self.cfg
        xd = qd.dequantize_per_tensor(x, 0.05, 3, -128, 127, I8)
        w = qd.dequantize_per_channel(self.w, self.s, self.z, int(transposed), -127, 127, I8)
        conv = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
        y = conv(xd, w, self.b, stride, padding, groups=groups)
        return qd.quantize_per_tensor(torch.relu(y) if relu else y, 0.1, -2, -128, 127, I8)


def _conv_node(ep: Any) -> Any:
    (node,) = [n for n in ep.graph.nodes if (op_key(n.target) or "").startswith("et_vk.q8ta_conv2d")]
    return node


@pytest.mark.parametrize("cfg,ic,target", [
    ({}, 4, "et_vk.q8ta_conv2d_pw.default"),
    ({"k": 3, "groups": 8, "padding": 1}, 8, "et_vk.q8ta_conv2d_dw.default"),
])
def test_quantized_convolution_pw_dw_numerics(cfg: dict[str, Any], ic: int, target: str) -> None:
    m = QConv(ic=ic, **cfg)
    x = torch.randint(-128, 127, (1, ic, 6, 6), dtype=I8)
    ep = edge(m, (x,))
    ms = fuse(ep)
    assert [a.rule.name for a in ms.accepted] == ["quantized_convolution"]
    assert op_key(_conv_node(ep).target) == target and "aten.convolution.default" not in ops(ep)
    assert (ep.module()(x).int() - m(x).int()).abs().max() <= 1


@pytest.mark.parametrize("cfg,target", [
    ({"k": 3, "padding": 1, "relu": True}, "et_vk.q8ta_conv2d.default"),
    ({"k": 3, "transposed": True, "stride": 2}, "et_vk.q8ta_conv2d_transposed.default"),
])
def test_quantized_convolution_im2col_and_transposed_layout(cfg: dict[str, Any], target: str) -> None:
    # ExecuTorch 1.5.1's CPU references of q8ta_conv2d/_transposed view the packed
    # [OC, H*W*IC] weight as [OC, IC, H, W] (they ignore the (H, W, IC) order the stock
    # replacement packs), so they are no reference for k > 1: check the layout instead
    m = QConv(**cfg)
    x = torch.randint(-128, 127, (1, 4, 6, 6), dtype=I8)
    ep = edge(m, (x,))
    ms = fuse(ep)
    assert [a.rule.name for a in ms.accepted] == ["quantized_convolution"]
    node = _conv_node(ep)
    assert op_key(node.target) == target
    assert node.args[-1] == ("relu" if cfg.get("relu") else "none") and node.args[9] == [3, 3]
    from fusionkit.program_inputs import ProgramInputs

    packed = ProgramInputs(ep).constant(node.args[3]).tensor
    w = m.w if not cfg.get("transposed") else m.w.permute(1, 0, 2, 3)  # -> [OC, IC, H, W]
    oc, icg = w.shape[0], w.shape[1]
    assert packed.shape[-1] % 4 == 0
    back = packed[:, : 9 * icg].reshape(oc, 3, 3, icg).permute(0, 3, 1, 2)
    assert torch.equal(back, w)
    sums = ProgramInputs(ep).constant(node.args[4]).tensor
    assert torch.equal(sums[:oc], w.to(torch.int32).sum(dim=(1, 2, 3)))


def test_quantized_convolution_depthwise_channels_near_miss() -> None:
    m = QConv(oc=6, ic=6, k=3, groups=6, padding=1)
    ms = fuse(edge(m, (torch.randint(-128, 127, (1, 6, 6, 6), dtype=I8),)))
    assert not ms.accepted
    assert any("depthwise conv with 6 output channels" in r
               for r in declined(ms, "quantized_convolution"))


def test_dq8ca_is_fused_inside_preprocess_not_in_transform_passes(real_vulkan: Any) -> None:
    # ExecuTorch's op registry rejects et_vk.linear_dq8ca_q4gsw's int8 zero point at
    # partitioning time; the unfused ops are delegated and fused in preprocess (as stock)
    import importlib

    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, install, transform_passes

    install_mod = importlib.import_module("fusionkit.backends.vulkan_adapter.install")
    model, x = DynActQ4Linear(), torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    with install():
        before = install_mod.FUSED_IN_FUSE_PATTERNS_PASS.get("quantized_linear_dq8ca_q4gsw", 0)
        prog = to_edge_transform_and_lower(
            torch.export.export(model, (x,), strict=True),
            transform_passes=transform_passes(), partitioner=[VulkanPartitioner()],
            compile_config=EdgeCompileConfig(_check_ir_validity=False))
        after = install_mod.FUSED_IN_FUSE_PATTERNS_PASS.get("quantized_linear_dq8ca_q4gsw", 0)
    calls = [n for n in prog.exported_program().graph.nodes if n.op == "call_function"]
    assert "executorch_call_delegate" in str(calls[0].target)
    assert all(op_key(n.target) is None for n in calls)  # nothing left outside the delegate
    assert after == before + 1
    with torch.no_grad():
        want = model(x)
    assert_real(real_vulkan, prog, (x,), want, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("read_per_op", [False, True], ids=["one_read", "read_per_op"])
def test_kv_cache_model_lowers_through_the_adapter_drop_in(real_vulkan: Any, read_per_op: bool) -> None:
    """Symint-producing graphs: select_as_symint must not leave an undelegated et_vk op.
    The sdpa fusion made in preprocess calls the op by the name the runtime registers
    (``sdpa_with_kv_cache.default``, stock's ATen overload): the program loads and runs on
    the real runtime, caches and all, equal to eager. Also when each op reads the position
    itself, as ExecuTorch's llama attention does."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama.* ops)
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import (
        VulkanPartitioner,
        check,
        simulate,
        transform_passes,
    )
    from fusionkit.backends.vulkan_adapter.inspect.simulator import DelegateRun
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    m = KVAttention(read_per_op=read_per_op)
    # position 0: the fused op's caches start as uninitialised device memory (the runtime's
    # add_tensor_like), so a first call may read only rows it writes (cache_rows_written)
    a = (torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8),
         torch.tensor([0]))
    prog = to_edge_transform_and_lower(torch.export.export(m, a), transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()])
    assert check(prog) == []
    et = prog.to_executorch()
    with torch.no_grad():
        want = m(*a)
    runs: list[DelegateRun] = []
    torch.testing.assert_close(simulate(et, *a, trace=runs), want, atol=1e-5, rtol=1e-5)
    names = [op for r in runs for op in r.ops]
    # fused in preprocess, under the ATen overload's payload name (not the edge op's
    # "llama.sdpa_with_kv_cache.default", which the public runtime lacks)
    assert names.count("sdpa_with_kv_cache.default") == 1, names
    assert not any("update_cache" in n or "custom_sdpa" in n for n in names), names
    probed = cached_inventory()
    if probed is not None:  # the probe asks about what the rules create: nothing missing
        assert not probed.has_operator("llama.sdpa_with_kv_cache.default")
        assert check(et, runtime=probed) == []
    # the module's runtime process runs it in a child of its own (its fused op's caches start as
    # whatever memory it gets: runtime.uninitialized_state, test_vulkan_real_runtime_state)
    assert_real(real_vulkan, et, a, want, atol=1e-4, rtol=1e-4)
