"""The RMSNorm rule on edge programs: the six multiplier rows in fp32/fp16/bf16,
model re-creations, spelling variants, escapes, shared weights, and folding that
keeps the program consistent (run through XNNPACK and the portable runtime)."""

from __future__ import annotations

from typing import Any

import pytest
import rmsnorm_models as R
import torch
from executorch.exir import to_edge_transform_and_lower
from models import count_op, fresh
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from fusionkit import FusionPass, PrepackableConstant, Rule, capture, op, ref, replace_with
from fusionkit.passes.rms_norm import RMS_NORM_TARGET, VULKAN_DTYPES, rms_norm_rule

pytestmark = pytest.mark.usefixtures("vulkan_ops")

def _row_case(row: R.Row, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return R.row_case(row, dtype)


_edge = R.edge_program


def _fuse(ep: ExportedProgram, rule: Rule | None = None) -> tuple[ExportedProgram, FusionPass]:
    ep = fresh(ep)
    p = FusionPass([rule or rms_norm_rule()])
    p(ep)  # mutates ep in place
    return ep, p


def _close(out: Any, ref: Any, dtype: torch.dtype) -> None:
    if isinstance(out, tuple):
        for a, b in zip(out, ref, strict=True):
            _close(a, b, dtype)
        return
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out.float(), ref.float(), **R.tolerance(dtype))


def _assert_consistent(ep: ExportedProgram) -> None:
    """Every placeholder has a spec; every constant spec has its tensor, and vice versa."""
    sig = ep.graph_signature
    placeholders = [n.name for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    assert placeholders == [s.arg.name for s in sig.input_specs]
    for s in sig.input_specs:
        if s.kind == InputKind.PARAMETER:
            assert s.target in ep.state_dict
        elif s.kind == InputKind.CONSTANT_TENSOR:
            assert s.target in ep.constants
        elif s.kind == InputKind.BUFFER:
            assert s.target in ep.state_dict or s.target in ep.constants
    used = {s.target for s in sig.input_specs if s.target is not None}
    assert set(ep.state_dict) <= used, set(ep.state_dict) - used
    assert set(ep.constants) <= used, set(ep.constants) - used
    ep.graph_module.graph.lint()


# ------------------------------------------------------------------- six rows


@pytest.mark.parametrize("dtype", R.DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("row", R.ROWS, ids=lambda r: r.name)
def test_six_rows(row: R.Row, dtype: torch.dtype) -> None:
    ep0, m, args = _edge((row.name, dtype), lambda: _row_case(row, dtype))
    ep, p = _fuse(ep0)
    assert count_op(ep, RMS_NORM_TARGET) == int(row.fused), str(p.report)
    if row.fused:
        assert p.report.total_fused == 1 and not p.report.declined
        node = next(n for n in ep.graph_module.graph.nodes if n.name.startswith("et_vk"))
        weight = node.args[1]
        spec = {s.arg.name: s for s in ep.graph_signature.input_specs}[weight.name]
        if row.name in ("cast", "gemma"):  # folded into a new lifted constant
            assert spec.kind == InputKind.CONSTANT_TENSOR
            assert weight.meta.get("fusionkit_folded_from")
            # the original parameter had no other user: it is gone
            assert not any(s.kind == InputKind.PARAMETER for s in ep.graph_signature.input_specs)
            assert "weight" not in ep.state_dict
        else:
            assert spec.kind in (InputKind.PARAMETER, InputKind.BUFFER)
    else:
        (d,) = p.report.declined
        assert d.step == "prepackable_constant"
        assert ("user input" in d.reason) and ("cannot be folded" in d.reason) == (row.name == "adaln")
    _assert_consistent(ep)
    with torch.no_grad():
        _close(ep.module()(*args), m(*args), dtype)


def test_vulkan_dtypes_filter_declines_bf16() -> None:
    row = R.ROWS[0]
    ep0, _, _ = _edge((row.name, torch.bfloat16), lambda: _row_case(row, torch.bfloat16))
    ep, p = _fuse(ep0, rms_norm_rule(dtypes=VULKAN_DTYPES))
    assert count_op(ep, RMS_NORM_TARGET) == 0
    (d,) = p.report.declined
    assert d.step == "dtype" and "bfloat16" in d.reason


# ---------------------------------------------------------- model re-creations

RECREATIONS = {
    "llama": (R.LlamaRMSNorm, (2, R.D), 1),
    "hf_llama": (R.HFLlamaRMSNorm, (2, R.D), 1),
    "gemma": (R.GemmaRMSNorm, (2, R.D), 1),
    "t5": (R.T5LayerNorm, (2, R.D), 1),
    "diffusers": (R.DiffusersRMSNorm, (2, R.D), 1),
    "qwen_qk_norm": (R.QwenAttention, (1, 3, 16), 3),
}


@pytest.mark.parametrize("dtype", R.DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", list(RECREATIONS))
def test_model_recreations(name: str, dtype: torch.dtype) -> None:
    cls, shape, n = RECREATIONS[name]

    def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        return cls().to(dtype).eval(), (torch.randn(*shape, dtype=dtype),)

    ep0, m, args = _edge((name, dtype), make)
    ep, p = _fuse(ep0)
    assert count_op(ep, RMS_NORM_TARGET) == n, str(p.report)
    assert count_op(ep, "aten.rsqrt.default") == 0
    _assert_consistent(ep)
    with torch.no_grad():
        _close(ep.module()(*args), m(*args), dtype)


@pytest.mark.parametrize("kw", [
    {},
    {"square": "pow", "eps": "tensor", "weight_left": False, "rsqrt_left": False,
     "eps_left": False},
    {"eps": "tensor", "rsqrt_left": False},
    {"square": "pow", "weight_left": False, "eps_left": False},
], ids=["mul-left", "pow-right-tensor-eps", "tensor-eps", "pow-right"])
def test_spelling_variants(kw: dict[str, Any]) -> None:
    ep0, m, args = _edge(("variant", tuple(kw.items())),
                         lambda: (R.VariantNorm(**kw).eval(), (torch.randn(2, R.D),)))
    ep, _ = _fuse(ep0)
    assert count_op(ep, RMS_NORM_TARGET) == 1
    node = next(n for n in ep.graph_module.graph.nodes if n.name.startswith("et_vk"))
    assert node.args[2] == pytest.approx(1e-5)
    _close(ep.module()(*args), m(*args), torch.float32)


def test_aten_dialect_too() -> None:
    torch.manual_seed(0)
    m = R.GemmaRMSNorm().eval()
    args = (torch.randn(2, R.D),)
    ep = torch.export.export(m, args)
    FusionPass([rms_norm_rule()])(ep)
    assert count_op(ep, RMS_NORM_TARGET) == 1
    _assert_consistent(ep)
    _close(ep.module()(*args), m(*args), torch.float32)


def test_norm_output_with_second_user_is_not_fused() -> None:
    ep0, m, args = _edge("two_users", lambda: (R.TwoUsers().eval(), (torch.randn(2, R.D),)))
    ep, p = _fuse(ep0)
    assert count_op(ep, RMS_NORM_TARGET) == 0
    (d,) = p.report.declined
    assert d.step == "escape"
    _close(ep.module()(*args), m(*args), torch.float32)


@pytest.mark.parametrize("gemma", [False, True], ids=["plain", "gemma"])
def test_two_norms_share_one_weight(gemma: bool) -> None:
    ep0, m, args = _edge(("shared", gemma),
                         lambda: (R.SharedWeight(gemma).eval(), (torch.randn(2, R.D),)))
    ep, p = _fuse(ep0)
    assert count_op(ep, RMS_NORM_TARGET) == 2 and p.report.total_fused == 2
    weights = [n.args[1] for n in ep.graph_module.graph.nodes if n.name.startswith("et_vk")]
    if gemma:
        assert all(w.meta.get("fusionkit_folded_from") for w in weights)
        assert "weight" not in ep.state_dict
    else:
        assert weights[0] is weights[1]
        assert "weight" in ep.state_dict
    _assert_consistent(ep)
    _close(ep.module()(*args), m(*args), torch.float32)


class _MutatedWeight(torch.nn.Module):
    """The weight buffer is updated in forward: not a constant, never folded."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(R.D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.add_(1.0)
        return R.rms(x) * (1.0 + self.weight)


def test_mutable_buffer_is_not_folded() -> None:
    ep0, _, _ = _edge("mutated", lambda: (_MutatedWeight(), (torch.randn(2, R.D),)))
    ep, p = _fuse(ep0)
    assert count_op(ep, RMS_NORM_TARGET) == 0
    (d,) = p.report.declined
    assert "mutable buffer" in d.reason or "mutates" in d.reason


# ------------------------------------------------ folding alone, then XNNPACK


def _fold_only_rule() -> Rule:
    """``a * w`` -> the same multiply, with ``w`` folded when it is a constant expression."""
    return Rule("fold_mul_weight",
                op("aten.mul.Tensor", capture("a"), capture("w")),
                replace_with("aten.mul.Tensor", ref("a"), ref("w")),
                constraints=[PrepackableConstant("w", fold=True, role="fold test")])


class _FoldModel(torch.nn.Module):
    """Gemma ``1 + w``, a cast fp16 weight, and (optionally) another user of ``w``."""

    def __init__(self, other_user: bool) -> None:
        super().__init__()
        self.other_user = other_user
        self.w = torch.nn.Parameter(0.1 * torch.randn(R.D))
        self.w16 = torch.nn.Parameter(torch.randn(R.D).half())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = R.rms(x) * (1.0 + self.w)
        y = R.rms(y) * self.w16.float()
        return y + self.w if self.other_user else y


@pytest.mark.parametrize("other_user", [False, True], ids=["sole-user", "other-user"])
def test_folding_alone_runs_through_xnnpack(other_user: bool) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    torch.manual_seed(0)
    m = _FoldModel(other_user).eval()
    x = torch.randn(2, R.D)
    fold = FusionPass([_fold_only_rule()])
    edge = to_edge_transform_and_lower(torch.export.export(m, (x,)), transform_passes=[fold],
                                       partitioner=[XnnpackPartitioner()])
    assert fold.report.total_fused == 2 and fold.report.rules["fold_mul_weight"].folded == 2
    # the folded program itself (before to_executorch) is consistent
    folded = to_edge_transform_and_lower(torch.export.export(m, (x,)),
                                         transform_passes=[FusionPass([_fold_only_rule()])])
    ep = folded.exported_program()
    _assert_consistent(ep)
    kinds = {s.target: s.kind for s in ep.graph_signature.input_specs if s.target}
    assert sum(k == InputKind.CONSTANT_TENSOR and t.startswith("fk_folded") for t, k in kinds.items()) == 2
    assert ("w" in ep.state_dict) == other_user  # removed only when nothing else uses it
    assert "w16" not in ep.state_dict
    with torch.no_grad():
        want = m(x)
    _close(ep.module()(x), want, torch.float32)
    for prog in (edge, folded):  # XNNPACK-delegated and portable-only
        et = prog.to_executorch()
        out = _load_for_executorch_from_buffer(et.buffer).forward((x,))[0]
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
