"""Spec files → the same :class:`~fusionkit.rule.Rule` objects the Python DSL builds.

Loading is all-or-nothing: every file is parsed (``yaml.safe_load`` semantics,
via the safe composer so line numbers are known), validated against the
pydantic schema, and compiled; the first mistake raises a :class:`SpecError`
naming the file, the line and the field path (``rules[0].pattern.args[1].op``),
and no rule from any of the files is returned.

Value matchers and constraints are compiled through the vocabulary registry
(:mod:`fusionkit.vocabulary`): a YAML entry is its term's Python builder called
with the entry's fields. A Python reference (a ``custom`` check's ``fn``, a
Python replacement) is imported only when the caller consented
(:class:`~fusionkit.specs.trust.ImportPolicy`); otherwise it is an error, and
:func:`validate_specs` checks its form without importing anything.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fusionkit.check import constraints as C
from fusionkit.match import pattern as P
from fusionkit.rule import CallOp, PythonReplacement, Ref, Replacement, Rule, RuleError
from fusionkit.specs import schema as S
from fusionkit.specs.codec import DTYPES, CodecError, decode_literal, from_yaml, is_python_ref
from fusionkit.specs.trust import ImportPolicy, import_ref
from fusionkit.targets import UnknownOpError, op_key, resolve_op
from fusionkit.vocabulary import CONSTRAINTS, VALUE_MATCHERS, Term

__all__ = ["PythonRef", "SpecError", "SpecSummary", "load_spec_file", "load_spec_text",
           "load_specs", "validate_specs"]

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


@dataclass(frozen=True)
class PythonRef:
    """A Python reference found in a spec: where it is and whether it was imported."""

    file: str
    line: int | None
    path: str
    ref: str
    imported: bool


@dataclass
class SpecSummary:
    """What :func:`validate_specs` found in one file."""

    file: str
    rules: list[str] = field(default_factory=list)
    references: list[PythonRef] = field(default_factory=list)


def _unresolved(ref: str) -> Callable[..., Any]:
    def not_imported(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{ref} was validated but not imported (no consent to run it)")

    not_imported.__qualname__ = not_imported.__name__ = f"<not imported: {ref}>"
    # unimported, its capture parameters are unknown: it reads none (validation only)
    not_imported.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("context", inspect.Parameter.POSITIONAL_ONLY)])
    return not_imported


class _Refs:
    """Resolves the Python references of one load under one :class:`ImportPolicy`."""

    def __init__(self, policy: ImportPolicy, refuse: bool) -> None:
        #: ``refuse``: a reference the policy does not allow is an error (loading); else
        #: it is only checked for form and left unimported (validating)
        self.policy, self.refuse = policy, refuse
        self.found: list[PythonRef] = []

    def resolve(self, src: _Source, loc: Loc, ref: str) -> Callable[..., Any]:
        if not is_python_ref(ref):
            raise src.error(loc, f"{ref!r} is not a Python reference package.module:attr "
                            "made of identifiers")
        allowed = self.policy.allows(ref)
        line = src.error(loc, "").line
        if not allowed and self.refuse:
            raise src.error(loc, self.policy.refusal(ref))
        self.found.append(PythonRef(src.file, line, format_path(loc), ref, allowed))
        if not allowed:
            return _unresolved(ref)
        try:
            fn = import_ref(ref)
        except (ImportError, AttributeError) as e:
            raise src.error(loc, f"cannot import {ref!r}: {e}") from None
        if not callable(fn):
            raise src.error(loc, f"{ref!r} is not callable")
        return fn  # type: ignore[no-any-return]


def _args(model: BaseModel) -> dict[str, Any]:
    return {k: getattr(model, k) for k in type(model).model_fields}


class _RuleCompiler:
    """Compiles one validated rule; every error carries its data path."""

    def __init__(self, src: _Source, loc: Loc, spec: S.RuleSpec, refs: _Refs) -> None:
        self.src, self.loc, self.spec, self.refs = src, loc, spec, refs
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

    def _read(self, name: str, loc: Loc, what: str = "constraint reads") -> None:
        if name not in self.kinds:
            raise self.src.error(loc, f"{what} capture `{name}`, which the pattern never binds")

    def _key(self, name: str, loc: Loc) -> str:
        try:
            key = op_key(resolve_op(name))
        except UnknownOpError as e:
            raise self.src.error(loc, str(e)) from None
        assert key is not None
        return key

    def _keys(self, names: str | list[str], loc: Loc) -> list[str]:
        if isinstance(names, str):
            return [self._key(names, loc)]
        return [self._key(n, (*loc, i)) for i, n in enumerate(names)]

    def _named(self, built: P.Pattern, bind: str | None, loc: Loc) -> P.Pattern:
        self._bind(bind, "node", (*loc, "bind"))
        return built.bind(bind) if bind else built

    # -- patterns -------------------------------------------------------------------
    def pattern(self, node: Any, loc: Loc) -> P.Pattern:
        if isinstance(node, S.OpNode):
            targets = self._keys(node.op, (*loc, "op"))
            args = [self.pattern(a, (*loc, "args", i)) for i, a in enumerate(node.args)]
            kwargs = {k: self.pattern(v, (*loc, "kwargs", k)) for k, v in node.kwargs.items()}
            try:
                built: P.Pattern = P.op(targets, *args, commutative=node.commutative,
                                        strict_defaults=node.strict_defaults, **kwargs)
            except ValueError as e:
                raise self.src.error(loc, str(e)) from None
            return self._named(built, node.bind, loc)
        if isinstance(node, S.CaptureNode):
            self._bind(node.capture, "node", (*loc, "capture"))
            return self._named(P.capture(node.capture), node.bind, loc)
        if isinstance(node, S.AnyOfNode):
            options = [self.pattern(o, (*loc, "any_of", i)) for i, o in enumerate(node.any_of)]
            alt: P.Pattern = P.Alt(tuple(options)) if len(options) > 1 else options[0]
            return self._named(alt, node.bind, loc)
        if isinstance(node, S.ThroughNode):
            if node.through == "casts":
                keys = [self._key(o, (*loc, "through")) for o in P.CASTS]
            else:
                keys = self._keys(node.through, (*loc, "through"))
            inner = self.pattern(node.inner, (*loc, "inner"))
            return self._named(P.through(keys, inner, node.max_depth, narrowing=node.narrowing),
                               node.bind, loc)
        if isinstance(node, S.SeqNode):
            items = [self.pattern(x, (*loc, "seq", i)) for i, x in enumerate(node.seq)]
            return self._named(P.seq(*items), node.bind, loc)
        if isinstance(node, S.OutputsNode):
            primary = self.pattern(node.outputs, (*loc, "outputs"))
            others = []
            for i, a in enumerate(node.also):
                aloc = (*loc, "also", i)
                inner = self.pattern(a.pattern, (*aloc, "pattern"))
                self._read(a.near, (*aloc, "near"), "output reads")
                self._bind(a.name, "node", (*aloc, "name"))
                try:
                    others.append(P.also(a.name, inner, a.near, a.max_depth))
                except ValueError as e:
                    raise self.src.error(aloc, str(e)) from None
            try:
                out: P.Pattern = P.outputs(primary, *others)
            except ValueError as e:
                raise self.src.error(loc, str(e)) from None
            return self._named(out, node.bind, loc)
        if isinstance(node, S.UseNode):
            return self._named(self.use(node.use, (*loc, "use")), node.bind, loc)
        if isinstance(node, S.DtypeNode):
            return self._named(P.lit(DTYPES[node.dtype]), node.bind, loc)
        if isinstance(node, BaseModel):
            return self.value(node, loc)
        try:  # a plain YAML literal
            return P.lit(decode_literal(node))
        except CodecError as e:
            raise self.src.error(loc, f"{e} (a list of patterns is written {{seq: [...]}})") from None

    def _call(self, term: Term, args: BaseModel, loc: Loc) -> Any:
        kwargs: dict[str, Any] = {}
        for name, v in _args(args).items():
            hint = term.hints[name]
            here = (*loc, name)
            if name in term.reads:
                for i, c in enumerate([v] if isinstance(v, str) else v):
                    self._read(c, here if isinstance(v, str) else (*here, i))
            try:
                kwargs[name] = from_yaml(hint, v, lambda r, here=here: self.refs.resolve(  # type: ignore[misc]
                    self.src, here, r))
            except CodecError as e:
                raise self.src.error(here, str(e)) from None
        try:
            return term.build(**kwargs)
        except (ValueError, TypeError) as e:
            raise self.src.error(loc, str(e)) from None

    def value(self, node: BaseModel, loc: Loc) -> P.Pattern:
        (key,) = (k for k in type(node).model_fields)
        term = VALUE_MATCHERS[key]
        args = getattr(node, key)
        v: P.Value = self._call(term, args, (*loc, key))
        self._bind(v.name, "value", (*loc, key, "name"))
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
    def constraint(self, entry: BaseModel, loc: Loc) -> C.Constraint:
        (key,) = (k for k in type(entry).model_fields)
        c: C.Constraint = self._call(CONSTRAINTS[key], getattr(entry, key), (*loc, key))
        return c

    # -- replacement ------------------------------------------------------------------
    def _arg(self, a: Any, loc: Loc) -> Any:
        if isinstance(a, dict) and set(a) == {"ref"} and isinstance(a["ref"], str):
            a = S.RefArg(ref=a["ref"])  # a reference nested in a list argument
        if isinstance(a, S.RefArg):
            self._read(a.ref, (*loc, "ref"), "the replacement uses")
            return Ref(a.ref)
        if isinstance(a, list):
            return [self._arg(x, (*loc, i)) for i, x in enumerate(a)]
        try:
            return decode_literal(a)
        except CodecError as e:
            raise self.src.error(loc, str(e)) from None

    def replacement(self, r: S.ReplaceOp | S.ReplacePython, loc: Loc) -> Replacement:
        if isinstance(r, S.ReplaceOp):
            key = self._key(r.op, (*loc, "op"))
            args = tuple(self._arg(a, (*loc, "args", i)) for i, a in enumerate(r.args))
            kwargs = {k: self._arg(v, (*loc, "kwargs", k)) for k, v in r.kwargs.items()}
            return CallOp(key, args, kwargs)
        for i, name in enumerate(r.reads or ()):
            self._read(name, (*loc, "reads", i), "the replacement uses")
        fn = self.refs.resolve(self.src, (*loc, "fn"), r.fn)
        if r.reads is None:  # the captures are fn's parameters
            try:
                return PythonReplacement(fn)
            except TypeError as e:
                raise self.src.error((*loc, "fn"), str(e)) from None
        return PythonReplacement(fn, frozenset(r.reads))

    def rule(self) -> Rule:
        s = self.spec
        pat = self.pattern(s.pattern, (*self.loc, "pattern"))
        cons = [self.constraint(c, (*self.loc, "constraints", i)) for i, c in enumerate(s.constraints)]
        rep = self.replacement(s.replacement, (*self.loc, "replacement"))
        try:
            return Rule(s.name, pat, rep, cons, s.priority, s.allow_escape, s.description)
        except RuleError as e:
            raise self.src.error((*self.loc, "pattern"), str(e)) from None


def _hint(err: Mapping[str, Any], data: Any, loc: Loc) -> str:
    """Why an unknown key is unknown: an old spelling, ``bind`` on a value matcher, or a
    typo of a key that is valid there (``; did you mean `capture`?``)."""
    key = err["loc"][-1]
    if key in S.RENAMED:
        return f" (it is `{S.RENAMED[key]}`: YAML uses the Python names)"
    if key == "pattern" and "through" in str(err["loc"]):
        return " (it is `inner`, as in through(ops, inner))"
    if key == "bind" and any(k in VALUE_MATCHERS for k in err["loc"]):
        return " (a value matcher is named by its own `name` argument: {scalar: {name: eps}})"
    parent = loc[:-1] if loc and loc[-1] == key else loc
    return _suggest(str(key), _valid_keys(data, parent))


def _suggest(word: str, valid: Iterable[str]) -> str:
    """``; did you mean `x`?`` for the valid words closest to ``word`` (difflib), then
    what is valid there; empty when nothing is known to be valid."""
    import difflib

    choices = sorted(set(valid))
    if not choices:
        return ""
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    mean = f"; did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
    if close and len(choices) > 12:
        return mean
    return f"{mean} (valid here: {', '.join(choices)})"


def _fields(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _valid_keys(data: Any, parent: Loc) -> list[str]:
    """The keys a mapping at ``parent`` may have: the fields of the spec model it is."""
    here = _at(data, parent)
    if not isinstance(here, dict):
        return []
    if parent == ():
        return _fields(S.SpecFile)
    if len(parent) == 2 and parent[0] == "rules":
        return _fields(S.RuleSpec)
    if len(parent) == 3 and parent[0] == "rules" and parent[2] == "replacement":
        return _fields(S.ReplacePython if "fn" in here else S.ReplaceOp)
    if len(parent) >= 2 and parent[-2] == "also":
        return _fields(S.AlsoSpec)
    up, key = _at(data, parent[:-1]), parent[-1]
    if isinstance(up, dict) and isinstance(key, str):  # the arguments of {key: {...}}
        if "constraints" in parent and key in CONSTRAINTS and len(up) == 1:
            return [p.name for p in CONSTRAINTS[key].parameters]
        if key in VALUE_MATCHERS and S.pattern_tag(up) == key:
            return [p.name for p in VALUE_MATCHERS[key].parameters]
    tag = S.pattern_tag(here)
    if tag in S.STRUCTURE:
        return _fields(S.STRUCTURE[tag])
    if tag in S.VALUE_NODES:
        return [tag]
    return []


def _unknown_tag(data: Any, loc: Loc, valid: Iterable[str], what: str) -> str | None:
    """``{captur: x}`` where a pattern node (or a constraint) goes: the key nearest a
    valid one, named with the suggestion."""
    here = _at(data, loc)
    if not isinstance(here, dict) or not here:
        return None
    valid = list(valid)
    unknown = [k for k in here if k not in valid and k not in ("bind",)]
    if not unknown:
        return None
    key = str(unknown[0])
    return f"{what} `{key}`{_suggest(key, valid)}"


def _at(data: Any, loc: Loc) -> Any:
    for seg in loc:
        try:
            data = data[seg]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _validate(src: _Source, data: Any) -> S.SpecFile:
    if not isinstance(data, dict):
        raise src.error((), f"a spec file must be a mapping with `version` and `rules`, "
                        f"got {type(data).__name__}")
    try:
        return S.SpecFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = _data_loc(data, err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key `{err['loc'][-1]}`" + _hint(err, data, loc)
            loc = (*loc, err["loc"][-1]) if loc and loc[-1] != err["loc"][-1] else loc
        elif err["type"] == "literal_error" and err["loc"][:1] == ("version",):
            msg = f"unsupported spec version {data.get('version')!r}; this fusionkit reads version {S.SPEC_VERSION}"
        elif err["type"] in ("unknown_pattern_node", "unknown_constraint"):
            pattern = err["type"] == "unknown_pattern_node"
            named = _unknown_tag(data, loc, S.PATTERN_KEYS if pattern else S.CONSTRAINT_MODELS,
                                 "not a pattern node: unknown key" if pattern
                                 else "unknown constraint")
            if named is not None:
                msg = named
        elif err["type"] == "missing":
            want = err["loc"][-1]
            msg = f"missing required field `{want}`"
            parent = loc[:-1] if loc and loc[-1] == want else loc
            here = _at(data, parent)
            old = [k for k in here if S.RENAMED.get(k) == want] if isinstance(here, dict) else []
            if old:  # an old spelling of the missing field
                msg = f"unknown key `{old[0]}` (it is `{want}`: YAML uses the Python names)"
                loc = (*parent, old[0])
            elif isinstance(here, dict):  # a typo of the missing field: name the typo
                import difflib

                valid = set(_valid_keys(data, parent))
                typos = [k for k in here if isinstance(k, str) and k not in valid
                         and difflib.get_close_matches(k, [str(want)], n=1, cutoff=0.6)]
                if typos:
                    msg = f"unknown key `{typos[0]}`; did you mean `{want}`?"
                    loc = (*parent, typos[0])
        more = len(e.errors()) - 1
        if more:
            msg += f" (and {more} more problem{'s' if more > 1 else ''})"
        raise src.error(loc, msg) from None


def _compile(src: _Source, text: str, seen: dict[str, str], refs: _Refs) -> list[Rule]:
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
        rules.append(_RuleCompiler(src, loc, rs, refs).rule())
    return rules


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(str(path), None, "", f"cannot read: {e.strerror or e}") from None


def load_spec_text(text: str, file: str = "<spec>", *, trust: bool = False,
                   allow_modules: Iterable[str] = ()) -> list[Rule]:
    """Rules of one spec given as text (``file`` names it in errors).

    Python references are imported only with ``trust=True`` or when their
    module is under one of ``allow_modules``; any other is a :class:`SpecError`.
    """
    refs = _Refs(ImportPolicy.of(trust, allow_modules), refuse=True)
    return _compile(_Source(file, text), text, {}, refs)


def load_specs(paths: Iterable[str | Path], *, trust: bool = False,
               allow_modules: Iterable[str] = (), existing: Mapping[str, str] | None = None
               ) -> list[Rule]:
    """Rules of several spec files, all or nothing; rule names must be unique overall.

    Python references (``custom`` checks, Python replacements) are imported only
    with ``trust=True`` or when their module is under one of ``allow_modules``
    (``"mypkg"`` allows ``mypkg`` and ``mypkg.*``); any other is a
    :class:`SpecError` naming the file, line and field, and nothing is imported.
    """
    refs = _Refs(ImportPolicy.of(trust, allow_modules), refuse=True)
    seen: dict[str, str] = dict(existing or {})
    rules: list[Rule] = []
    for p in paths:
        path = Path(p)
        text = _read(path)
        rules.extend(_compile(_Source(str(path), text), text, seen, refs))
    return rules


def load_spec_file(path: str | Path, *, trust: bool = False,
                   allow_modules: Iterable[str] = ()) -> list[Rule]:
    return load_specs([path], trust=trust, allow_modules=allow_modules)


def validate_specs(paths: Iterable[str | Path], *, trust: bool = False,
                   allow_modules: Iterable[str] = ()) -> list[SpecSummary]:
    """Check spec files completely, importing only the Python references the user allowed.

    Every other reference is checked for form (``package.module:attr``, made of
    identifiers) and reported with ``imported=False``; none is an error here.
    """
    out: list[SpecSummary] = []
    seen: dict[str, str] = {}
    for p in paths:
        path = Path(p)
        text = _read(path)
        refs = _Refs(ImportPolicy.of(trust, allow_modules), refuse=False)
        rules = _compile(_Source(str(path), text), text, seen, refs)
        out.append(SpecSummary(str(path), [r.name for r in rules], refs.found))
    return out
