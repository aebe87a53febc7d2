"""The Arm takeover of ``FoldDyTAffineIntoConvPass`` (an int8 DyT's gamma and beta folded into
the following convolution): through the whole TOSA pipeline against stock's flatbuffer and
the fake-quantized model on the reference model, and on ExecuTorch's own hand-built graphs
(its pass tests, run with the rule pass in the stock pass's place)."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("tosa_reference_model")
pytest.importorskip("executorch.backends.arm.tosa.partitioner")

import executorch.backends.arm.tosa.dialect  # noqa: F401  (registers tosa.*)
from executorch.backends.arm._passes import FoldDyTAffineIntoConvPass
from executorch.backends.arm.test.passes import test_fold_dyt_affine_into_conv_pass as stock_test

from fusionkit.backends.arm_adapter import preprocess_rules
from fusionkit.backends.arm_adapter import reference_model as rm
from fusionkit.passes.arm import rules_for

pytestmark = pytest.mark.slow

STOCK = "FoldDyTAffineIntoConvPass"


# --- whole pipeline ---------------------------------------------------------------------------

class DyTAffine(torch.nn.Module):
    """ExecuTorch's own ``DyTAffineModule`` (conv -> NHWC -> tanh(alpha x) * gamma + beta ->
    NCHW -> conv), with gamma, beta and the second conv's padding given."""

    def __init__(self, gamma: list[float] | None = None, beta: list[float] | None = None,
                 padding: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv_in = torch.nn.Conv2d(3, 3, kernel_size=1)
        self.alpha = torch.nn.Parameter(torch.tensor([0.5]))
        self.gamma = torch.nn.Parameter(torch.tensor(gamma or [1.0, 1.0, 1.0]))
        self.beta = torch.nn.Parameter(torch.tensor(beta or [0.0, 0.0, 0.0]))
        self.conv_out = torch.nn.Conv2d(3, 3, kernel_size=1, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.alpha * torch.permute(self.conv_in(x), (0, 2, 3, 1)))
        return self.conv_out(torch.permute(y * self.gamma + self.beta, (0, 3, 1, 2)))


#: name -> (model, whether the site is rewritten: stock's ``modified`` on these programs)
PIPELINE = {
    "identity": (DyTAffine(), True),
    "beta": (DyTAffine(beta=[0.1, -0.2, 0.05]), True),
    "padded": (DyTAffine(beta=[0.1, -0.2, 0.05], padding=1), True),
    "not_affine": (DyTAffine(gamma=[0.7, 1.3, -1.0], beta=[0.1, -0.2, 0.3]), False),
}


@pytest.mark.parametrize("case", sorted(PIPELINE))
def test_the_affine_fold_gives_stocks_tosa_and_equals_the_fake_quantized_model(case: str
                                                                              ) -> None:
    model, rewritten = PIPELINE[case]
    inputs = (torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)),)
    with rm.dyt_folds_inserted(affine=True):
        stock = rm.evaluate(model.eval(), inputs, fusionkit=False, spec=rm.INT)
        preprocess_rules.reset_counts()
        ours = rm.evaluate(model, inputs, fusionkit=True, spec=rm.INT)
    counts = preprocess_rules.counts()
    assert counts[STOCK] == {"runs": 1, "fused": int(rewritten)}, counts
    assert counts["FoldDyTAlphaIntoLUTPass"]["fused"] == 1, counts
    assert ours.tosa == stock.tosa
    assert ours.error == 0.0 and stock.error == 0.0  # bit-identical to the fake-quantized model


def test_not_inserted_nothing_is_taken_over() -> None:
    model, _ = PIPELINE["beta"]
    preprocess_rules.reset_counts()
    rm.evaluate(model.eval(), (torch.rand(1, 3, 8, 8),), fusionkit=True, spec=rm.INT)
    assert STOCK not in preprocess_rules.counts()


# --- ExecuTorch's own pass tests, with the rule pass in the stock pass's place ----------------

def _rule_pass(exported_program: Any) -> Any:
    rule_pass = preprocess_rules.ArmRulePass(FoldDyTAffineIntoConvPass(exported_program),
                                             tuple(rules_for(STOCK)))
    rule_pass.exported_program = exported_program
    return rule_pass(exported_program.graph_module)


#: every hand-built-graph test of ExecuTorch's (the pipeline test is the one above)
STOCK_TESTS = sorted(name for name, fn in inspect.getmembers(stock_test, inspect.isfunction)
                     if name.startswith("test_") and "tosa" not in name)


def test_every_stock_graph_test_is_run() -> None:
    assert len(STOCK_TESTS) >= 15, STOCK_TESTS


@pytest.mark.parametrize("name", STOCK_TESTS)
def test_the_rule_passes_executorchs_own_pass_test(name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Folded weights and biases, the ops left, the constants dropped, the zero points kept
    or moved: what ExecuTorch's test asserts of its pass holds of the rule."""
    calls: list[bool] = []

    def call(exported_program: Any) -> Any:
        result = _rule_pass(exported_program)
        calls.append(result.modified)
        return result

    monkeypatch.setattr(stock_test, "_call_pass", call)
    getattr(stock_test, name)()
    assert calls, f"{name} did not run the pass"


def test_a_declined_site_says_why() -> None:
    """Padded, and the affine map not the identity: the rule declines at the convolution."""
    from fusionkit import find_matches

    table = (torch.arange(256, dtype=torch.int16).remainder(21) - 10).to(torch.int8)
    ep, _, _ = stock_test._build_post_rescale_fixture(
        table=table, gamma_code=2, beta_code=3, actual_dyt_identity_qparams=False,
        padded_depthwise=True)
    ms = find_matches(ep, rules_for(STOCK))
    assert ms.accepted == []
    (decline,) = ms.declined
    assert "the convolution has padding" in decline.reason, decline.reason


def _gamma_doubled_each_call() -> Any:
    """ExecuTorch's fold fixture (gamma 2, beta 3, unpadded) whose gamma buffer the program
    doubles on every call (a ``BUFFER_MUTATION`` output): the mul reads the buffer's value
    at the call, 2 on the first, 4 on the second."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.export.graph_signature import (
        ExportGraphSignature,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )

    table = (torch.arange(256, dtype=torch.int16).remainder(21) - 10).to(torch.int8)
    ep, _, _ = stock_test._build_post_rescale_fixture(
        table=table, gamma_code=2, beta_code=3, actual_dyt_identity_qparams=False,
        padded_depthwise=False)
    graph = ep.graph_module.graph
    gamma = stock_test._buffer_nodes(ep)["gamma"]
    output = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(output):
        doubled = graph.call_function(exir_ops.edge.aten.add.Tensor, (gamma, gamma))
    doubled.meta["val"] = gamma.meta["val"]
    output.args = ((doubled, *output.args[0]),)
    sig = ep.graph_signature
    ep._graph_signature = ExportGraphSignature(list(sig.input_specs), [
        OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(doubled.name), "gamma"),
        *sig.output_specs])
    ep.graph_module.recompile()
    return ep


def test_stock_bakes_a_mutated_gamma_the_rule_declines() -> None:
    """Stock reads gamma with ``get_param_tensor`` (any buffer) and folds its value at
    lowering time into the weight, while the program goes on doubling it; the rule
    declines: a mutated buffer is not a constant."""
    from executorch.exir.dialects._ops import ops as exir_ops

    from fusionkit import find_matches

    stock_ep = _gamma_doubled_each_call()
    assert stock_test._call_pass(stock_ep).modified
    weight, _ = stock_test._conv_constants(stock_ep)
    folded_from = stock_test._fixture_weight_and_bias(depthwise=False, channel_slice=False)[0]
    assert torch.equal(weight, folded_from * 2)  # gamma's value at lowering, baked in
    assert exir_ops.edge.aten.mul.Tensor not in {
        n.target for n in stock_ep.graph_module.graph.nodes}

    ours = _gamma_doubled_each_call()
    ms = find_matches(ours, rules_for(STOCK))
    assert ms.accepted == []
    (decline,) = ms.declined
    assert "`b_gamma` is a mutable buffer" in decline.reason, decline.reason
    assert not _rule_pass(ours).modified


# --- fusionkit.verify on the pipeline's program form ------------------------------------------

def _recording_plans(monkeypatch: pytest.MonkeyPatch, log: Path, change: Any = None
                     ) -> Callable[[], Counter[str]]:
    """The plan kinds the rule computes from here on (each ``change(plan)`` first, if given),
    as a function that counts them: each is written to ``log`` where it is computed (the
    verifier's worker process is not this one)."""
    from fusionkit.passes.arm import dyt_affine_conv

    planned = dyt_affine_conv.plan

    def plan(*args: Any) -> Any:
        got = planned(*args)
        if isinstance(got, dyt_affine_conv.Plan):
            with log.open("a") as f:
                f.write(got.kind + "\n")
            got = change(got) if change is not None else got
        return got

    monkeypatch.setattr(dyt_affine_conv, "plan", plan)
    return lambda: Counter(log.read_text().split()) if log.exists() else Counter()


def test_verify_judges_every_branch_of_the_affine_fold_bit_exact(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The drawn site (TABLE, rescales, mul by gamma, add of beta, permute, int8 convolution)
    in the pipeline's form: the fold, the identity and the identity gamma are each judged,
    and the rewritten program equals the site's with no int8 tolerance at all."""
    from fusionkit.authoring import verify as verify_module
    from fusionkit.authoring.verify import EQUAL, verify
    from fusionkit.passes.arm.dyt_affine_conv import dyt_affine_conv_rule

    kinds = _recording_plans(monkeypatch, tmp_path / "plans")
    monkeypatch.setitem(verify_module.TOLERANCES, torch.int8, 0)
    v = verify(dyt_affine_conv_rule(), cases=40, max_examples=300)
    assert v.status == EQUAL and v.cases >= 40, v
    assert set(kinds()) == {"fold", "identity", "gamma_identity"}, kinds()


def test_verify_finds_a_fold_that_drops_the_folded_bias_different(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The fold keeping the convolution's own bias (beta's and the table zero point's offsets
    dropped): found different on a drawn site, judged bit-exact as the right fold is."""
    import dataclasses

    from fusionkit.authoring import verify as verify_module
    from fusionkit.authoring.verify import DIFFERENT, verify
    from fusionkit.passes.arm.dyt_affine_conv import dyt_affine_conv_rule

    monkeypatch.setitem(verify_module.TOLERANCES, torch.int8, 0)

    def keep_bias(plan: Any) -> Any:
        return dataclasses.replace(plan, bias=None) if plan.kind == "fold" else plan

    _recording_plans(monkeypatch, tmp_path / "plans", keep_bias)
    rule = dataclasses.replace(dyt_affine_conv_rule(), name="dyt_affine_keeps_bias")
    v = verify(rule, cases=20, max_examples=200)
    assert v.status == DIFFERENT and v.counterexample is not None, v
    assert v.counterexample.literals["padding"] == [0, 0], v.counterexample


_QPARAMS = ("input_qparams", "output_qparams")


def _site(conv: Any) -> dict[str, Any]:
    """The nodes of the affine site before ``conv``, by role."""
    from fusionkit.passes.arm import _dyt_sites as sites
    from fusionkit.passes.arm import dyt_affine_conv as m

    add_output = m._layout_source(conv.args[0])[0]
    add = add_output.args[0]
    a_index, a_rescale, gamma_output, _, _ = sites._binary(add, lambda n: m._is(n, m.RESCALE))
    mul = gamma_output.args[0]
    t_index, t_rescale, table, _, _ = sites._binary(mul, lambda n: m._is(n, sites.TABLE))
    return {"conv": conv, "add_output": add_output, "add": add, "a_index": a_index,
            "a_rescale": a_rescale, "gamma_output": gamma_output, "mul": mul,
            "t_index": t_index, "t_rescale": t_rescale, "table": table}


def test_the_program_form_writes_the_qparams_the_pipeline_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The affine form's qparams, derived from the site's rescales alone, on the site the
    pipeline gives the rule (ExecuTorch's DyT module, padded): each node the form annotates
    has the pipeline's keys, dtypes, ranges, zero points and per-channel layout; and the
    scale relations the form derives its scales by hold of the pipeline's own."""
    import copy
    import math

    from fusionkit.passes.arm import _dyt_sites, dyt_affine_conv
    from fusionkit.targets import op_key

    sites: list[Any] = []
    call = preprocess_rules.ArmRulePass.__call__

    def capture(self: Any, graph_module: Any) -> Any:
        if self.stock_pass == STOCK:
            sites.append(copy.deepcopy(graph_module))
        return call(self, graph_module)

    monkeypatch.setattr(preprocess_rules.ArmRulePass, "__call__", capture)
    model, _ = PIPELINE["padded"]
    inputs = (torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(0)),)
    with rm.dyt_folds_inserted(affine=True):
        rm.evaluate(model.eval(), inputs, fusionkit=True, spec=rm.INT)
    (gm,) = sites
    conv = [n for n in gm.graph.nodes if op_key(n.target) == "aten.convolution.default"][-1]
    s = _site(conv)
    written = {"table": ("output_qparams",), "mul": _QPARAMS, "add": _QPARAMS, "conv": _QPARAMS}
    real = {role: {k: s[role].meta.pop(k) for k in keys} for role, keys in written.items()}
    _dyt_sites._annotate_affine_site(conv, dyt_affine_conv._layout_source)
    for role, keys in written.items():
        for key in keys:
            want, got = real[role][key], s[role].meta[key]
            assert set(got) == set(want), (role, key)
            for i, q in want.items():
                # (the convolution's output zero point is its own: no rescale of the site says
                # it, the form states 0)
                own = role == "conv" and key == "output_qparams"
                fields = ("dtype", "qmin", "qmax", "per_channel", "axis", *(() if own else ("zp",)))
                assert [getattr(got[i], f) for f in fields] == [getattr(q, f) for f in fields], (
                    role, key, i, got[i], q)

    def ratio(node: Any) -> float:
        return float(node.args[2][0])

    table_out, mul_in = real["table"]["output_qparams"][0], real["mul"]["input_qparams"]
    assert math.isclose(mul_in[s["t_index"]].scale, table_out.scale / ratio(s["t_rescale"]))
    add_in = real["add"]["input_qparams"]
    int32 = real["mul"]["output_qparams"][0].scale / ratio(s["gamma_output"]) / ratio(
        s["a_rescale"])
    assert all(math.isclose(q.scale, int32, rel_tol=1e-6) for q in add_in.values())
    conv_in = real["conv"]["input_qparams"]
    assert math.isclose(conv_in[0].scale, int32 / ratio(s["add_output"]), rel_tol=1e-6)
    assert all(math.isclose(b, conv_in[0].scale * w, rel_tol=1e-6)
               for b, w in zip(conv_in[2].scale, conv_in[1].scale, strict=True))
