"""One reasoned result (``fusionkit.result``): every layer that says "why not" speaks it.

The matcher's near miss, every constraint's refusal, the finder's declines at each step
(structure, a constraint, overlap, escape, executable, error), ``why_not``'s verdicts, a
replacement that raised while a pass applied it, the pass report and ``explain --json``
all give :class:`MatchResult` with one status, one step and one JSON shape.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from fusionkit import (
    CallOp,
    FusionPass,
    MatchResult,
    PrepackableConstant,
    Rule,
    Status,
    Step,
    capture,
    find_matches,
    op,
    ref,
    replace_with,
    why_not,
)
from fusionkit.app.present import explain_json

RECORD_KEYS = {"rule", "root", "status", "step", "node", "reason", "nodes"}


def addmm_rule(name: str = "addmm") -> Rule:
    return Rule(name, op("aten.add.Tensor", op("aten.mm.default", capture("x"), capture("w")),
                         capture("b")),
                replace_with("aten.addmm.default", ref("b"), ref("x"), ref("w")),
                constraints=[PrepackableConstant("b")])


class Two(nn.Module):
    """``mm + bias`` (fuses) and ``mm + input`` (declined: the bias is not constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.mm(x, self.w) + self.bias, torch.mm(x, self.w) + e


ARGS = (torch.randn(4, 8), torch.randn(8))


@pytest.fixture(scope="module")
def edge() -> Any:
    from executorch.exir import to_edge

    return to_edge(torch.export.export(Two().eval(), ARGS)).exported_program()


def test_a_decline_is_a_result_with_a_status(edge: Any) -> None:
    ms = find_matches(edge, [addmm_rule()])
    (d,) = ms.declined
    assert isinstance(d, MatchResult)
    assert d.status is Status.DECLINED and not d.is_error
    assert d.step == "prepackable_constant" and type(d) is MatchResult and d.claimed
    assert set(d.record()) == RECORD_KEYS
    assert d.record()["status"] == "declined" and d.record()["root"] == d.root.name


def test_why_not_gives_the_same_type_and_the_same_json_shape(edge: Any) -> None:
    ms = find_matches(edge, [addmm_rule()], all_near_misses=True)
    (d,) = [d for d in ms.declined if d.step != "structure"]
    verdict = why_not(edge, addmm_rule(), d.root)
    assert isinstance(verdict, MatchResult)
    assert (verdict.status, verdict.step, verdict.node, verdict.reason) == (
        d.status, d.step, d.node, d.reason)
    assert set(verdict.record()) == set(d.record())
    fused = why_not(edge, addmm_rule(), ms.accepted[0].root)
    assert fused.status is Status.FUSED and fused.step == Step.FUSED
    assert fused.record()["nodes"] == [n.name for n in ms.accepted[0].claimed]


def test_explain_json_accepted_and_declined_share_one_shape(edge: Any) -> None:
    data = explain_json(find_matches(edge, [addmm_rule()]))
    (acc,), (dec,) = data["accepted"], data["declined"]
    assert RECORD_KEYS <= set(acc) and set(dec) == RECORD_KEYS
    assert (acc["status"], dec["status"]) == ("fused", "declined")


def test_a_replacement_that_raises_is_an_error_result_in_the_report(edge: Any) -> None:
    class Boom(CallOp):
        def build(self, rw: Any, captures: Any) -> Any:
            raise RuntimeError("boom in the replacement")

    base = addmm_rule("boom")
    rule = Rule("boom", base.pattern, Boom("aten.addmm.default", (ref("b"), ref("x"), ref("w"))),
                constraints=list(base.constraints))
    p = FusionPass([rule], strict=False)  # the suite runs strict; users by default do not
    result = p.call(copy.deepcopy(edge))
    assert not result.modified
    (err,) = p.report.errors
    assert isinstance(err, MatchResult) and err.status is Status.ERROR
    assert err.step == Step.ERROR and err.error_type == "RuntimeError"
    assert "boom in the replacement" in err.reason
    (rec,) = [r for r in p.report.to_dict()["rules"] if r["rule"] == "boom"]
    assert rec["errors"][0]["status"] == "error" and set(rec["errors"][0]) >= RECORD_KEYS


@pytest.mark.parametrize("status", list(Status))
def test_fail_derives_the_status_from_the_step(edge: Any, status: Status) -> None:
    node = next(iter(edge.graph.nodes))
    r = MatchResult(rule="r", root=node, status=str(status), step="x", node=None, reason="why")
    assert r.status is status  # a plain string is read as the enum
    assert MatchResult.fail("r", node, "error", "raised").status is Status.ERROR
    assert MatchResult.fail("r", node, "dtype", "wrong dtype").status is Status.DECLINED


# ------------------------------------------- every layer's failure is the one result type


def bmm_rule() -> Rule:
    """Rooted at the adds, but wants a bmm where the graph has an mm: a structural near miss."""
    return Rule("bmm", op("aten.add.Tensor", op("aten.bmm.default", capture("x"), capture("w")),
                          capture("b")),
                replace_with("aten.addmm.default", ref("b"), ref("x"), ref("w")))


def _adds(ep: Any) -> list[Any]:
    return [n for n in ep.graph.nodes if n.op == "call_function"
            and "add" in str(n.target)]


def test_the_matchers_near_miss_is_the_finders_structural_decline(edge: Any) -> None:
    from fusionkit.match.matcher import compile_pattern
    from fusionkit.program_inputs import ProgramInputs

    inputs = ProgramInputs(edge)
    declined = {d.root: d for d in find_matches(edge, [bmm_rule()], all_near_misses=True).declined}
    adds = _adds(edge)
    assert len(adds) == 2 and set(declined) == set(adds)
    for add in adds:
        _, search = compile_pattern(bmm_rule().pattern).search(add, inputs, lambda b: None)
        r = search.result("bmm")
        assert isinstance(r, MatchResult) and type(r) is MatchResult
        assert (r.status, r.step, r.root) == (Status.DECLINED, Step.STRUCTURE, add)
        d = declined[add]
        assert (r.rule, r.step, r.node, r.reason, r.claimed) == (
            d.rule, d.step, d.node, d.reason, d.claimed)
        assert "expected aten.bmm.default" in r.reason and r.node is not None
        assert r.record() == d.record()
        verdict = why_not(edge, bmm_rule(), add)  # the near-miss layer says the same
        assert (verdict.status, verdict.step, verdict.node, verdict.reason) == (
            r.status, r.step, r.node, r.reason)
    # a search whose one binding was handed on failed nowhere: no result to report
    mm = next(n for n in edge.graph.nodes if n.op == "call_function" and "mm" in str(n.target))
    only_mm = op("aten.mm.default", capture("x"), capture("w"))
    _, search = compile_pattern(only_mm).search(mm, inputs, lambda b: None)
    assert search.progress == -1 and search.result("mm") is None


def test_the_finder_reports_the_structural_near_miss_through_search_result(
        edge: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One path: the finder's structural decline is ``Search.result()``, not a copy of its fields."""
    import dataclasses

    from fusionkit.match.matcher import Search

    plain = Search.result

    def marked(self: Search, rule: str) -> MatchResult | None:
        r = plain(self, rule)
        return None if r is None else dataclasses.replace(r, reason=f"[marked] {r.reason}")

    monkeypatch.setattr(Search, "result", marked)
    declined = find_matches(edge, [bmm_rule()], all_near_misses=True).declined
    assert len(declined) == 2
    for d in declined:
        assert type(d) is MatchResult and d.step == Step.STRUCTURE
        assert d.reason.startswith("[marked] ") and "expected aten.bmm.default" in d.reason


def _constraint_cases(edge: Any) -> list[tuple[Any, dict[str, Any], str]]:
    """(constraint, captures, the capture it must blame) that each refuse their match."""
    from fusionkit import (
        Custom,
        DtypeIn,
        GraphLeaf,
        Rank,
        ReducesLastDim,
        SameDtype,
        ScalarRange,
        StaticShape,
        UserInput,
        broadcasts_over_last_dim,
    )

    ph = {n.name: n for n in edge.graph.nodes if n.op == "placeholder"}
    (mm, *_) = [n for n in edge.graph.nodes if "mm" in str(n.target)]
    x, e = ph["x"], ph["e"]
    w = next(n for name, n in ph.items() if "w" in name and n.meta["val"].dim() == 2)

    def weight_is_bad(ctx: Any, x: Any, w: Any) -> Any:
        return ctx.fail("the weight is the problem", at="w")

    return [
        (PrepackableConstant("x"), {"x": x}, "x"),
        (GraphLeaf("x"), {"x": mm}, "x"),
        (UserInput("w"), {"w": w}, "w"),
        (DtypeIn("x", {torch.float16}), {"x": x}, "x"),
        (Rank("x", {3}), {"x": x}, "x"),
        (StaticShape("x"), {"x": 1.0}, "x"),
        (SameDtype("x", "s"), {"x": x, "s": 2}, "x"),
        (broadcasts_over_last_dim("e", "w"), {"e": x, "w": w}, "e"),
        (ReducesLastDim("dim", "x"), {"dim": [0], "x": x}, "dim"),
        (ScalarRange("s", 0.0, 1.0), {"s": 2.0}, "s"),
        (Custom(lambda ctx, x: "x is the problem", "plain"), {"x": x}, "x"),
        (Custom(weight_is_bad, "named"), {"x": x, "w": w}, "w"),
        (Custom(lambda ctx: ctx.fail("e is the problem", at="e"), "old", ("x", "e")),
         {"x": x, "e": e}, "e"),
    ]


def test_every_constraints_refusal_is_a_result_naming_its_capture(edge: Any) -> None:
    from fusionkit import CheckContext
    from fusionkit.program_inputs import ProgramInputs

    root = _adds(edge)[0]
    cases = _constraint_cases(edge)
    for c, captures, blamed in cases:
        ctx = CheckContext(edge, ProgramInputs(edge), root, captures, rule="r")
        f = c.check(ctx)
        assert type(f) is MatchResult, c
        assert (f.status, f.rule, f.root, f.capture) == (Status.DECLINED, "r", root, blamed), c
        kind = f"custom:{c.name}" if c.kind == "custom" else c.kind
        assert f.step == kind, c
        captured = captures[blamed]
        assert f.node is (captured if isinstance(captured, torch.fx.Node) else None), c
        assert f.reason and set(f.record()) == RECORD_KEYS, c
    assert len({c.kind for c, _, _ in cases}) == 11  # every built-in kind, and custom


def test_the_vulkan_delegation_refusal_names_its_rule_and_the_root() -> None:
    """``DelegatedByVulkan`` (the partitioner would not take the fused op) refuses with the
    match's rule and root, the root being the node at fault (where the fused op would go)."""
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401  (registers et_vk)
    from executorch.exir import to_edge
    from executorch.exir.dialects._ops import ops as exir_ops

    from fusionkit import CheckContext
    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes
    from fusionkit.backends.vulkan_adapter.delegation import DelegatedByVulkan

    class RMS(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.rand(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w

    program = to_edge(torch.export.export(RMS().eval(), (torch.randn(2, 8),))).exported_program()
    blocked = [torch.ops.et_vk.rms_norm.default, exir_ops.edge.et_vk.rms_norm.default]
    seen: list[tuple[CheckContext, Any]] = []
    plain = DelegatedByVulkan.check

    def spy(self: DelegatedByVulkan, ctx: CheckContext) -> Any:
        out = plain(self, ctx)
        seen.append((ctx, out))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DelegatedByVulkan, "check", spy)
        passes = transform_passes(partitioner=VulkanPartitioner(operator_blocklist=blocked))
        for p in passes:
            p(program)
    refusals = [(ctx, f) for ctx, f in seen if f is not None]
    assert refusals, "the blocked rms_norm fusion was never refused"
    for ctx, f in refusals:
        assert type(f) is MatchResult
        assert f.rule == ctx.rule != "" and f.root is ctx.root and f.node is ctx.root
        assert f.step == "delegated_by_vulkan_partitioner" and f.status is Status.DECLINED
        assert "rms_norm" in f.reason and set(f.record()) == RECORD_KEYS


class Escapes(nn.Module):
    """``mm`` is also an output: fusing it into the add would compute it twice."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.mm(x, self.w)
        return y + self.bias, y


def test_every_step_the_finder_declines_at_is_a_result_with_its_status(edge: Any) -> None:
    from executorch.exir import to_edge

    from fusionkit import Custom

    def raises(ctx: Any, x: Any) -> str | None:
        raise RuntimeError("a bug in the check")

    mm_first = Rule("mm", op("aten.mm.default", capture("x"), capture("w")),
                    replace_with("aten.mm.default", ref("x"), ref("w")))
    base = addmm_rule()
    cases: list[tuple[Any, list[Rule], str, Status]] = [
        (edge, [bmm_rule()], Step.STRUCTURE, Status.DECLINED),
        (edge, [base], "prepackable_constant", Status.DECLINED),
        (edge, [mm_first, addmm_rule()], Step.OVERLAP, Status.DECLINED),
        (edge, [Rule("err", base.pattern, base.replacement,
                     constraints=[Custom(raises, "raises")])], Step.ERROR, Status.ERROR),
        (edge, [Rule("silu", base.pattern, replace_with("aten.silu.default", ref("x")))],
         Step.EXECUTABLE, Status.DECLINED),
        (to_edge(torch.export.export(Escapes().eval(), (torch.randn(4, 8),))).exported_program(),
         [addmm_rule()], Step.ESCAPE, Status.DECLINED),
    ]
    for ep, rules, step, status in cases:
        declined = find_matches(ep, rules, all_near_misses=step == Step.STRUCTURE,
                                strict=False).declined  # the suite runs strict
        mine = [d for d in declined if d.step == step]
        assert mine, (step, [(d.step, d.reason) for d in declined])
        for d in mine:
            assert isinstance(d, MatchResult) and d.status is status, d
            assert (d.error_type is not None) == (status is Status.ERROR)
            assert d.reason and d.node is not None and set(d.record()) >= RECORD_KEYS


class TwoAlike(nn.Module):
    """Two ``mm + bias`` of the same shapes: one question for the replacement check."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8, 8))
        self.b1, self.b2 = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.mm(x, self.w1) + self.b1, torch.mm(y, self.w2) + self.b2


def test_a_memoised_executable_verdict_is_each_matchs_own_result() -> None:
    """The replacement check's verdict is memoised by metadata and shared by matches alike
    (``NotRunnable``); each decline made of it names its own root as the node at fault."""
    from executorch.exir import to_edge

    from fusionkit.find.executable import NotRunnable
    from fusionkit.find.finder import RuleIndex

    ep = to_edge(torch.export.export(TwoAlike().eval(), (torch.randn(4, 8), torch.randn(4, 8)))
                 ).exported_program()
    base = addmm_rule()
    rule = Rule("silu", base.pattern, replace_with("aten.silu.default", ref("x")))
    index = RuleIndex([rule])
    declined = find_matches(ep, index, strict=False).declined
    (verdict,) = index.replacement_check(rule).memo.values()  # one question asked
    assert isinstance(verdict, NotRunnable) and not isinstance(verdict, MatchResult)
    assert len(declined) == 2 and len({d.root for d in declined}) == 2
    for d in declined:
        assert isinstance(d, MatchResult) and d.status is Status.DECLINED
        assert d.step == Step.EXECUTABLE and "silu" in d.reason
        assert d.node is d.root and d.root in d.claimed  # its own root, not the first match's
        assert d == verdict.result("silu", d.root, d.claimed)
