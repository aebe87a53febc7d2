"""One vocabulary: every shipped rule and every DSL construct round-trips Python -> YAML -> Python.

"Equal" is structural equality of the rule's fields (patterns, constraints and
replacements compare as data, a named value matcher by its arguments), not a
comparison of two dumps. The schema, the compiler and the dumper are derived
from the registry in :mod:`fusionkit.vocabulary`, so the tests below check the
registry's contract once for every term instead of listing terms by hand.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import AddMM, export_aten, rand_inputs

import fusionkit as fk
from fusionkit.passes.registry import registered
from fusionkit.specs import (
    DumpError,
    SpecError,
    json_schema,
    load_spec_text,
    rule_to_data,
    rules_equal,
    rules_to_yaml,
)
from fusionkit.specs.equality import rule_differences
from fusionkit.vocabulary import CONSTRAINTS, VALUE_MATCHERS, arguments_of


def _shipped_rules() -> list[fk.Rule]:
    seen: dict[str, fk.Rule] = {}
    for factory in registered():
        for r in factory.rules():
            seen.setdefault(r.name, r)
    return list(seen.values())


SHIPPED = _shipped_rules()


def _round_trip(rule: fk.Rule, **consent: Any) -> tuple[fk.Rule, str]:
    text = rules_to_yaml([rule])
    (back,) = load_spec_text(text, **consent)
    return back, text


# ------------------------------------------------------------- every shipped rule

def test_every_builtin_rule_is_among_the_checked_ones() -> None:
    names = {r.name for r in SHIPPED}
    assert {r.name for r in fk.passes.rule_set("builtin")} <= names  # type: ignore[attr-defined]
    assert len(fk.passes.rule_set("builtin")) >= 15  # type: ignore[attr-defined]


@pytest.mark.parametrize("rule", SHIPPED, ids=[r.name for r in SHIPPED])
def test_shipped_rule_round_trips_to_an_equal_rule(rule: fk.Rule) -> None:
    back, text = _round_trip(rule, trust=True)
    assert rule_differences(back, rule) == []
    assert rules_equal(back, rule)
    assert rules_to_yaml([back]) == text  # the dump is stable
    # no Python predicate is left in a shipped rule: every value matcher is named vocabulary
    assert "python" not in text


# ---------------------------------------------------------------- the registry

def _schema_defs() -> dict[str, Any]:
    return json_schema()["$defs"]  # type: ignore[return-value]


@pytest.mark.parametrize("key", sorted(VALUE_MATCHERS) + sorted(CONSTRAINTS))
def test_schema_fields_are_the_python_parameters(key: str) -> None:
    term = VALUE_MATCHERS.get(key) or CONSTRAINTS[key]
    defs = _schema_defs()
    camel = "".join(w.capitalize() for w in key.split("_"))
    entry = defs[camel + ("Node" if key in VALUE_MATCHERS else "Constraint")]
    ref = entry["properties"][key]
    args = defs[ref["$ref"].rsplit("/", 1)[1]] if "$ref" in ref else ref
    assert list(args["properties"]) == [p.name for p in term.parameters]


def test_every_term_dumps_back_to_its_arguments() -> None:
    """Build each value matcher with its defaults, dump, load: the same object."""
    required = {"lit": {"value": 3}, "one_of": {"values": [1, 2]}}
    for key in VALUE_MATCHERS:
        built = getattr(fk, key)(**required.get(key, {}))
        assert arguments_of(built)[0].key == key
        rule = fk.Rule("t", fk.op("aten.add.Tensor", fk.capture("a"), built),
                       fk.replace_with("aten.relu.default", fk.ref("a")))
        back, _ = _round_trip(rule)
        assert back.pattern == rule.pattern, key


# --------------------------------------------------------- every DSL construct

def module_check(ctx: fk.CheckContext) -> str | None:
    """A custom check with an importable name (used through the trust opt-in)."""
    return None


def module_build(rw: fk.Rewriter, c: Any) -> Any:
    return rw.call("aten.cos.default", c["x"]), rw.call("aten.sin.default", c["x"])


def _every_construct() -> fk.Rule:
    x = fk.capture("x")
    shared = fk.through(["aten.clone.default"], x, max_depth=3)
    primary = fk.op("aten.cat.default",
                    fk.seq(fk.op("aten.mul.Tensor", shared, fk.any_float("k")), shared),
                    fk.integer("dim", lo=-4, hi=3),
                    ).bind("out")
    other = fk.op("aten.view_copy.default", fk.capture("x").bind("x_again"),
                  [1, -1], fk.per_row_block("blk", rank=3))
    return fk.Rule(
        name="every_construct",
        pattern=fk.outputs(primary, fk.also("side", other, near="x", max_depth=5)),
        constraints=[
            fk.DtypeIn("x", [torch.float32, torch.bfloat16]),  # any iterable
            fk.Rank("x", (2, 3)),
            fk.ScalarRange("k", lo=0.5),
            fk.PrepackableConstant("x", fold=True, role="why"),
            fk.broadcasts_over_last_dim("out", "x"),
            fk.Custom(module_check, "module_check", ["x", "out"]),
        ],
        replacement=fk.PythonReplacement(module_build, frozenset({"x"})),
        priority=2, allow_escape=True, description="all of it",
    )


def _values_rule() -> fk.Rule:
    return fk.Rule(
        "values",
        fk.op("quantized_decomposed.dequantize_per_tensor.default", fk.capture("q"),
              fk.positive("scale", tensor_ok=True), fk.integer("zp"), -128, 127, torch.int8,
              out_dtype=fk.optional_dtype(torch.float32, torch.float16), strict_defaults=False),
        fk.replace_with("aten.add.Tensor", fk.ref("q"), [fk.ref("zp"), 2], alpha=1),
        constraints=[fk.named_shape_relation("same_last_dim", "q", "q")],
    )


def test_every_construct_round_trips_with_consent() -> None:
    rule = _every_construct()
    with pytest.raises(SpecError, match="--trust"):
        _round_trip(rule)  # the custom check and the replacement are Python: consent needed
    back, text = _round_trip(rule, allow_modules=["test_specs_vocabulary"])
    assert rule_differences(back, rule) == []
    data = yaml.safe_load(text)["rules"][0]
    assert set(data["pattern"]) == {"outputs", "also"}
    assert data["replacement"]["fn"] == "test_specs_vocabulary:module_build"


def test_value_matchers_literals_and_dtypes_round_trip() -> None:
    rule = _values_rule()
    back, text = _round_trip(rule)
    assert rule_differences(back, rule) == []
    args = yaml.safe_load(text)["rules"][0]["pattern"]["args"]
    assert args[1] == {"positive": {"name": "scale", "tensor_ok": True}}
    assert args[2] == {"integer": {"name": "zp"}}
    assert args[5] == {"dtype": "int8"}


def test_structural_equality() -> None:
    a, b = _every_construct(), _every_construct()
    assert a.pattern == b.pattern and a.constraints == b.constraints and rules_equal(a, b)
    assert fk.lit(True) != fk.lit(1) and fk.lit(1) == fk.lit(1)
    assert fk.scalar("e", lo=0) == fk.scalar("e", lo=0.0) != fk.scalar("e", lo=0.1)
    pred = fk.where(lambda v: v > 1, "big")
    assert pred == pred and pred != fk.where(lambda v: v > 1, "big")
    assert not rules_equal(a, fk.Rule(**{**a.__dict__, "priority": 3}))


def test_plain_iterables_where_sets_are_required() -> None:
    assert fk.DtypeIn("x", [torch.int8]) == fk.DtypeIn("x", frozenset({torch.int8}))
    assert fk.DtypeIn("x", (d for d in [torch.int8])).dtypes == frozenset({torch.int8})
    assert fk.Rank("x", [4, 4]) == fk.Rank("x", {4})
    assert fk.Custom(module_check, "c", ["x"]).reads == ("x",)


def test_arbitrary_predicates_and_closures_have_no_spec_form() -> None:
    rule = fk.Rule("w", fk.op("aten.add.Tensor", fk.capture("a"), fk.where(lambda v: v > 1, "big")),
                   fk.replace_with("aten.relu.default", fk.ref("a")))
    with pytest.raises(DumpError, match=r"arbitrary Python predicate.*positive"):
        rule_to_data(rule)

    def local(ctx: fk.CheckContext) -> None:
        return None

    rule = fk.Rule("c", fk.op("aten.relu.default", fk.capture("a")),
                   fk.replace_with("aten.relu.default", fk.ref("a")),
                   constraints=[fk.Custom(local, "local", ["a"])])
    with pytest.raises(DumpError, match="closure or lambda"):
        rule_to_data(rule)


# ------------------------------------------------------------ named matchers

def test_named_matchers_decide_like_the_predicates_they_replace() -> None:
    assert fk.integer().predicate(3) and not fk.integer().predicate(True)
    assert not fk.integer().predicate(3.0) and not fk.integer(lo=1).predicate(0)
    assert fk.positive().predicate(0.5) and fk.positive().predicate(2)
    assert not any(fk.positive().predicate(v) for v in (0, -1.0, True, "1"))
    blk = fk.per_row_block()
    assert blk.predicate([1, 32]) and blk.predicate((1, 8))
    assert not any(blk.predicate(v) for v in ([2, 32], [1, 0], [1], [1, 2, 3], [True, 4]))
    assert fk.per_row_block(rank=3).predicate([1, 1, 64])
    opt = fk.optional_dtype(torch.float32)
    assert opt.predicate(None) and opt.predicate(torch.float32) and not opt.predicate(torch.float16)


# ----------------------------------------------------------- old spellings

OLD_GOOD = """\
version: 1
rules:
- name: r
  pattern:
    op: aten.mul.Tensor
    args:
    - {capture: x}
    - {op: aten.sigmoid.default, args: [{capture: x}]}
  replacement: {op: aten.silu.default, args: [{ref: x}]}
"""


@pytest.mark.parametrize("old,new,hint", [
    ("replacement:", "replace:", "`replacement`"),
    ("- {capture: x}\n", "- {scalar: {min: 0, name: x}}\n", "`lo`"),
    ("- {capture: x}\n", "- {scalar: {name: x}, bind: x}\n", "own `name`"),
    ("- {capture: x}\n", "- {through: casts, pattern: {capture: x}}\n", "`inner`"),
    ("{op: aten.silu.default, args: [{ref: x}]}", "{python: 'm:f', reads: [x]}", "`fn`"),
])
def test_old_names_are_errors_that_name_the_new_one(old: str, new: str, hint: str) -> None:
    load_spec_text(OLD_GOOD)
    text = OLD_GOOD.replace(old, new, 1)
    assert text != OLD_GOOD
    with pytest.raises(SpecError) as info:
        load_spec_text(text, file="old.yaml")
    assert hint in info.value.message and info.value.line is not None, info.value


# ------------------------------------------------------------ the node at fault

def blame_bias(ctx: fk.CheckContext) -> fk.MatchResult:
    return ctx.fail("the bias is the problem", at="bias")


def test_a_custom_check_names_its_node_at_fault() -> None:
    ep = export_aten(AddMM("param"), rand_inputs((4, 8)))
    rule = fk.Rule("addmm", fk.op("aten.add.Tensor", fk.op("aten.mm.default", fk.capture("a"),
                                                          fk.capture("w")), fk.capture("bias")),
                   fk.replace_with("aten.addmm.default", fk.ref("bias"), fk.ref("a"), fk.ref("w")),
                   constraints=[fk.Custom(blame_bias, "blame", ("a", "bias"))])
    (d,) = find_declines(ep, rule)
    assert d.node is not None and d.node.name == bias_name(ep)
    assert d.reason == "the bias is the problem" and d.step == "custom:blame"


def find_declines(ep: Any, rule: fk.Rule) -> list[Any]:
    return list(fk.find_matches(ep, [rule]).declined)


def bias_name(ep: Any) -> str:
    add = next(n for n in ep.graph.nodes if n.op == "call_function" and "add" in str(n.target))
    return next(a.name for a in add.args if a.op == "placeholder")


# ----------------------------------------------- generated literals and matchers

_dtypes = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                           torch.int64, torch.bool])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                     st.floats(allow_nan=False, width=64), st.text(max_size=5), _dtypes)
_literals = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
_names = st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True))
_bound = st.one_of(st.none(), st.integers(-5, 5))
_fbound = st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False))


def _value_matchers() -> st.SearchStrategy[fk.Pattern]:
    return st.one_of(
        st.builds(fk.lit, _literals, name=_names, tensor_ok=st.booleans()),
        st.builds(fk.one_of, st.lists(_literals, min_size=1, max_size=3), name=_names,
                  tensor_ok=st.booleans()),
        st.builds(fk.scalar, name=_names, lo=_fbound, hi=_fbound, tensor_ok=st.booleans()),
        st.builds(fk.integer, name=_names, lo=_bound, hi=_bound),
        st.builds(fk.int_list, length=st.one_of(st.none(), st.integers(0, 4)), name=_names),
        st.builds(fk.per_row_block, name=_names, rank=st.integers(1, 4)),
        st.builds(fk.positive, name=_names, tensor_ok=st.booleans()),
        st.builds(fk.any_float, name=_names, tensor_ok=st.booleans()),
        st.builds(fk.any_value, name=_names),
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_value_matchers(), min_size=1, max_size=4))
def test_generated_value_matchers_round_trip(values: list[fk.Pattern]) -> None:
    names = [v.name for v in values if v.name]  # type: ignore[attr-defined]
    if len(names) != len(set(names)) or "a" in names:
        return  # one capture name bound twice (to different matchers) is a spec error anyway
    rule = fk.Rule("gen", fk.op("aten.add.Tensor", fk.capture("a"), fk.seq(*values)),
                   fk.replace_with("aten.relu.default", fk.ref("a")))
    back, text = _round_trip(rule)
    assert back.pattern == rule.pattern, text
    assert rules_to_yaml([back]) == text


_caps = st.sampled_from(["a", "b", "c"])


def _constraints() -> st.SearchStrategy[fk.Constraint]:
    return st.one_of(
        st.builds(fk.PrepackableConstant, _caps, fold=st.booleans(),
                  role=st.text(min_size=1, max_size=12)),
        st.builds(fk.GraphLeaf, _caps), st.builds(fk.UserInput, _caps),
        st.builds(fk.StaticShape, _caps),
        st.builds(fk.DtypeIn, _caps, st.lists(_dtypes, min_size=1, max_size=4)),
        st.builds(fk.Rank, _caps, st.lists(st.integers(0, 6), min_size=1, max_size=3)),
        st.builds(fk.SameDtype, _caps, _caps),
        st.builds(fk.named_shape_relation,
                  st.sampled_from(["broadcasts_over_last_dim", "same_shape", "same_last_dim"]),
                  _caps, _caps),
        st.builds(fk.ReducesLastDim, _caps, _caps),
        st.builds(fk.ScalarRange, _caps, lo=_fbound, hi=_fbound),
        st.builds(fk.Custom, st.just(module_check), st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                  st.lists(_caps, max_size=3)),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_constraints(), max_size=5))
def test_generated_constraints_round_trip(constraints: list[fk.Constraint]) -> None:
    pattern = fk.op("aten.add.Tensor", fk.capture("a"), fk.op("aten.mul.Tensor", fk.capture("b"),
                                                              fk.capture("c")))
    rule = fk.Rule("gen", pattern, fk.replace_with("aten.relu.default", fk.ref("a")),
                   constraints=constraints)
    back, text = _round_trip(rule, allow_modules=["test_specs_vocabulary"])
    assert back.constraints == rule.constraints, text


def test_float_edge_cases_survive_yaml() -> None:
    for v in (math.inf, -math.inf, 1e-300, -0.0):
        rule = fk.Rule("f", fk.op("aten.add.Tensor", fk.capture("a"), fk.lit(v)),
                       fk.replace_with("aten.relu.default", fk.ref("a")))
        back, _ = _round_trip(rule)
        assert back.pattern == rule.pattern


def test_schema_is_serializable_and_names_every_term() -> None:
    text = json.dumps(json_schema())
    for key in (*VALUE_MATCHERS, *CONSTRAINTS, "outputs", "also", "seq", "replacement"):
        assert f'"{key}"' in text, key
