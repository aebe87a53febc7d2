"""The pattern DSL, construct by construct: each one matching and not matching.

Matching is exercised through :func:`find_matches` on real exported programs in
both dialects (ATen from ``torch.export``, edge from ``to_edge``).
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir.dialects._ops import ops as exir_ops
from models import (
    AddMM,
    MulSigmoidOther,
    Pow,
    RMSNorm,
    SiluLike,
    export_aten,
    export_edge,
    rand_inputs,
    silu_rule,
)
from torch import nn

from fusionkit import (
    CASTS,
    Rule,
    any_float,
    capture,
    find_matches,
    lit,
    op,
    ref,
    replace_with,
    scalar,
    through,
    where,
)
from fusionkit.match.pattern import Alt
from fusionkit.rule import RuleError
from fusionkit.targets import UnknownOpError, op_key

DIALECTS = ["aten", "edge"]


def _export(dialect: str, model: nn.Module, inputs: tuple[torch.Tensor, ...]):
    return (export_aten if dialect == "aten" else export_edge)(model, inputs)


def _rule(pattern, name: str = "r", **kw) -> Rule:
    """A rule around ``pattern``; the replacement is never applied by these tests."""
    first = sorted(pattern.captures())[0]
    return Rule(name, pattern, replace_with("aten.relu.default", ref(first)), **kw)


def _matches(ep, pattern, **kw):
    # these tests are about matching: the stand-in replacement (relu of the first capture)
    # is not what would run, so it is not built and judged at find time
    ms = find_matches(ep, [_rule(pattern, **kw)], check_replacements=False)
    return ms.accepted


X2 = rand_inputs((2, 8))


@pytest.fixture(scope="module", params=DIALECTS)
def silu_ep(request):
    return _export(request.param, SiluLike(), X2)


@pytest.fixture(scope="module", params=DIALECTS)
def silu_swapped_ep(request):
    return _export(request.param, SiluLike(swapped=True), X2)


@pytest.fixture(scope="module", params=DIALECTS)
def mul_sigmoid_other_ep(request):
    return _export(request.param, MulSigmoidOther(), rand_inputs((2, 8), (2, 8)))


@pytest.fixture(scope="module", params=DIALECTS)
def rms_ep(request):
    return _export(request.param, RMSNorm(), X2)


# ------------------------------------------------------------------------- op targets


@pytest.mark.parametrize("spelling", ["name", "name_colons", "aten_object", "edge_object"])
def test_op_by_name_or_object_matches_both_dialects(silu_ep, spelling):
    target = {
        "name": "aten.sigmoid.default",
        "name_colons": "aten::sigmoid.default",
        "aten_object": torch.ops.aten.sigmoid.default,
        "edge_object": exir_ops.edge.aten.sigmoid.default,
    }[spelling]
    found = _matches(silu_ep, op(target, capture("x")))
    assert len(found) == 1
    assert op_key(found[0].root.target) == "aten.sigmoid.default"
    assert found[0].captures["x"].op == "placeholder"


def test_op_key_is_the_same_for_aten_and_edge_overloads():
    assert op_key(torch.ops.aten.mul.Tensor) == "aten.mul.Tensor"
    assert op_key(exir_ops.edge.aten.mul.Tensor) == "aten.mul.Tensor"
    assert op_key("not an op") is None


def test_op_with_unknown_name_fails_when_built():
    with pytest.raises(UnknownOpError):
        op("aten.no_such_op.default", capture("x"))
    with pytest.raises(UnknownOpError):
        op("mul", capture("x"))


def test_op_of_a_different_target_does_not_match(silu_ep):
    assert _matches(silu_ep, op("aten.tanh.default", capture("x"))) == []


def test_multiple_targets(silu_ep):
    both = op(["aten.sigmoid.default", "aten.mul.Tensor"], capture("x"), commutative=False)
    roots = {op_key(m.root.target) for m in _matches(silu_ep, both)}
    assert roots == {"aten.sigmoid.default", "aten.mul.Tensor"}
    only_tanh_relu = op(["aten.tanh.default", "aten.relu.default"], capture("x"))
    assert _matches(silu_ep, only_tanh_relu) == []


# --------------------------------------------------------------------------- captures


def test_capture_used_twice_binds_the_same_node(silu_ep, mul_sigmoid_other_ep):
    x = capture("x")
    pattern = op("aten.mul.Tensor", x, op("aten.sigmoid.default", x))
    (m,) = _matches(silu_ep, pattern)
    assert m.captures["x"].op == "placeholder"
    assert _matches(mul_sigmoid_other_ep, pattern) == []


def test_mul_x_x_does_not_match_mul_x_y():
    class MulXY(nn.Module):
        def forward(self, x, y):
            return x * y, x * x

    ep = export_aten(MulXY(), rand_inputs((2, 8), (2, 8)))
    square = op("aten.mul.Tensor", capture("x"), capture("x"))
    found = _matches(ep, square)
    assert len(found) == 1
    root = found[0].root
    assert root.args[0] is root.args[1]
    # distinct names bind anything, so both multiplies match
    assert len(_matches(ep, op("aten.mul.Tensor", capture("x"), capture("y")))) == 2


def test_bind_names_an_inner_op(silu_ep):
    pattern = op("aten.mul.Tensor", capture("x"),
                 op("aten.sigmoid.default", capture("x")).bind("gate"))
    (m,) = _matches(silu_ep, pattern)
    assert op_key(m.captures["gate"].target) == "aten.sigmoid.default"
    assert m.captures["gate"] in m.claimed


def test_capture_name_must_be_an_identifier():
    with pytest.raises(ValueError, match="identifier"):
        capture("not valid")


# ------------------------------------------------------------------------ commutative


def test_commutative_ops_match_either_operand_order_with_one_rule(silu_ep, silu_swapped_ep):
    rule = silu_rule()  # aten.silu is not core ATen: its replacement is not judged here
    for ep in (silu_ep, silu_swapped_ep):
        ms = find_matches(ep, [rule], check_replacements=False)
        assert [m.rule.name for m in ms.accepted] == ["silu"]
    # the swapped graph really has the operands the other way round
    (m,) = find_matches(silu_swapped_ep, [rule], check_replacements=False).accepted
    assert op_key(m.root.args[0].target) == "aten.sigmoid.default"


def test_commutative_false_keeps_operand_order(silu_ep, silu_swapped_ep):
    x = capture("x")
    ordered = op("aten.mul.Tensor", x, op("aten.sigmoid.default", x), commutative=False)
    assert len(_matches(silu_ep, ordered)) == 1
    assert _matches(silu_swapped_ep, ordered) == []


def test_add_is_commutative_too():
    pattern = op("aten.add.Tensor", op("aten.mm.default", capture("a"), capture("b")),
                 capture("bias"))
    for swapped in (False, True):
        ep = export_aten(AddMM("param", swapped=swapped), X2)
        (m,) = _matches(ep, pattern)
        assert m.captures["bias"].name == "p_b"


def test_non_commutative_op_is_not_swapped():
    class Sub(nn.Module):
        def forward(self, x):
            return torch.sigmoid(x) - x

    ep = export_aten(Sub(), X2)
    x = capture("x")
    assert _matches(ep, op("aten.sub.Tensor", x, op("aten.sigmoid.default", x))) == []
    assert len(_matches(ep, op("aten.sub.Tensor", op("aten.sigmoid.default", x), x))) == 1


# ----------------------------------------------------------------------- alternatives


def test_alternatives_match_either_option(silu_ep):
    relu_or_sigmoid = op("aten.relu.default", capture("x")) | op("aten.sigmoid.default",
                                                                  capture("x"))
    assert isinstance(relu_or_sigmoid, Alt)
    (m,) = _matches(silu_ep, relu_or_sigmoid)
    assert op_key(m.root.target) == "aten.sigmoid.default"
    tanh_or_relu = op("aten.tanh.default", capture("x")) | op("aten.relu.default", capture("x"))
    assert _matches(silu_ep, tanh_or_relu) == []


def test_alternatives_flatten():
    a, b, c = (op(t, capture("x")) for t in
               ("aten.relu.default", "aten.tanh.default", "aten.sigmoid.default"))
    assert len(((a | b) | c).options) == 3
    assert len((a | (b | c)).options) == 3


@pytest.mark.parametrize("square", ["mul", "pow"])
def test_alternatives_inside_a_pattern(square):
    ep = export_aten(RMSNorm(square=square), X2)
    x = capture("x")
    sq = op("aten.mul.Tensor", x, x) | op("aten.pow.Tensor_Scalar", x, 2)
    found = _matches(ep, op("aten.mean.dim", sq, [-1], True))
    assert len(found) == 1
    only_mul = op("aten.mean.dim", op("aten.mul.Tensor", x, x), [-1], True)
    assert len(_matches(ep, only_mul)) == (1 if square == "mul" else 0)


def test_rule_root_must_be_an_op():
    with pytest.raises(RuleError, match="root must be an op"):
        Rule("bad", capture("x"), replace_with("aten.relu.default", ref("x")))
    with pytest.raises(RuleError, match="root must be an op"):
        Rule("bad", op("aten.relu.default", capture("x")) | capture("x"),
             replace_with("aten.relu.default", ref("x")))


# ---------------------------------------------------------------------------- through


class Casts(nn.Module):
    """relu of ``x`` after ``n`` dtype casts (alternating float16/float32)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x):
        for i in range(self.n):
            x = x.to(torch.float16 if i % 2 == 0 else torch.float32)
        return torch.relu(x)


@pytest.mark.parametrize("dialect, n_casts", [
    *[("edge", n) for n in (0, 1, 2, 3)],
    # ATen exports put aten._assert_tensor_metadata on every cast input: such
    # run-time checks do not count as users outside the match
    *[("aten", n) for n in (0, 1, 2, 3)],
])
def test_through_casts_any_number(dialect, n_casts):
    ep = _export(dialect, Casts(n_casts), X2)
    # the chain starts fp32 -> fp16 (narrowing): passed through only when the rule says so
    (m,) = _matches(ep, op("aten.relu.default", through(CASTS, capture("x"), narrowing=True)))
    x = m.captures["x"]
    assert x.op == "placeholder", "the whole cast chain is passed through"
    # the casts belong to the match (they are replaced with it)
    assert len(m.claimed) == 1 + n_casts
    cast_keys = {op_key(n.target) for n in m.claimed if n is not m.root}
    assert cast_keys <= set(CASTS)


def test_through_respects_max_depth():
    ep = export_aten(Casts(3), X2)
    (m,) = _matches(ep, op("aten.relu.default",
                           through(CASTS, capture("x"), max_depth=1, narrowing=True)))
    assert m.captures["x"].op == "call_function"
    assert len(m.claimed) == 2


def test_through_does_not_pass_other_ops():
    class NegRelu(nn.Module):
        def forward(self, x):
            return torch.relu(-x)

    ep = export_aten(NegRelu(), X2)
    pattern = op("aten.relu.default", through(CASTS, op("aten.sigmoid.default", capture("x"))))
    assert _matches(ep, pattern) == []
    leaf = op("aten.relu.default", through(CASTS, capture("x")))
    (m,) = _matches(ep, leaf)
    assert op_key(m.captures["x"].target) == "aten.neg.default"


def test_through_backs_off_to_a_shorter_chain_when_the_inner_pattern_needs_a_cast():
    # the inner pattern wants the float16 cast itself: the matcher tries the longest
    # chain first, fails, and backs off by one cast
    ep = export_edge(Casts(2), X2)
    to_fp16 = op("dim_order_ops._to_dim_order_copy.default", capture("x"),
                 dtype=torch.float16, strict_defaults=False)
    (m,) = _matches(ep, op("aten.relu.default", through(CASTS, to_fp16)))  # fp16 -> fp32 widens
    assert m.captures["x"].op == "placeholder"
    assert len(m.claimed) == 3
    to_fp64 = op("dim_order_ops._to_dim_order_copy.default", capture("x"),
                 dtype=torch.float64, strict_defaults=False)
    assert _matches(ep, op("aten.relu.default", through(CASTS, to_fp64))) == []


# ----------------------------------------------------------------- literal arguments


@pytest.fixture(scope="module")
def rms_aten():
    return export_aten(RMSNorm(eps=1e-5), X2)


def _mean(dim, keepdim):
    x = capture("x")
    return op("aten.mean.dim", op("aten.mul.Tensor", x, x), dim, keepdim)


def test_literal_list_argument_exact(rms_aten):
    assert len(_matches(rms_aten, _mean([-1], True))) == 1
    assert len(_matches(rms_aten, _mean((-1,), True))) == 1, "tuples equal lists"
    assert _matches(rms_aten, _mean([1], True)) == []
    assert _matches(rms_aten, _mean([-1, 0], True)) == []


def test_literal_bool_is_exact(rms_aten):
    assert _matches(rms_aten, _mean([-1], False)) == []
    assert _matches(rms_aten, _mean([-1], 1)) == [], "True is not 1"
    assert len(_matches(rms_aten, _mean([-1], lit(True)))) == 1


def test_literal_keyword_argument(rms_aten):
    x = capture("x")
    by_kw = op("aten.mean.dim", op("aten.mul.Tensor", x, x), [-1], keepdim=True)
    assert len(_matches(rms_aten, by_kw)) == 1
    assert _matches(rms_aten, op("aten.mean.dim", op("aten.mul.Tensor", x, x), [-1],
                                 keepdim=False)) == []


def test_predicate_on_literal(rms_aten):
    last = where(lambda d: list(d) == [-1], "dim == [-1]", name="dim")
    (m,) = _matches(rms_aten, _mean(last, True))
    assert list(m.captures["dim"]) == [-1]
    first = where(lambda d: list(d) == [0], "dim == [0]")
    assert _matches(rms_aten, _mean(first, True)) == []


def test_raising_predicate_is_an_error_decline_or_raises_when_strict(rms_aten):
    def boom(_):
        raise RuntimeError("cannot judge")

    rule = _rule(_mean(where(boom, "boom"), True))
    ms = find_matches(rms_aten, [rule], strict=False)
    assert ms.accepted == []
    (d,) = ms.declined
    assert (d.step, d.error_type, d.root.name) == ("error", "RuntimeError", "mean")
    assert "value matcher 'boom'" in d.reason and "cannot judge" in d.reason
    assert ms.errors == [d]
    with pytest.raises(RuntimeError, match="cannot judge"):
        find_matches(rms_aten, [rule], strict=True)


@pytest.mark.parametrize("exponent, matches", [(2, True), (3, False)])
def test_literal_exponent(exponent, matches):
    ep = export_aten(Pow(exponent), X2)
    found = _matches(ep, op("aten.pow.Tensor_Scalar", capture("x"), 2))
    assert len(found) == (1 if matches else 0)


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 0.1])
def test_any_float_binds_the_value(eps):
    ep = export_aten(RMSNorm(eps=eps), X2)
    x = capture("x")
    mean = op("aten.mean.dim", op("aten.mul.Tensor", x, x), [-1], True)
    (m,) = _matches(ep, op("aten.add.Tensor", mean, any_float("eps")))
    assert m.captures["eps"] == pytest.approx(eps)


def test_any_float_rejects_non_numbers():
    v = any_float()
    assert v.predicate(1e-6) and v.predicate(2)
    assert not v.predicate(True)
    assert not v.predicate(float("inf"))
    assert not v.predicate("1.0")


def test_literal_value_must_repeat_under_the_same_name():
    class TwoAdds(nn.Module):
        def forward(self, x):
            return torch.relu(x + 1.0) + 2.0, torch.relu(x + 3.0) + 3.0

    ep = export_aten(TwoAdds(), X2)
    inner = op("aten.add.Tensor", capture("x"), any_float("c"))
    pattern = op("aten.add.Tensor", op("aten.relu.default", inner), any_float("c"))
    (m,) = _matches(ep, pattern)
    assert m.captures["c"] == 3.0


# --------------------------------------------------- 0-d lifted constants as scalars


def _eps_pattern(value):
    x = capture("x")
    mean = op("aten.mean.dim", op("aten.mul.Tensor", x, x), [-1], True)
    return op("aten.add.Tensor", mean, value)


def test_edge_lifts_the_eps_into_a_0d_constant(rms_ep):
    (add,) = [n for n in rms_ep.graph_module.graph.nodes
              if op_key(getattr(n, "target", None)) == "aten.add.Tensor"]
    if "edge" not in str(type(add.target)).lower():
        assert add.args[1] == pytest.approx(1e-6)  # ATen keeps the literal
        return
    assert isinstance(add.args[1], torch.fx.Node)
    assert add.args[1].op == "placeholder"
    assert add.args[1].meta["val"].dim() == 0


def test_scalar_accepts_a_0d_constant_tensor(rms_ep):
    (m,) = _matches(rms_ep, _eps_pattern(scalar("eps")))
    assert isinstance(m.captures["eps"], float)
    assert m.captures["eps"] == pytest.approx(1e-6)


def test_scalar_without_tensor_ok_rejects_a_lifted_constant():
    edge = export_edge(RMSNorm(), X2)
    aten = export_aten(RMSNorm(), X2)
    strict = _eps_pattern(scalar("eps", tensor_ok=False))
    assert _matches(edge, strict) == []
    assert len(_matches(aten, strict)) == 1
    # a number literal matches what to_edge makes of it (issue 23): the float32 constant
    assert len(_matches(edge, _eps_pattern(lit(1e-6)))) == 1
    assert _matches(edge, _eps_pattern(lit(1e-5))) == []


def test_scalar_range(rms_ep):
    assert len(_matches(rms_ep, _eps_pattern(scalar("eps", lo=0.0, hi=1e-3)))) == 1
    assert _matches(rms_ep, _eps_pattern(scalar("eps", lo=1e-3))) == []


def test_scalar_does_not_accept_a_non_0d_or_non_constant_tensor():
    class AddTensor(nn.Module):
        def __init__(self):
            super().__init__()
            self.b = nn.Parameter(torch.ones(8))
            self.s = nn.Parameter(torch.tensor(0.5))

        def forward(self, x, y):
            return torch.relu(x) + self.b, torch.tanh(x) + y.sum(), torch.sigmoid(x) + self.s

    ep = export_aten(AddTensor(), rand_inputs((2, 8), (2, 8)))
    found = _matches(ep, op("aten.add.Tensor", op(["aten.relu.default", "aten.tanh.default",
                                                   "aten.sigmoid.default"], capture("x")),
                            scalar("s")))
    assert [op_key(m.root.args[0].target) for m in found] == ["aten.sigmoid.default"]
    assert found[0].captures["s"] == pytest.approx(0.5)


# ------------------------------------------------------------------- strict defaults


class AddAlpha(nn.Module):
    def __init__(self, alpha: float = 1) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return torch.add(a, b, alpha=self.alpha)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_strict_defaults_reject_non_default_arguments(dialect):
    inputs = rand_inputs((2, 8), (2, 8))
    plain = _export(dialect, AddAlpha(1), inputs)
    alpha2 = _export(dialect, AddAlpha(2), inputs)
    pattern = op("aten.add.Tensor", capture("a"), capture("b"))
    assert len(_matches(plain, pattern)) == 1
    assert _matches(alpha2, pattern) == []
    loose = op("aten.add.Tensor", capture("a"), capture("b"), strict_defaults=False)
    assert len(_matches(alpha2, loose)) == 1
    explicit = op("aten.add.Tensor", capture("a"), capture("b"), alpha=2)
    assert len(_matches(alpha2, explicit)) == 1
    assert _matches(plain, explicit) == []


def test_pattern_is_reusable_data():
    x = capture("x")
    p = op("aten.mul.Tensor", x, op("aten.sigmoid.default", x))
    assert p.captures() == {"x"}
    assert p.root_keys() == frozenset({"aten.mul.Tensor"})
    assert "aten.mul.Tensor" in repr(p)
