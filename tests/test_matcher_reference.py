"""The compiled matcher against its executable specification (``reference_matcher``).

For every rule fusionkit ships, at every op node of real exported graphs, and for
generated patterns cut from those graphs (captures that must agree, commutative
ops, pass-through casts, alternatives, literals, wrong ops, names), both matchers
must yield the same bindings in the same order and record the same deepest
failure (progress, node, message, claimed nodes) — the failure is what a
near-miss report says, so it is compared word for word.
"""

from __future__ import annotations

from typing import Any

import pytest
import reference_matcher as ref
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import export_edge
from rmsnorm_models import ROWS, D, HFLlamaRMSNorm, QwenAttention, TwoUsers
from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit import CASTS, capture, lit, op, through
from fusionkit.match.matcher import match_pattern
from fusionkit.match.pattern import Alt, Pattern
from fusionkit.program_inputs import ProgramInputs
from fusionkit.result import MatchResult, Status, Step
from fusionkit.targets import op_key


class CastBlock(torch.nn.Module):
    """Casts, a commutative op with equal operands, literals, a shared value, a cat."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(D))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32) * x.to(torch.float32)
        h = h + y * 2.0
        g = torch.rsqrt(h.mean(-1, keepdim=True) + 1e-6) * h
        c = torch.cat([g, y], dim=-1)
        # x * 0.5 on the fp16 input: to_edge lifts 0.5 to float32 and casts it to float16
        return ((c[..., :D] * self.w).to(torch.float16) + torch.relu(g).to(torch.float16)
                + x * 0.5)


def _corpus() -> dict[str, ExportedProgram]:
    out = {r.name: export_edge(r.make(torch.float32), (torch.randn(2, D), *r.extra(torch.float32)))
           for r in ROWS}
    out["hf"] = export_edge(HFLlamaRMSNorm(), (torch.randn(2, 3, D),))
    out["qwen"] = export_edge(QwenAttention(), (torch.randn(2, 3, 16),))
    out["two_users"] = export_edge(TwoUsers(), (torch.randn(2, 3, D),))
    out["casts"] = export_edge(CastBlock(), (torch.randn(2, D, dtype=torch.float16),
                                             torch.randn(2, D)))
    return out


@pytest.fixture(scope="module")
def corpus() -> dict[str, ExportedProgram]:
    return _corpus()


def _norm(v: Any) -> Any:
    if isinstance(v, Node):
        return ("node", v.name)
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    return ("value", repr(v))


def _outcome(bindings: Any, failure: Any) -> tuple[Any, ...]:
    found = [(sorted((k, _norm(v)) for k, v in b.captures.items()),
              [n.name for n in b.claimed]) for b in bindings]
    return (found, failure.progress, failure.node.name if failure.node is not None else None,
            failure.message, [n.name for n in failure.claimed])


def _as_result(failure: Any, root: Node) -> None:
    """The compiled matcher's deepest failure, reported as the one result type, says what
    the search recorded (the reference has no result type: it is compared field by field)."""
    r = failure.result("rule")
    if failure.progress < 0:
        assert r is None
        return
    assert isinstance(r, MatchResult) and (r.status, r.step) == (Status.DECLINED, Step.STRUCTURE)
    assert (r.root, r.node, r.reason, r.claimed) == (root, failure.node, failure.message,
                                                   failure.claimed)
    assert len(r.claimed) == failure.progress


def _both(pattern: Pattern, node: Node, inputs: ProgramInputs) -> tuple[Any, Any]:
    def run(fn: Any) -> Any:
        try:
            bindings, failure = fn(pattern, node, inputs)
            found = list(bindings)
        except Exception as e:  # a predicate's error must surface the same way
            return ("raised", type(e).__name__, str(e))
        if fn is match_pattern:
            _as_result(failure, node)
        return _outcome(found, failure)
    return run(match_pattern), run(ref.match_pattern)


def _shipped_rules() -> list[Any]:
    from fusionkit.passes import rule_set

    rules = {r.name: r for r in rule_set("builtin")}
    for r in rule_set("vulkan"):
        rules.setdefault(r.name, r)
    return list(rules.values())


def test_shipped_rules_agree_with_the_reference_everywhere(
        corpus: dict[str, ExportedProgram]) -> None:
    rules = _shipped_rules()
    compared = matched = 0
    for name, ep in corpus.items():
        inputs = ProgramInputs(ep)
        for node in ep.graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            for rule in rules:
                new, old = _both(rule.pattern, node, inputs)
                assert new == old, f"{rule.name} at {name}:{node.name}"
                compared += 1
                matched += bool(new[0])
    assert compared > 1000 and matched > 10  # the comparison covered real matches


# ---------------------------------------------------------- generated patterns


def _pattern_from(node: Any, draw: Any, depth: int, all_keys: list[str]) -> Any:
    """A pattern cut from the graph at ``node``, perturbed by the draws."""
    names = ["a", "b", "c"]
    if not isinstance(node, Node):
        kind = draw(st.sampled_from(["lit", "capture", "other_lit"]))
        if kind == "capture":
            return capture(draw(st.sampled_from(names)))
        if kind == "other_lit" or (isinstance(node, (list, tuple)) and not node):
            return lit(7)
        if isinstance(node, (list, tuple)):
            return [_pattern_from(x, draw, depth, all_keys) for x in node]
        try:
            return lit(node)
        except Exception:
            return capture(draw(st.sampled_from(names)))
    if draw(st.integers(0, 5)) == 0:  # a literal where the graph has a node: a lifted
        # constant (or a cast of one) compared in its dtype, or a mismatch
        return lit(draw(st.sampled_from([0.5, 2.0, 1e-6, 7])))
    kind = draw(st.sampled_from(["op", "op", "op", "capture", "through", "alt", "wrong_op"]))
    if depth <= 0 or node.op != "call_function" or kind == "capture":
        return capture(draw(st.sampled_from(names)))
    key = op_key(node.target)
    if key is None:
        return capture(draw(st.sampled_from(names)))
    if kind == "wrong_op":
        key = draw(st.sampled_from(all_keys))
    args = [_pattern_from(a, draw, depth - 1, all_keys) for a in node.args]
    p: Pattern = op(key, *args, commutative=draw(st.booleans()) if len(args) >= 2 else None)
    if kind == "through":
        p = through(CASTS, p, narrowing=draw(st.booleans()))
    elif kind == "alt":
        other = op(draw(st.sampled_from(all_keys)), *args)
        p = Alt((other, p) if draw(st.booleans()) else (p, other))
    if draw(st.integers(0, 4)) == 0:
        p = p.bind(draw(st.sampled_from(["out", *names])))
    return p


@pytest.fixture(scope="module")
def generated_graph() -> ExportedProgram:
    return export_edge(CastBlock(), (torch.randn(2, D, dtype=torch.float16), torch.randn(2, D)))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_generated_patterns_agree_with_the_reference(generated_graph: ExportedProgram,
                                                     data: st.DataObject) -> None:
    ep = generated_graph
    calls = [n for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    all_keys = sorted({k for n in calls if (k := op_key(n.target)) is not None})
    start = data.draw(st.sampled_from(calls))
    try:
        pattern = _pattern_from(start, data.draw, data.draw(st.integers(1, 4)), all_keys)
    except (TypeError, ValueError):  # a literal the DSL cannot express: not a matcher case
        return
    if not isinstance(pattern, Pattern):
        return
    inputs = ProgramInputs(ep)
    for node in calls:  # at its own root and everywhere else (near misses)
        new, old = _both(pattern, node, inputs)
        assert new == old, f"{pattern!r} at {node.name}"


def test_literals_on_lifted_and_cast_constants_agree_with_the_reference(
        generated_graph: ExportedProgram) -> None:
    """``x * 0.5`` on fp16 ``x``: the literal meets a float32 constant cast to float16;
    ``y * 2.0`` on fp32 ``y``: the float32 constant itself. Both matchers accept the
    literal there and word the miss of another literal the same way."""
    inputs = ProgramInputs(generated_graph)
    muls = [n for n in generated_graph.graph.nodes if op_key(n.target) == "aten.mul.Tensor"]
    accepted = 0
    for value in (0.5, 2.0, 0.25):
        for node in muls:
            new, old = _both(op("aten.mul.Tensor", capture("a"), value), node, inputs)
            assert new == old, (value, node.name)
            accepted += bool(new[0])
            if value == 0.25 and node.args and isinstance(node.args[1], Node):
                assert "constant)" in new[3] or "not a 0-d constant" in new[3]
    assert accepted >= 2  # 0.5 at the fp16 mul, 2.0 at the fp32 one


# ---------------------------------------------------------- large patterns


class _Tree(torch.nn.Module):
    """A balanced tree of aten subtractions over 2**depth leaves (all ``x``)."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        level = [x] * 2 ** self.depth
        while len(level) > 1:
            level = [torch.ops.aten.sub.Tensor(level[i], level[i + 1])
                     for i in range(0, len(level), 2)]
        return level[0]


class _Chain(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = torch.ops.aten.relu.default(x)
        return x


def _last_call(gm: torch.fx.GraphModule) -> Node:
    return [n for n in gm.graph.nodes if n.op == "call_function"][-1]


def test_large_patterns_match_without_running_out_of_stack(
        generated_graph: ExportedProgram) -> None:
    """A continuation runs inside the match that produced it, so the stack grows with
    the pattern's size: a 511-op tree (which the generator search handled) and a
    700-op chain (which it did not) must still match, the tree exactly as before.

    The graphs are FX traces of aten calls (exporting them takes seconds); captures
    never consult the program's inputs, so any program's ``ProgramInputs`` will do.
    """
    inputs = ProgramInputs(generated_graph)
    depth = 9
    gm = torch.fx.symbolic_trace(_Tree(depth))
    leaves = iter(range(2 ** depth))

    def tree(d: int) -> Pattern:
        if d == 0:
            return capture(f"x{next(leaves)}")
        return op("aten.sub.Tensor", tree(d - 1), tree(d - 1))
    pattern = tree(depth)
    new, old = _both(pattern, _last_call(gm), inputs)
    assert new == old and len(new[0]) == 1 and len(new[0][0][1]) == 2 ** depth - 1

    chain_len = 700
    gm = torch.fx.symbolic_trace(_Chain(chain_len))
    chain: Pattern = capture("x")
    for _ in range(chain_len):
        chain = op("aten.relu.default", chain)
    bindings, _ = match_pattern(chain, _last_call(gm), inputs)
    (b,) = list(bindings)
    assert len(b.claimed) == chain_len and b.captures["x"].op == "placeholder"
