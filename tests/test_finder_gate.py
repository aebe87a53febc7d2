"""The finder's O(1) gates only skip searches that could not report anything."""

from __future__ import annotations

import pytest
import torch
from models import export_edge
from rmsnorm_models import ROWS, D, HFLlamaRMSNorm, QwenAttention, TwoUsers

import fusionkit.find.finder as finder
from fusionkit import RuleIndex, find_matches
from fusionkit.passes import rule_set


def _summary(ms: finder.MatchSet) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    return ([(m.rule.name, m.root.name, *(n.name for n in m.claimed)) for m in ms.accepted],
            [(d.rule, d.root.name, d.step, d.reason) for d in ms.declined])


def _corpus() -> list[tuple[str, torch.nn.Module, tuple[torch.Tensor, ...]]]:
    out = [(r.name, r.make(torch.float32), (torch.randn(2, D), *r.extra(torch.float32)))
           for r in ROWS]
    out += [("hf", HFLlamaRMSNorm(), (torch.randn(2, 3, D),)),
            ("qwen", QwenAttention(), (torch.randn(2, 3, 16),)),
            ("two_users", TwoUsers(), (torch.randn(2, 3, D),))]
    return out


@pytest.mark.parametrize("name,model,inputs", _corpus(), ids=[c[0] for c in _corpus()])
def test_gates_change_no_result(name: str, model: torch.nn.Module,
                                inputs: tuple[torch.Tensor, ...],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    ep = export_edge(model, inputs)
    gated = _summary(find_matches(ep, RuleIndex(rule_set("builtin"))))
    monkeypatch.setattr(finder.RuleIndex, "gate", lambda self, rule: None)
    ungated = _summary(find_matches(ep, RuleIndex(rule_set("builtin"))))
    assert gated == ungated


def test_alternative_roots_are_gated_by_their_own_op() -> None:
    # as fusionkit ships it (a shipped rule's near-miss threshold sets the gate's depth)
    (rule,) = [r for r in rule_set("shipped") if r.name == "quantized_linear_q4gsw"]
    index = RuleIndex([rule])
    gate = index.gate(index.rules[0])
    assert gate is not None and gate.depth == 2
    ep = export_edge(torch.nn.Linear(8, 4, bias=False), (torch.randn(3, 8),))
    (mm,) = [n for n in ep.graph.nodes if n.op == "call_function" and "mm" in str(n.target)]
    assert not gate.may_match(mm)  # a float weight: no dequantize behind the transpose


def test_deep_gates_through_list_operands_change_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gates may look up to GATE_DEPTH levels deep and into a list operand (``cat``'s
    tensors) while staying under the rule's near-miss threshold: on the benchmark's
    Llama/DiT graph (interleaved RoPE: view_copy(cat([...]))) the RoPE rules' gates skip
    the near roots, and the result is the same as searching everywhere."""
    from benchmarks import graphs

    ep = graphs.build("mixed", 2)
    index = RuleIndex(rule_set("builtin"))
    by_name = {r.name: r for r in index.rules}
    deep = index.gate(by_name["export_llama_rope"])
    assert deep is not None and deep.depth > 2
    listed = index.gate(by_name["hf_rope"])
    assert listed is not None  # its root is cat([...]): gated through the list operand
    roots = [n for n in ep.graph_module.graph.nodes
             if n.op == "call_function" and "view_copy" in str(n.target)
             and any("cat" in str(getattr(a, "target", "")) for a in n.args)]
    assert roots and not any(deep.may_match(n) for n in roots)
    gated = _summary(find_matches(ep, index))
    monkeypatch.setattr(finder.RuleIndex, "gate", lambda self, rule: None)
    assert _summary(find_matches(ep, RuleIndex(rule_set("builtin")))) == gated


class _CastsBeforeANearMiss(torch.nn.Module):
    """``(x.float().double() * sigmoid(x)) * w``: RMSNorm's normed product with two widening
    casts before ``x`` and a sigmoid where ``rsqrt`` belongs. The search claims the root,
    the product and both casts before it fails (progress 4, the rule's near-miss
    threshold), so the rule reports a near miss there."""

    def __init__(self, casts: bool = True) -> None:
        super().__init__()
        self.casts = casts
        self.w = torch.nn.Parameter(torch.randn(D, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.float().double() if self.casts else x
        return (a * torch.sigmoid(x.double())) * self.w


def test_gate_lets_pass_through_operands_by(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RMSNorm gate looks through ``through(CASTS, capture("x"))`` to the ``rsqrt``
    operand only when ``x``'s value is not a cast: a cast there would be claimed, so a
    failure at ``rsqrt`` could be a reportable near miss, and the gate lets the node by."""
    from fusionkit.passes.rms_norm import rms_norm_rule

    rule = rms_norm_rule()
    index = RuleIndex([rule])
    gate = index.gate(index.rules[0])
    assert gate is not None and gate.depth == 3  # root mul, normed mul, rsqrt
    ep = export_edge(_CastsBeforeANearMiss(), (torch.randn(2, D, dtype=torch.float16),))
    gated = _summary(find_matches(ep, index))
    assert [d[2] for d in gated[1]] == ["structure"], gated  # the near miss is reported
    monkeypatch.setattr(finder.RuleIndex, "gate", lambda self, rule: None)
    assert _summary(find_matches(ep, RuleIndex([rule]))) == gated
    monkeypatch.undo()
    # without the casts the same structure fails after two nodes: the gate skips it
    plain = export_edge(_CastsBeforeANearMiss(casts=False),
                        (torch.randn(2, D, dtype=torch.float64),))
    roots = [n for n in plain.graph_module.graph.nodes
             if n.op == "call_function" and "mul" in str(n.target) and n.users
             and all(u.op == "output" for u in n.users)]
    assert roots and not gate.may_match(roots[0])
