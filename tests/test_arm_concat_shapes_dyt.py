"""The Arm takeover of ``FuseConsecutiveConcatShapesPass`` and ``FoldDyTAlphaIntoLUTPass``:
through the whole TOSA pipeline against stock's flatbuffer (and, for DyT, on the reference
model against the fake-quantized model), and on hand-built graphs where the rules decline
what stock folds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("tosa_reference_model")
pytest.importorskip("executorch.backends.arm.tosa.partitioner")

import executorch.backends.arm.tosa.dialect  # noqa: F401  (registers tosa.*)
from executorch.backends.arm._passes import FoldDyTAlphaIntoLUTPass
from executorch.backends.arm._passes.quant_args import QuantArgs
from executorch.backends.arm.test.passes import test_fold_dyt_alpha_into_lut_pass as stock_dyt_test
from executorch.backends.arm.tosa.specification import (
    TosaLoweringContext,
    TosaSpecification,
)
from executorch.exir.dialects._ops import ops as exir_ops

from fusionkit.backends.arm_adapter import preprocess_rules
from fusionkit.backends.arm_adapter import reference_model as rm
from fusionkit.passes.arm import consecutive_concat_shapes, rules_for

pytestmark = pytest.mark.slow

INT_TOL = 1e-6
RESCALE = exir_ops.backend.tosa.RESCALE.default
CONCAT_SHAPE = exir_ops.backend.tosa.CONCAT_SHAPE.default
INT = TosaSpecification.create_from_string("TOSA-1.0+INT")


# --- FuseConsecutiveConcatShapesPass -------------------------------------------------------

def _concat_graph(outer_len: int | None = None, tensor_element: bool = False
                  ) -> tuple[torch.fx.Node, torch.fx.Node]:
    graph = torch.fx.Graph()

    def shape(name: str, dims: list[int]) -> torch.fx.Node:
        n = graph.placeholder(name)
        n.meta["val"] = dims
        return n

    a, b, c = shape("a", [1]), shape("b", [2, 3]), shape("c", [4])
    inner = graph.create_node("call_function", CONCAT_SHAPE, ([b, c],))
    inner.meta["val"] = [2, 3, 4]
    d: Any = shape("d", [5])
    if tensor_element:
        d.meta["val"] = torch.ones(5)
    outer = graph.create_node("call_function", CONCAT_SHAPE, ([a, inner, d],))
    outer.meta["val"] = [1, 2, 3, 4, 5][:outer_len]
    graph.output(outer)
    return outer, inner


def _nested(outer: torch.fx.Node) -> str | None:
    return consecutive_concat_shapes._nested(None, outer, outer.args[0])  # type: ignore[arg-type]


def test_a_concat_of_concats_is_flattened() -> None:
    outer, inner = _concat_graph()
    assert _nested(outer) is None
    assert consecutive_concat_shapes.flattened(outer.args[0]) == [  # type: ignore[arg-type]
        outer.args[0][0], *inner.args[0], outer.args[0][2]]  # type: ignore[index, misc]


def test_a_flat_concat_is_left_alone() -> None:
    _, inner = _concat_graph()
    assert "no element is a CONCAT_SHAPE" in str(_nested(inner))


def test_a_concat_whose_elements_are_not_its_shape_is_declined() -> None:
    # stock flattens whatever the list holds; a tensor element or elements that do not add
    # up to the concat's own rank give a shape no later pass expects
    outer, _ = _concat_graph(tensor_element=True)
    assert "is no shape" in str(_nested(outer))
    outer, _ = _concat_graph(outer_len=4)
    assert "hold 5 dimensions, the concat 4" in str(_nested(outer))


def test_the_rule_flattens_arms_own_nested_concat_as_stock_does() -> None:
    # ExecuTorch's pass test's graph (CONST_SHAPE [0], CONCAT_SHAPE([1], [2]), [3])
    from executorch.backends.arm.test.passes import test_fuse_consecutive_concat_shapes as t

    ours, stock = t._graph_module_with_nested_concat(), t._graph_module_with_nested_concat()
    outer = t._concat_shape_nodes(ours)[-1]
    assert _nested(outer) is None
    flat = consecutive_concat_shapes.flattened(outer.args[0])  # type: ignore[arg-type]
    stock_outer = t._concat_shape_nodes(t._run_fuse_pass(stock))[-1]
    assert t._const_shape_values(flat) == t._const_shape_values(stock_outer.args[0]) == [
        0, 1, 2, 3]


class _Expand(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 1).unsqueeze(1).expand(-1, 3, -1, -1).flatten(1, 2)


def test_a_symbolic_shape_program_lowers_to_stocks_bytes() -> None:
    """``TOSA-1.1+FP+shape`` with a dynamic batch: the shapes the pipeline builds reach the
    rule pass (it runs in the stock pass's place) and the flatbuffer is stock's. The
    reference model cannot run a shape-extension program here (it needs the
    ``infer_shapes`` tool, not in ``tosa-tools``), so this is judged on bytes alone."""
    x = torch.randn(2, 4, 6)
    batch = torch.export.Dim("batch", min=2, max=8)
    tosa = {}
    for way in (False, True):
        preprocess_rules.reset_counts()
        ep = torch.export.export(_Expand(), (x,), dynamic_shapes={"x": {0: batch}})
        edge = rm.lower(ep, (x,), fusionkit=way, spec="TOSA-1.1+FP+shape")
        tosa[way] = rm.tosa_flatbuffers(edge)
        runs = preprocess_rules.counts().get("FuseConsecutiveConcatShapesPass", {})
        assert runs.get("runs", 0) == (1 if way else 0)
    assert len(tosa[True]) == 1 and tosa[True] == tosa[False]


# --- FoldDyTAlphaIntoLUTPass: whole pipeline ------------------------------------------------

class DyT(torch.nn.Module):
    """ExecuTorch's own DyT fixture: ``tanh(alpha * permute(conv(x)))``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, kernel_size=1)
        self.alpha = torch.nn.Parameter(torch.tensor([0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * torch.permute(self.conv(x), (0, 2, 3, 1)))


@pytest.fixture(scope="module")
def dyt() -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = DyT().eval(), (torch.rand(1, 3, 8, 8),)
    out: dict[str, Any] = {}
    with rm.dyt_folds_inserted():
        for way in ("stock", "fusionkit"):
            preprocess_rules.reset_counts()
            out[way] = rm.evaluate(model, inputs, fusionkit=way == "fusionkit", spec=rm.INT)
            out[f"{way}_counts"] = preprocess_rules.counts()
    preprocess_rules.reset_counts()
    out["not_inserted"] = rm.evaluate(model, inputs, fusionkit=True, spec=rm.INT)
    out["not_inserted_counts"] = preprocess_rules.counts()
    return out


def test_the_dyt_alpha_fold_is_taken_over_where_it_is_inserted(dyt: dict[str, Any]) -> None:
    stock, ours = dyt["stock"], dyt["fusionkit"]
    assert dyt["fusionkit_counts"]["FoldDyTAlphaIntoLUTPass"] == {"runs": 1, "fused": 1}
    assert "FoldDyTAlphaIntoLUTPass" not in dyt["stock_counts"]
    assert ours.tosa == stock.tosa
    assert ours.error <= INT_TOL and stock.error <= INT_TOL  # vs the fake-quantized model
    # not inserted: no pass to take over, and another program (mul and tanh lowered apart)
    assert "FoldDyTAlphaIntoLUTPass" not in dyt["not_inserted_counts"]
    assert dyt["not_inserted"].tosa != ours.tosa
    assert dyt["not_inserted"].error <= INT_TOL


# --- FoldDyTAlphaIntoLUTPass: hand-built graphs (ExecuTorch's own fixture, with values) ---

def _q(scale: float, zp: int, dtype: torch.dtype = torch.int8) -> QuantArgs:
    r = torch.iinfo(dtype)
    return QuantArgs(scale=scale, zp=zp, qmin=r.min, qmax=r.max, dtype=dtype)


# ExecuTorch's own fixture's qparams and its reference (RESCALE / MUL / tanh, op by op)
_ACT, _ALPHA, _TIN, _TOUT = (
    stock_dyt_test._ACTIVATION_QARGS, stock_dyt_test._ALPHA_QARGS,
    stock_dyt_test._TANH_INPUT_QARGS, stock_dyt_test._TANH_OUTPUT_QARGS)


class _Fixture(torch.nn.Module):
    alpha_code: torch.Tensor

    def __init__(self, alpha_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("alpha_code", torch.full(alpha_shape, 127, dtype=torch.int8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.alpha_code


def _dyt_program(alpha_shape: tuple[int, ...] = (1,)) -> Any:
    """The post-``InsertRescaleInt32Pass`` DyT site of ExecuTorch's pass test, every node
    with its value (the output shape is the broadcast of activation and alpha)."""
    from torch._guards import detect_fake_mode

    x = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8).reshape(1, 1, 16, 16)
    ep = torch.export.export(_Fixture(alpha_shape), (x,), strict=True)
    graph = ep.graph_module.graph
    alpha_name = next(iter(ep.graph_signature.inputs_to_buffers))
    alpha = next(n for n in graph.nodes if n.name == alpha_name)
    act = next(n for n in graph.nodes if n.op == "placeholder" and n is not alpha)
    add = next(n for n in graph.nodes if n.op == "call_function")
    output = next(n for n in graph.nodes if n.op == "output")
    fake = detect_fake_mode([act.meta["val"]])
    out_shape = torch.broadcast_shapes(tuple(x.shape), alpha_shape)

    def node(target: Any, args: tuple[Any, ...], shape: Any, dtype: torch.dtype) -> Any:
        n = graph.call_function(target, args)
        with fake:
            n.meta["val"] = torch.empty(shape, dtype=dtype)
        return n

    with graph.inserting_before(output):
        ra = node(RESCALE, (act, torch.int32, [1.0], 3, 0), x.shape, torch.int32)
        rb = node(RESCALE, (alpha, torch.int32, [1.0], -128, 0), alpha_shape, torch.int32)
        mul = node(exir_ops.edge.aten.mul.Tensor, (ra, rb), out_shape, torch.int32)
        scale = stock_dyt_test._MUL_OUTPUT_RESCALE.scale
        ro = node(RESCALE, (mul, torch.int8, [scale], 0, 2), out_shape, torch.int8)
        tanh = node(exir_ops.edge.aten.tanh.default, (ro,), out_shape, torch.int8)
    act.meta["output_qparams"] = {0: _ACT}
    mul.meta["input_qparams"] = {0: _q(_ACT.get_scale_per_tensor(), 0, torch.int32),
                                 1: _q(_ALPHA.get_scale_per_tensor(), 0, torch.int32)}
    tanh.meta["input_qparams"] = {0: _TIN}
    tanh.meta["output_qparams"] = {0: _TOUT}
    output.replace_input_with(add, tanh)
    graph.erase_node(add)
    ep.graph_module.recompile()
    return ep


def _ops(ep: Any) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def _table(ep: Any) -> torch.Tensor:
    ((_, value),) = [(k, v) for k, v in {**ep.state_dict, **ep.constants}.items()
                     if "dyt_table_constant" in k]
    return value


def _stock(ep: Any) -> bool:
    with TosaLoweringContext(INT):
        return bool(FoldDyTAlphaIntoLUTPass(ep).call(ep.graph_module).modified)


def _ours(ep: Any) -> preprocess_rules.ArmRulePass:
    rule_pass = preprocess_rules.ArmRulePass(FoldDyTAlphaIntoLUTPass(ep),
                                             tuple(rules_for("FoldDyTAlphaIntoLUTPass")))
    rule_pass.exported_program = ep
    with TosaLoweringContext(INT):
        rule_pass(ep.graph_module)
    return rule_pass


def test_the_rule_builds_stocks_table() -> None:
    stock_ep, our_ep = _dyt_program(), _dyt_program()
    assert _stock(stock_ep)
    report = _ours(our_ep).history[0]
    assert report.total_fused == 1, report
    assert not any("tanh" in t or "mul" in t for t in _ops(our_ep))
    assert sum("TABLE" in t for t in _ops(our_ep)) == 1
    assert torch.equal(_table(our_ep), _table(stock_ep))
    # the table is the integer path on every int8 code (ExecuTorch's own reference)
    codes = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)
    assert torch.equal(_table(our_ep), stock_dyt_test._tosa_reference_outputs(codes))


def test_an_alpha_that_broadcasts_the_product_is_declined_where_stock_folds() -> None:
    # alpha [1, 1, 1, 1, 1] times a [1, 1, 16, 16] activation: the tanh's output is rank 5;
    # stock's TABLE on the activation is rank 4, read by every user as rank 5
    stock_ep, our_ep = _dyt_program((1, 1, 1, 1, 1)), _dyt_program((1, 1, 1, 1, 1))
    assert _stock(stock_ep)
    table = next(n for n in stock_ep.graph.nodes if "TABLE" in str(n.target))
    assert table.args[0].meta["val"].dim() == 4 and table.meta["val"].dim() == 5
    report = _ours(our_ep).history[0]
    assert report.total_fused == 0
    (why,) = [d.reason for d in report.declined]
    assert "the tanh's output is [1, 1, 1, 16, 16], the activation [1, 1, 16, 16]" in why
    assert any("tanh" in t for t in _ops(our_ep))


# --- FoldDyTAlphaIntoLUTPass: fusionkit.verify on the pipeline's program form ---------------

def test_verify_judges_the_alpha_fold_bit_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program form gives the drawn site the edge dialect's targets and the qparams the
    pipeline writes; the tanh runs as InsertTableOpsPass's table: the fold equals the chain
    on every drawn code, with no int8 tolerance at all."""
    from fusionkit.authoring import verify as verify_module
    from fusionkit.authoring.verify import EQUAL, verify
    from fusionkit.passes.arm.dyt_alpha_lut import dyt_alpha_lut_rule

    monkeypatch.setitem(verify_module.TOLERANCES, torch.int8, 0)
    v = verify(dyt_alpha_lut_rule(), cases=8, max_examples=80)
    assert v.status == EQUAL and v.cases >= 8, v  # (more once every drawn variant is judged)


def test_verify_finds_a_table_that_ignores_the_alpha_different() -> None:
    """The same fold computing its table for an alpha of 1 (the code read as absent)."""
    import dataclasses

    from fusionkit import PythonReplacement
    from fusionkit.authoring.verify import DIFFERENT, verify
    from fusionkit.passes.arm.dyt_alpha_lut import dyt_alpha_lut_rule

    right = dyt_alpha_lut_rule()
    table: Any = right.replacement.fn  # type: ignore[attr-defined]

    def alpha_of_one(rw: Any, tanh: Any, out_rescale: Any, mul: Any) -> Any:
        read = rw.tensor

        def tensor(n: Any) -> torch.Tensor:
            t = read(n)
            return torch.ones_like(t) if t.numel() == 1 else t

        rw.tensor = tensor
        return table(rw, tanh, out_rescale, mul)

    wrong = dataclasses.replace(right, name="dyt_alpha_ignored",
                                replacement=PythonReplacement(alpha_of_one))
    v = verify(wrong, cases=8, max_examples=80)
    assert v.status == DIFFERENT and v.counterexample is not None, v
    assert v.counterexample.inputs["rhs_code"]["values"] != [1], v.counterexample


def test_the_program_form_writes_the_qparams_the_pipeline_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The alpha form's qparams, derived from the site's rescales alone, on the site the
    pipeline gives the rule (ExecuTorch's DyT fixture): the activation, the mul and the tanh
    carry the pipeline's keys, dtypes, ranges and zero points; and the scale relations the
    form derives its scales by hold of the pipeline's own."""
    import copy
    import math

    from fusionkit.passes.arm import _dyt_sites, dyt_alpha_lut
    from fusionkit.targets import op_key

    sites: list[Any] = []
    call = preprocess_rules.ArmRulePass.__call__

    def capture(self: Any, graph_module: Any) -> Any:
        if self.stock_pass == "FoldDyTAlphaIntoLUTPass":
            sites.append(copy.deepcopy(graph_module))
        return call(self, graph_module)

    monkeypatch.setattr(preprocess_rules.ArmRulePass, "__call__", capture)
    torch.manual_seed(0)
    with rm.dyt_folds_inserted():
        rm.evaluate(DyT().eval(), (torch.rand(1, 3, 8, 8),), fusionkit=True, spec=rm.INT)
    (gm,) = sites
    (tanh,) = [n for n in gm.graph.nodes if op_key(n.target) == "aten.tanh.default"]
    out_rescale, mul = tanh.args[0], tanh.args[0].args[0]
    rescales = [a if op_key(a.target) == dyt_alpha_lut.RESCALE else a.args[0]
                for a in mul.args[:2]]
    activation = next(r for r in rescales if r.args[0].op != "placeholder")
    written = {tanh: ("input_qparams", "output_qparams"), mul: ("input_qparams", "output_qparams"),
               activation.args[0]: ("output_qparams",)}
    real = {n: {k: n.meta.pop(k) for k in keys} for n, keys in written.items()}
    constants = {r.args[0].name for r in rescales if r is not activation}
    _dyt_sites._annotate_alpha_site(tanh, out_rescale, mul, constants)
    assert all(gm.graph.find_nodes(op="placeholder", target=c)[0].meta.get("output_qparams")
               is None for c in constants)  # (a frozen parameter has none)
    for n, keys in written.items():
        for key in keys:
            want, got = real[n][key], n.meta[key]
            assert set(got) == set(want), (n.name, key)
            for i, q in want.items():
                # (the tanh's output zero point is its own: no rescale of the site says it)
                own = n is tanh and key == "output_qparams"
                fields = ("dtype", "qmin", "qmax", "per_channel", "axis", *(() if own else ("zp",)))
                assert [getattr(got[i], f) for f in fields] == [getattr(q, f) for f in fields], (
                    n.name, key, i, got[i], q)
    mul_in, index = real[mul]["input_qparams"], rescales.index(activation)
    act = real[activation.args[0]]["output_qparams"][0]
    assert math.isclose(mul_in[index].scale, act.scale / float(activation.args[2][0]))
    product = real[mul]["output_qparams"][0].scale
    assert math.isclose(product, mul_in[0].scale * mul_in[1].scale, rel_tol=1e-6)
    assert math.isclose(real[tanh]["input_qparams"][0].scale,
                        product / float(out_rescale.args[2][0]), rel_tol=1e-6)
