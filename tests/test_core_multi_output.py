"""DSL additions made for the Vulkan ports: seq() list operands, outputs()/also()
multi-output patterns, Rewriter.constant/getitem."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fusionkit import Match, PythonReplacement, Rewriter, Rule, capture, find_matches, op
from fusionkit.apply.rewrite import apply_matches
from fusionkit.match.pattern import also, outputs, seq


class Cat(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cat([a * 2, b * 3], -1)


def test_seq_matches_list_operands_elementwise() -> None:
    ep = torch.export.export(Cat(), (torch.randn(2), torch.randn(2)))
    pat = op("aten.cat.default", seq(op("aten.mul.Tensor", capture("a"), 2),
                                     op("aten.mul.Tensor", capture("b"), 3)), -1)
    rule = Rule("cat", pat, PythonReplacement(
        lambda rw, c: rw.call("aten.cat.default", [c["a"], c["b"]], -1), frozenset({"a", "b"})))
    ms = find_matches(ep, [rule])
    assert [m.rule.name for m in ms.accepted] == ["cat"]
    bad = op("aten.cat.default", seq(op("aten.mul.Tensor", capture("a"), 2)), -1)  # 1 element
    assert not find_matches(ep, [Rule("one", bad, rule.replacement.__class__(
        lambda rw, c: c["a"], frozenset({"a"})))]).accepted


class Two(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sin(x) * 2, torch.cos(x) * 2


def test_outputs_also_replaces_two_outputs_with_one_tuple_op_and_new_constant() -> None:
    ep = torch.export.export(Two(), (torch.randn(4),))
    pat = outputs(op("aten.mul.Tensor", op("aten.sin.default", capture("x")), 2),
                  also("c", op("aten.mul.Tensor", op("aten.cos.default", capture("x")), 2),
                       near="x"))

    def build(rw: Rewriter, c: Mapping[str, Any]) -> tuple[Any, Any]:
        two = rw.constant("fk_two", torch.tensor(2.0))
        both = rw.call("aten.stack.default", [rw.call("aten.sin.default", c["x"]),
                                              rw.call("aten.cos.default", c["x"])])
        scaled = rw.call("aten.mul.Tensor", both, two)
        return (rw.call("aten.select.int", scaled, 0, 0), rw.call("aten.select.int", scaled, 0, 1))

    rule = Rule("sincos", pat, PythonReplacement(build, frozenset({"x"})))
    ms = find_matches(ep, [rule])
    assert [m.rule.name for m in ms.accepted] == ["sincos"]
    assert ms.accepted[0].captures["c"].op == "call_function"
    x = torch.randn(4)
    apply_matches(ep, ms.accepted)
    got = ep.module()(x)
    assert torch.allclose(got[0], torch.sin(x) * 2) and torch.allclose(got[1], torch.cos(x) * 2)
    assert "fk_two" in {n.name for n in ep.graph.nodes if n.op == "placeholder"}


def test_outputs_may_drop_an_unused_output_but_not_a_used_one() -> None:
    import pytest

    from fusionkit import FusionError

    pat = outputs(op("aten.mul.Tensor", op("aten.sin.default", capture("x")), 2),
                  also("c", op("aten.mul.Tensor", op("aten.cos.default", capture("x")), 2),
                       near="x"))
    rule = Rule("drop", pat, PythonReplacement(
        lambda rw, c: (rw.call("aten.mul.Tensor", rw.call("aten.sin.default", c["x"]), 2), None),
        frozenset({"x"})))
    ep = torch.export.export(Two(), (torch.randn(4),))
    ms = find_matches(ep, [rule])
    # the cos output is returned: declined in the one phase (fusionkit.find.returned_values)
    assert not ms.accepted
    assert [d.step for d in ms.declined] == ["escape"] and "drops it" in ms.declined[0].reason
    # applied anyway (a match made by hand), the rewrite refuses it
    d = ms.declined[0]
    match = Match(rule, d.root, {"x": d.root.args[0].args[0], "c": d.node}, d.claimed)
    with pytest.raises(FusionError, match="dropped output"):
        apply_matches(ep, [match])
