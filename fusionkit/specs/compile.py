"""Spec files → the same :class:`~fusionkit.rule.Rule` objects the Python DSL builds.

Loading is all-or-nothing: every file is parsed (``yaml.safe_load`` semantics,
via the safe composer so line numbers are known), validated against the
pydantic schema, and compiled; the first mistake raises a :class:`SpecError`
naming the file, the line and the field path (``rules[0].pattern.args[1].op``),
and no rule from any of the files is returned.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from pydantic import ValidationError

from fusionkit import constraints as C
from fusionkit import pattern as P
from fusionkit.rule import CallOp, PythonReplacement, Ref, Replacement, Rule, RuleError
from fusionkit.specs import schema as S
from fusionkit.targets import UnknownOpError, op_key, resolve_op

__all__ = ["SpecError", "load_spec_file", "load_spec_text", "load_specs"]

Loc = tuple[str | int, ...]


class SpecError(ValueError):
    """A user's mistake in a spec file: where it is and what is wrong."""

    def __init__(self, file: str, line: int | None, path: str, message: str) -> None:
        self.file, self.line, self.path, self.message = file, line, path, message
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {path}: {message}" if path else f"{where}: {message}")


def format_path(loc: Iterable[str | int]) -> str:
    out = ""
    for seg in loc:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else str(seg))
    return out


def _line_map(text: str) -> dict[Loc, int]:
    """1-based line of every mapping value / sequence item, by its data path."""
    lines: dict[Loc, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines

    def walk(node: yaml.Node, loc: Loc) -> None:
        lines[loc] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = k.value if isinstance(k, yaml.ScalarNode) else str(k.value)
                lines[(*loc, key)] = k.start_mark.line + 1
                walk(v, (*loc, key))
                lines[(*loc, key)] = k.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, (*loc, i))

    if root is not None:
        walk(root, ())
    return lines


def _data_loc(data: Any, loc: Iterable[str | int]) -> Loc:
    """Map pydantic's error location onto the data: drop the union-tag segments.

    A discriminated union adds its tag (``op``, ``dtype``, ``ReplaceOp``, ...)
    to the location; a tag is recognised as a segment that does not index the
    data, or that equals the node's own tag and is followed by a segment that
    does index it.
    """
    segs = list(loc)
    out: list[str | int] = []
    cur = data
    for i, seg in enumerate(segs):
        nxt = segs[i + 1] if i + 1 < len(segs) else None
        if isinstance(cur, dict):
            tag = S.pattern_tag(cur) if S.constraint_tag(cur) is None else S.constraint_tag(cur)
            is_tag = seg == tag and nxt is not None and (nxt == seg or nxt in cur)
            if seg in cur and not is_tag:
                out.append(seg)
                cur = cur[seg]
            elif not is_tag and isinstance(seg, str) and seg[:1].islower() and "[" not in seg \
                    and seg not in ("literal", "int", "float", "bool", "str", "none") \
                    and not seg.startswith("function-"):
                out.append(seg)  # a missing or unknown field: name it, then stop
                break
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cur):
            out.append(seg)
            cur = cur[seg]
    return tuple(out)


class _Source:
    def __init__(self, file: str, text: str) -> None:
        self.file = file
        self.lines = _line_map(text)

    def error(self, loc: Loc, message: str) -> SpecError:
        line = None
        for cut in range(len(loc), -1, -1):
            line = self.lines.get(loc[:cut])
            if line is not None:
                break
        return SpecError(self.file, line, format_path(loc), message)


def _import(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class _RuleCompiler:
    """Compiles one validated rule; every error carries its data path."""

    def __init__(self, src: _Source, loc: Loc, spec: S.RuleSpec) -> None:
        self.src, self.loc, self.spec = src, loc, spec
        self.kinds: dict[str, tuple[str, Loc]] = {}
        self.lets: dict[str, P.Pattern] = {}
        self.building: set[str] = set()

    # -- captures ------------------------------------------------------------------
    def _bind(self, name: str | None, kind: str, loc: Loc) -> None:
        if name is None:
            return
        prev = self.kinds.get(name)
        if prev is not None and prev[0] != kind:
            raise self.src.error(loc, f"capture `{name}` is bound as a {kind} here but as a "
                                 f"{prev[0]} at {format_path(prev[1])}")
        self.kinds.setdefault(name, (kind, loc))

    def _key(self, name: str, loc: Loc) -> str:
        try:
            key = op_key(resolve_op(name))
        except UnknownOpError as e:
            raise self.src.error(loc, str(e)) from None
        assert key is not None
        return key

    # -- patterns -------------------------------------------------------------------
    def pattern(self, node: Any, loc: Loc) -> P.Pattern:
        if isinstance(node, S.OpNode):
            names = [node.op] if isinstance(node.op, str) else node.op
            targets = [self._key(n, (*loc, "op") if isinstance(node.op, str) else (*loc, "op", i))
                       for i, n in enumerate(names)]
            args = [self.pattern(a, (*loc, "args", i)) for i, a in enumerate(node.args)]
            kwargs = {k: self.pattern(v, (*loc, "kwargs", k)) for k, v in node.kwargs.items()}
            try:
                built: P.Pattern = P.op(targets, *args, commutative=node.commutative,
                                        strict_defaults=node.strict_defaults, **kwargs)
            except ValueError as e:
                raise self.src.error(loc, str(e)) from None
            self._bind(node.bind, "node", (*loc, "bind"))
            return built.bind(node.bind) if node.bind else built
        if isinstance(node, S.CaptureNode):
            self._bind(node.capture, "node", (*loc, "capture"))
            return P.capture(node.capture)
        if isinstance(node, S.AnyOfNode):
            options = [self.pattern(o, (*loc, "any_of", i)) for i, o in enumerate(node.any_of)]
            alt: P.Pattern = P.Alt(tuple(options)) if len(options) > 1 else options[0]
            self._bind(node.bind, "node", (*loc, "bind"))
            return alt.bind(node.bind) if node.bind else alt
        if isinstance(node, S.ThroughNode):
            ops = list(P.CASTS) if node.through == "casts" else list(node.through)
            keys = [self._key(o, (*loc, "through") if node.through == "casts" else (*loc, "through", i))
                    for i, o in enumerate(ops)]
            return P.through(keys, self.pattern(node.pattern, (*loc, "pattern")), node.max_depth)
        if isinstance(node, S.UseNode):
            return self.use(node.use, (*loc, "use"))
        return self.value(node, loc)

    def value(self, node: Any, loc: Loc) -> P.Pattern:
        if isinstance(node, S.LitNode):
            v: P.Value = P.lit(node.lit, node.bind, node.tensor_ok)
        elif isinstance(node, S.ScalarNode):
            v = P.scalar(node.bind, node.scalar.min, node.scalar.max, node.tensor_ok)
        elif isinstance(node, S.AnyFloatNode):
            v = P.any_float(node.bind, node.tensor_ok)
        elif isinstance(node, S.AnyValueNode):
            v = P.any_value(node.bind)
        elif isinstance(node, S.OneOfNode):
            v = P.one_of(node.one_of, node.bind, node.tensor_ok)
        elif isinstance(node, S.IntListNode):
            v = P.int_list(node.int_list.len, node.bind)
        else:  # a plain YAML literal
            return P.lit(node)
        self._bind(v.name, "value", (*loc, "bind"))
        return v

    def use(self, name: str, loc: Loc) -> P.Pattern:
        if name in self.lets:
            return self.lets[name]
        if name not in self.spec.let:
            known = ", ".join(sorted(self.spec.let)) or "none"
            raise self.src.error(loc, f"`{name}` is not defined under `let` (defined: {known})")
        if name in self.building:
            raise self.src.error(loc, f"`let` entry `{name}` refers to itself")
        self.building.add(name)
        self.lets[name] = self.pattern(self.spec.let[name], (*self.loc, "let", name))
        self.building.discard(name)
        return self.lets[name]

    # -- constraints -----------------------------------------------------------------
    def constraint(self, entry: Any, loc: Loc) -> C.Constraint:
        (key, args), = entry.model_dump(exclude_unset=False).items()
        cloc = (*loc, key)
        reads: dict[str, str] = {k: v for k, v in args.items()
                                 if k in ("capture", "a", "b", "dim", "x") and isinstance(v, str)}
        for field, name in reads.items():
            if name not in self.kinds:
                raise self.src.error((*cloc, field), f"constraint reads capture `{name}`, which "
                                     "the pattern never binds")
        a = getattr(entry, key)
        if key == "prepackable_constant":
            extra = {"role": a.role} if a.role else {}
            return C.PrepackableConstant(a.capture, a.fold, **extra)
        if key == "graph_leaf":
            return C.GraphLeaf(a.capture)
        if key == "user_input":
            return C.UserInput(a.capture)
        if key == "static_shape":
            return C.StaticShape(a.capture)
        if key == "dtype":
            dtypes = []
            for i, name in enumerate(a.dtypes):
                dt = getattr(torch, name, None)
                if not isinstance(dt, torch.dtype):
                    raise self.src.error((*cloc, "dtypes", i), f"{name!r} is not a torch dtype")
                dtypes.append(dt)
            return C.DtypeIn(a.capture, frozenset(dtypes))
        if key == "rank":
            return C.Rank(a.capture, frozenset(a.ranks))
        if key == "same_dtype":
            return C.SameDtype(a.a, a.b)
        if key == "shape_relation":
            return C.named_shape_relation(a.relation, a.a, a.b)
        if key == "reduces_last_dim":
            return C.ReducesLastDim(a.dim, a.x)
        if key == "scalar_range":
            return C.ScalarRange(a.capture, a.min, a.max)
        if key == "custom":
            for i, name in enumerate(a.reads):
                if name not in self.kinds:
                    raise self.src.error((*cloc, "reads", i), f"constraint reads capture `{name}`, "
                                         "which the pattern never binds")
            fn = self._callable(a.python, (*cloc, "python"))
            return C.Custom(fn, a.name, tuple(a.reads))
        raise self.src.error(cloc, f"unknown constraint {key!r}")  # pragma: no cover

    def _callable(self, ref: str, loc: Loc) -> Callable[..., Any]:
        try:
            fn = _import(ref)
        except (ImportError, AttributeError) as e:
            raise self.src.error(loc, f"cannot import {ref!r}: {e}") from None
        if not callable(fn):
            raise self.src.error(loc, f"{ref!r} is not callable")
        return fn  # type: ignore[no-any-return]

    # -- replacement ------------------------------------------------------------------
    def _arg(self, a: Any, loc: Loc) -> Any:
        if isinstance(a, S.RefArg):
            if a.ref not in self.kinds:
                raise self.src.error((*loc, "ref"), f"capture `{a.ref}` is used in the replacement "
                                     "but never bound by the pattern")
            return Ref(a.ref)
        if isinstance(a, list):
            return [self._arg(x, (*loc, i)) for i, x in enumerate(a)]
        return a

    def replacement(self, r: S.ReplaceOp | S.ReplacePython, loc: Loc) -> Replacement:
        if isinstance(r, S.ReplaceOp):
            key = self._key(r.op, (*loc, "op"))
            args = tuple(self._arg(a, (*loc, "args", i)) for i, a in enumerate(r.args))
            kwargs = {k: self._arg(v, (*loc, "kwargs", k)) for k, v in r.kwargs.items()}
            return CallOp(key, args, kwargs)
        for i, name in enumerate(r.reads):
            if name not in self.kinds:
                raise self.src.error((*loc, "reads", i), f"capture `{name}` is used in the "
                                     "replacement but never bound by the pattern")
        fn = self._callable(r.python, (*loc, "python"))
        return PythonReplacement(fn, frozenset(r.reads))

    def rule(self) -> Rule:
        s = self.spec
        pat = self.pattern(s.pattern, (*self.loc, "pattern"))
        cons = [self.constraint(c, (*self.loc, "constraints", i)) for i, c in enumerate(s.constraints)]
        rep = self.replacement(s.replace, (*self.loc, "replace"))
        try:
            return Rule(s.name, pat, rep, cons, s.priority, s.allow_escape, s.description)
        except RuleError as e:
            raise self.src.error((*self.loc, "pattern"), str(e)) from None


def _validate(src: _Source, data: Any) -> S.SpecFile:
    if not isinstance(data, dict):
        raise src.error((), f"a spec file must be a mapping with `version` and `rules`, "
                        f"got {type(data).__name__}")
    try:
        return S.SpecFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = _data_loc(data, err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown key `{err['loc'][-1]}`"
            loc = (*loc, err["loc"][-1]) if loc and loc[-1] != err["loc"][-1] else loc
        elif err["type"] == "literal_error" and err["loc"][:1] == ("version",):
            msg = f"unsupported spec version {data.get('version')!r}; this fusionkit reads version {S.SPEC_VERSION}"
        elif err["type"] == "missing":
            msg = f"missing required field `{err['loc'][-1]}`"
        more = len(e.errors()) - 1
        if more:
            msg += f" (and {more} more problem{'s' if more > 1 else ''})"
        raise src.error(loc, msg) from None


def _compile(src: _Source, text: str, seen: dict[str, str]) -> list[Rule]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(src.file, line, "", f"malformed YAML: {problem}") from None
    spec = _validate(src, data)
    rules = []
    for i, rs in enumerate(spec.rules):
        loc: Loc = ("rules", i)
        if rs.name in seen:
            raise src.error((*loc, "name"), f"duplicate rule name {rs.name!r} "
                            f"(first defined in {seen[rs.name]})")
        seen[rs.name] = f"{src.file} rules[{i}]"
        rules.append(_RuleCompiler(src, loc, rs).rule())
    return rules


def load_spec_text(text: str, file: str = "<spec>") -> list[Rule]:
    """Rules of one spec given as text (``file`` names it in errors)."""
    return _compile(_Source(file, text), text, {})


def load_specs(paths: Iterable[str | Path], *, existing: Mapping[str, str] | None = None
               ) -> list[Rule]:
    """Rules of several spec files, all or nothing; rule names must be unique overall."""
    seen: dict[str, str] = dict(existing or {})
    rules: list[Rule] = []
    for p in paths:
        path = Path(p)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise SpecError(str(path), None, "", f"cannot read: {e.strerror or e}") from None
        rules.extend(_compile(_Source(str(path), text), text, seen))
    return rules


def load_spec_file(path: str | Path) -> list[Rule]:
    return load_specs([path])
