"""Every built-in constraint, accepting and declining, and what a decline says.

Constraint rules here root at ``aten.sub.Tensor`` (not commutative, so the
decline reported is the one for the written operand order).
"""

from __future__ import annotations

import pytest
import torch
from models import (
    AddMM,
    SiluLikeEscape,
    addmm_rule,
    export_aten,
    export_edge,
    node_named,
    rand_inputs,
    silu_rule,
)
from torch import nn
from torch.export import Dim

from fusionkit import (
    Custom,
    DtypeIn,
    GraphLeaf,
    PrepackableConstant,
    Rank,
    Rule,
    SameDtype,
    ScalarRange,
    ShapeRelation,
    StaticShape,
    UserInput,
    any_float,
    broadcasts_over_last_dim,
    capture,
    find_matches,
    op,
    ref,
    replace_with,
)
from fusionkit.rule import RuleError
from fusionkit.targets import op_key

X2 = rand_inputs((2, 8))


class SubOf(nn.Module):
    """``x - <b>`` for every kind of operand ``b`` can be, one output each.

    Roots (ATen names): ``sub`` param, ``sub_1`` buffer, ``sub_2`` lifted
    constant, ``sub_3`` user input, ``sub_4`` computed (``relu(y)``),
    ``sub_5`` float16 parameter, ``sub_6`` (1, 8) parameter, ``sub_7`` (2, 8)
    parameter.
    """

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.randn(8))
        self.register_buffer("buf", torch.randn(8))
        self.c = torch.randn(8)
        self.h = nn.Parameter(torch.randn(8).to(torch.float16))
        self.row = nn.Parameter(torch.randn(1, 8))
        self.full = nn.Parameter(torch.randn(2, 8))

    def forward(self, x, y):
        return (x - self.p, x - self.buf, x - self.c, x - y, x - torch.relu(y), x - self.h,
                x - self.row, x - self.full)


@pytest.fixture(scope="module")
def sub_ep():
    return export_aten(SubOf(), rand_inputs((2, 8), (8,)))


ROOTS = {"param": "sub", "buffer": "sub_1", "const": "sub_2", "input": "sub_3",
         "computed": "sub_4", "half": "sub_5", "row": "sub_6", "full": "sub_7"}


def _sub_rule(*constraints, name: str = "r") -> Rule:
    return Rule(name, op("aten.sub.Tensor", capture("x"), capture("b")),
                replace_with("aten.sub.Tensor", ref("x"), ref("b")),
                constraints=list(constraints))


def _outcomes(ep, rule):
    """root name -> None (accepted) or the decline."""
    ms = find_matches(ep, [rule])
    out = {m.root.name: None for m in ms.accepted}
    out.update({d.root.name: d for d in ms.declined})
    return out


def _accepted_kinds(ep, *constraints):
    out = _outcomes(ep, _sub_rule(*constraints))
    return {k for k, root in ROOTS.items() if out.get(root, "missing") is None}


def test_sub_program_is_what_the_tests_assume(sub_ep):
    targets = {n.name: op_key(n.target) for n in sub_ep.graph_module.graph.nodes
               if n.op == "call_function"}
    for root in ROOTS.values():
        assert targets[root] == "aten.sub.Tensor"


# ---------------------------------------------------------------- PrepackableConstant


def test_prepackable_constant_accepts_params_buffers_and_lifted_constants(sub_ep):
    assert _accepted_kinds(sub_ep, PrepackableConstant("b")) == {
        "param", "buffer", "const", "half", "row", "full"}


def test_prepackable_constant_declines_a_user_input(sub_ep):
    d = _outcomes(sub_ep, _sub_rule(PrepackableConstant("b", role="it is prepacked"),
                                    name="pp"))[ROOTS["input"]]
    assert d.rule == "pp"
    assert d.root is node_named(sub_ep, "sub_3")
    assert d.step == "prepackable_constant"
    assert d.node is node_named(sub_ep, "y")
    assert "is a user input" in d.reason
    assert "it is prepacked" in d.reason
    assert "pp at `sub_3`: declined (prepackable_constant) [y]:" in str(d)


def test_prepackable_constant_declines_a_computed_value_without_fold(sub_ep):
    d = _outcomes(sub_ep, _sub_rule(PrepackableConstant("b")))[ROOTS["computed"]]
    assert d.step == "prepackable_constant"
    assert d.node is node_named(sub_ep, "relu")
    assert "computed in the graph (aten.relu.default)" in d.reason


def test_prepackable_constant_fold_never_folds_what_depends_on_an_input(sub_ep):
    d = _outcomes(sub_ep, _sub_rule(PrepackableConstant("b", fold=True)))[ROOTS["computed"]]
    assert d.step == "prepackable_constant"
    assert "cannot be folded" in d.reason
    assert "depends on a user input `y`" in d.reason


def test_prepackable_constant_declines_a_mutable_buffer():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(8))

        def forward(self, x):
            self.n.add_(1.0)
            return x - self.n

    ep = export_aten(Counter(), X2)
    ms = find_matches(ep, [_sub_rule(PrepackableConstant("b"))])
    assert ms.accepted == []
    (d,) = ms.declined
    assert d.step == "prepackable_constant"


def test_prepackable_constant_declines_a_literal():
    class SubScalar(nn.Module):
        def forward(self, x):
            return x - 2.0

    ep = export_aten(SubScalar(), X2)
    rule = Rule("r", op("aten.sub.Tensor", capture("x"), any_float("b")),
                replace_with("aten.sub.Tensor", ref("x"), ref("b")),
                constraints=[PrepackableConstant("b")])
    (d,) = find_matches(ep, [rule]).declined
    assert d.step == "prepackable_constant" and "literal" in d.reason


@pytest.mark.parametrize("bias", ["cast", "plus_one"])
@pytest.mark.parametrize("fold", [False, True])
def test_prepackable_constant_fold_plans_a_fold_of_constant_expressions(bias, fold):
    ep = export_edge(AddMM(bias), X2)
    ms = find_matches(ep, [addmm_rule(fold=fold)])
    if fold:
        (m,) = ms.accepted
        assert set(m.folds) == {"bias"}
        assert m.folds["bias"] is m.captures["bias"]
        assert m.captures["bias"].op == "call_function"
        assert "folds bias=" in str(m)
    else:
        assert ms.accepted == []
        (d,) = ms.declined
        assert d.step == "prepackable_constant"
        assert "computed in the graph" in d.reason


# ------------------------------------------------------------- GraphLeaf / UserInput


def test_graph_leaf(sub_ep):
    assert _accepted_kinds(sub_ep, GraphLeaf("b")) == set(ROOTS) - {"computed"}
    d = _outcomes(sub_ep, _sub_rule(GraphLeaf("b")))[ROOTS["computed"]]
    assert d.step == "graph_leaf"
    assert "not a graph leaf" in d.reason and "computed in the graph" in d.reason


def test_user_input(sub_ep):
    assert _accepted_kinds(sub_ep, UserInput("b")) == {"input"}
    out = _outcomes(sub_ep, _sub_rule(UserInput("b")))
    assert out[ROOTS["param"]].step == "user_input"
    assert "is a parameter, not a user input" in out[ROOTS["param"]].reason
    assert "is a buffer" in out[ROOTS["buffer"]].reason
    assert "is a lifted constant" in out[ROOTS["const"]].reason


# ------------------------------------------------------------ dtype / rank / shape


def test_dtype_in(sub_ep):
    assert _accepted_kinds(sub_ep, DtypeIn("b", frozenset({torch.float16}))) == {"half"}
    d = _outcomes(sub_ep, _sub_rule(DtypeIn("b", frozenset({torch.float16}))))[ROOTS["param"]]
    assert d.step == "dtype"
    assert "has dtype float32, expected one of float16" in d.reason


def test_rank(sub_ep):
    assert _accepted_kinds(sub_ep, Rank("b", frozenset({2}))) == {"row", "full"}
    d = _outcomes(sub_ep, _sub_rule(Rank("b", frozenset({2}))))[ROOTS["param"]]
    assert d.step == "rank" and "has rank 1, expected [2]" in d.reason


def test_static_shape():
    class Sub(nn.Module):
        def forward(self, x, y):
            return x - y

    inputs = rand_inputs((4, 8), (4, 8))
    static = export_aten(Sub(), inputs)
    batch = Dim("batch", min=2, max=16)
    dynamic = export_aten(Sub(), inputs, dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    rule = _sub_rule(StaticShape("x"))
    assert len(find_matches(static, [rule]).accepted) == 1
    ms = find_matches(dynamic, [rule])
    assert ms.accepted == []
    (d,) = ms.declined
    assert d.step == "static_shape" and "dynamic shape" in d.reason


def test_same_dtype(sub_ep):
    assert _accepted_kinds(sub_ep, SameDtype("x", "b")) == set(ROOTS) - {"half"}
    d = _outcomes(sub_ep, _sub_rule(SameDtype("x", "b")))[ROOTS["half"]]
    assert d.step == "same_dtype"
    assert "torch.float32" in d.reason and "torch.float16" in d.reason


def test_broadcasts_over_last_dim(sub_ep):
    # b is a vector over the last dim of x: (8,) and (1, 8) yes, (2, 8) no
    accepted = _accepted_kinds(sub_ep, broadcasts_over_last_dim("b", "x"))
    assert accepted == {"param", "buffer", "const", "input", "computed", "half", "row"}
    d = _outcomes(sub_ep, _sub_rule(broadcasts_over_last_dim("b", "x")))[ROOTS["full"]]
    assert d.step == "shape_relation"
    assert "(2, 8)" in d.reason and "vector over the last dim" in d.reason


def test_broadcasts_over_last_dim_rejects_a_wrong_length():
    class Sub(nn.Module):
        def forward(self, x, y):
            return x - y

    ep = export_aten(Sub(), rand_inputs((1, 8), (8, 1)))
    ms = find_matches(ep, [_sub_rule(broadcasts_over_last_dim("b", "x"))])
    assert ms.accepted == [] and ms.declined[0].step == "shape_relation"


def test_shape_relation_custom_relation(sub_ep):
    same = ShapeRelation("x", "b", lambda a, b: a == b, "the same shape")
    assert _accepted_kinds(sub_ep, same) == {"full"}
    d = _outcomes(sub_ep, _sub_rule(same))[ROOTS["param"]]
    assert "expected the same shape" in d.reason


# ------------------------------------------------------------------- ScalarRange


class SubScalars(nn.Module):
    def forward(self, x):
        return x - 0.5, x - 3.0


@pytest.mark.parametrize("lo, hi, accepted", [
    (0.0, 1.0, {0.5}), (1.0, None, {3.0}), (None, None, {0.5, 3.0}), (4.0, 5.0, set())])
def test_scalar_range(lo, hi, accepted):
    ep = export_aten(SubScalars(), X2)
    rule = Rule("r", op("aten.sub.Tensor", capture("x"), any_float("s")),
                replace_with("aten.sub.Tensor", ref("x"), ref("s")),
                constraints=[ScalarRange("s", lo, hi)])
    ms = find_matches(ep, [rule])
    assert {m.captures["s"] for m in ms.accepted} == accepted
    assert len(ms.declined) == 2 - len(accepted)
    for d in ms.declined:
        assert d.step == "scalar_range" and "is not a number in" in d.reason


def test_scalar_range_declines_a_tensor(sub_ep):
    d = _outcomes(sub_ep, _sub_rule(ScalarRange("b", 0.0, 1.0)))[ROOTS["param"]]
    assert d.step == "scalar_range"


# ------------------------------------------------------------------------- Custom


def test_custom_constraint_reason_is_the_decline(sub_ep):
    def only_params(ctx):
        b = ctx.node("b")
        return None if b is not None and b.name.startswith("p_") else f"{b} is no param"

    out = _outcomes(sub_ep, _sub_rule(Custom(only_params, "only_params", ("b",))))
    accepted = {k for k, root in ROOTS.items() if out[root] is None}
    assert accepted == {"param", "half", "row", "full"}
    d = out[ROOTS["input"]]
    assert d.step == "custom:only_params"
    assert d.reason == "y is no param"
    assert d.node is node_named(sub_ep, "y")


def test_custom_constraint_sees_the_context(sub_ep):
    seen = []

    def spy(ctx):
        seen.append((ctx.root.name, ctx.val("x").shape, ctx.ep is sub_ep))
        return None

    find_matches(sub_ep, [_sub_rule(Custom(spy, "spy", ("x",)))])
    assert len(seen) == len(ROOTS)
    assert all(shape == (2, 8) and same_ep for _, shape, same_ep in seen)


def test_constraints_run_in_order_and_first_failure_wins(sub_ep):
    calls = []

    def never(ctx):
        calls.append(ctx.root.name)
        return "never"

    rule = _sub_rule(UserInput("b"), Custom(never, "never", ("b",)))
    out = _outcomes(sub_ep, rule)
    assert out[ROOTS["param"]].step == "user_input"
    assert out[ROOTS["input"]].step == "custom:never"
    assert calls == [ROOTS["input"]]


def test_constraint_on_an_unbound_capture_fails_when_the_rule_is_built():
    with pytest.raises(RuleError, match="never binds"):
        _sub_rule(UserInput("nope"))
    with pytest.raises(RuleError, match="never binds"):
        Rule("r", op("aten.relu.default", capture("x")),
             replace_with("aten.relu.default", ref("y")))


# --------------------------------------------------------------------- no escape


def test_escaping_intermediate_is_declined_with_step_escape():
    ep = export_aten(SiluLikeEscape(), X2)
    ms = find_matches(ep, [silu_rule()])
    assert ms.accepted == []
    (d,) = ms.declined
    assert d.rule == "silu"
    assert d.step == "escape"
    assert op_key(d.root.target) == "aten.mul.Tensor"
    assert op_key(d.node.target) == "aten.sigmoid.default"
    assert "also used by" in d.reason and "compute it twice" in d.reason


def test_allow_escape_accepts_it():
    ep = export_aten(SiluLikeEscape(), X2)
    (m,) = find_matches(ep, [silu_rule(allow_escape=True)]).accepted
    assert op_key(m.root.target) == "aten.mul.Tensor"


def test_captures_are_not_claimed_so_their_other_uses_do_not_escape():
    class SiluAndMore(nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(x), x + 1.0, torch.relu(x)

    ep = export_aten(SiluAndMore(), X2)
    ms = find_matches(ep, [silu_rule()])
    (m,) = ms.accepted
    assert ms.declined == []
    assert m.captures["x"] not in m.claimed
    assert {op_key(n.target) for n in m.claimed} == {"aten.mul.Tensor", "aten.sigmoid.default"}


# ------------------------------------------------------------- structural near miss


class NotQuiteRMSNorm(nn.Module):
    """``x * rsqrt(mean(x * y) + eps) * w``: the square is of two different values."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x, y):
        return x * torch.rsqrt((x * y).mean(-1, keepdim=True) + 1e-6) * self.w


def test_structural_near_miss_is_declined_with_step_structure():
    from fusionkit.passes.rms_norm import rms_norm_rule

    ep = export_aten(NotQuiteRMSNorm(), rand_inputs((2, 8), (2, 8)))
    ms = find_matches(ep, [rms_norm_rule()])
    assert ms.accepted == []
    structure = [d for d in ms.declined if d.step == "structure"]
    assert structure, ms.declined
    d = structure[0]
    assert d.rule == "rms_norm"
    assert op_key(d.root.target) == "aten.mul.Tensor"
    assert "capture `x` must be the same value" in d.reason
    assert find_matches(ep, [rms_norm_rule()], structural_declines=False).declined == []


def test_shallow_structural_misses_are_reported_for_a_users_rule_only():
    import dataclasses

    from models import MulSigmoidOther

    # x * sigmoid(y) fails after two pattern ops: too shallow for a shipped rule's report,
    # a near miss of a user's own rule (issue 23)
    ep = export_aten(MulSigmoidOther(), rand_inputs((2, 8), (2, 8)))
    ms = find_matches(ep, [silu_rule()])
    assert ms.accepted == [] and [d.step for d in ms.declined] == ["structure"]
    ms = find_matches(ep, [dataclasses.replace(silu_rule(), shipped=True)])
    assert ms.accepted == [] and ms.declined == []
