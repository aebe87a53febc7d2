"""``verify`` proves a rule of elementwise, broadcast and layout ops for every value and size.

Held-out right rules (a clamp chain, a double relu, a permute of a permute, a slice of a
slice, ``x * sigmoid(x)``) are proved; held-out wrong twins (a wrong bound, a dropped
operand, permutes composed in the wrong order, a slice off by one) are refuted with a
counterexample that running the case confirms; a rule outside the fragment says which op
has no symbolic form, and without the solver verify still samples and says why it did not
prove. The proof is checked against the solver itself (``prove_equal`` on exported programs
with symbolic sizes), not against strings this file expects.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import torch

from fusionkit import PythonReplacement, Rule, capture, lit, op, ref, replace_with
from fusionkit.app.verify_job import verification_text
from fusionkit.authoring.prove import NOT_PROVED, PROVED, REFUTED, available, prove_equal, ranges_of
from fusionkit.authoring.verify import DIFFERENT, EQUAL, verify
from fusionkit.passes.registry import rule_set

#: every test but the one without the solver needs z3 (the optional ``prove`` extra)
needs_z3 = pytest.mark.skipif(available() is not None, reason="z3-solver not installed")

X, Y = capture("x"), capture("y")
END = 9223372036854775807  # what export writes for an open slice end
CASES = 4


def _clamp_chain(lo: float, hi: float) -> Rule:
    """clamp(clamp(x, 0, 6), -1, 3) -> clamp(x, lo, hi): right for (0, 3)."""
    inner = op("aten.clamp.default", X, lit(0.0), lit(6.0))
    return Rule(f"clamp_chain_{lo}_{hi}", op("aten.clamp.default", inner, lit(-1.0), lit(3.0)),
                replace_with("aten.clamp.default", ref("x"), lo, hi))


def _relu_relu() -> Rule:
    return Rule("relu_relu", op("aten.relu.default", op("aten.relu.default", X)),
                replace_with("aten.relu.default", ref("x")))


def _permutes(composed: list[int]) -> Rule:
    """permute(permute(x, [1, 0, 2]), [0, 2, 1]) is permute(x, [1, 2, 0]); [2, 0, 1] composes
    them in the wrong order."""
    inner = op("aten.permute.default", X, lit([1, 0, 2]))
    return Rule(f"permute_permute_{''.join(map(str, composed))}",
                op("aten.permute.default", inner, lit([0, 2, 1])),
                replace_with("aten.permute.default", ref("x"), composed))


def _slices(start: int, end: int) -> Rule:
    """x[1:][1:3] along dim 0 is x[2:4]; x[1:3] is off by one."""
    inner = op("aten.slice.Tensor", X, lit(0), lit(1), lit(END))
    return Rule(f"slice_slice_{start}_{end}", op("aten.slice.Tensor", inner, lit(0), lit(1), lit(3)),
                replace_with("aten.slice.Tensor", ref("x"), 0, start, end))


def _silu() -> Rule:
    return Rule("mul_sigmoid_to_silu", op("aten.mul.Tensor", X, op("aten.sigmoid.default", X)),
                replace_with("aten.silu.default", ref("x")))


def _add_dropped() -> Rule:
    return Rule("add_dropped_operand", op("aten.add.Tensor", X, Y),
                replace_with("aten.clone.default", ref("x")))


def _neg_sum() -> Rule:
    """sum(-x) -> -sum(x): right, but a reduction has no symbolic form."""
    def fused(rw: Any, x: Any) -> Any:
        return rw.call("aten.neg.default", rw.call("aten.sum.dim_IntList", x, [-1]))

    return Rule("neg_sum", op("aten.sum.dim_IntList", op("aten.neg.default", X), lit([-1])),
                PythonReplacement(fused))


RIGHT = {"clamp chain": lambda: _clamp_chain(0.0, 3.0), "relu of relu": _relu_relu,
         "permute of permute": lambda: _permutes([1, 2, 0]), "slice of slice": lambda: _slices(2, 4),
         "x * sigmoid(x)": _silu}
WRONG = {"clamp chain, wrong bound": lambda: _clamp_chain(-1.0, 3.0),
         "x + y -> x": _add_dropped,
         "permutes composed in the wrong order": lambda: _permutes([2, 0, 1]),
         "slice off by one": lambda: _slices(1, 3)}


@needs_z3
@pytest.mark.parametrize("name", RIGHT)
def test_a_right_rule_of_elementwise_and_layout_ops_is_proved(name: str) -> None:
    v = verify(RIGHT[name](), cases=CASES)
    assert v.status == EQUAL, v
    assert v.proof is not None and v.proof.status == PROVED, v.proof
    proved, structures = v.proof.structures
    assert proved == structures >= 1
    assert "every size" in v.proof.reason and "over the reals" in v.proof.reason
    record = json.loads(json.dumps(v.to_dict()))
    assert record["proof"]["status"] == PROVED
    assert str(v.proof) in v.summary()
    text = verification_text([v])  # fusionkit verify's report: the proof line, the count
    assert f"  {v.proof}" in text.splitlines() and " 1 proved," in text.splitlines()[-1]


@needs_z3
@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_rule_is_refuted_with_a_counterexample_running_confirms(name: str) -> None:
    v = verify(WRONG[name](), cases=CASES)
    assert v.status == DIFFERENT, v  # the sampled verdict stays
    proof = v.proof
    assert proof is not None and proof.status == REFUTED, proof
    cx = proof.counterexample
    assert cx is not None and cx["confirmed"], cx  # the solver's case, run: it differs
    shapes = [tuple(s) for s in cx["shapes"].values()]
    assert shapes and all(all(d >= 1 for d in s) for s in shapes)
    assert "running them" in proof.reason


def _exported(f: Any, x: torch.Tensor) -> tuple[torch.fx.GraphModule, dict[str, Any]]:
    class P(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return f(x)  # type: ignore[no-any-return]

    dims = tuple(torch.export.Dim.AUTO for _ in x.shape)
    ep = torch.export.export(P(), (x,), dynamic_shapes=(dims,), strict=False)
    return ep.module(), ranges_of(ep)


@needs_z3
def test_the_solver_proves_and_refutes_programs_for_symbolic_sizes() -> None:
    """The permutes composed right are equal for every size; composed wrong, the solver gives
    operands (of its own sizes) on which running the two programs differs."""
    aten = torch.ops.aten
    x = torch.randn(2, 3, 4)
    before, ranges = _exported(
        lambda x: aten.permute.default(aten.permute.default(x, [1, 0, 2]), [0, 2, 1]), x)
    assert len(ranges) == 3  # one symbol per dim
    right, _ = _exported(lambda x: aten.permute.default(x, [1, 2, 0]), x)
    wrong, _ = _exported(lambda x: aten.permute.default(x, [2, 0, 1]), x)
    assert prove_equal(before, right, ranges=ranges).status == PROVED
    out = prove_equal(before, wrong, ranges=ranges)
    assert out.status == REFUTED, out
    (shape,) = out.shapes
    values = out.values[0]
    operand = torch.tensor(values, dtype=torch.float32) if values is not None else torch.randn(shape)
    want, got = before(operand), wrong(operand)
    assert want.shape != got.shape or not torch.equal(want, got)


@needs_z3
def test_a_rule_outside_the_fragment_is_not_proved_and_names_the_op() -> None:
    v = verify(_neg_sum(), cases=CASES)
    assert v.status == EQUAL and v.reason.startswith("equal on"), v
    assert v.proof is not None and v.proof.status == NOT_PROVED
    assert "aten.sum.dim_IntList" in v.proof.reason and "no symbolic form" in v.proof.reason


def test_without_the_solver_verify_samples_and_says_why_it_did_not_prove(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "z3", None)  # import z3 raises ImportError
    right, wrong = verify(_relu_relu(), cases=CASES), verify(_add_dropped(), cases=CASES)
    assert right.status == EQUAL and wrong.status == DIFFERENT, (right, wrong)
    assert wrong.counterexample is not None
    for v in (right, wrong):
        assert v.proof is not None and v.proof.status == NOT_PROVED
        assert "z3-solver not installed" in v.proof.reason


#: shipped rules of elementwise and layout ops, proved on their own cases
SHIPPED_PROVED = ("arm_fuse_consecutive_clamps", "fuse_view_copy", "view_to_squeeze", "view_to_unsqueeze",
                  "xnnpack_decompose_cat")


@needs_z3
def test_shipped_elementwise_and_layout_rules_are_proved() -> None:
    rules = {r.name: r for r in rule_set("shipped")}
    for name in SHIPPED_PROVED:
        v = verify(rules[name], cases=CASES)
        assert v.status == EQUAL, v
        assert v.proof is not None and v.proof.status == PROVED, (name, v.proof)
