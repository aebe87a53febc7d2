"""Rule → spec data (and YAML): the inverse of :mod:`fusionkit.specs.compile`.

Used to write a Python-DSL rule as a spec and to compare rules by content:
two rules are the same fusion exactly when their expanded data is equal.
Sub-patterns shared by object identity in Python become ``let`` entries.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import yaml

from fusionkit import constraints as C
from fusionkit import pattern as P
from fusionkit.rule import CallOp, PythonReplacement, Ref, Rule
from fusionkit.specs.schema import SPEC_VERSION

__all__ = ["DumpError", "rule_to_data", "rules_to_yaml"]


class DumpError(ValueError):
    """A rule that holds Python-only parts (an arbitrary predicate) has no spec form."""


def _callable_ref(fn: Any) -> str:
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or "<" in qual:
        raise DumpError(f"{fn!r} is not an importable module-level function")
    return f"{mod}:{qual}"


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


class _Dumper:
    def __init__(self, rule: Rule, hoist: bool) -> None:
        self.rule = rule
        self.hoist = hoist
        self.lets: dict[int, str] = {}
        self.let_data: dict[str, Any] = {}
        counts: Counter[int] = Counter()
        self._count(rule.pattern, counts, set())
        self.shared = {i for i, n in counts.items() if n > 1} if hoist else set()

    def _count(self, p: P.Pattern, counts: Counter[int], stack: set[int]) -> None:
        if not isinstance(p, (P.Capture, P.Value)):
            counts[id(p)] += 1
            if counts[id(p)] > 1:
                return
        for child in _children(p):
            self._count(child, counts, stack)

    def pattern(self, p: P.Pattern, top: bool = False) -> Any:
        if not top and id(p) in self.shared:
            name = self.lets.get(id(p))
            if name is None:
                name = f"p{len(self.lets) + 1}"
                self.lets[id(p)] = name
                self.let_data[name] = self.pattern(p, top=True)
            return {"use": name}
        if isinstance(p, P.Named):
            inner = self.pattern(p.inner)
            if not isinstance(inner, dict) or not ({"op", "any_of"} & inner.keys()) or "bind" in inner:
                raise DumpError(f"bind({p.name!r}) on {p.inner!r} has no spec form")
            return {**inner, "bind": p.name}
        if isinstance(p, P.Capture):
            return {"capture": p.name}
        if isinstance(p, P.Alt):
            return {"any_of": [self.pattern(o) for o in p.options]}
        if isinstance(p, P.Through):
            ops = "casts" if p.ops == frozenset(P.through(P.CASTS, P.capture("_")).ops) \
                else sorted(p.ops)
            out: dict[str, Any] = {"through": ops, "pattern": self.pattern(p.inner)}
            if p.max_depth != 8:
                out["max_depth"] = p.max_depth
            return out
        if isinstance(p, P.Op):
            out = {"op": next(iter(p.targets)) if len(p.targets) == 1 else sorted(p.targets)}
            if p.args:
                out["args"] = [self.pattern(a) for a in p.args]
            if p.kwargs:
                out["kwargs"] = {k: self.pattern(v) for k, v in p.kwargs.items()}
            if p.commutative != (p.targets <= P.COMMUTATIVE):
                out["commutative"] = p.commutative
            if not p.strict_defaults:
                out["strict_defaults"] = False
            return out
        if isinstance(p, P.Value):
            return self.value(p)
        raise DumpError(f"no spec form for {p!r}")

    def value(self, v: P.Value) -> Any:
        if v.spec is None:
            raise DumpError(f"value matcher {v.description!r} is an arbitrary Python predicate")
        kind, *params = v.spec
        if kind == "lit":
            literal = _plain(params[0])
            if v.name is None and not v.tensor_ok and not isinstance(literal, dict):
                return literal
            out: dict[str, Any] = {"lit": literal}
            if v.tensor_ok:
                out["tensor_ok"] = True
        elif kind == "scalar":
            rng = {k: val for k, val in (("min", params[0]), ("max", params[1])) if val is not None}
            out = {"scalar": rng}
            if not v.tensor_ok:
                out["tensor_ok"] = False
        elif kind == "any_float":
            out = {"any_float": True}
            if not v.tensor_ok:
                out["tensor_ok"] = False
        elif kind == "any_value":
            out = {"any_value": True}
        elif kind == "one_of":
            out = {"one_of": _plain(params[0])}
            if v.tensor_ok:
                out["tensor_ok"] = True
        elif kind == "int_list":
            out = {"int_list": {} if params[0] is None else {"len": params[0]}}
        else:  # pragma: no cover
            raise DumpError(f"unknown value matcher kind {kind!r}")
        if v.name:
            out["bind"] = v.name
        return out


def _children(p: P.Pattern) -> list[P.Pattern]:
    if isinstance(p, P.Named):
        return [p.inner]
    if isinstance(p, P.Alt):
        return list(p.options)
    if isinstance(p, P.Through):
        return [p.inner]
    if isinstance(p, P.Op):
        return [*p.args, *p.kwargs.values()]
    return []


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def constraint_to_data(c: C.Constraint) -> dict[str, Any]:
    if isinstance(c, C.PrepackableConstant):
        args: dict[str, Any] = {"capture": c.capture}
        if c.fold:
            args["fold"] = True
        if c.role != C.PrepackableConstant.role:
            args["role"] = c.role
        return {"prepackable_constant": args}
    simple = {C.GraphLeaf: "graph_leaf", C.UserInput: "user_input", C.StaticShape: "static_shape"}
    for cls, key in simple.items():
        if isinstance(c, cls):
            return {key: {"capture": c.capture}}  # type: ignore[attr-defined]
    if isinstance(c, C.DtypeIn):
        return {"dtype": {"capture": c.capture, "dtypes": sorted(_dtype_name(d) for d in c.dtypes)}}
    if isinstance(c, C.Rank):
        return {"rank": {"capture": c.capture, "ranks": sorted(c.ranks)}}
    if isinstance(c, C.SameDtype):
        return {"same_dtype": {"a": c.a, "b": c.b}}
    if isinstance(c, C.ShapeRelation):
        if c.relation_name is None:
            raise DumpError(f"shape relation {c.description!r} is an arbitrary Python function")
        return {"shape_relation": {"a": c.a, "b": c.b, "relation": c.relation_name}}
    if isinstance(c, C.ReducesLastDim):
        return {"reduces_last_dim": {"dim": c.dim, "x": c.x}}
    if isinstance(c, C.ScalarRange):
        rng = {k: v for k, v in (("min", c.lo), ("max", c.hi)) if v is not None}
        return {"scalar_range": {"capture": c.capture, **rng}}
    if isinstance(c, C.Custom):
        return {"custom": {"python": _callable_ref(c.fn), "name": c.name, "reads": list(c.reads)}}
    raise DumpError(f"constraint {type(c).__name__} has no spec form")


def _arg(a: Any) -> Any:
    if isinstance(a, Ref):
        return {"ref": a.name}
    if isinstance(a, (list, tuple)):
        return [_arg(x) for x in a]
    return a


def rule_to_data(rule: Rule, hoist: bool = True) -> dict[str, Any]:
    """The spec mapping of ``rule``; ``hoist=False`` inlines shared sub-patterns."""
    d = _Dumper(rule, hoist)
    pattern = d.pattern(rule.pattern, top=True)
    out: dict[str, Any] = {"name": rule.name}
    if rule.description:
        out["description"] = rule.description
    if rule.priority:
        out["priority"] = rule.priority
    if rule.allow_escape:
        out["allow_escape"] = True
    if d.let_data:
        out["let"] = d.let_data
    out["pattern"] = pattern
    if rule.constraints:
        out["constraints"] = [constraint_to_data(c) for c in rule.constraints]
    rep = rule.replacement
    if isinstance(rep, CallOp):
        r: dict[str, Any] = {"op": rep.target}
        if rep.args:
            r["args"] = [_arg(a) for a in rep.args]
        if rep.kwargs:
            r["kwargs"] = {k: _arg(v) for k, v in rep.kwargs.items()}
    elif isinstance(rep, PythonReplacement):
        r = {"python": _callable_ref(rep.fn), "reads": sorted(rep.reads)}
    else:
        raise DumpError(f"replacement {type(rep).__name__} has no spec form")
    out["replace"] = r
    return out


def rules_to_yaml(rules: list[Rule]) -> str:
    data = {"version": SPEC_VERSION, "rules": [rule_to_data(r) for r in rules]}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
