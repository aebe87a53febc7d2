"""FusionPass end to end: rewriting, metadata, validity, modified/recompile, idempotence,
overlap and priority, folding, the report, and the ExecuTorch pipeline entry points."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.pass_base import ExportedProgramPassBase
from models import (
    AddMM,
    MulSigmoidOther,
    ReluChain,
    RMSNorm,
    SiluLike,
    SiluLikeEscape,
    addmm_rule,
    count_op,
    edge_config,
    export_aten,
    export_edge,
    fresh,
    nodes_of,
    op_counts,
    outputs_close,
    rand_inputs,
    relu_relu_rule,
    run_program,
    silu_rule,
)
from torch import nn
from torch.export.graph_signature import InputKind

from fusionkit import FusionPass, Rule, capture, find_matches, op, ref, replace_with
from fusionkit.passes.rms_norm import rms_norm_rule

X2 = rand_inputs((2, 8))
#: aten.silu (the reference silu rule's output) is not core ATen: let the edge verifier accept it
SILU_OK = edge_config(torch.ops.aten.silu.default)


class Mixed(nn.Module):
    """One of everything: a silu-like, an mm + bias, an RMSNorm, and near misses."""

    def __init__(self) -> None:
        super().__init__()
        self.addmm = AddMM("param")
        self.norm = RMSNorm()

    def forward(self, x, y):
        a = x * torch.sigmoid(x)  # fusable (silu)
        b = x * torch.sigmoid(y)  # not silu
        c = self.addmm(a)  # fusable (addmm with a parameter bias)
        d = torch.mm(b, self.addmm.w) + y  # bias is a user input: declined
        return self.norm(c + d), torch.relu(torch.relu(b))


def all_rules():
    return [silu_rule(), addmm_rule(), rms_norm_rule(), relu_relu_rule()]


MIXED_INPUTS = rand_inputs((2, 8), (2, 8), seed=1)


@pytest.fixture(scope="module")
def mixed_model():
    torch.manual_seed(0)
    return Mixed().eval()


@pytest.fixture(scope="module")
def mixed_edge(mixed_model):
    return export_edge(mixed_model, MIXED_INPUTS, compile_config=SILU_OK)


@pytest.fixture(scope="module")
def mixed_aten(mixed_model):
    return export_aten(mixed_model, MIXED_INPUTS)


@pytest.fixture(params=["aten", "edge"])
def mixed_ep(request, mixed_aten, mixed_edge):
    return fresh(mixed_aten if request.param == "aten" else mixed_edge)


def _eager(model, inputs):
    with torch.no_grad():
        return model(*inputs)


# -------------------------------------------------------------------------- basics


def test_fusion_pass_is_an_exported_program_pass():
    p = FusionPass([silu_rule()])
    assert isinstance(p, ExportedProgramPassBase)
    assert [r.name for r in p.rules] == ["silu"]
    assert "silu" in repr(p)


def test_duplicate_rule_names_are_rejected():
    with pytest.raises(ValueError, match="duplicate rule names"):
        FusionPass([silu_rule("a"), relu_relu_rule("a")])


def test_fuses_everything_fusable_and_keeps_the_numerics(vulkan_ops, mixed_model, mixed_ep):
    p = FusionPass(all_rules())
    res = p(mixed_ep)
    assert res.modified is True
    ep = res.exported_program
    counts = op_counts(ep)
    assert counts["aten.silu.default"] == 1
    assert counts["aten.addmm.default"] == 1
    assert counts["et_vk.rms_norm.default"] == 1
    assert counts["aten.sigmoid.default"] == 1, "x * sigmoid(y) stays"
    assert counts["aten.mm.default"] == 1, "mm + user-input bias stays"
    assert counts["aten.relu.default"] == 1
    assert counts["aten.rsqrt.default"] == 0
    ep.graph_module.graph.lint()
    assert outputs_close(run_program(ep, *MIXED_INPUTS), _eager(mixed_model, MIXED_INPUTS))


def test_report_per_rule(vulkan_ops, mixed_ep):
    p = FusionPass(all_rules())
    p(mixed_ep)
    rep = p.report
    assert {n: r.fused for n, r in rep.rules.items()} == {
        "silu": 1, "addmm": 1, "rms_norm": 1, "relu_relu": 1}
    assert rep.total_fused == 4
    assert rep.rules["addmm"].declines_by_step() == {"prepackable_constant": 1}
    (d,) = rep.rules["addmm"].declines
    assert "is a user input" in d.reason
    # a user's own rule reports its near miss (issue 23): x * sigmoid(y) is not a silu
    (near,) = rep.rules["silu"].declines
    assert near.step == "structure" and "capture `x` must be the same value" in near.reason
    as_dict = rep.to_dict()
    addmm = next(r for r in as_dict["rules"] if r["rule"] == "addmm")
    assert addmm["fused"] == 1 and addmm["declined"][0]["step"] == "prepackable_constant"
    assert len(as_dict["accepted"]) == 4
    text = str(rep)
    assert "addmm" in text and "declined addmm" in text
    assert p.history == [rep]


def test_new_nodes_carry_metadata(vulkan_ops, mixed_ep):
    # root nodes (and their provenance) before the pass
    ms = find_matches(mixed_ep, all_rules())
    roots = {m.rule.name: (m.root.name, m.root.meta.get("stack_trace")) for m in ms.accepted}
    FusionPass(all_rules())(mixed_ep)
    new = [n for n in mixed_ep.graph_module.graph.nodes if "fusionkit_rule" in n.meta]
    assert sorted(n.meta["fusionkit_rule"] for n in new) == sorted(roots)
    for n in new:
        root_name, stack = roots[n.meta["fusionkit_rule"]]
        val = n.meta["val"]
        assert isinstance(val, torch.Tensor)
        assert type(val).__name__ == "FakeTensor"
        assert stack is not None and n.meta.get("stack_trace") == stack
        # every replaced node, the root last (ExecuTorch's ancestry follows the last)
        *_, src = n.meta["from_node"]
        assert src.name == root_name
        assert all(n.meta["fusionkit_rule"] in s.pass_name for s in n.meta["from_node"])


def test_new_nodes_use_the_program_dialect(mixed_aten, mixed_edge):
    for ep, edge in ((fresh(mixed_aten), False), (fresh(mixed_edge), True)):
        FusionPass([silu_rule()])(ep)
        (n,) = nodes_of(ep, "aten.silu.default")
        assert (type(n.target).__name__ == "EdgeOpOverload") is edge


def test_program_validates_and_rebuilds_after_the_pass(vulkan_ops, mixed_model, mixed_ep):
    FusionPass(all_rules())(mixed_ep)
    mixed_ep.validate()
    # a second module built from the program runs and matches eager
    assert outputs_close(mixed_ep.module()(*MIXED_INPUTS), _eager(mixed_model, MIXED_INPUTS))


def test_output_signature_follows_a_replaced_output(vulkan_ops):
    """The fused root is the program's output: the signature must name the new node."""
    ep = export_edge(SiluLike(), X2, compile_config=SILU_OK)
    FusionPass([silu_rule()])(ep)
    out_node = ep.graph_module.graph.output_node()
    names = [a.name for a in out_node.args[0]]
    assert [s.arg.name for s in ep.graph_signature.output_specs] == names
    ep.validate()


# ----------------------------------------------------------- modified / recompile


class _RecompileSpy:
    def __init__(self, monkeypatch, gm):
        self.calls = 0
        original = gm.recompile

        def spy(*a, **k):
            self.calls += 1
            return original(*a, **k)

        monkeypatch.setattr(gm, "recompile", spy)


@pytest.mark.parametrize("model, inputs", [
    (MulSigmoidOther(), rand_inputs((2, 8), (2, 8))),
    (SiluLikeEscape(), X2),
    (AddMM("input"), rand_inputs((2, 8), (8,))),
])
def test_nothing_matches_not_modified_and_not_recompiled(monkeypatch, model, inputs):
    ep = export_edge(model, inputs)
    gm = ep.graph_module
    code, nodes = gm.code, list(gm.graph.nodes)
    spy = _RecompileSpy(monkeypatch, gm)
    res = FusionPass([silu_rule(), addmm_rule()])(ep)
    assert res.modified is False
    assert res.exported_program is ep
    assert spy.calls == 0
    assert ep.graph_module is gm
    assert gm.code is code
    assert list(gm.graph.nodes) == nodes
    assert all(a is b for a, b in zip(gm.graph.nodes, nodes, strict=True))


def test_a_match_modifies_and_code_is_regenerated_once_when_needed(monkeypatch):
    ep = export_edge(SiluLike(), X2, compile_config=SILU_OK)
    gm = ep.graph_module
    code = gm.code
    spy = _RecompileSpy(monkeypatch, gm)
    res = FusionPass([silu_rule()])(ep)
    assert res.modified is True
    assert spy.calls == 0  # ExecuTorch's pass manager recompiles after the pass anyway
    assert gm.code != code and "silu" in gm.code  # reading the code regenerates it
    assert gm.code == gm.graph.python_code("self").src
    assert spy.calls == 1
    (out,) = gm(*X2)  # the graph module runs the fused graph; no further recompile
    assert spy.calls == 1
    torch.testing.assert_close(out, SiluLike()(*X2))


# ---------------------------------------------------------------------- idempotence


def test_second_run_fuses_nothing(vulkan_ops, mixed_model, mixed_ep):
    rules = [silu_rule(), addmm_rule(), rms_norm_rule()]
    first = FusionPass(rules)(mixed_ep)
    assert first.modified
    code = mixed_ep.graph_module.code
    p2 = FusionPass(rules)
    second = p2(mixed_ep)
    assert second.modified is False
    assert p2.report.total_fused == 0
    assert mixed_ep.graph_module.code is code
    assert outputs_close(run_program(mixed_ep, *MIXED_INPUTS), _eager(mixed_model, MIXED_INPUTS))


# ----------------------------------------------------------------- overlap & priority


def test_overlapping_matches_a_node_belongs_to_one_match():
    ep = export_aten(ReluChain(3), X2)
    ms = find_matches(ep, [relu_relu_rule()])
    (m,) = ms.accepted
    assert [n.name for n in m.claimed] == ["relu_1", "relu"]
    (d,) = ms.declined
    assert d.step == "overlap"
    assert d.root.name == "relu_2" and d.node.name == "relu_1"
    assert "already belongs to the relu_relu match at `relu_1`" in d.reason
    claimed = [n for m in ms.accepted for n in m.claimed]
    assert len(claimed) == len(set(claimed))
    res = FusionPass([relu_relu_rule()])(ep)
    assert res.modified and count_op(ep, "aten.relu.default") == 2


def test_overlap_between_two_rules_graph_order_wins():
    """relu(relu(sigmoid(x) * x)): silu claims the mul before the relu rules get there."""

    class M(nn.Module):
        def forward(self, x):
            return torch.relu(torch.relu(torch.sigmoid(x) * x))

    ep = export_aten(M(), X2)
    claims_mul = Rule("relu_of_mul", op("aten.relu.default",
                                        op("aten.mul.Tensor", capture("a"), capture("b"))),
                      replace_with("aten.relu.default", ref("a")), priority=100)
    ms = find_matches(ep, [claims_mul, silu_rule()])
    assert [m.rule.name for m in ms.accepted] == ["silu"]
    (d,) = ms.declined
    assert d.rule == "relu_of_mul" and d.step == "overlap"


@pytest.mark.parametrize("prio_a, prio_b, order, winner", [
    (0, 1, "ab", "b"), (1, 0, "ab", "a"), (0, 0, "ab", "a"), (0, 0, "ba", "b"),
    (5, -5, "ba", "a")])
def test_same_root_higher_priority_wins(prio_a, prio_b, order, winner):
    ep = export_aten(SiluLike(), X2)
    a = silu_rule("a", priority=prio_a)
    b = Rule("b", op("aten.mul.Tensor", capture("x"), capture("y")),
             replace_with("aten.mul.Tensor", ref("x"), ref("y")), priority=prio_b)
    rules = [a, b] if order == "ab" else [b, a]
    ms = find_matches(ep, rules)
    assert [m.rule.name for m in ms.accepted] == [winner]
    assert ms.declined == []
    assert find_matches(ep, rules).accepted[0].root is ms.accepted[0].root


def test_matching_is_deterministic(mixed_edge):
    def summary():
        ms = find_matches(mixed_edge, all_rules())
        return ([(m.rule.name, m.root.name, [n.name for n in m.claimed]) for m in ms.accepted],
                [(d.rule, d.root.name, d.step, d.reason) for d in ms.declined])

    assert summary() == summary()


# -------------------------------------------------------------------------- folding


@pytest.mark.parametrize("dialect, bias", [
    ("edge", "cast"), ("edge", "plus_one"), ("aten", "plus_one"),
    # the ATen export's aten._assert_tensor_metadata(p_b) goes with the folded cast
    ("aten", "cast"),
])
def test_fold_makes_a_new_lifted_constant(dialect, bias):
    torch.manual_seed(0)
    model = AddMM(bias).eval()
    ep = (export_aten if dialect == "aten" else export_edge)(model, X2)
    p = FusionPass([addmm_rule(fold=True)])
    assert p(ep).modified
    assert p.report.rules["addmm"].folded == 1
    (addmm,) = nodes_of(ep, "aten.addmm.default")
    folded = addmm.args[0]
    assert folded.op == "placeholder"
    spec = next(s for s in ep.graph_signature.input_specs if s.arg.name == folded.name)
    assert spec.kind == InputKind.CONSTANT_TENSOR
    assert spec.target in ep.constants
    expected = model.b.detach().to(torch.float32) + (1.0 if bias == "plus_one" else 0.0)
    assert torch.equal(ep.constants[spec.target], expected)
    # the original parameter had no other use: it is gone from the program
    assert "b" not in ep.state_dict
    assert all(s.target != "b" for s in ep.graph_signature.input_specs)
    ep.validate()
    assert outputs_close(run_program(ep, *X2), _eager(model, X2))


def test_fold_keeps_a_parameter_that_is_still_used():
    class TwoUses(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8))
            self.b = nn.Parameter(torch.randn(8))

        def forward(self, a):
            return torch.mm(a, self.w) + (1.0 + self.b), a * self.b

    torch.manual_seed(0)
    model = TwoUses().eval()
    ep = export_edge(model, X2)
    assert FusionPass([addmm_rule(fold=True)])(ep).modified
    assert "b" in ep.state_dict
    assert any(s.target == "b" for s in ep.graph_signature.input_specs)
    assert count_op(ep, "aten.addmm.default") == 1
    ep.validate()
    assert outputs_close(run_program(ep, *X2), _eager(model, X2))


def test_fold_never_touches_input_dependent_values():
    ep = export_edge(AddMM("computed"), X2)
    code = ep.graph_module.code
    p = FusionPass([addmm_rule(fold=True)])
    assert p(ep).modified is False
    assert ep.graph_module.code is code
    (d,) = p.report.rules["addmm"].declines
    assert d.step == "prepackable_constant" and "depends on a user input" in d.reason


# ------------------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("dialect", ["aten", "edge"])
@pytest.mark.parametrize("kwargs", [
    {}, {"square": "pow"}, {"eps": 1e-5}, {"weight": "plus_one"}, {"weight": "cast"}])
def test_rms_norm_rule_numerics(vulkan_ops, dialect, kwargs):
    torch.manual_seed(0)
    model = RMSNorm(**kwargs).eval()
    ep = (export_aten if dialect == "aten" else export_edge)(model, X2)
    p = FusionPass([rms_norm_rule()])
    assert p(ep).modified, str(p.report)
    assert count_op(ep, "et_vk.rms_norm.default") == 1
    assert count_op(ep, "aten.rsqrt.default") == 0
    ep.validate()
    got = run_program(ep, *X2)
    assert torch.allclose(got, _eager(model, X2), atol=1e-5, rtol=1e-5)


def test_rms_norm_weight_from_an_input_is_declined(vulkan_ops):
    ep = export_edge(RMSNorm(weight="input"), rand_inputs((2, 8), (8,)))
    code = ep.graph_module.code
    p = FusionPass([rms_norm_rule()])
    assert p(ep).modified is False
    assert ep.graph_module.code is code
    (d,) = p.report.rules["rms_norm"].declines
    assert d.step == "prepackable_constant"
    assert d.node.name == "w" and "is a user input" in d.reason


# ---------------------------------------------------------------- pipeline entries


def test_in_to_edge_transform_and_lower(vulkan_ops, mixed_model, mixed_aten):
    p = FusionPass(all_rules())
    edge = to_edge_transform_and_lower(fresh(mixed_aten), transform_passes=[p],
                                       compile_config=SILU_OK)
    ep = edge.exported_program()
    assert p.history[0].total_fused == 4
    assert count_op(ep, "et_vk.rms_norm.default") == 1
    assert count_op(ep, "aten.silu.default") == 1
    assert outputs_close(run_program(ep, *MIXED_INPUTS), _eager(mixed_model, MIXED_INPUTS))


def test_in_edge_program_manager_transform(vulkan_ops, mixed_model, mixed_aten):
    p = FusionPass(all_rules())
    edge = to_edge(fresh(mixed_aten), compile_config=SILU_OK).transform([p])
    ep = edge.exported_program()
    assert count_op(ep, "aten.addmm.default") == 1
    assert count_op(ep, "et_vk.rms_norm.default") == 1
    assert p.history[0].total_fused == 4
    assert all(r.total_fused == 0 for r in p.history[1:])
    assert outputs_close(run_program(ep, *MIXED_INPUTS), _eager(mixed_model, MIXED_INPUTS))
