"""YAML specs: round trip with the Python DSL, equivalence on the corpus, bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from models import export_edge, outputs_close, run_program
from rmsnorm_models import (
    ROWS,
    D,
    DiffusersRMSNorm,
    GemmaRMSNorm,
    HFLlamaRMSNorm,
    LlamaRMSNorm,
    QwenAttention,
    SharedWeight,
    T5LayerNorm,
    TwoUsers,
    VariantNorm,
)

import fusionkit as fk
from fusionkit import FusionPass, find_matches
from fusionkit.passes.rms_norm import rms_norm_rule
from fusionkit.specs import (
    SpecError,
    json_schema,
    load_spec_file,
    load_spec_text,
    load_specs,
    rule_to_data,
    rules_equal,
    rules_to_yaml,
)

SPEC_DIR = Path(fk.__file__).resolve().parent.parent / "passes" / "specs"
RMS_NORM_YAML = SPEC_DIR / "rms_norm.yaml"


def test_rms_norm_spec_is_installed_under_the_package() -> None:
    import fusionkit.passes

    installed = Path(fusionkit.passes.__file__).parent / "specs" / "rms_norm.yaml"
    assert installed.is_file()


# ------------------------------------------------------------------- round trips

def test_yaml_rms_norm_compiles_to_the_python_rule() -> None:
    (from_yaml,) = load_spec_file(RMS_NORM_YAML)
    assert rules_equal(from_yaml, rms_norm_rule())  # structurally, not only as dumps
    assert rule_to_data(from_yaml, hoist=False) == rule_to_data(rms_norm_rule(), hoist=False)


def test_python_rule_round_trips_through_yaml() -> None:
    rule = rms_norm_rule()
    text = rules_to_yaml([rule])
    (back,) = load_spec_text(text)
    assert rule_to_data(back) == rule_to_data(rule)
    assert rule_to_data(back, hoist=False) == rule_to_data(rule, hoist=False)
    # the dump is itself stable: dumping the reloaded rule gives the same text
    assert rules_to_yaml([back]) == text


def _every_construct_rule() -> fk.Rule:
    x = fk.capture("x")
    sig = fk.op("aten.sigmoid.default", fk.through(fk.CASTS, x))
    return fk.Rule(
        name="everything",
        pattern=fk.op("aten.mul.Tensor", x, sig | fk.op("aten.tanh.default", x)).bind("out"),
        constraints=[
            fk.DtypeIn("x", frozenset({torch.float32, torch.bfloat16})),
            fk.Rank("x", frozenset({2, 3})),
            fk.StaticShape("x"),
            fk.GraphLeaf("x"),
            fk.UserInput("x"),
            fk.SameDtype("out", "x"),
            fk.named_shape_relation("same_shape", "out", "x"),
        ],
        replacement=fk.replace_with("aten.silu.default", fk.ref("x")),
        priority=3,
        allow_escape=True,
        description="every construct",
    )


def test_every_construct_round_trips() -> None:
    rule = _every_construct_rule()
    (back,) = load_spec_text(rules_to_yaml([rule]))
    assert rule_to_data(back) == rule_to_data(rule)
    assert back.priority == 3 and back.allow_escape


def test_value_matchers_and_kwargs_round_trip() -> None:
    m = fk.op("aten.mean.dim", fk.capture("x"), fk.int_list(1, name="dim"),
              fk.one_of([True, False], name="keep"), dtype=None)
    rule = fk.Rule("mean", m, fk.replace_with("aten.mean.dim", fk.ref("x"), fk.ref("dim"),
                                              fk.ref("keep")))
    data = rule_to_data(rule)
    assert data["pattern"]["kwargs"] == {"dtype": None}
    (back,) = load_spec_text(rules_to_yaml([rule]))
    assert rule_to_data(back) == data


def test_arbitrary_python_predicate_has_no_yaml_form() -> None:
    from fusionkit.specs import DumpError

    rule = fk.Rule("w", fk.op("aten.add.Tensor", fk.capture("a"), fk.where(lambda v: v > 1, "big")),
                   fk.replace_with("aten.relu.default", fk.ref("a")))
    with pytest.raises(DumpError, match="arbitrary Python predicate"):
        rule_to_data(rule)


def test_schema_is_json_schema_for_the_format() -> None:
    schema = json_schema()
    assert schema["title"] == "fusionkit spec"
    assert set(schema["required"]) == {"version", "rules"}
    text = yaml.safe_dump(schema)  # serializable
    assert "prepackable_constant" in text and "through" in text


# ------------------------------------------------ equivalence on the whole corpus

def _corpus() -> list[tuple[str, torch.nn.Module, tuple[torch.Tensor, ...]]]:
    out = []
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for row in ROWS:
            x = torch.randn(2, D, generator=g).to(dtype)
            out.append((f"{row.name}-{dtype}", row.make(dtype), (x, *row.extra(dtype))))
    x3 = torch.randn(2, 3, D, generator=g)
    for cls in (LlamaRMSNorm, HFLlamaRMSNorm, GemmaRMSNorm, T5LayerNorm, DiffusersRMSNorm,
                TwoUsers, SharedWeight):
        out.append((cls.__name__, cls(), (x3,)))
    out.append(("QwenAttention", QwenAttention(), (torch.randn(2, 3, 16, generator=g),)))
    for kw in ({"square": "pow", "eps": "scalar", "weight_left": False},
               {"square": "mul", "eps": "scalar", "weight_left": True}):
        out.append((f"VariantNorm{kw}", VariantNorm(**kw), (x3,)))
    return out


CORPUS = _corpus()


def _summary(ms: fk.MatchSet) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    acc = [(m.rule.name, m.root.name, *sorted(n.name for n in m.claimed),
            *sorted(f"{k}={v.name}" for k, v in m.folds.items())) for m in ms.accepted]
    dec = [(d.rule, d.root.name, d.step, d.node.name if d.node is not None else "", d.reason)
           for d in ms.declined]
    return acc, dec


@pytest.mark.parametrize("name,model,inputs", CORPUS, ids=[c[0] for c in CORPUS])
def test_yaml_and_python_rules_decide_identically(name: str, model: torch.nn.Module,
                                                   inputs: tuple[torch.Tensor, ...]) -> None:
    ep = export_edge(model, inputs)
    (from_yaml,) = load_spec_file(RMS_NORM_YAML)
    assert _summary(find_matches(ep, [from_yaml])) == _summary(find_matches(ep, [rms_norm_rule()]))


def test_yaml_rule_fuses_and_keeps_numerics() -> None:
    _, model, inputs = CORPUS[3]  # gemma fp32: needs folding
    import copy

    ep = export_edge(model, inputs)
    (from_yaml,) = load_spec_file(RMS_NORM_YAML)
    p = FusionPass([from_yaml])
    res = p(copy.deepcopy(ep))
    assert res.modified and p.report.total_fused == 1
    assert outputs_close(run_program(res.exported_program, *inputs), model(*inputs))


# ------------------------------------------------------------------- bad input

GOOD = textwrap.dedent("""\
    version: 1
    rules:
    - name: silu
      pattern:
        op: aten.mul.Tensor
        args:
        - {capture: x}
        - op: aten.sigmoid.default
          args: [{capture: x}]
      replacement:
        op: aten.silu.default
        args: [{ref: x}]
    """)


def _bad(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, file="bad.yaml")
    return info.value


def test_good_spec_loads() -> None:
    (rule,) = load_spec_text(GOOD)
    assert rule.name == "silu" and rule.root_keys == frozenset({"aten.mul.Tensor"})


def test_malformed_yaml_names_file_and_line() -> None:
    e = _bad(GOOD.replace("args: [{capture: x}]", "args: [{capture: x}"))
    assert e.file == "bad.yaml" and e.line is not None and e.line >= 9
    assert "malformed YAML" in str(e) and str(e).startswith("bad.yaml:")


def test_unknown_key() -> None:
    e = _bad(GOOD.replace("  replacement:", "  replacee: 1\n  replacement:"))
    assert e.path == "rules[0].replacee" and "unknown key" in e.message and e.line == 10


def test_unknown_op_names_field_path_and_line() -> None:
    e = _bad(GOOD.replace("aten.sigmoid.default", "aten.sigmoidd.default"))
    assert e.path == "rules[0].pattern.args[1].op"
    assert e.line == 8 and "aten.sigmoidd.default" in e.message
    assert str(e).startswith("bad.yaml:8: rules[0].pattern.args[1].op:")


def test_capture_used_in_replacement_but_never_bound() -> None:
    e = _bad(GOOD.replace("args: [{ref: x}]", "args: [{ref: y}]"))
    assert e.path == "rules[0].replacement.args[0].ref" and "`y`" in e.message
    assert "never binds" in e.message and e.line == 12


def test_same_capture_bound_to_two_kinds() -> None:
    text = GOOD.replace("args: [{capture: x}]", "args: [{scalar: {lo: 0, name: x}}]")
    e = _bad(text)
    assert "capture `x`" in e.message and "value" in e.message and "node" in e.message
    assert e.path.startswith("rules[0].pattern.args[1]")


def test_duplicate_rule_names_in_one_file_and_across_files(tmp_path: Path) -> None:
    data = yaml.safe_load(GOOD)
    data["rules"].append(data["rules"][0])
    e = _bad(yaml.safe_dump(data))
    assert e.path == "rules[1].name" and "duplicate rule name 'silu'" in e.message
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(GOOD)
    b.write_text(GOOD)
    with pytest.raises(SpecError, match=r"b\.yaml.*duplicate rule name 'silu'.*a\.yaml"):
        load_specs([a, b])


def test_wrong_types() -> None:
    e = _bad(GOOD.replace("- name: silu", "- name: silu\n  priority: high"))
    assert e.path == "rules[0].priority" and e.line == 4
    e = _bad(GOOD.replace("version: 1", "version: 7"))
    assert e.path == "version" and "unsupported spec version 7" in e.message
    e = _bad("- just a list\n")
    assert "must be a mapping" in e.message


def test_unknown_constraint() -> None:
    text = GOOD.replace("  replacement:", "  constraints:\n  - must_be_nice: {capture: x}\n"
                        "  replacement:")
    e = _bad(text)
    assert e.path == "rules[0].constraints[0]" and "unknown constraint" in e.message
    assert e.line == 11


def test_constraint_on_unbound_capture_and_bad_dtype() -> None:
    text = GOOD.replace("  replacement:", "  constraints:\n  - graph_leaf: {capture: w}\n"
                        "  replacement:")
    e = _bad(text)
    assert e.path == "rules[0].constraints[0].graph_leaf.capture" and "`w`" in e.message
    text = GOOD.replace("  replacement:", "  constraints:\n"
                        "  - dtype: {capture: x, dtypes: [float32, floaty]}\n  replacement:")
    e = _bad(text)
    assert e.path == "rules[0].constraints[0].dtype.dtypes[1]" and "'floaty'" in e.message


def test_unknown_pattern_node_and_missing_field() -> None:
    e = _bad(GOOD.replace("- {capture: x}\n", "- {captur: x}\n", 1))
    assert e.path == "rules[0].pattern.args[0]" and "not a pattern node" in e.message
    e = _bad(GOOD.replace("  replacement:\n    op: aten.silu.default\n    args: [{ref: x}]\n", ""))
    assert e.path == "rules[0].replacement" and "missing" in e.message


def test_bad_python_reference() -> None:
    text = GOOD.replace("    op: aten.silu.default\n    args: [{ref: x}]\n",
                        "    fn: 'fusionkit.nope:build'\n")
    e = _bad(text)  # without consent: refused before anything is imported
    assert e.path == "rules[0].replacement.fn" and "--trust" in e.message
    with pytest.raises(SpecError) as info:
        load_spec_text(text, file="bad.yaml", trust=True)
    assert info.value.path == "rules[0].replacement.fn" and "cannot import" in info.value.message


def test_nothing_half_registered(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(GOOD.replace("name: silu", "name: other").replace("aten.silu", "aten.siluu"))
    with pytest.raises(SpecError):
        load_specs([good, bad])
    # the good file alone still loads: the failed call left no state behind
    assert [r.name for r in load_specs([good])] == ["silu"]


def test_safe_load_only() -> None:
    e = _bad("!!python/object/apply:os.system ['echo hacked']\n")
    assert "malformed YAML" in e.message
