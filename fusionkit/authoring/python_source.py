"""A rule or pattern printed as the DSL code that builds it.

A traced rule (:mod:`fusionkit.authoring.from_example`) is data nobody wrote by hand;
printing it as ``op(...)``/``capture(...)`` code lets its author read what was
traced, paste it into a module and edit it like a hand-written rule.
Executing the printed code builds an equal pattern (the tests do exactly that).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from fusionkit.match.pattern import (
    CASTS,
    COMMUTATIVE,
    Also,
    Alt,
    Capture,
    Named,
    Op,
    Outputs,
    Pattern,
    PatternVisitor,
    Seq,
    Through,
    Value,
)
from fusionkit.public_names import EXPORTS
from fusionkit.rule import CallOp, PythonReplacement, Ref, Replacement, Rule
from fusionkit.targets import op_key, resolve_op

__all__ = ["NotPrintable", "to_python"]


class NotPrintable(ValueError):
    """A part of a rule that is Python code, not data (a predicate, a custom check)."""


def _cast_keys() -> frozenset[str]:
    return frozenset(op_key(resolve_op(c)) or c for c in CASTS)


def _literal(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return str(v)  # torch.float32
    if isinstance(v, (set, frozenset)):
        items = sorted(_literal(x) for x in v)
        return "{" + ", ".join(items) + "}" if items else "set()"
    if isinstance(v, tuple):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    if isinstance(v, list):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return f"torch.{v}" if not isinstance(v, torch.device) else f"torch.device({str(v)!r})"
    return repr(v)


def _kw(**items: Any) -> str:
    return "".join(f", {k}={v}" for k, v in items.items() if v is not None)


@dataclass
class _Printer(PatternVisitor[str]):
    casts: frozenset[str] = field(default_factory=_cast_keys)
    #: hoisted sub-pattern text -> variable name (text repeated in the pattern)
    hoisted: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    needs: set[str] = field(default_factory=set)

    def value(self, p: Value) -> str:
        spec = p.spec
        if spec is None:
            raise NotPrintable(f"value matcher {p.description!r} is a Python predicate")
        if len(spec) == 2 and isinstance(spec[1], tuple) and all(
                isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in spec[1]):
            return self._named_value(p, spec[0], dict(spec[1]))
        return self._legacy_value(p, spec)

    def _named_value(self, p: Value, key: str, args: dict[str, Any]) -> str:
        """A matcher of the vocabulary: ``key(first, k=v, name=..., tensor_ok=...)``."""
        import fusionkit.match.pattern as dsl

        builder = getattr(dsl, key, None)
        if builder is None:
            raise NotPrintable(f"value matcher {key!r} is not a fusionkit.match.pattern builder")
        self.needs.add(key)
        params = inspect.signature(builder).parameters
        full = {**args, "name": p.name, "tensor_ok": p.tensor_ok}
        if key == "lit" and p.name is None and not p.tensor_ok:
            self.needs.discard(key)
            return _literal(args["value"])  # op() reads a plain value as lit(value)
        parts: list[str] = []
        for i, (k, prm) in enumerate(params.items()):
            if k not in full:
                continue
            v = full[k]
            if prm.default is not inspect.Parameter.empty and v == prm.default \
                    and type(v) is type(prm.default):
                continue
            parts.append(_literal(v) if i == 0 else f"{k}={_literal(v)}")
        return f"{key}({', '.join(parts)})"

    def _legacy_value(self, p: Value, spec: tuple[Any, ...]) -> str:
        name = repr(p.name) if p.name else None
        tensor_ok = "True" if p.tensor_ok else None
        kind = spec[0]
        if kind == "lit":
            if name is None and tensor_ok is None:
                return _literal(spec[1])
            self.needs.add("lit")
            return f"lit({_literal(spec[1])}{_kw(name=name, tensor_ok=tensor_ok)})"
        if kind == "any_value":
            self.needs.add("any_value")
            return f"any_value({name or ''})"
        if kind == "any_float":
            self.needs.add("any_float")
            return f"any_float({name or 'None'}{'' if p.tensor_ok else ', tensor_ok=False'})"
        if kind == "scalar":
            self.needs.add("scalar")
            lo = repr(spec[1]) if spec[1] is not None else None
            hi = repr(spec[2]) if len(spec) > 2 and spec[2] is not None else None
            return (f"scalar({name or 'None'}{_kw(lo=lo, hi=hi)}"
                    f"{'' if p.tensor_ok else ', tensor_ok=False'})")
        if kind == "one_of":
            self.needs.add("one_of")
            return f"one_of({_literal(spec[1])}{_kw(name=name, tensor_ok=tensor_ok)})"
        if kind == "int_list":
            self.needs.add("int_list")
            return f"int_list({spec[1]!r}{_kw(name=name)})"
        raise NotPrintable(f"value matcher {p.description!r} ({kind}) has no printed form")

    def expr(self, p: Any) -> str:
        return p.accept(self) if isinstance(p, Pattern) else _literal(p)

    def _hoisted(self, text: str) -> str:
        """``text`` itself, or the variable it is hoisted into when the pattern repeats it."""
        if self.counts.get(text, 0) > 1:
            var = self.hoisted.get(text)
            if var is None:
                var = self.hoisted[text] = f"p{len(self.hoisted) + 1}"
                self.lines.append(f"{var} = {text}")
            return var
        return text

    def generic(self, p: Pattern) -> str:
        raise NotPrintable(f"pattern node {type(p).__name__} has no printed form")

    def visit_capture(self, p: Capture) -> str:
        self.needs.add("capture")
        return f"capture({p.name!r})"

    def visit_value(self, p: Value) -> str:
        return self.value(p)

    def visit_named(self, p: Named) -> str:
        return self._hoisted(f"{self.expr(p.inner)}.bind({p.name!r})")

    def visit_alt(self, p: Alt) -> str:
        return "(" + " | ".join(self.expr(o) for o in p.options) + ")"

    def visit_through(self, p: Through) -> str:
        self.needs.add("through")
        if p.ops == self.casts:
            self.needs.add("CASTS")
            ops = "CASTS"
        else:
            ops = _literal(sorted(p.ops))
        depth = f", max_depth={p.max_depth}" if p.max_depth != 8 else ""
        if p.narrowing:
            depth += ", narrowing=True"
        return f"through({ops}, {self.expr(p.inner)}{depth})"

    def visit_seq(self, p: Seq) -> str:
        self.needs.add("seq")
        return f"seq({', '.join(self.expr(i) for i in p.items)})"

    def visit_op(self, p: Op) -> str:
        self.needs.add("op")
        targets = sorted(p.targets)
        head = repr(targets[0]) if len(targets) == 1 else _literal(targets)
        parts = [head, *(self.expr(a) for a in p.args)]
        parts += [f"{k}={self.expr(v)}" for k, v in p.kwargs.items()]
        if p.commutative != (p.targets <= COMMUTATIVE):
            parts.append(f"commutative={p.commutative}")
        if not p.strict_defaults:
            parts.append("strict_defaults=False")
        return self._hoisted(f"op({', '.join(parts)})")

    def visit_outputs(self, p: Outputs) -> str:
        self.needs.update(("outputs", "also"))
        others = [self._also(o) for o in p.others]
        return f"outputs({self.expr(p.primary)}, {', '.join(others)})"

    def _also(self, o: Also) -> str:
        depth = f", max_depth={o.max_depth}" if o.max_depth != 12 else ""
        return f"also({o.name!r}, {self.expr(o.pattern)}, near={o.near!r}{depth})"

    def count(self, p: Any) -> None:
        """First pass: how often each sub-pattern's text occurs (to hoist repeats)."""
        if isinstance(p, Pattern):
            p.accept(_Repeats(self))


class _Repeats(PatternVisitor[None]):
    """Counts the text of every op and bound sub-pattern (the ones a printer may hoist)."""

    def __init__(self, printer: _Printer) -> None:
        self.printer = printer

    def generic(self, p: Pattern) -> None:
        for c in p.children():
            c.accept(self)

    def _seen(self, p: Pattern) -> None:
        self.generic(p)
        text = p.accept(_Printer(self.printer.casts))
        self.printer.counts[text] = self.printer.counts.get(text, 0) + 1

    def visit_op(self, p: Op) -> None:
        self._seen(p)

    def visit_named(self, p: Named) -> None:
        self._seen(p)


def _ref_args(a: Any) -> str:
    if isinstance(a, Ref):
        return f"ref({a.name!r})"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_ref_args(x) for x in a) + "]"
    return _literal(a)


def _replacement(r: Replacement, needs: set[str]) -> tuple[list[str], str]:
    """(definition lines, expression) of a replacement."""
    if isinstance(r, CallOp):
        needs.update(("replace_with", "ref"))
        args = [repr(r.target), *(_ref_args(a) for a in r.args)]
        args += [f"{k}={_ref_args(v)}" for k, v in r.kwargs.items()]
        return [], f"replace_with({', '.join(args)})"
    steps = getattr(r, "steps", None)
    outs = getattr(r, "outs", None)
    if isinstance(r, PythonReplacement) and steps is not None and outs is not None:
        needs.add("PythonReplacement")
        lines = ["def build(rw, c):"]

        def arg(a: Any) -> str:
            kind = type(a).__name__
            if isinstance(a, Ref):
                return f"c[{a.name!r}]"
            if kind == "_Step":
                return f"n{a.index}"
            if kind == "_ConstTensor":
                raise NotPrintable("the traced replacement creates a constant tensor")
            if isinstance(a, (list, tuple)):
                return "[" + ", ".join(arg(x) for x in a) + "]"
            return _literal(a)

        for i, (target, args, kwargs) in enumerate(steps):
            if getattr(target, "__name__", "") == "getitem":
                lines.append(f"    n{i} = rw.getitem({arg(args[0])}, {args[1]!r})")
                continue
            key = op_key(target) or str(target)
            call = ", ".join([repr(key), *(arg(a) for a in args),
                              *(f"{k}={arg(v)}" for k, v in kwargs.items())])
            lines.append(f"    n{i} = rw.call({call})")
        ret = ", ".join(arg(o) for o in outs)
        lines.append(f"    return {ret}")
        reads = sorted(r.captures())
        return lines, f"PythonReplacement(build, frozenset({reads!r}))"
    if isinstance(r, PythonReplacement):
        fn = r.fn
        raise NotPrintable(f"Python replacement {getattr(fn, '__module__', '?')}."
                           f"{getattr(fn, '__qualname__', fn)!s} is code, not data")
    raise NotPrintable(f"replacement {type(r).__name__} has no printed form")


def _constraint(c: Any, needs: set[str]) -> str:
    import importlib

    exported = _fusionkit_exports()
    try:  # the one vocabulary: the builder and the arguments that rebuild ``c``
        vocabulary = importlib.import_module("fusionkit.vocabulary")
        term, args = vocabulary.arguments_of(c)
        builder = getattr(term.build, "__name__", "")
        if builder in exported and _public(builder) is term.build:
            needs.add(builder)
            parts = [f"{k}={_literal(v)}" for k, v in args.items()]
            return f"{builder}({', '.join(parts)})"
    except (ImportError, LookupError, AttributeError):
        pass
    cls = type(c).__name__
    if cls == "Custom" or cls not in exported or _public(cls) is not type(c):
        raise NotPrintable(f"constraint {getattr(c, 'kind', cls)} is custom Python code")
    text = repr(c)
    if "<" in text:
        raise NotPrintable(f"constraint {cls} holds a value without a printed form: {text}")
    needs.add(cls)
    return text


def to_python(obj: Rule | Pattern, variable: str = "rule") -> str:
    """DSL source that builds ``obj`` (a Rule or a Pattern), assigned to ``variable``.

    Raises :class:`NotPrintable` for parts that are Python code (predicates,
    custom checks, hand-written replacement functions).
    """
    pr = _Printer()
    pattern = obj.pattern if isinstance(obj, Rule) else obj
    pr.count(pattern)
    body = pr.expr(pattern)
    out_lines = list(pr.lines)
    needs = set(pr.needs)
    if isinstance(obj, Rule):
        defs, rep = _replacement(obj.replacement, needs)
        cons = [_constraint(c, needs) for c in obj.constraints]
        needs.add("Rule")
        out_lines += defs
        cons_text = "".join(f"        {c},\n" for c in cons)
        extra = ""
        if obj.priority:
            extra += f"    priority={obj.priority},\n"
        if obj.allow_escape:
            extra += "    allow_escape=True,\n"
        if obj.description:
            extra += f"    description={obj.description!r},\n"
        out_lines.append(
            f"{variable} = Rule(\n    name={obj.name!r},\n    pattern={body},\n"
            f"    constraints=[\n{cons_text}    ],\n    replacement={rep},\n{extra})")
    else:
        out_lines.append(f"{variable} = {body}")
    exported = _fusionkit_exports()
    top = sorted((n for n in needs if n in exported), key=lambda s: (not s[0].isupper(), s))
    rest = sorted(n for n in needs if n not in exported)
    head = ["import torch", f"from fusionkit import {', '.join(top)}"]
    if rest:
        head.append(f"from fusionkit.match.pattern import {', '.join(rest)}")
    return "\n".join([*head, "", *out_lines]) + "\n"


def _fusionkit_exports() -> frozenset[str]:
    return frozenset(EXPORTS)


def _public(name: str) -> Any:
    """What ``from fusionkit import name`` gives (read from the table, not the facade)."""
    import importlib

    return getattr(importlib.import_module(EXPORTS[name][0]), name)
