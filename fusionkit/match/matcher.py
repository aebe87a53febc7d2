"""Structural matching of one pattern at one graph value.

A depth-first search over every way the pattern can bind (alternatives,
commutative operand orders and pass-through depths are the choice points), so
that constraint checking can move on to the next binding when one fails. The
search records its deepest failure, which becomes the "structural step that
failed" of a near-miss decline.

Why compiled closures in continuation-passing style: matching runs at every
node whose op a rule's root names, so its cost is per graph node. A pattern is
compiled once into nested closures; each solution is handed to a continuation
(the rest of the pattern, finally the caller's ``accept``) instead of being
yielded up a chain of generators, and the text saying where a failure happened
is built only if that failure is the one reported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from fusionkit.match.memo import PerObject
from fusionkit.match.pattern import (
    CASTS,
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
    widens,
)
from fusionkit.program_inputs import ProgramInputs
from fusionkit.result import MatchResult, Step
from fusionkit.targets import OP_KEY_MEMO, op_key, schema_of

__all__ = ["Binding", "CompiledPattern", "PredicateError", "Search", "compile_pattern",
           "match_pattern"]

_MISSING = object()
_CAST_KEYS = frozenset(CASTS)


class PredicateError(Exception):
    """A value matcher's predicate raised: a bug in the rule, not a non-match.

    Carries the original exception (``error``) and where it was raised, so the
    finder can decline with step ``error`` (or re-raise it in strict mode).
    """

    def __init__(self, where: str, description: str, error: Exception) -> None:
        super().__init__(f"{where}: value matcher {description!r} raised "
                         f"{type(error).__name__}: {error}")
        self.where = f"value matcher {description!r} ({where})"
        self.error = error


def _same_value(a: Any, b: Any) -> bool:
    """Identity for nodes; equality (never raising) for literals."""
    if isinstance(a, Node) or isinstance(b, Node):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b) and (isinstance(a, bool) or isinstance(b, bool)):
        return False
    try:
        return bool(a == b)
    except Exception:  # a value without a truth value for ==: only itself
        return a is b


@dataclass(slots=True)
class Binding:
    """One structural solution: captured values and the op nodes it covers.

    Treated as immutable (``bind``/``claim`` return new bindings); not a frozen
    dataclass only because frozen construction costs several times more, and
    the search builds one per op and capture it matches.
    """

    captures: dict[str, Any]
    claimed: tuple[Node, ...]

    def bind(self, name: str, value: Any) -> Binding | None:
        prev = self.captures.get(name, _MISSING)
        if prev is not _MISSING:
            return self if _same_value(prev, value) else None
        caps = self.captures.copy()
        caps[name] = value
        return Binding(caps, self.claimed)

    def claim(self, node: Node) -> Binding:
        if node in self.claimed:
            return self
        return Binding(self.captures, (*self.claimed, node))


class Search:
    """One search's state, and the deepest point at which its attempts failed.

    That deepest failure is the near miss a finder reports: :meth:`result` gives it as
    the one reasoned result type (:class:`~fusionkit.result.MatchResult`, status
    ``declined``, step ``structure``). It is kept as plain fields until then, and its
    text is formatted on first read: the search records a failure at every choice
    point, most are overwritten by a deeper one, and most searches report none.
    """

    __slots__ = ("_args", "_message", "claimed", "inputs", "node", "progress", "root",
                 "swapped", "taken")

    def __init__(self, inputs: ProgramInputs, root: Node,
                 taken: Container[Node] = ()) -> None:
        self.inputs = inputs
        self.root = root
        #: nodes other (accepted) matches own: never a further output's root. A value
        #: shared by many matches (RoPE's tables, used by every layer) would otherwise
        #: offer every earlier layer's outputs first and exhaust the binding budget.
        self.taken = taken
        #: how many op nodes the deepest failed attempt had matched (-1: no failure recorded)
        self.progress = -1
        #: the node at fault there (None when the failure names none)
        self.node: Node | None = None
        self._message: str | Callable[..., str] = ""
        self._args: tuple[Any, ...] = ()
        #: the nodes matched when the search stopped there (what a picture marks)
        self.claimed: tuple[Node, ...] = ()
        #: > 0 while matching a commutative op's swapped operands: a failure there as
        #: deep as one in the written order does not replace it (the written order
        #: names the operand the author expected: "expected mm, got bmm")
        self.swapped = 0

    def fail(self, b: Binding, node: Node | None, message: str | Callable[..., str],
             *args: Any) -> None:
        """Record a failure if it is the deepest so far; ``message(*args)`` is formatted
        only when read (most failures are overwritten or never reported)."""
        if len(b.claimed) > self.progress or (len(b.claimed) == self.progress
                                              and not self.swapped):
            self.progress, self.node, self._message, self._args = (len(b.claimed), node,
                                                                   message, args)
            self.claimed = b.claimed

    @property
    def message(self) -> str:
        """The sentence saying where and why the deepest attempt failed."""
        m = self._message
        if not isinstance(m, str):
            m = self._message = m(*self._args)
            self._args = ()
        return m

    def result(self, rule: str) -> MatchResult | None:
        """The deepest failure as rule ``rule``'s result at the search's root (None when
        no attempt failed: every binding was handed on)."""
        if self.progress < 0:
            return None
        return MatchResult.fail(rule, self.root, Step.STRUCTURE, self.message, self.node,
                                self.claimed)


def _fmt(v: Any) -> str:
    if isinstance(v, Node):
        return f"`{v.name}`"
    return repr(v)


# Where in the pattern a value is matched, kept unformatted until a failure that
# mentions it is reported: "root", or one of these tuples.
_ARG, _KWARG, _THROUGH, _ITEM = 0, 1, 2, 3
Where = str | tuple[Any, ...]


def _where(w: Where) -> str:
    """The text of a position: "argument 1 of `mul_3` (aten.mul.Tensor) through `cast`"."""
    if isinstance(w, str):
        return w
    kind = w[0]
    if kind == _ARG:
        return f"argument {w[1]} of `{w[2].name}` ({w[3]})"
    if kind == _KWARG:
        return f"argument `{w[1]}` of `{w[2].name}` ({w[3]})"
    if kind == _THROUGH:
        return f"{_where(w[1])} through `{w[2].name}`"
    return f"{_where(w[1])}[{w[2]}]"


def _here(node: Node, key: str | None) -> str:
    return f"`{node.name}` ({key})"


def _arg_value(node: Node, index: int | None, name: str | None) -> Any:
    """An argument by position or schema name, falling back to its default."""
    if index is not None and index < len(node.args):  # the common case: no schema needed
        return node.args[index]
    schema = schema_of(node.target)
    if index is None and schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.name == name:
                index = i
                break
    if index is not None and index < len(node.args):
        return node.args[index]
    if schema is not None and index is not None and index < len(schema.arguments):
        arg = schema.arguments[index]
        if arg.name in node.kwargs:
            return node.kwargs[arg.name]
        if arg.has_default_value():
            return arg.default_value
    if name is not None and name in node.kwargs:
        return node.kwargs[name]
    return _MISSING


#: the continuation a solution is handed to: None to go on searching, anything
#: else stops the search and becomes its result
Accept = Callable[[Binding], Any]
#: a compiled pattern level: (value, binding so far, search, where, continuation)
_M = Callable[[Any, Binding, "Search", Where, Accept], Any]


class _Compiler(PatternVisitor[_M]):
    """Each pattern node kind compiled into its matching closure, through the node's own
    :meth:`~fusionkit.match.pattern.Pattern.accept` (a subclass of a node kind compiles as
    that kind). Runs once per pattern; the closures it returns are the hot path."""

    def generic(self, p: Pattern) -> _M:
        raise TypeError(f"unknown pattern node {p!r}")

    def visit_capture(self, p: Capture) -> _M:
        return _compile_capture(p)

    def visit_value(self, p: Value) -> _M:
        return _compile_value(p)

    def visit_named(self, p: Named) -> _M:
        return _compile_named(p)

    def visit_alt(self, p: Alt) -> _M:
        return _compile_alt(p)

    def visit_through(self, p: Through) -> _M:
        return _compile_through(p)

    def visit_seq(self, p: Seq) -> _M:
        return _compile_seq(p)

    def visit_outputs(self, p: Outputs) -> _M:
        return _compile_outputs(p)

    def visit_op(self, p: Op) -> _M:
        return _compile_op(p)


_COMPILER = _Compiler()


def _compile(p: Pattern) -> _M:
    return p.accept(_COMPILER)


def _capture_mismatch(where: Where, name: str, value: Any, prev: Any) -> str:
    return (f"{_where(where)}: capture `{name}` must be the same value at each use, "
            f"got {_fmt(value)} and {_fmt(prev)}")


def _compile_capture(p: Capture) -> _M:
    name = p.name

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept) -> Any:
        caps = b.captures  # Binding.bind, inlined: this runs for every capture of every search
        prev = caps.get(name, _MISSING)
        if prev is _MISSING:
            caps = caps.copy()
            caps[name] = value
            return k(Binding(caps, b.claimed))
        if prev is value or _same_value(prev, value):
            return k(b)
        s.fail(b, value if isinstance(value, Node) else None, _capture_mismatch, where, name,
               value, prev)
        return None
    return m


#: the most dtype casts looked through to the 0-d constant a literal stands for
_MAX_CONSTANT_CASTS = 4


def _constant_scalar(value: Node, inputs: ProgramInputs) -> tuple[Any, torch.dtype] | None:
    """The number a node stands for, and its dtype, when it is a 0-d constant tensor
    or dtype casts of one (``to_edge`` lifts ``x * 0.5`` into a float32 constant and,
    in an fp16/bf16 program, casts it to the activations' dtype); else None."""
    casts: list[Node] = []
    n = value
    while (len(casts) < _MAX_CONSTANT_CASTS and n.op == "call_function" and n.args
           and isinstance(n.args[0], Node) and op_key(n.target) in _CAST_KEYS):
        casts.append(n)
        n = n.args[0]
    ref = inputs.constant(n)
    if ref is None or ref.tensor.dim() != 0:
        return None
    t = ref.tensor
    for c in reversed(casts):
        dtype = _dtype_of(c)
        if not isinstance(dtype, torch.dtype):
            return None
        t = t.to(dtype)
    return t.item(), t.dtype


def _constant_note(dtype: torch.dtype | None) -> str:
    return f" (a {str(dtype).removeprefix('torch.')} constant)" if dtype is not None else ""


def _compile_value(p: Value) -> _M:
    constants_ok = p.constants_ok

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept) -> Any:
        got, dtype = value, None
        if isinstance(value, Node):
            if not constants_ok:
                s.fail(b, value, lambda: f"{_where(where)}: expected {p.description}, got node "
                       f"`{value.name}`")
                return None
            met = _constant_scalar(value, s.inputs)
            if met is None:
                s.fail(b, value, lambda: f"{_where(where)}: expected {p.description}, got "
                       f"`{value.name}`, which is not a 0-d constant tensor")
                return None
            got, dtype = met
        try:
            ok = p.accepts(got, dtype)
        except Exception as e:  # a bug in the rule: the finder declines with step "error"
            raise PredicateError(_where(where), p.description, e) from e
        if not ok:
            s.fail(b, value if isinstance(value, Node) else None,
                   lambda: f"{_where(where)}: expected {p.description}, got {_fmt(got)}"
                   f"{_constant_note(dtype)}")
            return None
        if p.name is None:
            return k(b)
        nb = b.bind(p.name, got)
        if nb is None:
            s.fail(b, None, lambda: f"{_where(where)}: `{p.name}` is already bound to a "
                   "different value")
            return None
        return k(nb)
    return m


def _compile_alt(p: Alt) -> _M:
    options = tuple(_compile(o) for o in p.options)

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept) -> Any:
        for option in options:
            r = option(value, b, s, where, k)
            if r is not None:
                return r
        return None
    return m


def _compile_named(p: Named) -> _M:
    inner, name = _compile(p.inner), p.name

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept) -> Any:
        def bind(nb: Binding) -> Any:
            bound = nb.bind(name, value)
            if bound is None:
                s.fail(nb, value if isinstance(value, Node) else None,
                       lambda: f"{_where(where)}: `{name}` must be the same value at each use")
                return None
            return k(bound)
        return inner(value, b, s, where, bind)
    return m


def _compile_seq(p: Seq) -> _M:
    items = tuple(_compile(i) for i in p.items)
    count = len(items)

    # defined once per pattern, its state passed along: a closure made per call that called
    # itself would be a cycle (function -> its cell -> function) holding the search, its
    # ProgramInputs and the program until the cyclic collector ran
    def item(i: int, nb: Binding, value: Any, s: Search, where: Where, k: Accept) -> Any:
        if i == count:
            return k(nb)
        return items[i](value[i], nb, s, (_ITEM, where, i),
                        lambda nb2: item(i + 1, nb2, value, s, where, k))

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != count:
            s.fail(b, value if isinstance(value, Node) else None,
                   lambda: f"{_where(where)}: expected a list of {count} values, got {_fmt(value)}")
            return None
        return item(0, b, value, s, where, k)
    return m


def _downstream(start: Node, depth: int) -> list[Node]:
    """Nodes reachable from ``start`` through users in at most ``depth`` steps, in graph order."""
    seen: dict[Node, None] = {}
    frontier = [start]
    for _ in range(depth):
        nxt: list[Node] = []
        for n in frontier:
            for u in n.users:
                if u not in seen:
                    seen[u] = None
                    nxt.append(u)
        frontier = nxt
    return list(seen)


def _compile_outputs(p: Outputs) -> _M:
    primary = _compile(p.primary)
    others = tuple((o, o.pattern.root_keys(), _compile(o.pattern)) for o in p.others)

    def also(i: int, b: Binding, s: Search, k: Accept) -> Any:
        if i == len(others):
            return k(b)
        o, keys, pat = others[i]
        near = b.captures.get(o.near)
        if not isinstance(near, Node):
            s.fail(b, None, f"output `{o.name}`: `{o.near}` is not bound to a node")
            return None
        found = False
        for cand in _downstream(near, o.max_depth):
            if cand in b.claimed or cand.op != "call_function" or cand in s.taken:
                continue
            if keys is not None and op_key(cand.target) not in keys:
                continue

            def bind(nb: Binding, cand: Node = cand) -> Any:
                nonlocal found
                bound = nb.bind(o.name, cand)
                if bound is None:
                    return None
                found = True
                return also(i + 1, bound, s, k)
            r = pat(cand, b, s, f"output `{o.name}` at `{cand.name}`", bind)
            if r is not None:
                return r
        if not found:
            s.fail(b, near, lambda: f"output `{o.name}`: no node downstream of `{near.name}` "
                   f"matches {o.pattern!r}")
        return None

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept) -> Any:
        return primary(value, b, s, where, lambda nb: also(0, nb, s, k))
    return m


def _dtype_of(v: Any) -> Any:
    val = v.meta.get("val") if isinstance(v, Node) else None
    return getattr(val, "dtype", None)


def _not_passed_through(where: Where, value: Node, src: Any, dst: Any) -> str:
    return (f"{_where(where)}: `{value.name}` converts {src} to {dst}, which "
            "can change values, so it is not passed through (narrowing=True would)")


def _compile_through(p: Through) -> _M:
    inner, ops, max_depth, narrowing = _compile(p.inner), p.ops, p.max_depth, p.narrowing

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept, depth: int = 0) -> Any:
        if depth < max_depth and isinstance(value, Node) and value.op == "call_function":
            try:
                key = OP_KEY_MEMO[value.target]
            except (KeyError, TypeError):
                key = op_key(value.target)
        else:
            key = None
        if key in ops and value.args:
            src, dst = _dtype_of(value.args[0]), _dtype_of(value)
            if narrowing or (src is not None and dst is not None and widens(src, dst)):
                r = m(value.args[0], b.claim(value), s, (_THROUGH, where, value), k, depth + 1)
                if r is not None:
                    return r
            else:
                s.fail(b, value, _not_passed_through, where, value, src, dst)
        return inner(value, b, s, where, k)
    return m


def _expected_call(where: Where, targets: frozenset[str], value: Any) -> str:
    return (f"{_where(where)}: expected a call of {' or '.join(sorted(targets))}, "
            f"got {_fmt(value)}" + (f" ({value.op})" if isinstance(value, Node) else ""))


def _expected_op(where: Where, targets: frozenset[str], value: Node, key: str | None) -> str:
    return (f"{_where(where)}: expected {' or '.join(sorted(targets))}, "
            f"got `{value.name}` ({key or value.target})")


def _no_argument(node: Node, key: str | None, which: str) -> str:
    return f"{_here(node, key)}: has no argument {which}"


def _compile_op(p: Op) -> _M:
    targets, strict_defaults = p.targets, p.strict_defaults
    arg_ms = tuple(_compile(a) for a in p.args)
    nargs = len(arg_ms)
    kw_ms = tuple((k, _compile(sub)) for k, sub in p.kwargs.items())
    commutative = p.commutative and nargs >= 2
    written = tuple(range(nargs))
    swapped = (1, 0, *range(2, nargs)) if commutative else written

    def chain(node: Node, key: str | None, vals: Any, named: dict[str, Any] | None,
              order: tuple[int, ...], i: int, b: Binding, s: Search, k: Accept) -> Any:
        if i < nargs:
            j = order[i]
            return arg_ms[i](vals[j], b, s, (_ARG, j, node, key),
                             lambda nb: chain(node, key, vals, named, order, i + 1, nb, s, k))
        kj = i - nargs
        if kj < len(kw_ms):
            name, sub = kw_ms[kj]
            assert named is not None
            return sub(named[name], b, s, (_KWARG, name, node, key),
                       lambda nb: chain(node, key, vals, named, order, i + 1, nb, s, k))
        return k(b)

    def args_in(node: Node, key: str | None, vals: Any, named: dict[str, Any] | None,
                order: tuple[int, ...], b: Binding, s: Search, k: Accept) -> Any:
        # the common shapes without a continuation per argument level
        if not kw_ms:
            if nargs == 1:
                return arg_ms[0](vals[0], b, s, (_ARG, 0, node, key), k)
            if nargs == 2:
                i0, i1 = order[0], order[1]
                m1, v1, w1 = arg_ms[1], vals[i1], (_ARG, i1, node, key)
                return arg_ms[0](vals[i0], b, s, (_ARG, i0, node, key),
                                 lambda nb: m1(v1, nb, s, w1, k))
            if nargs == 0:
                return k(b)
        return chain(node, key, vals, named, order, 0, b, s, k)

    def m(value: Any, b: Binding, s: Search, where: Where, k: Accept) -> Any:
        if not isinstance(value, Node) or value.op != "call_function":
            s.fail(b, value if isinstance(value, Node) else None, _expected_call, where, targets,
                   value)
            return None
        try:
            key = OP_KEY_MEMO[value.target]
        except (KeyError, TypeError):
            key = op_key(value.target)
        if key not in targets:
            s.fail(b, value, _expected_op, where, targets, value, key)
            return None
        claimed = b.claimed
        if value not in claimed:
            b = Binding(b.captures, (*claimed, value))
        vals: Any = value.args
        if strict_defaults and (value.kwargs or len(vals) > nargs) and not _defaults_hold(
                p, value, b, s, key):
            return None
        if len(vals) < nargs:
            vals = [_arg_value(value, i, None) for i in range(nargs)]
            for i, v in enumerate(vals):
                if v is _MISSING:
                    s.fail(b, value, _no_argument, value, key, str(i))
                    return None
        named: dict[str, Any] | None = None
        if kw_ms:
            named = {name: _arg_value(value, None, name) for name, _ in kw_ms}
            for name, v in named.items():
                if v is _MISSING:
                    s.fail(b, value, _no_argument, value, key, f"`{name}`")
                    return None
        if nargs == 2 and not kw_ms:  # args_in, inlined for the most common shape
            m1, v1 = arg_ms[1], vals[1]
            w1 = (_ARG, 1, value, key)
            r = arg_ms[0](vals[0], b, s, (_ARG, 0, value, key), lambda nb: m1(v1, nb, s, w1, k))
        else:
            r = args_in(value, key, vals, named, written, b, s, k)
        if r is not None or not commutative or vals[0] is vals[1]:
            return r
        s.swapped += 1
        try:
            return args_in(value, key, vals, named, swapped, b, s, k)
        finally:
            s.swapped -= 1
    return m


def _defaults_hold(p: Op, node: Node, b: Binding, s: Search, key: str | None) -> bool:
    """Arguments the pattern leaves out must be at their schema default."""
    if not node.kwargs and len(node.args) <= len(p.args):
        return True  # every argument the graph passes is one the pattern matches
    schema = schema_of(node.target)
    if schema is None:
        return True
    for i, arg in enumerate(schema.arguments):
        if i < len(p.args) or arg.name in p.kwargs or not arg.has_default_value():
            continue
        if i < len(node.args):
            v = node.args[i]
        elif arg.name in node.kwargs:
            v = node.kwargs[arg.name]
        else:
            continue
        default = arg.default_value
        if isinstance(v, Node) or not _equal_literal(v, default):
            s.fail(b, node, f"{_here(node, key)}: argument `{arg.name}` is {_fmt(v)}, "
                   f"the pattern requires its default {default!r}")
            return False
    return True


def _equal_literal(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal_literal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.dtype) or isinstance(b, torch.dtype):
        return a is b
    try:
        return bool(a == b)
    except Exception:
        return False


class CompiledPattern:
    """A pattern compiled once for repeated searches (a rule's, held by the finder's index)."""

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        # A continuation is called inside the match that produced it, so the stack
        # grows with the nodes matched so far, a few frames each: a large pattern
        # gets the headroom it needs (pure Python calls: no C stack in 3.11+).
        size = _pattern_size(pattern)
        self._frames = _FRAMES_PER_NODE * size if size > _SMALL_PATTERN else 0
        with _headroom(self._frames):
            self._m = _compile(pattern)

    def search(self, root: Node, inputs: ProgramInputs, accept: Accept,
               taken: Container[Node] = ()) -> tuple[Any, Search]:
        """Hand each binding rooted at ``root`` to ``accept``, in search order, until it
        returns something other than None; that (or None) and the search, which holds
        its deepest failure (:meth:`Search.result`). ``taken``: nodes earlier accepted
        matches own, skipped as the root of a further output."""
        s = Search(inputs, root, taken)
        if not self._frames:
            return self._m(root, Binding({}, ()), s, "root", accept), s
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + self._frames)
        try:
            return self._m(root, Binding({}, ()), s, "root", accept), s
        finally:
            sys.setrecursionlimit(limit)


@contextmanager
def _headroom(frames: int) -> Iterator[None]:
    """The recursion limit raised by ``frames`` for the block (nothing for 0)."""
    if not frames:
        yield
        return
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


#: patterns of up to this many nodes search within the caller's recursion limit
#: (a full match measured about one frame per pattern node; 4x that is reserved)
_SMALL_PATTERN = 50
_FRAMES_PER_NODE = 4


def _pattern_size(p: Pattern) -> int:
    """How many pattern nodes ``p`` has, subpatterns included (iterative: any depth)."""
    size, todo = 0, [p]
    while todo:
        q = todo.pop()
        size += 1
        todo.extend(q.children())
    return size


_COMPILED: PerObject[CompiledPattern] = PerObject(CompiledPattern)


def compile_pattern(pattern: Pattern) -> CompiledPattern:
    """``pattern`` compiled, remembered for the last few hundred patterns (by identity)."""
    return _COMPILED(pattern)


def match_pattern(pattern: Pattern, root: Node, inputs: ProgramInputs, limit: int | None = None
                  ) -> tuple[Iterator[Binding], Search]:
    """The structural bindings of ``pattern`` rooted at ``root`` (at most ``limit``), in
    search order, and the search that found them (its deepest failure: :meth:`Search.result`).

    Every binding is found before this returns; a caller that stops at the
    first acceptable one should use :meth:`CompiledPattern.search`.
    """
    found: list[Binding] = []

    def collect(b: Binding) -> Any:
        found.append(b)
        return True if limit is not None and len(found) >= limit else None
    _, failure = compile_pattern(pattern).search(root, inputs, collect)
    return iter(found), failure

