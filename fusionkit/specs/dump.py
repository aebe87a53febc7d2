"""Rule → spec data (and YAML): the inverse of :mod:`fusionkit.specs.compile`.

Value matchers and constraints dump through the vocabulary registry: a term's
YAML entry is the arguments its object was built with, under the term's key,
defaults left out. Functions (a ``custom`` check, a Python replacement) dump
as their importable name ``package.module:qualname``; a function that has none
(a closure, a lambda) has no spec form. Sub-patterns shared by object identity
in Python become ``let`` entries.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import yaml

from fusionkit.check import constraints as C
from fusionkit.match import pattern as P
from fusionkit.rule import CallOp, PythonReplacement, Ref, Rule
from fusionkit.specs.codec import CodecError, dtype_name, encode_literal, has_mapping, to_yaml
from fusionkit.specs.schema import SPEC_VERSION, shorthand
from fusionkit.specs.trust import import_ref
from fusionkit.vocabulary import Term, arguments_of, term_of

__all__ = ["DumpError", "constraint_to_data", "python_ref", "rule_to_data", "rules_to_yaml"]

_CASTS = frozenset(P.through(P.CASTS, P.capture("_")).ops)


class DumpError(ValueError):
    """A rule that holds Python-only parts (an arbitrary predicate, a closure) has no spec form."""


def python_ref(fn: Any) -> str:
    """The importable name of ``fn`` (``package.module:qualname``), checked by resolving it."""
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not mod or not qual or "<" in qual:
        raise DumpError(f"{fn!r} is not an importable module-level function "
                        "(a closure or lambda has no name a spec could refer to)")
    ref = f"{mod}:{qual}"
    try:
        same = import_ref(ref) is fn  # the module is already imported: fn came from it
    except (ImportError, AttributeError):
        same = False
    if not same:
        raise DumpError(f"{ref} does not name {fn!r}")
    return ref


def _term_data(term: Term, args: dict[str, Any]) -> dict[str, Any]:
    """A term's arguments as YAML data, parameters at their default left out."""
    defaults = term.defaults()
    out: dict[str, Any] = {}
    for p in term.parameters:
        v = args[p.name]
        if p.name in defaults and _same(v, defaults[p.name]):
            continue
        try:
            out[p.name] = to_yaml(term.hints[p.name], v, python_ref)
        except CodecError as e:
            raise DumpError(f"{term.key}: {e}") from None
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    try:
        return bool(a == b)
    except Exception:
        return False


class _Dumper(P.PatternVisitor[Any]):
    def __init__(self, rule: Rule, hoist: bool) -> None:
        self.rule = rule
        self.hoist = hoist
        self.lets: dict[int, str] = {}
        self.let_data: dict[str, Any] = {}
        counts: Counter[int] = Counter()
        self._count(rule.pattern, counts)
        self.shared = {i for i, n in counts.items() if n > 1} if hoist else set()

    def _count(self, p: P.Pattern, counts: Counter[int]) -> None:
        if not p.accept(_IsLeaf()):
            counts[id(p)] += 1
            if counts[id(p)] > 1:
                return
        for child in p.children():
            self._count(child, counts)

    def pattern(self, p: P.Pattern, top: bool = False) -> Any:
        if not top and id(p) in self.shared:
            name = self.lets.get(id(p))
            if name is None:
                name = f"p{len(self.lets) + 1}"
                self.lets[id(p)] = name
                self.let_data[name] = self.pattern(p, top=True)
            return {"use": name}
        return p.accept(self)

    def generic(self, p: P.Pattern) -> Any:
        raise DumpError(f"no spec form for {p!r}")

    def visit_named(self, p: P.Named) -> Any:
        inner = self.pattern(p.inner)
        if p.inner.accept(_IsValue()):
            raise DumpError(f"{p!r} has no spec form: name the value matcher instead "
                            f"(name={p.name!r})")
        if not isinstance(inner, dict) or "bind" in inner:
            raise DumpError(f"{p!r} has no spec form (bound twice)")
        return {**inner, "bind": p.name}

    def visit_capture(self, p: P.Capture) -> Any:
        return {"capture": p.name}

    def visit_alt(self, p: P.Alt) -> Any:
        # a bare literal is only an exact value as an op argument: spell it out here
        return {"any_of": [d if isinstance(d, dict) else {"lit": d}
                           for d in (self.pattern(o) for o in p.options)]}

    def visit_through(self, p: P.Through) -> Any:
        out: dict[str, Any] = {"through": "casts" if p.ops == _CASTS else sorted(p.ops),
                               "inner": self.pattern(p.inner)}
        if p.max_depth != 8:
            out["max_depth"] = p.max_depth
        if p.narrowing:
            out["narrowing"] = True
        return out

    def visit_seq(self, p: P.Seq) -> Any:
        return {"seq": [self.pattern(i) for i in p.items]}

    def visit_outputs(self, p: P.Outputs) -> Any:
        also = []
        for o in p.others:
            a: dict[str, Any] = {"name": o.name, "pattern": self.pattern(o.pattern), "near": o.near}
            if o.max_depth != 12:
                a["max_depth"] = o.max_depth
            also.append(a)
        return {"outputs": self.pattern(p.primary), "also": also}

    def visit_op(self, p: P.Op) -> Any:
        out: dict[str, Any] = {"op": next(iter(p.targets)) if len(p.targets) == 1
                               else sorted(p.targets)}
        if p.args:
            out["args"] = [self.pattern(a) for a in p.args]
        if p.kwargs:
            out["kwargs"] = {k: self.pattern(v) for k, v in p.kwargs.items()}
        if p.commutative != (p.targets <= P.COMMUTATIVE):
            out["commutative"] = p.commutative
        if not p.strict_defaults:
            out["strict_defaults"] = False
        return out

    def visit_value(self, p: P.Value) -> Any:
        return value_to_data(p)


class _IsValue(P.PatternVisitor[bool]):
    """Whether a node is a value matcher."""

    def generic(self, p: P.Pattern) -> bool:
        return False

    def visit_value(self, p: P.Value) -> bool:
        return True


class _IsLeaf(_IsValue):
    """Whether a node is a leaf repeated freely in a dump (a capture or a value matcher)."""

    def visit_capture(self, p: P.Capture) -> bool:
        return True


def value_to_data(v: P.Value) -> Any:
    """A value matcher as YAML: ``{key: {args}}``, or the bare literal / dtype where that is exact."""
    term = term_of(v)
    if term is None:
        raise DumpError(f"value matcher {v.description!r} is an arbitrary Python predicate "
                        "(use a named matcher: " + ", ".join(sorted(_value_keys())) + ")")
    _, args = arguments_of(v)
    data = _term_data(term, args)
    if term.key == "lit" and set(data) == {"value"}:
        literal = args["value"]
        if isinstance(literal, torch.dtype):
            return {"dtype": dtype_name(literal)}
        encoded = encode_literal(literal)
        if not has_mapping(encoded):
            return encoded  # a plain YAML value in an argument is this exact literal
    short = shorthand(term)
    if short is not None and set(data) == {short}:
        return {term.key: data[short]}
    return {term.key: data or True}


def _value_keys() -> list[str]:
    from fusionkit.vocabulary import VALUE_MATCHERS

    return list(VALUE_MATCHERS)


def constraint_to_data(c: C.Constraint) -> dict[str, Any]:
    term = term_of(c)
    if term is None:
        raise DumpError(f"constraint {type(c).__name__} is not in the vocabulary "
                        "(register it with fusionkit.vocabulary.constraint_term)")
    try:
        _, args = arguments_of(c)
    except LookupError as e:
        raise DumpError(str(e)) from None
    return {term.key: _term_data(term, args)}


def _arg(a: Any) -> Any:
    if isinstance(a, Ref):
        return {"ref": a.name}
    if isinstance(a, (list, tuple)):
        return [_arg(x) for x in a]
    try:
        return encode_literal(a)
    except CodecError as e:
        raise DumpError(str(e)) from None


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
        r = {"fn": python_ref(rep.fn)}
        if rep.parameters is None:  # the older fn(rw, captures): its reads are listed
            r["reads"] = sorted(rep.reads or ())
    else:
        raise DumpError(f"replacement {type(rep).__name__} has no spec form")
    out["replacement"] = r
    return out


def rules_to_yaml(rules: list[Rule]) -> str:
    data = {"version": SPEC_VERSION, "rules": [rule_to_data(r) for r in rules]}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)

