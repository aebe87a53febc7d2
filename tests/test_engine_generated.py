"""Generated tests of the engine: random programs, random rules, through FusionPass.

Hypothesis writes a small program (unary and binary ops over shared operands,
dtype casts, several returned values — some used before the op a rule roots
at) and derives rules from it: one- and multi-output patterns (``outputs`` /
``also``), operands behind ``through(CASTS, ...)``. Each rule's replacement
re-emits what its pattern matched, so a correct engine must leave a program
that lints, runs and equals eager PyTorch — or decline the match with a step
and a reason. Never an exception, never a half-applied program.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.fx import Node

from fusionkit import CASTS, FusionPass, PythonReplacement, Rewriter, Rule, capture, op, through
from fusionkit.find.finder import DECLINE_STEPS
from fusionkit.match.pattern import Outputs, Pattern, also, outputs
from fusionkit.targets import op_key

UNARY = {"sin": torch.sin, "cos": torch.cos, "neg": torch.neg, "relu": torch.relu,
         "tanh": torch.tanh, "sigmoid": torch.sigmoid, "abs": torch.abs}
BINARY = {"add": torch.add, "mul": torch.mul, "sub": torch.sub}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
          "f64": torch.float64}
#: op keys the generated rules may root at or descend into (casts only via through)
OPS = {f"aten.{n}.default" for n in UNARY if n != "neg"} | {"aten.neg.default"} \
    | {f"aten.{n}.Tensor" for n in BINARY}
SHAPE = (2, 3)


@dataclass(frozen=True)
class Step:
    kind: str  # "unary", "binary", "cast"
    name: str  # op name or dtype name
    args: tuple[int, ...]  # indices into the values computed so far


class Program(nn.Module):
    """Interprets generated steps; values 0 and 1 are the inputs."""

    def __init__(self, steps: list[Step], returned: list[int]) -> None:
        super().__init__()
        self.steps, self.returned = steps, returned

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        vals = [x, y]
        for s in self.steps:
            a = [vals[i] for i in s.args]
            if s.kind == "unary":
                vals.append(UNARY[s.name](a[0]))
            elif s.kind == "binary":
                vals.append(BINARY[s.name](a[0], a[1]))
            else:
                vals.append(a[0].to(DTYPES[s.name]))
        return tuple(vals[i] for i in self.returned)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    steps: list[Step] = []
    for k in range(draw(st.integers(3, 9))):
        n = 2 + k  # values available
        kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "cast"]))
        if kind == "unary":
            steps.append(Step(kind, draw(st.sampled_from(sorted(UNARY))),
                              (draw(st.integers(0, n - 1)),)))
        elif kind == "binary":
            steps.append(Step(kind, draw(st.sampled_from(sorted(BINARY))),
                              (draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1)))))
        else:
            steps.append(Step(kind, draw(st.sampled_from(sorted(DTYPES))),
                              (draw(st.integers(0, n - 1)),)))
    last = 1 + len(steps)
    extra = draw(st.lists(st.integers(2, last), max_size=3, unique=True))
    return Program(steps, sorted({last, *extra}))


# ------------------------------------------------------------------------ rules


@dataclass(frozen=True)
class Spec:
    """A pattern tree that can also re-emit itself: op (bound to a name), or a capture
    (maybe behind casts)."""

    key: str | None  # op key, or None for a capture
    name: str = ""  # capture name, or the name the op's node is bound to
    through: bool = False
    children: tuple[Spec, ...] = ()

    def pattern(self) -> Pattern:
        if self.key is None:
            cap = capture(self.name)
            return through(CASTS, cap).bind(f"t_{self.name}") if self.through else cap
        return op(self.key, *(c.pattern() for c in self.children)).bind(self.name)

    def ops(self) -> list[Spec]:
        if self.key is None:
            return []
        return [self, *(o for c in self.children for o in c.ops())]

    def leaves(self) -> set[str]:
        if self.key is None:
            return {self.name}
        return set().union(*(ch.leaves() for ch in self.children))


class Emitter:
    """Re-emits a match's op specs as new nodes, each once. A capture bound to a node the
    match itself replaces (an output or intermediate read by another part) reads its new
    node, never the old one."""

    def __init__(self, rw: Rewriter, c: Mapping[str, Any], specs: list[Spec]) -> None:
        self.rw, self.c = rw, c
        self.by_node = {c[o.name]: o for s in specs for o in s.ops()}
        self.done: dict[Node, Node] = {}

    def node(self, spec: Spec) -> Node:
        old = self.c[spec.name]
        if old not in self.done:
            self.done[old] = self.rw.call(spec.key, *(self.value(ch) for ch in spec.children))
        return self.done[old]

    def value(self, spec: Spec) -> Node:
        if spec.key is not None:
            return self.node(spec)
        v = self.c[spec.name]
        if v in self.by_node:
            v = self.node(self.by_node[v])
        if spec.through:  # the dtype the matched op saw: value-preserving casts only
            want = self.c[f"t_{spec.name}"].meta["val"].dtype
            if v.meta["val"].dtype != want:
                v = self.rw.call("aten._to_copy.default", v, dtype=want)
        return v


def _is_op(n: Any) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and op_key(n.target) in OPS


def spec_at(node: Node, depth: int, draw: st.DrawFn, names: list[int]) -> Spec:
    children = []
    for a in node.args:
        assert isinstance(a, Node)
        if depth > 1 and _is_op(a) and draw(st.booleans()):
            children.append(spec_at(a, depth - 1, draw, names))
        else:
            children.append(Spec(None, a.name, draw(st.booleans())))
    names.append(len(names))
    return Spec(op_key(node.target), f"n{len(names)}", children=tuple(children))


@st.composite
def rule_for(draw: st.DrawFn, ep: torch.export.ExportedProgram, index: int) -> Rule:
    """A rule derived from the program: rooted at one of its ops, maybe with more outputs."""
    ops = [n for n in ep.graph.nodes if _is_op(n)]
    root = draw(st.sampled_from(ops))
    names: list[int] = []
    primary = spec_at(root, draw(st.integers(1, 2)), draw, names)
    specs = [primary]
    others = []
    for j in range(draw(st.integers(0, 2))):
        leaves = sorted(set().union(*(s.leaves() for s in specs)))
        cands = [n for n in ops if n is not root
                 and any(isinstance(a, Node) and a.name in leaves for a in n.args)]
        if not cands:
            break
        n2 = draw(st.sampled_from(cands))
        s2 = spec_at(n2, 1, draw, names)
        near = sorted(s2.leaves() & set(leaves))[0]
        specs.append(s2)
        others.append(also(f"o{j}", s2.pattern(), near=near))
    pattern = outputs(primary.pattern(), *others) if others else primary.pattern()
    reads = frozenset(pattern.captures())

    def build(rw: Rewriter, c: Mapping[str, Any]) -> Node | tuple[Node, ...]:
        e = Emitter(rw, c, specs)
        news = tuple(e.node(s) for s in specs)
        return news if len(news) > 1 else news[0]

    return Rule(f"r{index}", pattern, PythonReplacement(build, reads))


def _same(a: Any, b: Any) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        torch.testing.assert_close(x, y, equal_nan=True, atol=1e-6, rtol=1e-5)


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*SHAPE, generator=g), torch.randn(*SHAPE, generator=g)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs(), data=st.data())
def test_generated_rules_fuse_correctly_or_decline(program: Program, data: st.DataObject) -> None:
    ep = torch.export.export(program.eval(), _inputs(0))
    rules = [data.draw(rule_for(ep, i)) for i in range(data.draw(st.integers(1, 3)))]
    before = copy.deepcopy(ep)
    p = FusionPass(rules)
    res = p(ep)  # strict mode (tests/conftest.py): any exception fails the test
    rep = p.report
    for m in rep.accepted:
        event("fused " + ("multi-output" if len(m.rule.pattern.captures()) and
                          isinstance(m.rule.pattern, Outputs) else "single-output"))
        if m.insert_before is not m.root:
            event("fused, placed before another node than the root")
    for d in rep.declined:
        event(f"declined: {d.step}")
        assert d.step in DECLINE_STEPS and d.step != "error", str(d)
        assert d.reason
    assert res.modified is bool(rep.accepted)
    if not rep.accepted:
        assert ep.graph_module.code == before.graph_module.code
    ep.graph_module.graph.lint()
    for m in rep.accepted:  # replaced: no claimed node survives
        assert all(n.graph is not ep.graph or n._erased for n in m.claimed), str(m)
    for seed in (1, 2):
        with torch.no_grad():
            _same(ep.module()(*_inputs(seed)), program(*_inputs(seed)))


# ---------------------------------------------------------- seen failure #2 (issue 14)


class SinCos(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.sin(x)
        b = a + 1
        c = torch.cos(x)
        return b * 2, c


def _cos_sin_rule() -> Rule:
    x = capture("x")
    return Rule("cos_sin", outputs(op("aten.cos.default", x),
                                   also("s", op("aten.sin.default", x), near="x")),
                PythonReplacement(lambda rw, c: (rw.call("aten.cos.default", c["x"]),
                                                 rw.call("aten.sin.default", c["x"])),
                                  frozenset({"x"})))


def test_output_used_before_the_root_is_placed_before_its_user() -> None:
    from fusionkit import find_matches

    ep = torch.export.export(SinCos(), (torch.randn(4),))
    (m,) = find_matches(ep, [_cos_sin_rule()]).accepted
    assert m.insert_before is not None and m.insert_before.name == "add"
    FusionPass([_cos_sin_rule()])(ep)
    ep.graph_module.graph.lint()
    x = torch.randn(4)
    _same(ep.module()(x), SinCos()(x))


class Crossed(nn.Module):
    """The sin output feeds an input of the add part: no point suits both."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.sin(x)
        t = s * 3
        return x + t, s


def test_no_single_point_is_a_placement_decline() -> None:
    from fusionkit import find_matches

    x, t = capture("x"), capture("t")
    rule = Rule("crossed", outputs(op("aten.add.Tensor", x, t),
                                   also("s", op("aten.sin.default", x), near="x")),
                PythonReplacement(lambda rw, c: (c["t"], c["x"]), frozenset({"x", "t"})))
    ep = torch.export.export(Crossed(), (torch.randn(4),))
    before = ep.graph_module.code
    ms = find_matches(ep, [rule])
    assert not ms.accepted
    (d,) = ms.declined
    assert d.step == "placement" and d.node is not None and d.node.name == "mul", str(d)
    assert "`sin`" in d.reason and "`mul`" in d.reason
    p = FusionPass([rule])
    assert p(ep).modified is False and ep.graph_module.code == before


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
