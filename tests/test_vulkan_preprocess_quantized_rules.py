"""The quantized and dtype passes of Vulkan preprocess as fusionkit rules (issue 25).

``InsertDtypePromotionPass``, ``FuseQuantizedOpsTransform`` and ``FoldQDQPass`` of
ExecuTorch 1.5.1's ``VulkanBackend.preprocess`` are replaced by the rules of
``passes/vulkan/{dtype_promotion,weight_only_linear,fold_qdq}.py``. Programs that reach
them -- weight-only int8 and int4 linears (``VulkanQuantizer``), a pt2e int8 conv net
whose max-pool leaves a quantize -> dequantize pair, comparisons of float and integer
tensors -- are lowered through the adapter with the rules and with the stock passes
(:func:`preprocess_rules.disabled`), under ``pass_gating.checking()``: the ``.pte``
files must be byte-identical, the rules must have rewritten what the stock pass
rewrites, and the program must run on the real Vulkan runtime (lavapipe, one child
process) equal to the eager model (the quantized model, for the quantized programs).

Where the rules differ from stock on purpose, a test shows stock's fault: one 4-bit
linear applied twice (stock's lowering dies; ours runs equal to eager), and on edge
programs built for them: affine weight zero points (stock raises in preprocess), a weight
quantized along its input channels (stock's kernel scales the wrong way), a 3-D input
to the 8-bit kernel (stock's retrace dies), a dequantize to float16 of a float32 value
(stock's fold changes the dtype the graph reads) and an arithmetic op of float16 and
int32 operands (stock computes it in float32 under a node that says float16).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge
from test_vulkan_preprocess_rules import Lowered, _eager, lower
from torch import nn

from fusionkit import find_matches
from fusionkit.backends.vulkan_adapter import preprocess_rules as pr
from fusionkit.backends.vulkan_adapter import runtime

pytest.importorskip("torchao")

REPLACED = ("InsertDtypePromotionPass", "FuseQuantizedOpsTransform", "FoldQDQPass")


# ----------------------------------------------------------------------- the programs


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 8), nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))  # type: ignore[no-any-return]


class ConvPool(nn.Module):
    """A quantized conv, then a max-pool the Vulkan patterns do not fuse: its quantize ->
    dequantize pair is left for FoldQDQPass (its quantize has two dequantize users)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.relu(self.conv(x)), 2, 2)
        return torch.sigmoid(y) + y


class Comparisons(nn.Module):
    """float32 > int32 and int32 < int64: mixed-dtype comparisons (to_edge casts the
    operands of arithmetic ops itself, not those of comparisons)."""

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x * (x > i) + (i < torch.arange(i.shape[-1])).float()


def _calibrated(model: nn.Module, x: tuple[torch.Tensor, ...], quantizer: Any) -> Any:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(model, x).module(), quantizer)
    for _ in range(3):
        prepared(*(torch.randn_like(t) for t in x))
    prepared(*x)
    return convert_pt2e(prepared)


def _weight_only(bits: int) -> tuple[Any, tuple[torch.Tensor, ...]]:
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
        get_symmetric_quantization_config,
    )

    x = (torch.randn(4, 16),)
    q = VulkanQuantizer().set_global(get_symmetric_quantization_config(is_dynamic=False,
                                                                       weight_bits=bits))
    return _calibrated(TwoLinears().eval(), x, q), x


def _conv_pool() -> tuple[Any, tuple[torch.Tensor, ...]]:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    x = (torch.randn(1, 4, 8, 8),)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    return _calibrated(ConvPool().eval(), x, q), x


def _comparisons() -> tuple[Any, tuple[torch.Tensor, ...]]:
    return Comparisons(), (torch.randn(2, 8), torch.randint(-3, 3, (2, 8), dtype=torch.int32))


#: name -> (build, stock pass the program reaches, rewrites it makes, tolerance vs eager)
PROGRAMS: dict[str, tuple[Any, str, int, float]] = {
    "weight-only int8 linears": (lambda: _weight_only(8), "FuseQuantizedOpsTransform", 2, 1e-4),
    "weight-only int4 linears": (lambda: _weight_only(4), "FuseQuantizedOpsTransform", 2, 1e-4),
    "pt2e conv + max-pool": (_conv_pool, "FoldQDQPass", 1, 1e-4),
    "mixed-dtype comparisons": (_comparisons, "InsertDtypePromotionPass", 2, 0.0),
}


@pytest.fixture(scope="module")
def lowered() -> dict[str, tuple[Any, tuple[torch.Tensor, ...], Lowered, Lowered]]:
    out = {}
    for i, (name, (build, _, _, _)) in enumerate(PROGRAMS.items()):
        torch.manual_seed(10 + i)
        model, x = build()
        out[name] = (model, x, lower(model, x, True), lower(model, x, False))
    return out


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_rules_rewrite_what_the_stock_pass_rewrites_with_its_bytes(
        lowered: Any, name: str) -> None:
    _, _, rules, stock = lowered[name]
    _, stock_pass, fused, _ = PROGRAMS[name]
    assert rules.rule_counts[stock_pass]["fused"] == fused
    assert rules.rule_counts[stock_pass]["stock_runs"] == 0
    for p in REPLACED:
        assert p not in rules.pass_counts, f"{p} ran although its rules replace it"
    assert stock.pass_counts[stock_pass]["ran"] >= 1, "the stock pass had nothing to do"
    assert rules.pte == stock.pte


def test_the_programs_run_like_eager_on_the_real_runtime(lowered: Any,
                                                         vulkan_runtime: Any) -> None:
    jobs = [runtime.Job(rules.pte, list(x)) for _, x, rules, _ in lowered.values()]
    results = runtime.run_many_in_child(jobs)
    bad = []
    for (name, (model, x, _, _)), res in zip(lowered.items(), results, strict=True):
        if res.status != "ok" or not res.outputs:
            bad.append(f"{name}: {res.status} {res.message}")
            continue
        err = float((res.outputs[0].double() - _eager(model, x).double()).abs().max())
        if err > PROGRAMS[name][3]:
            bad.append(f"{name}: max error {err}")
    assert not bad, bad


# ----------------------------------------------------------------------- stock's faults


class SharedLinear(nn.Module):
    """One linear applied twice: two dequantize nodes read one quantized weight."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.lin(torch.relu(x))  # type: ignore[no-any-return]


def test_a_shared_4_bit_weight_lowers_where_stock_dies(vulkan_runtime: Any) -> None:
    """Stock packs the shared weight's state-dict entry in place for the first linear; the
    second dequantize then reads uint8 and the pass's retrace dies. The rule packs once
    into a new constant both read; the 8-bit program (nothing packed) keeps stock's bytes."""
    from executorch.backends.vulkan.quantizer.vulkan_quantizer import (
        VulkanQuantizer,
        get_symmetric_quantization_config,
    )

    x = (torch.randn(4, 16),)
    for bits in (8, 4):
        torch.manual_seed(20)
        q = VulkanQuantizer().set_global(get_symmetric_quantization_config(
            is_dynamic=False, weight_bits=bits))
        model = _calibrated(SharedLinear().eval(), x, q)
        rules = lower(model, x, True)
        assert rules.rule_counts["FuseQuantizedOpsTransform"]["fused"] == 2
        if bits == 8:
            assert rules.pte == lower(model, x, False).pte
        else:
            with pytest.raises(Exception, match="FuseQuantizedOpsTransform"):
                lower(model, x, False)
        res = runtime.run_in_child(rules.pte, list(x))
        assert res.status == "ok" and res.outputs, res.message
        assert float((res.outputs[0] - _eager(model, x)).abs().max()) <= 1e-4


class HandQuantizedLinear(nn.Module):
    """``linear(x, dequantize_per_channel(w, scales, zeros, axis))``, as written by hand."""

    def __init__(self, zeros: int = 0, axis: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.axis = axis
        self.register_buffer("w", torch.randint(-100, 100, (8, 8), generator=g,
                                                dtype=torch.int8))
        self.register_buffer("scales", torch.rand(8, generator=g) / 50 + 0.01)
        self.register_buffer("zeros", torch.full((8,), zeros, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.ops.quantized_decomposed.dequantize_per_channel(
            self.w, self.scales, self.zeros, self.axis, -128, 127, torch.int8)
        return F.linear(x, w)


def _edge(model: nn.Module, *inputs: torch.Tensor) -> Any:
    import torch.ao.quantization.fx._decomposed
    from executorch.backends.transforms.addmm_mm_to_linear import AddmmToLinearTransform

    ep = to_edge(torch.export.export(model, inputs)).exported_program()
    AddmmToLinearTransform()(ep.graph_module)  # the linear back, as preprocess makes it first
    return ep


def _stock_fuse_quantized(ep: Any) -> Any:
    from executorch.backends.vulkan._passes.fuse_quantized_ops import FuseQuantizedOpsTransform

    p = FuseQuantizedOpsTransform()
    p._exported_program = ep
    return p(ep.graph_module)


def _declined_unchanged(ep: Any, stock_pass: str) -> str:
    """Run the rules in place of ``stock_pass``: nothing changes; the one decline's reason."""
    before = str(ep.graph_module.graph)
    pr.reset_counts()
    pr.RulePass(stock_pass)(ep)
    assert str(ep.graph_module.graph) == before
    assert pr.counts()[stock_pass]["fused"] == 0
    declined = find_matches(ep, list(pr.rules_for(stock_pass)), structural_declines=False,
                            check_replacements=False).declined
    assert declined
    return " | ".join(d.reason for d in declined)


def test_affine_weight_zero_points_are_declined_where_stock_raises() -> None:
    ep = _edge(HandQuantizedLinear(zeros=3), torch.randn(4, 8))
    with pytest.raises(NotImplementedError, match="symmetric"):
        _stock_fuse_quantized(copy.deepcopy(ep))
    assert "zero point" in _declined_unchanged(ep, "FuseQuantizedOpsTransform")


def test_a_weight_quantized_along_its_inputs_is_declined_where_stock_scales_wrongly() -> None:
    model, x = HandQuantizedLinear(axis=1).eval(), torch.randn(4, 8)
    want = _eager(model, (x,))
    ep = _edge(model, x)
    twin = copy.deepcopy(ep)
    result = _stock_fuse_quantized(twin)
    assert any("_weight_int8pack_mm" in str(n.target) for n in result.graph_module.graph.nodes)
    with torch.no_grad():
        wrong = result.graph_module(*_gm_inputs(twin, x))
    assert float((wrong[0] - want).abs().max()) > 1e-2, "stock's bug is gone?"
    assert "axis 1" in _declined_unchanged(ep, "FuseQuantizedOpsTransform")
    with torch.no_grad():
        assert float((ep.module()(x) - want).abs().max()) <= 1e-5


def _gm_inputs(ep: Any, x: torch.Tensor) -> list[Any]:
    """The graph module's placeholders in order: the program's constants, then ``x``."""
    args = []
    for spec in ep.graph_signature.input_specs:
        if spec.target is None:
            args.append(x)
        elif spec.target in ep.state_dict:
            args.append(ep.state_dict[spec.target])
        else:
            args.append(ep.constants[spec.target])
    return args


def _linear_of_3d(ep: Any) -> None:
    """``view(linear(view(x, 2-D)), 3-D)`` -> ``linear(x)``: a 3-D linear, as a graph can
    hold it (to_edge writes the views)."""
    g = ep.graph_module.graph
    (linear,) = [n for n in g.nodes if "linear" in str(n.target)]
    into, (out,) = linear.args[0], list(linear.users)
    linear.replace_input_with(into, into.args[0])
    linear.meta["val"] = out.meta["val"]
    out.replace_all_uses_with(linear)
    g.erase_node(out)
    g.erase_node(into)
    ep.graph_module.recompile()


def test_a_3d_input_to_the_8_bit_kernel_is_declined_where_stock_dies() -> None:
    ep = _edge(HandQuantizedLinear(), torch.randn(2, 4, 8))
    _linear_of_3d(ep)
    with pytest.raises(Exception, match="2D"):
        _stock_fuse_quantized(copy.deepcopy(ep))
    assert "2-D" in _declined_unchanged(ep, "FuseQuantizedOpsTransform")


class HalfDequantize(nn.Module):
    """A float32 value quantized, then dequantized to float16."""

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        q = qd.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8)
        return qd.dequantize_per_tensor(q, 0.05, 0, -128, 127, torch.int8,
                                        out_dtype=torch.float16) + h


def test_a_dequantize_to_another_dtype_is_kept_where_stock_changes_the_dtype() -> None:
    from executorch.backends.vulkan._passes.fold_qdq import FoldQDQPass

    x, h = torch.randn(2, 8), torch.randn(2, 8).half()
    ep = _edge(HalfDequantize(), x, h)
    out_val = next(iter(ep.graph_module.graph.find_nodes(op="output"))).args[0][0].meta["val"]
    assert out_val.dtype == torch.float16
    result = FoldQDQPass()(copy.deepcopy(ep).graph_module)
    out = next(iter(result.graph_module.graph.find_nodes(op="output"))).args[0][0]
    assert out.meta["val"].dtype == torch.float32, "stock's bug is gone?"
    assert "float16" in _declined_unchanged(ep, "FoldQDQPass")


def _uncast_add(ep: Any) -> Any:
    """``add(x16, _to_copy(i32, float16))`` -> ``add(x16, i32)``: the mixed operands that a
    hand-written graph (not to_edge) can hold."""
    g = ep.graph_module.graph
    (add,) = [n for n in g.nodes if "add" in str(n.target)]
    cast = add.args[1]
    add.replace_input_with(cast, cast.args[0])
    g.erase_node(cast)
    ep.graph_module.recompile()
    return add


class HalfPlusInt(nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x + i


def test_float16_plus_int32_is_declined_where_stock_computes_float32() -> None:
    from executorch.backends.vulkan._passes.insert_dtype_promotion import (
        InsertDtypePromotionPass,
    )

    x, i = torch.randn(2, 8).half(), torch.randint(-3, 3, (2, 8), dtype=torch.int32)
    ep = _edge(HalfPlusInt(), x, i)
    add = _uncast_add(ep)
    assert add.meta["val"].dtype == torch.float16
    twin = copy.deepcopy(ep)
    result = InsertDtypePromotionPass()(twin.graph_module)
    (stock_add,) = [n for n in result.graph_module.graph.nodes if "add" in str(n.target)]
    assert stock_add.meta["val"].dtype == torch.float16  # what the node claims
    with torch.no_grad():
        got = result.graph_module(x, i)[0]
    assert got.dtype == torch.float32, "stock's bug is gone?"  # what it computes
    assert "float16" in _declined_unchanged(ep, "InsertDtypePromotionPass")
