"""The structural matcher as it was before it was compiled to closures (a generator
search), kept verbatim as an executable specification: ``test_matcher_reference``
checks that the compiled matcher finds the same bindings, in the same order, and
records the same deepest failure, on real graphs and generated patterns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

from fusionkit.match.pattern import (
    CASTS,
    Also,
    Alt,
    Capture,
    Named,
    Op,
    Outputs,
    Pattern,
    Seq,
    Through,
    Value,
    widens,
)
from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import op_key, schema_of

__all__ = ["Binding", "PredicateError", "StructuralFailure", "match_pattern"]

_MISSING = object()


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


@dataclass(frozen=True)
class Binding:
    """One structural solution: captured values and the op nodes it covers."""

    captures: dict[str, Any]
    claimed: tuple[Node, ...]

    def bind(self, name: str, value: Any) -> Binding | None:
        prev = self.captures.get(name, _MISSING)
        if prev is not _MISSING:
            return self if _same_value(prev, value) else None
        caps = dict(self.captures)
        caps[name] = value
        return Binding(caps, self.claimed)

    def claim(self, node: Node) -> Binding:
        if node in self.claimed:
            return self
        return Binding(self.captures, (*self.claimed, node))


@dataclass
class StructuralFailure:
    """The deepest point at which every structural attempt failed.

    ``message`` is formatted on first read: most failures are overwritten by a
    deeper one, or never reported, so formatting each eagerly is wasted work.
    """

    progress: int = -1
    node: Node | None = None
    _message: str | Callable[[], str] = ""
    #: the nodes matched when the search stopped there (what a picture marks)
    claimed: tuple[Node, ...] = ()

    @property
    def message(self) -> str:
        m = self._message
        if not isinstance(m, str):
            m = self._message = m()
        return m


@dataclass
class _Search:
    inputs: ProgramInputs
    failure: StructuralFailure = field(default_factory=StructuralFailure)
    #: > 0 while matching a commutative op's swapped operands: a failure there as
    #: deep as one in the written order does not replace it (the written order
    #: names the operand the author expected: "expected mm, got bmm")
    swapped: int = 0

    def fail(self, b: Binding, node: Node | None, message: str | Callable[[], str]) -> None:
        f = self.failure
        if len(b.claimed) > f.progress or (len(b.claimed) == f.progress and not self.swapped):
            f.progress, f.node, f._message = len(b.claimed), node, message
            f.claimed = b.claimed


def _fmt(v: Any) -> str:
    if isinstance(v, Node):
        return f"`{v.name}`"
    return repr(v)


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


def _constant_scalar(value: Node, inputs: ProgramInputs) -> tuple[Any, torch.dtype] | None:
    """A 0-d constant placeholder, or up to 4 dtype casts of one: its number and dtype."""
    casts: list[Node] = []
    n = value
    while (len(casts) < 4 and n.op == "call_function" and n.args
           and isinstance(n.args[0], Node) and op_key(n.target) in CASTS):
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


def _match_value(p: Value, value: Any, b: Binding, s: _Search, where: str) -> Iterator[Binding]:
    got, dtype = value, None
    if isinstance(value, Node):
        if not (p.tensor_ok or p.in_dtype is not None):
            s.fail(b, value, f"{where}: expected {p.description}, got node `{value.name}`")
            return
        met = _constant_scalar(value, s.inputs)
        if met is None:
            s.fail(b, value, f"{where}: expected {p.description}, got `{value.name}`, "
                   "which is not a 0-d constant tensor")
            return
        got, dtype = met
    try:
        ok = p.in_dtype(got, dtype) if p.in_dtype is not None else bool(p.predicate(got))
    except Exception as e:  # a bug in the rule: the finder declines with step "error"
        raise PredicateError(where, p.description, e) from e
    if not ok:
        note = f" (a {str(dtype).removeprefix('torch.')} constant)" if dtype is not None else ""
        s.fail(b, value if isinstance(value, Node) else None,
               f"{where}: expected {p.description}, got {_fmt(got)}{note}")
        return
    if p.name is None:
        yield b
        return
    nb = b.bind(p.name, got)
    if nb is None:
        s.fail(b, None, f"{where}: `{p.name}` is already bound to a different value")
        return
    yield nb


def _match(p: Pattern, value: Any, b: Binding, s: _Search, where: str) -> Iterator[Binding]:
    # Dispatch the common pattern classes straight to their generator, so each
    # pattern level costs one generator frame, not two (matching is per node).
    t = type(p)
    if t is Op:
        return _match_op(p, value, b, s, where)  # type: ignore[arg-type]
    if t is Through:
        return _match_through(p, value, b, s, where, 0)  # type: ignore[arg-type]
    return _match_any(p, value, b, s, where)


def _match_any(p: Pattern, value: Any, b: Binding, s: _Search, where: str) -> Iterator[Binding]:
    if isinstance(p, Capture):
        nb = b.bind(p.name, value)
        if nb is None:
            s.fail(b, value if isinstance(value, Node) else None,
                   f"{where}: capture `{p.name}` must be the same value at each use, "
                   f"got {_fmt(value)} and {_fmt(b.captures[p.name])}")
            return
        yield nb
    elif isinstance(p, Value):
        yield from _match_value(p, value, b, s, where)
    elif isinstance(p, Op):
        yield from _match_op(p, value, b, s, where)
    elif isinstance(p, Alt):
        for option in p.options:
            yield from _match(option, value, b, s, where)
    elif isinstance(p, Named):
        for nb in _match(p.inner, value, b, s, where):
            bound = nb.bind(p.name, value)
            if bound is not None:
                yield bound
            else:
                s.fail(nb, value if isinstance(value, Node) else None,
                       f"{where}: `{p.name}` must be the same value at each use")
    elif isinstance(p, Through):
        yield from _match_through(p, value, b, s, where, 0)
    elif isinstance(p, Seq):
        yield from _match_seq(p, value, b, s, where)
    elif isinstance(p, Outputs):
        for nb in _match(p.primary, value, b, s, where):
            yield from _match_also(p.others, 0, nb, s)
    else:  # pragma: no cover - closed set of pattern classes
        raise TypeError(f"unknown pattern node {p!r}")


def _match_seq(p: Seq, value: Any, b: Binding, s: _Search, where: str) -> Iterator[Binding]:
    if not isinstance(value, (list, tuple)) or len(value) != len(p.items):
        s.fail(b, value if isinstance(value, Node) else None,
               f"{where}: expected a list of {len(p.items)} values, got {_fmt(value)}")
        return
    yield from _match_items(p.items, value, 0, b, s, where)


def _match_items(items: tuple[Pattern, ...], values: Any, i: int, b: Binding, s: _Search,
                 where: str) -> Iterator[Binding]:
    if i == len(items):
        yield b
        return
    for nb in _match(items[i], values[i], b, s, f"{where}[{i}]"):
        yield from _match_items(items, values, i + 1, nb, s, where)


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


def _match_also(others: tuple[Also, ...], i: int, b: Binding, s: _Search) -> Iterator[Binding]:
    if i == len(others):
        yield b
        return
    o = others[i]
    near = b.captures.get(o.near)
    if not isinstance(near, Node):
        s.fail(b, None, f"output `{o.name}`: `{o.near}` is not bound to a node")
        return
    keys = o.pattern.root_keys()
    found = False
    for cand in _downstream(near, o.max_depth):
        if cand in b.claimed or cand.op != "call_function":
            continue
        if keys is not None and op_key(cand.target) not in keys:
            continue
        for nb in _match(o.pattern, cand, b, s, f"output `{o.name}` at `{cand.name}`"):
            bound = nb.bind(o.name, cand)
            if bound is not None:
                found = True
                yield from _match_also(others, i + 1, bound, s)
    if not found:
        s.fail(b, near, f"output `{o.name}`: no node downstream of `{near.name}` matches "
               f"{o.pattern!r}")


def _dtype_of(v: Any) -> Any:
    val = v.meta.get("val") if isinstance(v, Node) else None
    return getattr(val, "dtype", None)


def _match_through(p: Through, value: Any, b: Binding, s: _Search, where: str,
                   depth: int) -> Iterator[Binding]:
    if (
        depth < p.max_depth
        and isinstance(value, Node)
        and value.op == "call_function"
        and op_key(value.target) in p.ops
        and value.args
    ):
        src, dst = _dtype_of(value.args[0]), _dtype_of(value)
        if p.narrowing or (src is not None and dst is not None and widens(src, dst)):
            yield from _match_through(p, value.args[0], b.claim(value), s,
                                      f"{where} through `{value.name}`", depth + 1)
        else:
            s.fail(b, value, lambda: f"{where}: `{value.name}` converts {src} to {dst}, which "
                   "can change values, so it is not passed through (narrowing=True would)")
    yield from _match(p.inner, value, b, s, where)


def _match_op(p: Op, value: Any, b: Binding, s: _Search, where: str) -> Iterator[Binding]:
    if not isinstance(value, Node) or value.op != "call_function":
        s.fail(b, value if isinstance(value, Node) else None,
               lambda: f"{where}: expected a call of {' or '.join(sorted(p.targets))}, "
               f"got {_fmt(value)}" + (f" ({value.op})" if isinstance(value, Node) else ""))
        return
    key = op_key(value.target)
    if key not in p.targets:
        s.fail(b, value, lambda: f"{where}: expected {' or '.join(sorted(p.targets))}, "
               f"got `{value.name}` ({key or value.target})")
        return
    here = f"`{value.name}` ({key})"
    b = b.claim(value)

    if p.strict_defaults and not _defaults_hold(p, value, b, s, here):
        return

    positional = [_arg_value(value, i, None) for i in range(len(p.args))]
    named = {k: _arg_value(value, None, k) for k in p.kwargs}
    for i, v in enumerate(positional):
        if v is _MISSING:
            s.fail(b, value, f"{here}: has no argument {i}")
            return
    for k, v in named.items():
        if v is _MISSING:
            s.fail(b, value, f"{here}: has no argument `{k}`")
            return

    orders: list[list[int]] = [list(range(len(p.args)))]
    if p.commutative and len(p.args) >= 2 and positional[0] is not positional[1]:
        swapped = list(range(len(p.args)))
        swapped[0], swapped[1] = 1, 0
        orders.append(swapped)

    items_kw = list(p.kwargs.items())
    yield from _match_args(p, value, positional, orders[0], 0, named, items_kw, b, s, here)
    if len(orders) > 1:
        s.swapped += 1
        try:
            yield from _match_args(p, value, positional, orders[1], 0, named, items_kw, b, s, here)
        finally:
            s.swapped -= 1


def _match_args(p: Op, node: Node, positional: list[Any], order: list[int], i: int,
                named: dict[str, Any], items_kw: list[tuple[str, Pattern]], b: Binding,
                s: _Search, here: str) -> Iterator[Binding]:
    if i < len(p.args):
        v = positional[order[i]]
        for nb in _match(p.args[i], v, b, s, f"argument {order[i]} of {here}"):
            yield from _match_args(p, node, positional, order, i + 1, named, items_kw, nb, s, here)
        return
    j = i - len(p.args)
    if j < len(items_kw):
        k, sub = items_kw[j]
        for nb in _match(sub, named[k], b, s, f"argument `{k}` of {here}"):
            yield from _match_args(p, node, positional, order, i + 1, named, items_kw, nb, s, here)
        return
    yield b


def _defaults_hold(p: Op, node: Node, b: Binding, s: _Search, here: str) -> bool:
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
            s.fail(b, node, f"{here}: argument `{arg.name}` is {_fmt(v)}, "
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


def match_pattern(pattern: Pattern, root: Node, inputs: ProgramInputs
                  ) -> tuple[Iterator[Binding], StructuralFailure]:
    """All structural bindings of ``pattern`` rooted at ``root``.

    The failure record is filled in as the iterator is consumed.
    """
    s = _Search(inputs)
    return _match(pattern, root, Binding({}, ()), s, "root"), s.failure
