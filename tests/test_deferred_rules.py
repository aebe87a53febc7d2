"""Rules built only for programs that hold their root ops (issue: a light first call).

A :class:`~fusionkit.find.finder.DeferredRules` group is built the first time a searched
program holds one of the op keys it states; until then the program pays nothing for its
patterns. The index must find exactly what an index of the same rules built at once
finds, a statement of roots that leaves out a rule's root is an error, and every
shipped factory that states its roots states them all.
"""

from __future__ import annotations

import pytest
import torch
from models import AddMM, ReluChain, addmm_rule, export_edge, rand_inputs, relu_relu_rule

from fusionkit import FusionPass, find_matches
from fusionkit.find.finder import DeferredRules, RuleIndex
from fusionkit.passes.registry import registered


def _counted(rules_of: dict[str, list]) -> tuple[list[DeferredRules], dict[str, int]]:
    built = {k: 0 for k in rules_of}

    def group(label: str, roots: frozenset[str]) -> DeferredRules:
        def build() -> list:
            built[label] += 1
            return rules_of[label]
        return DeferredRules(roots, build, label)

    return ([group("addmm", frozenset({"aten.add.Tensor"})),
             group("relu", frozenset({"aten.relu.default"}))], built)


@pytest.fixture(scope="module")
def relu_ep():
    return export_edge(ReluChain(), rand_inputs((2, 8)))


def test_a_group_is_built_only_when_the_program_holds_its_root(relu_ep) -> None:
    groups, built = _counted({"addmm": [addmm_rule()], "relu": [relu_relu_rule()]})
    index = RuleIndex((), groups)
    ms = find_matches(relu_ep, index)
    assert built == {"addmm": 0, "relu": 1}
    eager = find_matches(relu_ep, [addmm_rule(), relu_relu_rule()])
    assert [(m.rule.name, m.root.name) for m in ms.accepted] == \
        [(m.rule.name, m.root.name) for m in eager.accepted] and ms.accepted
    # asked again: not built again; every rule is listed once asked for, in order
    find_matches(relu_ep, index)
    assert built["relu"] == 1
    assert [r.name for r in index.rules] == [addmm_rule().name, relu_relu_rule().name]
    assert built == {"addmm": 1, "relu": 1}


def test_the_pass_report_lists_every_rule_and_builds_the_rest_only_then(relu_ep) -> None:
    groups, built = _counted({"addmm": [addmm_rule()], "relu": [relu_relu_rule()]})
    p = FusionPass(RuleIndex((), groups))
    p(relu_ep)
    assert built == {"addmm": 0, "relu": 1}
    rep = p.report
    assert set(rep.rules) == {addmm_rule().name, relu_relu_rule().name}
    assert rep.rules[relu_relu_rule().name].fused >= 1 and p.history == [rep]


def test_a_rule_rooted_outside_the_stated_roots_is_an_error() -> None:
    ep = export_edge(AddMM(), rand_inputs((2, 8)))
    wrong = DeferredRules(frozenset({"aten.add.Tensor"}), lambda: [addmm_rule(), _rooted_at_mm()],
                          "wrong")
    with pytest.raises(ValueError, match=r"mm_rule.*aten\.mm\.default"):
        find_matches(ep, RuleIndex((), [wrong]))


def _rooted_at_mm():
    from fusionkit import Rule, capture, op, ref, replace_with

    return Rule(name="mm_rule", pattern=op("aten.mm.default", capture("a"), capture("b")),
                replacement=replace_with("aten.mm.default", ref("a"), ref("b")))


def test_duplicate_names_across_groups_are_an_error(relu_ep) -> None:
    groups = [DeferredRules(frozenset({"aten.relu.default"}), lambda: [relu_relu_rule()]),
              DeferredRules(frozenset({"aten.relu.default"}), lambda: [relu_relu_rule()])]
    with pytest.raises(ValueError, match="duplicate rule names"):
        find_matches(relu_ep, RuleIndex((), groups))


def test_every_shipped_factory_that_states_its_roots_states_them_all() -> None:
    stating = [f for f in registered() if f.roots is not None]
    assert stating, "no shipped factory states its roots"
    for f in stating:
        for r in f.rules():
            assert r.root_keys <= f.roots, (f.qualname, r.name, sorted(r.root_keys - f.roots))


def test_the_vulkan_pass_list_builds_only_the_rules_its_program_can_match() -> None:
    from benchmarks import graphs
    from fusionkit.backends.vulkan_adapter import transform_passes
    from fusionkit.targets import op_key

    *folds, fusion = transform_passes()
    ep = graphs.build("norms", 2)
    for p in folds:
        res = p(ep)
        ep = getattr(res, "exported_program", None) or ep
    present = {k for n in ep.graph.nodes if n.op == "call_function"
               and (k := op_key(n.target)) is not None}
    fusion(ep)
    factories = registered("vulkan")
    built = [d is None for d in fusion.index._pending]
    assert built == [bool(f.roots and f.roots & present and (not f.needs or f.needs & present))
                     for f in factories]
    assert not all(built)  # the quantized, RoPE and SDPA rules were not built
    report = fusion.report
    assert report.total_fused == 2
    assert len(report.rules) == sum(len(f.rules()) for f in factories)


def test_torch_ops_resolve_for_the_stated_roots() -> None:
    from fusionkit.targets import resolve_op

    for f in registered("vulkan"):
        for key in f.roots or ():
            if key.startswith("llama."):
                continue  # the llama op library loads only when a program needs it
            assert isinstance(resolve_op(key), torch._ops.OpOverload), key


class _AddOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


class _ReluAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + x


def _needy(built: list[int], needs: frozenset[str], rules=addmm_rule) -> DeferredRules:
    def build() -> list:
        built.append(1)
        return [rules()]
    return DeferredRules(frozenset({"aten.add.Tensor"}), build, "needy", needs)


def test_a_group_is_built_only_for_a_program_holding_what_it_needs() -> None:
    """``needs``: every addmm match holds an mm; a program of adds without one neither
    builds nor searches the group, and finds what an index built at once finds."""
    built: list[int] = []
    index = RuleIndex((), [_needy(built, frozenset({"aten.mm.default"}))])
    add_only = export_edge(_AddOnly(), rand_inputs((2, 8)))
    ms = find_matches(add_only, index)
    assert not built and not ms.accepted and not ms.declined
    eager = find_matches(add_only, [addmm_rule()])
    assert [m.rule.name for m in eager.accepted] == []
    # every near miss wanted: searched as if it needed nothing
    find_matches(add_only, index, all_near_misses=True)
    assert built == [1]

    built.clear()
    index = RuleIndex((), [_needy(built, frozenset({"aten.mm.default"}))])
    addmm_ep = export_edge(AddMM(), rand_inputs((2, 8)))
    ms = find_matches(addmm_ep, index)
    assert built == [1] and ms.accepted
    eager = find_matches(addmm_ep, [addmm_rule()])
    assert [(m.rule.name, m.root.name) for m in ms.accepted] == \
        [(m.rule.name, m.root.name) for m in eager.accepted]
    # built once, then a program without an mm is searched without the group's rules
    ms = find_matches(add_only, index)
    assert not ms.accepted and not ms.declined and built == [1]
    assert find_matches(addmm_ep, index).accepted


def test_a_need_the_patterns_do_not_back_is_an_error() -> None:
    ep = export_edge(_ReluAdd(), rand_inputs((2, 8)))
    index = RuleIndex((), [_needy([], frozenset({"aten.relu.default"}))])
    with pytest.raises(ValueError, match=r"addmm.*without a node of \['aten\.relu\.default'\]"):
        find_matches(ep, index)


def test_every_shipped_statement_of_needs_is_backed_by_the_patterns() -> None:
    from fusionkit.match.required_ops import requires_one_of

    stating = [f for f in registered() if f.needs]
    assert stating, "no shipped factory states what it needs"
    for f in stating:
        for r in f.rules():
            assert requires_one_of(r.pattern, f.needs), (f.qualname, r.name)


def test_what_a_pattern_requires_is_read_from_every_alternative() -> None:
    from fusionkit import capture, op
    from fusionkit.match.pattern import through
    from fusionkit.match.required_ops import requires_one_of

    mm = op("aten.mm.default", capture("a"), capture("b"))
    dq = frozenset({"aten.mm.default"})
    assert requires_one_of(op("aten.add.Tensor", mm, capture("c")), dq)
    # an alternative without it, or only through optional pass-through ops: not required
    assert not requires_one_of(op("aten.add.Tensor", mm | capture("x"), capture("c")), dq)
    assert requires_one_of(op("aten.add.Tensor", mm | op("aten.mm.default", mm, capture("d")),
                              capture("c")), dq)
    assert not requires_one_of(through({"aten.mm.default"}, capture("x")), dq)
