"""Captures as parameters: a check or replacement names what it reads in its signature.

``def check(ctx, x, bias=None)`` reads captures ``x`` and ``bias``; nothing
else lists them. These tests pin the contract: the reads are the signature,
a parameter the pattern does not bind (or binds only on some alternatives,
without a default) is refused when the rule is built, a check sees only its
parameters, the blame of a decline lands on the capture the check names, and
the form round-trips through YAML.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import export_aten, node_named, rand_inputs
from torch import nn

from fusionkit import (
    CheckContext,
    Custom,
    DtypeIn,
    MatchResult,
    PythonReplacement,
    Rule,
    capture,
    find_matches,
    op,
    ref,
    replace_with,
)
from fusionkit.check.capture_parameters import UndeclaredCapture
from fusionkit.check.constraints import Constraint
from fusionkit.rule import RuleError
from fusionkit.specs import load_spec_text, rules_equal, rules_to_yaml
from fusionkit.vocabulary import constraint_term

# ----------------------------------------------------------------------- a model


class MatmulBias(nn.Module):
    """``x @ w + b`` twice: once with a parameter bias (``add``), once with an input bias (``add_1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.mm(x, self.w) + self.b, torch.mm(x, self.w) + y


@pytest.fixture(scope="module")
def ep() -> Any:
    return export_aten(MatmulBias(), rand_inputs((2, 8), (4,)))


PATTERN = op("aten.add.Tensor", op("aten.mm.default", capture("x"), capture("w")), capture("bias"))


# module-level checks and builds: a spec refers to them by importable name

def bias_is_a_parameter(ctx: CheckContext, w: Any, bias: Any) -> Any:
    """Reads ``w`` first, but the fault it reports is the bias's."""
    if ctx.inputs.constant(bias) is None:
        return ctx.fail(f"bias `{bias.name}` is not a constant", at="bias")
    if ctx.inputs.constant(w) is None:
        return "the weight is not a constant"
    return None


def bias_blamed_by_value(ctx: CheckContext, w: Any, bias: Any) -> Any:
    return None if ctx.inputs.constant(bias) is not None else ctx.fail("not constant", at=bias)


def bare_reason(ctx: CheckContext, w: Any, bias: Any) -> Any:
    return None if ctx.inputs.constant(bias) is not None else "not constant"


def build_addmm(rw: Any, x: Any, w: Any, bias: Any) -> Any:
    return rw.call("aten.addmm.default", bias, x, w)


def _rule(*constraints: Constraint, replacement: Any = None) -> Rule:
    return Rule("mm_bias", PATTERN,
                replacement or replace_with("aten.addmm.default", ref("bias"), ref("x"), ref("w")),
                constraints=list(constraints))


def _declines(ep: Any, rule: Rule) -> dict[str, Any]:
    ms = find_matches(ep, [rule])
    return {d.root.name: d for d in ms.declined}


# ----------------------------------------------------------------------- reads


def test_reads_are_the_signature() -> None:
    c = Custom(bias_is_a_parameter, "bias_is_a_parameter")
    assert c.reads == ("w", "bias") and c.captures() == {"w", "bias"}
    r = PythonReplacement(build_addmm)
    assert r.reads == frozenset({"x", "w", "bias"}) and r.captures() == {"x", "w", "bias"}


def test_reads_listed_as_well_must_agree_with_the_signature() -> None:
    assert Custom(bias_is_a_parameter, "c", ("bias", "w")).reads == ("w", "bias")
    with pytest.raises(ValueError, match=r"reads \['w'\] differ from the parameters"):
        Custom(bias_is_a_parameter, "c", ("w",))


@pytest.mark.parametrize("fn, why", [
    (lambda ctx, *caps: None, "variadic"),
    (lambda ctx, **caps: None, "variadic"),
    (lambda ctx, x, /: None, "positional-only"),
    (lambda: None, "first parameter"),
])
def test_a_signature_that_hides_its_reads_is_refused(fn: Any, why: str) -> None:
    with pytest.raises(TypeError, match=why):
        Custom(fn, "c")


# ------------------------------------------------------------- refused when built


def test_a_check_naming_an_unbound_capture_is_refused_when_the_rule_is_built() -> None:
    def check(ctx: CheckContext, x: Any, weight: Any) -> None:
        return None

    with pytest.raises(RuleError) as e:
        _rule(Custom(check, "weight_ok"))
    msg = str(e.value)
    assert "'mm_bias'" in msg and "'weight_ok'" in msg and "'weight'" in msg
    assert "never binds" in msg


def test_a_replacement_naming_an_unbound_capture_is_refused_when_the_rule_is_built() -> None:
    def build(rw: Any, x: Any, scale: Any) -> Any:
        raise AssertionError("never built")

    with pytest.raises(RuleError, match=r"'mm_bias'.*the replacement.*'scale'.*never binds"):
        _rule(replacement=PythonReplacement(build))


def test_a_required_parameter_bound_on_some_alternatives_only_is_refused() -> None:
    pattern = (op("aten.addmm.default", capture("bias"), capture("x"), capture("w"))
               | op("aten.mm.default", capture("x"), capture("w")))

    def needs_bias(ctx: CheckContext, x: Any, bias: Any) -> None:
        return None

    def maybe_bias(ctx: CheckContext, x: Any, bias: Any = None) -> None:
        return None

    with pytest.raises(RuleError, match=r"'needs_bias'.*requires the parameter 'bias'.*default"):
        Rule("r", pattern, replace_with("aten.mm.default", ref("x"), ref("w")),
             constraints=[Custom(needs_bias, "needs_bias")])
    Rule("r", pattern, replace_with("aten.mm.default", ref("x"), ref("w")),
         constraints=[Custom(maybe_bias, "maybe_bias")])


# ------------------------------------------------------------------------- blame


def test_blame_lands_on_the_capture_the_check_names(ep: Any) -> None:
    rule = _rule(Custom(bias_is_a_parameter, "bias_is_a_parameter"))
    d = _declines(ep, rule)["add_1"]
    assert d.step == "custom:bias_is_a_parameter"
    assert d.reason == "bias `y` is not a constant"
    assert d.node is node_named(ep, "y")  # not w, the check's first parameter


def test_blame_by_the_parameter_value_names_its_capture(ep: Any) -> None:
    d = _declines(ep, _rule(Custom(bias_blamed_by_value, "by_value")))["add_1"]
    assert d.node is node_named(ep, "y")
    w, y = node_named(ep, "p_w"), node_named(ep, "y")
    ctx = CheckContext(ep, None, d.root, {"w": w, "bias": y})  # type: ignore[arg-type]
    assert (ctx.fail("why", at=y).capture, ctx.fail("why", at="w").node) == ("bias", w)


def test_a_bare_reason_is_about_the_first_parameter(ep: Any) -> None:
    d = _declines(ep, _rule(Custom(bare_reason, "bare")))["add_1"]
    assert d.reason == "not constant" and d.node is node_named(ep, "p_w")


# --------------------------------------------------------------- sees its reads


def test_a_check_sees_only_its_parameters(ep: Any) -> None:
    def sneaky(ctx: CheckContext, bias: Any) -> None:
        ctx.val("w")  # not a parameter

    rule = _rule(Custom(sneaky, "sneaky"))
    ms = find_matches(ep, [rule], strict=False)
    assert not ms.accepted
    assert all(d.step == "error" and "UndeclaredCapture" in d.reason and "'w'" in d.reason
               for d in ms.declined)
    with pytest.raises(UndeclaredCapture, match="sneaky"):
        find_matches(ep, [rule], strict=True)


def test_parameters_receive_the_captured_values(ep: Any) -> None:
    seen: list[tuple[str, str, str]] = []

    def spy(ctx: CheckContext, x: Any, w: Any, bias: Any) -> None:
        seen.append((x.name, w.name, bias.name))
        assert dict(ctx.captures) == {"x": x, "w": w, "bias": bias}

    ms = find_matches(ep, [_rule(Custom(spy, "spy"), replacement=PythonReplacement(build_addmm))])
    assert len(ms.accepted) == 2
    assert sorted(seen) == [("x", "p_w", "p_b"), ("x", "p_w", "y")]


def test_a_parameter_style_replacement_lowers_like_eager() -> None:
    from fusionkit import FusionPass

    model = MatmulBias()
    inputs = rand_inputs((2, 8), (4,), seed=3)
    prog = export_aten(model, inputs)
    rule = _rule(Custom(bias_is_a_parameter, "bias_is_a_parameter"),
                 replacement=PythonReplacement(build_addmm))
    result = FusionPass([rule])(prog)
    assert result.modified
    ops = [n.target for n in prog.graph_module.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.aten.addmm.default) == 1  # the input bias stays an add
    assert torch.ops.aten.add.Tensor in ops
    for got, want in zip(prog.module()(*inputs), model(*inputs), strict=True):
        torch.testing.assert_close(got, want)


# -------------------------------------------------------------------------- YAML


def test_parameter_style_rule_round_trips_through_yaml_without_listing_reads() -> None:
    rule = _rule(DtypeIn("x", frozenset({torch.float32})),
                 Custom(bias_is_a_parameter, "bias_is_a_parameter"),
                 replacement=PythonReplacement(build_addmm))
    text = rules_to_yaml([rule])
    assert "reads" not in text
    (back,) = load_spec_text(text, allow_modules=["test_captures_as_parameters"])
    assert rules_equal(back, rule)
    assert back.constraints[1].reads == ("w", "bias")  # type: ignore[attr-defined]
    assert back.replacement.captures() == {"x", "w", "bias"}
    assert rules_to_yaml([back]) == text


# ------------------------------------------------------- constraint classes: once


def test_a_registered_constraint_gets_its_kind_and_reads_from_its_registration() -> None:
    assert DtypeIn("x", frozenset({torch.int8})).kind == "dtype"
    assert DtypeIn("x", frozenset({torch.int8})).captures() == {"x"}
    assert DtypeIn.capture_fields == ("capture",)


def test_a_constraint_class_stating_its_kind_again_is_refused() -> None:
    from dataclasses import dataclass

    with pytest.raises(TypeError, match="states its kind"):
        @constraint_term("test_twice_kind", reads=("capture",))
        @dataclass(frozen=True)
        class Twice(Constraint):
            capture: str
            kind = "test_twice_kind"

            def check(self, ctx: CheckContext) -> MatchResult | None:
                return None


# ------------------------------------------------------------ every shipped rule


def _shipped_rules() -> list[tuple[str, Rule]]:
    """(module of the factory, rule) for every rule the registry holds."""
    from fusionkit.passes.registry import registered

    return [(f.make.__module__, r) for f in registered() for r in f.rules()]


SHIPPED = _shipped_rules()

def _capture_parameters(fn: Any) -> list[str]:
    import inspect

    return list(inspect.signature(fn).parameters)[1:]


def _hand_listed_reads(rule: Rule) -> list[str]:
    """Why ``rule`` is not written with captures as parameters (empty: it is)."""
    import inspect

    how = "write it as fn(ctx, <the captures it reads>) (docs/authoring.md)"
    why: list[str] = []
    for c in rule.constraints:
        if isinstance(c, Custom):
            params = _capture_parameters(c.fn)
            if c.parameters is None and (params or c.reads):
                why.append(f"check {c.name!r} lists its reads by hand: {how}")
            elif list(c.reads) != params:
                why.append(f"check {c.name!r} reads {list(c.reads)}, its parameters {params}")
            elif not params and "captures" in inspect.getsource(c.fn):
                # a check of the root alone must not read captures behind ctx
                why.append(f"check {c.name!r} reads ctx.captures: {how}")
    rep = rule.replacement
    if isinstance(rep, PythonReplacement):
        if rep.parameters is None:
            why.append("the replacement lists its reads by hand: write it as "
                       "build(rw, <the captures it reads>)")
        elif rep.reads != frozenset(_capture_parameters(rep.fn)):
            why.append("the replacement's reads are not its parameters")
    return why


@pytest.mark.parametrize("module, rule", SHIPPED, ids=[r.name for _, r in SHIPPED])
def test_every_shipped_rule_reads_exactly_its_signatures(module: str, rule: Rule) -> None:
    """Each custom check and Python replacement of a shipped rule declares its captures as
    parameters: its reads are its signature (no hand-listed reads left to drift)."""
    assert rule.replacement.captures() <= rule.pattern.captures()
    assert _hand_listed_reads(rule) == [], f"{module}: {rule.name}"


def _reads_x_by_hand(ctx: CheckContext) -> None:
    ctx.captures["x"]


def _builds_by_hand(rw: Any, c: Any) -> Any:
    return rw.call("aten.addmm.default", c["bias"], c["x"], c["w"])


def test_a_rule_listing_its_reads_by_hand_is_caught() -> None:
    """The check above can fail: each older form a shipped rule might be written in is named."""
    by_hand = _rule(Custom(_reads_x_by_hand, "x_by_hand", ("x",)),
                    replacement=PythonReplacement(_builds_by_hand, frozenset({"bias", "x", "w"})))
    assert _hand_listed_reads(by_hand) == [
        "check 'x_by_hand' lists its reads by hand: write it as fn(ctx, <the captures it "
        "reads>) (docs/authoring.md)",
        "the replacement lists its reads by hand: write it as build(rw, <the captures it reads>)"]
    hidden = _rule(Custom(_reads_x_by_hand, "root_only"))  # no parameters, reads ctx.captures
    assert _hand_listed_reads(hidden) == [
        "check 'root_only' reads ctx.captures: write it as fn(ctx, <the captures it reads>) "
        "(docs/authoring.md)"]
    assert _hand_listed_reads(_rule(Custom(bias_is_a_parameter, "ok"),
                                    replacement=PythonReplacement(build_addmm))) == []


# ------------------------------------------- a Vulkan rule: blame on the bad bias


class Q4LinearInputBias(nn.Module):
    """A torchao 4-bit weight-only linear whose bias is a user input (not prepackable)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.register_buffer("w", torch.randint(-8, 8, (16, 64), dtype=torch.int8, generator=gen))
        self.register_buffer("s", torch.rand(16, 2, generator=gen) * 0.1 + 0.01)
        self.register_buffer("z", torch.zeros(16, 2, dtype=torch.int8))

    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        w = torch.ops.torchao.dequantize_affine(self.w, [1, 32], self.s, self.z, torch.int8, -8, 7)
        return torch.nn.functional.linear(x, w, b)


def test_a_bad_quantized_linear_bias_is_blamed_on_the_bias_not_the_weight() -> None:
    from vulkan_pattern_helpers import edge

    from fusionkit.passes.vulkan.quantized_linear import q4gsw_linear_rule

    ep = edge(Q4LinearInputBias(), (torch.randn(3, 64), torch.randn(16)))
    ms = find_matches(ep, [q4gsw_linear_rule()])
    assert not ms.accepted
    (d,) = ms.declined
    assert d.step == "custom:bias_is_constant_vector"
    assert "is not a constant tensor" in d.reason
    assert d.node is not None and d.node.op == "placeholder" and d.node.name == "b"


def test_a_spec_whose_check_names_an_unbound_capture_is_refused_with_its_location() -> None:
    from fusionkit.specs import SpecError

    text = ("version: 1\nrules:\n- name: r\n"
            "  pattern: {op: aten.add.Tensor, args: [{capture: x}, {capture: w}]}\n"
            "  constraints:\n"
            "  - custom: {fn: 'test_captures_as_parameters:bias_is_a_parameter', name: c}\n"
            "  replacement: {op: aten.add.Tensor, args: [{ref: x}, {ref: w}]}\n")
    with pytest.raises(SpecError) as e:
        load_spec_text(text, "bad.yaml", allow_modules=["test_captures_as_parameters"])
    assert e.value.file == "bad.yaml" and e.value.line is not None
    assert "'c'" in e.value.message and "'bias'" in e.value.message
    assert "never binds" in e.value.message
