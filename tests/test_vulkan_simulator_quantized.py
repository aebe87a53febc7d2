"""The simulator's quantized / KV-cache operators and the runtime conditions they enforce.

* Every operator of ExecuTorch 1.5.1's Vulkan op registry (``op_registry.py``,
  enumerated from ``vulkan_supported_ops``) is in ``SUPPORTED_OPS``.
* Each runtime implementation (``inspect/quantized_ops.py``) is compared, on
  generated cases (hypothesis), with the eager quantized computation written
  independently here (dequantize -> float op -> quantize), and with ExecuTorch's
  reference op where the two agree; where they do not (q8ta conv k > 1,
  linear_q8ta_q8csw / dq8ca input quantization), the test shows the reference
  is the one that is off.
* Synthetic payloads (one quantized op, constants in named data) run through
  ``run_payload``: a prepacked argument that is a runtime tensor raises
  ``NotConstantError``; each violated runtime condition raises
  ``RuntimeConditionError`` naming op, argument and the runtime's condition.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_cache_models import KVAttention

from fusionkit.backends.vulkan_adapter.inspect import quantized_ops as Q
from fusionkit.backends.vulkan_adapter.inspect import runtime_conditions as RC
from fusionkit.backends.vulkan_adapter.inspect import simulator as S

pytestmark = pytest.mark.usefixtures("vulkan_ops")


def _pack_q4_linear(w: torch.Tensor) -> torch.Tensor:
    """[N, K] in [-8, 7] -> [N, K/2] uint8, even K in the low nibble (written here)."""
    u = (w.to(torch.int16) + 8).to(torch.uint8)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).contiguous()


def _pack_q4_embedding(w: torch.Tensor) -> torch.Tensor:
    u = (w.to(torch.int16) + 8).to(torch.uint8)
    return ((u[:, 0::2] << 4) | u[:, 1::2]).contiguous()


def _quant(v: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
    return torch.clamp(torch.round(v / scale) + zp, -128, 127).to(torch.int8)


# ------------------------------------------------------------------ registry


def _registry_names() -> dict[str, str]:
    """serialized op name -> the op_registry key it comes from."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  llama ops
    from executorch.backends.vulkan.op_registry import vulkan_supported_ops

    names: dict[str, str] = {}
    for key in vulkan_supported_ops:
        if isinstance(key, str):  # "ns::op": the serializer writes node.target.__name__
            ns, op = key.split("::")
            names[f"{ns}.{op}.default"] = key
        else:
            names[key.__name__] = str(key)
    names.pop("getitem")  # not an op call: the serializer resolves it to a ValueList entry
    return names


def test_every_registry_op_is_supported() -> None:
    names = _registry_names()
    assert len(names) > 150
    missing = sorted(set(names) - S.SUPPORTED_OPS)
    assert missing == []
    S._load_op_libraries()
    for name in S.SUPPORTED_OPS:
        assert name in S._SPECIAL or name in S.RUNTIME_OP_NAMES or S._torch_op(name) is not None


def test_every_checked_op_is_supported() -> None:
    S._load_op_libraries()
    for c in RC.CONDITIONS:
        if c.op in RC.NOT_SIMULATED:  # in the table for the runtime only: no torch op
            assert c.op not in S.SUPPORTED_OPS and S._torch_op(c.op) is None, c.op
            continue
        assert c.op in S.SUPPORTED_OPS, c.op
        schema = {a.name for a in S._torch_op(c.op)._schema.arguments}
        assert set(c.args) <= schema, (c.op, c.name, set(c.args) - schema)
    for op, names in RC.PREPACKED.items():
        assert set(names) <= {a.name for a in S._torch_op(op)._schema.arguments}, op
        assert c.condition and c.source and c.effect in ("abort", "garbage")
    for op in RC.PREPACKED:
        assert op in S.SUPPORTED_OPS, op


# ------------------------------------------------------------ linear ops

dims4 = st.sampled_from([8, 16, 24, 32, 40])


@settings(max_examples=12)
@given(n=st.sampled_from([4, 8, 12, 24]), groups=st.integers(1, 3), g=st.sampled_from([8, 16, 32]),
       m=st.integers(1, 5), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_linear_q4gsw_is_the_grouped_int4_linear(n: int, groups: int, g: int, m: int,
                                                 bias: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    k = g * groups
    w = torch.randint(-8, 8, (n, k), generator=gen)
    s = torch.rand(n, groups, generator=gen) * 0.1 + 0.01
    b = torch.randn(n, generator=gen) if bias else None
    x = torch.randn(m, k, generator=gen)
    a = {"self": x, "weights": _pack_q4_linear(w), "weight_scales": s.t().contiguous(),
         "group_size": g, "bias": b}
    assert RC.violated("et_vk.linear_q4gsw.default", a) == []
    got = Q.linear_q4gsw(a)
    want = F.linear(x, w.float() * s.repeat_interleave(g, dim=1), b)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # ExecuTorch's reference agrees here
    ref = torch.ops.et_vk.linear_q4gsw(x, a["weights"], a["weight_scales"], g, b)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def _per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lo = x.amin(-1).clamp(max=0)
    hi = x.amax(-1).clamp(min=0)
    scale = (hi - lo) / 255
    zp = torch.clamp(torch.round(-128 - lo / scale), -128, 127)
    return scale, zp.to(torch.int32)


@settings(max_examples=12)
@given(n=st.sampled_from([8, 16, 24]), groups=st.integers(1, 3), g=st.sampled_from([16, 32]),
       m=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_linear_dq8ca_q4gsw_quantizes_the_input(n: int, groups: int, g: int, m: int,
                                                seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    k = g * groups
    w = torch.randint(-8, 8, (n, k), generator=gen)
    s = torch.rand(n, groups, generator=gen) * 0.1 + 0.01
    x = torch.randn(m, k, generator=gen)
    sx, zx = _per_token(x)
    sums = w.view(n, groups, g).sum(-1).t().contiguous().to(torch.int32)
    a = {"input": x, "input_scales": sx, "input_zp": zx, "weights": _pack_q4_linear(w),
         "weight_sums": sums, "weight_scales": s.t().contiguous(), "group_size": g, "bias": None}
    assert RC.violated("et_vk.linear_dq8ca_q4gsw.default", a) == []
    got = Q.linear_dq8ca_q4gsw(a)
    qx = torch.clamp(torch.round(x / sx[:, None]) + zx[:, None], -128, 127)
    xdq = (qx - zx[:, None]) * sx[:, None]
    want = F.linear(xdq, w.float() * s.repeat_interleave(g, dim=1))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # ExecuTorch's reference ignores the input quantization (a weight-only linear)
    ref = torch.ops.et_vk.linear_dq8ca_q4gsw(x, sx, zx, a["weights"], sums, a["weight_scales"],
                                             g, None)
    torch.testing.assert_close(ref, F.linear(x, w.float() * s.repeat_interleave(g, dim=1)))


def test_dq8ca_weight_sums_are_read_with_stride_n() -> None:
    # N % 8 == 4: ExecuTorch pads each row of sums to 8; the shader reads row g at g * N
    n, g, k = 12, 16, 32
    w = torch.randint(-8, 8, (n, k))
    sums = F.pad(w.view(n, 2, g).sum(-1).t().to(torch.int32), (0, 4))
    a = {"input": torch.randn(2, k), "input_scales": torch.full((2,), 0.02),
         "input_zp": torch.tensor([3, -5], dtype=torch.int32),
         "weights": _pack_q4_linear(w), "weight_sums": sums,
         "weight_scales": torch.full((2, n), 0.05), "group_size": g, "bias": None}
    bad = RC.violated("et_vk.linear_dq8ca_q4gsw.default", a)
    assert [c.name for c in bad] == ["weight_sums_shape"]
    unpadded = dict(a, weight_sums=sums[:, :n].contiguous())
    assert RC.violated("et_vk.linear_dq8ca_q4gsw.default", unpadded) == []
    assert not torch.allclose(Q.linear_dq8ca_q4gsw(a), Q.linear_dq8ca_q4gsw(unpadded))


@settings(max_examples=12)
@given(n=st.sampled_from([4, 8, 12]), k=dims4, m=st.integers(1, 4), relu=st.booleans(),
       pad=st.booleans(), seed=st.integers(0, 2**16))
def test_q8ta_linear_is_the_int8_linear(n: int, k: int, m: int, relu: bool, pad: bool,
                                        seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    ws = torch.rand(n, generator=gen) * 0.01 + 1e-3
    b = torch.randn(n, generator=gen)
    x = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    s_in, z_in, s_out, z_out = 0.05, 2, 0.3, -4
    # the fusion pads scales / bias / sums to a multiple of 4 (n = 12 -> 12, 4 -> 4)
    extra = 4 if pad else 0
    a = {"x": x, "input_scale": s_in, "input_zero_point": z_in, "weights": w,
         "weight_sums": F.pad(w.to(torch.int32).sum(1), (0, extra)),
         "weight_scales": F.pad(ws, (0, extra)), "output_scale": s_out,
         "output_zero_point": z_out, "bias": F.pad(b, (0, extra)),
         "activation": "relu" if relu else "none"}
    got = Q.q8ta_linear(a)
    y = F.linear((x.float() - z_in) * s_in, w.float() * ws[:, None], b)
    want = _quant(y.relu() if relu else y, s_out, z_out)
    assert (got.int() - want.int()).abs().max() <= 1
    if pad:  # ExecuTorch's reference fails on padded scales
        with pytest.raises(RuntimeError):
            torch.ops.et_vk.q8ta_linear(x, s_in, z_in, w, a["weight_sums"], a["weight_scales"],
                                        s_out, z_out, a["bias"], a["activation"])


@settings(max_examples=12)
@given(n=st.sampled_from([4, 8]), k=dims4, m=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_linear_q8ta_q8csw_quantizes_the_input(n: int, k: int, m: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    ws = torch.rand(n, generator=gen) * 0.01 + 1e-3
    x = torch.randn(m, k, generator=gen)
    s_in, z_in = 0.02, -3
    a = {"x": x, "input_scale": s_in, "input_zero_point": z_in, "weights": w,
         "weight_sums": w.to(torch.int32).sum(1), "weight_scales": ws, "bias": None}
    got = Q.linear_q8ta_q8csw(a)
    xdq = (_quant(x, s_in, z_in).float() - z_in) * s_in
    torch.testing.assert_close(got, F.linear(xdq, w.float() * ws[:, None]), atol=1e-4,
                               rtol=1e-4)


# ------------------------------------------------------------ convolution


def _conv_case(gen: torch.Generator, ic: int, oc: int, k: int, groups: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randint(-128, 128, (1, ic, 7, 6), generator=gen, dtype=torch.int8)
    w = torch.randint(-127, 128, (oc, ic // groups, k, k), generator=gen, dtype=torch.int8)
    ws = torch.rand(oc, generator=gen) * 0.01 + 1e-3
    b = torch.randn(oc, generator=gen)
    return x, w, ws, b


def _im2col(w: torch.Tensor) -> torch.Tensor:
    oc, icg, kh, kw = w.shape
    m = w.permute(0, 2, 3, 1).reshape(oc, kh * kw * icg)
    return F.pad(m, (0, -m.shape[1] % 4)).contiguous()


S_IN, Z_IN, S_OUT, Z_OUT = 0.04, 5, 0.25, -3


def _conv_args(x: torch.Tensor, wmat: torch.Tensor, sums: torch.Tensor, ws: torch.Tensor,
               b: torch.Tensor, k: int, stride: int, pad: int, groups: int) -> dict[str, Any]:
    return {"x": x, "input_scale": S_IN, "input_zero_point": Z_IN, "weights": wmat,
            "weight_sums": sums, "weight_scales": ws, "output_scale": S_OUT,
            "output_zero_point": Z_OUT, "bias": b, "kernel_size": [k, k],
            "stride": [stride, stride], "padding": [pad, pad], "dilation": [1, 1],
            "groups": groups, "activation": "none"}


@settings(max_examples=12)
@given(k=st.sampled_from([1, 3]), stride=st.integers(1, 2), pad=st.integers(0, 1),
       groups=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_q8ta_conv2d_reads_the_im2col_layout(k: int, stride: int, pad: int, groups: int,
                                             seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, w, ws, b = _conv_case(gen, 8, 8, k, groups)
    wmat = _im2col(w)
    a = _conv_args(x, wmat, wmat.to(torch.int32).sum(1), ws, b, k, stride, pad, groups)
    assert RC.violated("et_vk.q8ta_conv2d.default", a) == []
    got = Q.q8ta_conv2d(a)
    y = F.conv2d((x.float() - Z_IN) * S_IN, w.float() * ws.view(-1, 1, 1, 1), b, stride, pad,
                 1, groups)
    want = _quant(y, S_OUT, Z_OUT)
    assert (got.int() - want.int()).abs().max() <= 1
    ref = torch.ops.et_vk.q8ta_conv2d(x, S_IN, Z_IN, wmat, a["weight_sums"], ws, S_OUT, Z_OUT,
                                      b, [k, k], [stride] * 2, [pad] * 2, [1, 1], groups, "none")
    if k == 1:
        assert (ref.int() - want.int()).abs().max() <= 1
    else:  # ExecuTorch's reference views the row as (ic, kh, kw): wrong for k > 1
        assert (ref.int() - want.int()).abs().max() > 1


@settings(max_examples=12)
@given(k=st.sampled_from([3, 5]), stride=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_q8ta_conv2d_dw(k: int, stride: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, w, ws, b = _conv_case(gen, 8, 8, k, 8)
    wdw = w.reshape(8, k, k).permute(1, 2, 0).contiguous()
    a = _conv_args(x, wdw, w.to(torch.int32).sum((1, 2, 3)), ws, b, k, stride, k // 2, 8)
    assert RC.violated("et_vk.q8ta_conv2d_dw.default", a) == []
    got = Q.q8ta_conv2d_dw(a)
    y = F.conv2d((x.float() - Z_IN) * S_IN, w.float() * ws.view(-1, 1, 1, 1), b, stride,
                 k // 2, 1, 8)
    assert (got.int() - _quant(y, S_OUT, Z_OUT).int()).abs().max() <= 1


@settings(max_examples=12)
@given(k=st.sampled_from([2, 3]), stride=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_q8ta_conv2d_transposed(k: int, stride: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    ic, oc = 8, 4
    x = torch.randint(-128, 128, (1, ic, 5, 4), generator=gen, dtype=torch.int8)
    wt = torch.randint(-127, 128, (ic, oc, k, k), generator=gen, dtype=torch.int8)  # IC, OC, H, W
    ws = torch.rand(oc, generator=gen) * 0.01 + 1e-3
    b = torch.randn(oc, generator=gen)
    mat = wt.permute(1, 2, 3, 0).reshape(oc, k * k * ic)  # the fusion's layout
    mat = F.pad(mat, (0, -mat.shape[1] % 4)).contiguous()
    a = _conv_args(x, mat, wt.to(torch.int32).sum((0, 2, 3)), ws, b, k, stride, 0, 1)
    a["output_padding"] = [0, 0]
    assert RC.violated("et_vk.q8ta_conv2d_transposed.default", a) == []
    got = Q.q8ta_conv2d_transposed(a)
    y = F.conv_transpose2d((x.float() - Z_IN) * S_IN, wt.float() * ws.view(1, -1, 1, 1), b,
                           stride, 0)
    assert (got.int() - _quant(y, S_OUT, Z_OUT).int()).abs().max() <= 1


def test_wrong_conv_weight_sums_give_wrong_numbers() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w, ws, b = _conv_case(gen, 8, 8, 1, 1)
    wmat = _im2col(w)
    a = _conv_args(x, wmat, wmat.to(torch.int32).sum(1), ws, b, 1, 1, 0, 1)
    wrong = dict(a, weight_sums=torch.zeros(8, dtype=torch.int32))
    assert (Q.q8ta_conv2d(a).int() - Q.q8ta_conv2d(wrong).int()).abs().max() > 1


# ------------------------------------------------------------ embedding, qparams


@settings(max_examples=12)
@given(v=st.integers(2, 9), groups=st.integers(1, 2), g=st.sampled_from([32, 64]),
       linear=st.booleans(), seed=st.integers(0, 2**16))
def test_embedding_q4gsw(v: int, groups: int, g: int, linear: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    d = g * groups
    w = torch.randint(-8, 8, (v, d), generator=gen)
    s = torch.rand(v, groups, generator=gen) + 0.1
    idx = torch.randint(0, v, (2, 3), generator=gen, dtype=torch.int32)
    packed = _pack_q4_linear(w) if linear else _pack_q4_embedding(w)
    a = {"weight": packed, "weight_scales": s, "group_size": g, "indices": idx,
         "is_linear_weight": linear}
    assert RC.violated("et_vk.embedding_q4gsw.default", a) == []
    got = Q.embedding_q4gsw(a)
    want = F.embedding(idx.long(), w.float() * s.repeat_interleave(g, dim=1))
    torch.testing.assert_close(got, want)
    ref = torch.ops.et_vk.embedding_q4gsw(packed, s, g, idx, linear)
    torch.testing.assert_close(got, ref)


@settings(max_examples=12)
@given(m=st.integers(1, 4), k=dims4, seed=st.integers(0, 2**16))
def test_choose_qparams_affine_matches_torchao_asymmetric(m: int, k: int, seed: int) -> None:
    from torchao.quantization.quant_primitives import MappingType, choose_qparams_affine

    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    s, z = Q.choose_qparams_affine({"input": x, "block_size": [1, k], "quant_min": -128,
                                    "quant_max": 127})
    s_ref, z_ref = choose_qparams_affine(x, MappingType.ASYMMETRIC, [1, k], torch.int8, -128,
                                         127, eps=torch.finfo(torch.float32).eps,
                                         scale_dtype=torch.float32,
                                         zero_point_dtype=torch.int8)
    torch.testing.assert_close(s, s_ref.reshape(-1))
    assert (z - z_ref.reshape(-1).int()).abs().max() <= 1


# ------------------------------------------------------------ KV cache


def test_sdpa_with_kv_cache_matches_eager_causal_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    hq, hkv, d, cap = 4, 2, 8, 10
    kc, vc = torch.zeros(1, cap, hkv, d), torch.zeros(1, cap, hkv, d)
    keys, vals = [], []
    pos = 0
    for s in (3, 1, 1, 2):
        q, k, v = (torch.randn(1, s, h, d, generator=gen) for h in (hq, hkv, hkv))
        keys.append(k)
        vals.append(v)
        out = Q.sdpa_with_kv_cache({"query": q, "key": k, "value": v, "key_cache": kc,
                                    "value_cache": vc, "start_pos": pos})
        kk = torch.cat(keys, 1).transpose(1, 2).repeat_interleave(hq // hkv, 1)
        vv = torch.cat(vals, 1).transpose(1, 2).repeat_interleave(hq // hkv, 1)
        mask = torch.ones(s, pos + s, dtype=torch.bool).tril(pos)
        want = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=mask)
        torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-5, rtol=1e-5)
        pos += s
    torch.testing.assert_close(kc[:, :pos], torch.cat(keys, 1))


# ------------------------------------------------------------ payloads


def _serialize(chain: list[tuple[str, list[int]]], values: list[Any], inputs: list[int],
               outputs: list[int], constants: dict[str, torch.Tensor]
               ) -> tuple[bytes, dict[str, bytes]]:
    from executorch.backends.vulkan.serialization import vulkan_graph_schema as VS
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        serialize_vulkan_graph,
    )

    calls = [VS.OperatorCall(i, name, args) for i, (name, args) in enumerate(chain)]
    graph = VS.VkGraph("0", calls, values, inputs, outputs, [], [])
    payload = serialize_vulkan_graph(
        graph, [(key, t.numel() * t.element_size()) for key, t in constants.items()], [])
    return payload, {k: t.contiguous().view(torch.uint8).numpy().tobytes()
                     for k, t in constants.items()}


_VK = {torch.float32: 5, torch.uint8: 1, torch.int8: 2, torch.int32: 3}


def _tensor(t: torch.Tensor, cid: int) -> Any:
    from executorch.backends.vulkan.serialization import vulkan_graph_schema as VS

    return VS.VkValue(VS.VkTensor(VS.VkDataType(_VK[t.dtype]), list(t.shape), cid, -1))


def _scalar(kind: str, v: Any) -> Any:
    from executorch.backends.vulkan.serialization import vulkan_graph_schema as VS

    if kind == "Null":
        return VS.VkValue(VS.Null())
    return VS.VkValue(getattr(VS, kind)(v))


def _q4gsw_payload(n: int, k: int, g: int, weight_const: bool = True
                   ) -> tuple[Callable[[torch.Tensor], list[Any]], torch.Tensor, torch.Tensor]:
    w = torch.randint(-8, 8, (n, k), generator=torch.Generator().manual_seed(1))
    s = torch.rand(k // g, n, generator=torch.Generator().manual_seed(2)) + 0.1
    packed = _pack_q4_linear(w)
    x = torch.randn(3, k)
    out = torch.empty(3, n)
    values = [_tensor(x, -1), _tensor(packed, 0 if weight_const else -1), _tensor(s, 1),
              _scalar("Int", g), _scalar("Null", None), _tensor(out, -1)]
    inputs = [0] if weight_const else [0, 1]
    payload, named = _serialize([("et_vk.linear_q4gsw.default", [0, 1, 2, 3, 4, 5])], values,
                                inputs, [5], {"w": packed, "s": s})
    wf = w.float() * s.t().repeat_interleave(g, dim=1)

    def run(xx: torch.Tensor) -> list[Any]:
        ins = [xx] if weight_const else [xx, packed]
        return S.run_payload(payload, ins, named)

    return run, x, wf


def test_q4gsw_payload_runs() -> None:
    run, x, wf = _q4gsw_payload(8, 64, 32)
    (out,) = run(x)
    torch.testing.assert_close(out, x @ wf.t(), atol=1e-5, rtol=1e-5)


def test_q4gsw_runtime_weight_raises_val_is_tref() -> None:
    run, x, _ = _q4gsw_payload(8, 64, 32, weight_const=False)
    with pytest.raises(S.NotConstantError, match=re.escape("val_is_tref")) as e:
        run(x)
    assert (e.value.op, e.value.arg_name) == ("et_vk.linear_q4gsw.default", "weights")


@pytest.mark.parametrize(("n", "k", "g", "name", "text"), [
    (6, 64, 32, "n_multiple_of_4", "(N % 4 == 0) is false!"),
    (8, 12, 4, "k_multiple_of_8", "K % 8 == 0 does not hold"),
    (8, 48, 32, "group_size", "group_size % 4 == 0 && K % group_size == 0"),
])
def test_q4gsw_runtime_conditions_raise(n: int, k: int, g: int, name: str, text: str) -> None:
    w = torch.randint(-8, 8, (n, k))
    packed = _pack_q4_linear(w)
    s = torch.rand(max(k // g, 1), n)
    x = torch.randn(2, k)
    out = torch.empty(2, n)
    values = [_tensor(x, -1), _tensor(packed, 0), _tensor(s, 1), _scalar("Int", g),
              _scalar("Null", None), _tensor(out, -1)]
    payload, named = _serialize([("et_vk.linear_q4gsw.default", [0, 1, 2, 3, 4, 5])], values,
                                [0], [5], {"w": packed, "s": s})
    with pytest.raises(S.RuntimeConditionError, match=re.escape(text)) as e:
        S.run_payload(payload, [x], named)
    assert e.value.op == "et_vk.linear_q4gsw.default"
    assert e.value.condition.name == name
    assert e.value.arg_name in e.value.condition.args


def test_embedding_q4gsw_payload_and_embed_dim_condition() -> None:
    for d, ok in ((64, True), (48, False)):
        w = torch.randint(-8, 8, (5, d))
        packed, s = _pack_q4_embedding(w), torch.rand(5, 1) + 0.1
        idx = torch.tensor([[0, 4, 2]], dtype=torch.int32)
        out = torch.empty(1, 3, d)
        values = [_tensor(packed, 0), _tensor(s, 1), _scalar("Int", d), _tensor(idx, -1),
                  _scalar("Bool", False), _tensor(out, -1)]
        payload, named = _serialize([("et_vk.embedding_q4gsw.default", [0, 1, 2, 3, 4, 5])],
                                    values, [3], [5], {"w": packed, "s": s})
        if ok:
            (got,) = S.run_payload(payload, [idx], named)
            torch.testing.assert_close(got, F.embedding(idx.long(), w.float() * s))
        else:
            with pytest.raises(S.RuntimeConditionError, match=r"embed_dim_ref.*% 32 == 0"):
                S.run_payload(payload, [idx], named)


# ------------------------------------------------------------ real lowerings


class _Mlp(torch.nn.Module):
    """A Llama-style gated MLP (the linears torchao quantizes)."""

    def __init__(self, dim: int = 64, hidden: int = 96, bias: bool = False) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(dim, hidden, bias=bias)
        self.up = torch.nn.Linear(dim, hidden, bias=bias)
        self.down = torch.nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _quantized_mlp(config: str, group: int, bias: bool) -> torch.nn.Module:
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import (
        Int8DynamicActivationIntxWeightConfig,
        IntxWeightOnlyConfig,
        quantize_,
    )
    from torchao.utils import unwrap_tensor_subclass

    torch.manual_seed(0)
    m = _Mlp(bias=bias).eval()
    cfg: Any
    if config == "wo":
        cfg = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group))
    else:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                    weight_granularity=PerGroup(group))
    quantize_(m, cfg)
    unwrap_tensor_subclass(m)
    return m


@pytest.mark.parametrize(("config", "group", "bias", "op", "family"), [
    ("wo", 32, False, "et_vk.linear_q4gsw.default", "q4_weight_only"),
    ("8da4w", 32, True, "et_vk.linear_dq8ca_q4gsw.default", "dynamic_int8_activation"),
])
def test_quantized_mlp_simulates_to_the_quantized_eager_model(
        config: str, group: int, bias: bool, op: str, family: str) -> None:
    """Lowered by stock ExecuTorch 1.5.1 (its partitioner, its fusion inside preprocess,
    fusionkit uninstalled: the packing is ExecuTorch's own), simulated from the .pte."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    import fusionkit.backends.vulkan_adapter as vk
    from fusionkit.app.simulate_job import OP_FAMILIES, _delegate_report
    from fusionkit.backends.vulkan_adapter import constant_serializer as cs

    m = _quantized_mlp(config, group, bias)
    x = torch.randn(1, 3, 64)
    was, cs_was = vk.is_installed(), cs.is_installed()
    vk.uninstall()
    cs.uninstall()
    try:
        ep = torch.export.export(m, (x,), strict=True)
        prog = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()]).to_executorch()
    finally:
        if cs_was:
            cs.install()
        if was:
            vk.install()
    atol, rtol, _ = OP_FAMILIES[family]
    for xx in (x, torch.randn(1, 3, 64) * 4):
        trace: list[S.DelegateRun] = []
        got = S.simulate(prog, xx, trace=trace)
        with torch.no_grad():
            torch.testing.assert_close(got, m(xx), atol=atol, rtol=rtol)
        (run,) = trace
        assert run.ops.count(op) == 3, run.ops
        rep = _delegate_report(run)
        assert rep.ops[op] == 3 and family in rep.families
        assert rep.max_abs_error is not None and rep.max_abs_error <= atol * 10, rep


def test_kv_cache_is_carried_between_calls() -> None:
    """The drop-in lowering fuses the cache updates into llama.sdpa_with_kv_cache; the
    simulated program keeps its cache between calls like a loaded program does."""
    import copy

    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama.* ops)
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

    gen = torch.Generator().manual_seed(0)

    def step(pos: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(1, 2, 4, 8, generator=gen), torch.randn(1, 2, 2, 8, generator=gen),
                torch.randn(1, 2, 2, 8, generator=gen), torch.tensor([pos]))

    m = KVAttention()
    ep = torch.export.export(copy.deepcopy(m), step(0))
    prog = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()]).to_executorch()
    runs: list[S.DelegateRun] = []
    for pos in (0, 2, 4, 6, 8):
        x = step(pos)
        got = S.simulate(prog, *x, trace=runs)
        torch.testing.assert_close(got, m(*x), atol=1e-5, rtol=1e-5)
    # the ATen overload's payload name, as stock's fusion writes it (passes/vulkan/sdpa.py)
    assert sum(r.ops.count("sdpa_with_kv_cache.default") for r in runs) == 5
    # a fresh load does not start from the serialized (zero) caches: the runtime makes
    # them with add_tensor_like (sizes, not values), so a first call at position 2 reads
    # rows 0..1 of whatever memory it got (tests/test_vulkan_real_runtime_state.py)
    S.unload(prog)
    with pytest.raises(S.RuntimeConditionError, match="not written") as e:
        S.simulate(prog, *step(2))
    assert e.value.condition.name == "cache_rows_written" and e.value.arg_name == "key_cache"
    # ... and the rows stay unwritten: a later call that reads them is garbage too
    with pytest.raises(S.RuntimeConditionError):
        S.simulate(prog, *step(4))
    S.unload(prog)  # a fresh load that starts at position 0 reads only rows it wrote
    fresh = KVAttention()
    for pos in (0, 2):
        x = step(pos)
        torch.testing.assert_close(S.simulate(prog, *x), fresh(*x), atol=1e-5, rtol=1e-5)
