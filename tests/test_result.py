"""One reasoned result (``fusionkit.result``): every layer that says "why not" speaks it.

The finder's declines, ``why_not``'s verdicts, a replacement that raised while a pass
applied it, the pass report and ``explain --json`` all give :class:`MatchResult` with
one status, one step and one JSON shape.
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
    assert d.step == "prepackable_constant" and d.at is d.root and d.matched == d.claimed
    assert set(d.record()) == RECORD_KEYS
    assert d.record()["status"] == "declined" and d.record()["root"] == d.at.name


def test_why_not_gives_the_same_type_and_the_same_json_shape(edge: Any) -> None:
    ms = find_matches(edge, [addmm_rule()], all_near_misses=True)
    (d,) = [d for d in ms.declined if d.step != "structure"]
    verdict = why_not(edge, addmm_rule(), d.at)
    assert isinstance(verdict, MatchResult)
    assert (verdict.status, verdict.step, verdict.node, verdict.reason) == (
        d.status, d.step, d.node, d.reason)
    assert set(verdict.record()) == set(d.record())
    fused = why_not(edge, addmm_rule(), ms.accepted[0].root)
    assert fused.status is Status.FUSED and fused.step == Step.FUSED
    assert fused.record()["nodes"] == [n.name for n in ms.accepted[0].claimed]
    # the former name's field still reads
    assert fused.outcome == "fused"


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
    r = MatchResult(rule="r", at=node, status=str(status), step="x", node=None, reason="why")
    assert r.status is status  # a plain string is read as the enum
    assert MatchResult.fail("r", node, "error", "raised").status is Status.ERROR
    assert MatchResult.fail("r", node, "dtype", "wrong dtype").status is Status.DECLINED
