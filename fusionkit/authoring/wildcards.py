"""Wildcards: which literals of a traced example stand for a value the rule leaves open.

Traced literals stay exact unless the author names a wildcard. A wildcard is an
input or module attribute (``"eps"``) whose value becomes a capture, or an
``"op.arg"`` selector (``"view_copy.size"``) whose literals match anything. An
input's literals are found by tracing again: a float at a sentinel value no
other literal equals, an int (which may shape the graph) once more at another
value, keeping exactly the literals that changed. Inductor guessed instead and
turned every int literal into a wildcard (pytorch#195320).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.fx import Node

from fusionkit.authoring.example_trace import (
    ExampleError,
    ExampleTrace,
    TraceDialect,
    calls,
    get_attr_path,
    has_attr,
    set_attr_path,
    trace,
)
from fusionkit.match.pattern import Value, any_float, any_value, integer
from fusionkit.targets import op_key, schema_of

__all__ = ["Position", "is_selector", "selector_matches", "trace_with_wildcards",
           "wildcard_names", "wildcard_value"]

#: a position of a literal in a traced graph: (call index, argument key, path in a list)
Position = tuple[int, Any, tuple[Any, ...]]


def _literal_view(a: Any, tr: ExampleTrace) -> Any:
    """A node argument as a comparable literal (a lifted 0-d constant as its value)."""
    if isinstance(a, Node):
        t = tr.lifted.get(a.name)
        if t is not None and t.dim() == 0:
            return ("const", t.item())
        return ("node", a.name)
    if isinstance(a, (list, tuple)):
        return tuple(_literal_view(x, tr) for x in a)
    return a


def _arg_paths(a: Any, path: tuple[Any, ...]) -> Iterable[tuple[tuple[Any, ...], Any]]:
    yield path, a
    if isinstance(a, (list, tuple)):
        for i, x in enumerate(a):
            yield from _arg_paths(x, (*path, i))


def _changed_positions(a: ExampleTrace, b: ExampleTrace) -> set[Position] | None:
    """Literal positions that differ between two traces of one code, None if the structure differs."""
    ca, cb = calls(a.ep), calls(b.ep)
    if len(ca) != len(cb):
        return None
    out: set[Position] = set()
    for i, (na, nb) in enumerate(zip(ca, cb, strict=True)):
        if op_key(na.target) != op_key(nb.target) or len(na.args) != len(nb.args):
            return None
        if set(na.kwargs) != set(nb.kwargs):
            return None
        keyed = [*enumerate(zip(na.args, nb.args, strict=True)),
                 *((k, (na.kwargs[k], nb.kwargs[k])) for k in na.kwargs)]
        for key, (x, y) in keyed:
            vx, vy = _literal_view(x, a), _literal_view(y, b)
            if vx == vy:
                continue
            px, py = dict(_arg_paths(vx, ())), dict(_arg_paths(vy, ()))
            if px.keys() != py.keys():
                return None
            for p, v in px.items():
                w = py[p]
                if isinstance(v, tuple) and not (len(v) == 2 and v[0] == "const"):
                    continue  # a list: its elements are compared one by one
                if v != w:
                    if isinstance(v, tuple) and v[0] == "node":
                        return None
                    out.add((i, key, p))
    return out


def _sentinel(v: float) -> float:
    """A float near ``v`` (same sign and size, so the code takes the same path) that no
    other literal of the trace will equal."""
    return v * (1 + 1.2345678e-3) + (1.2345678e-9 if v >= 0 else -1.2345678e-9)


def _same_float(a: Any, b: float) -> bool:
    return (isinstance(a, float) and math.isfinite(a)
            and abs(a - b) <= 1e-6 * max(abs(a), abs(b)))


def _positions_equal_to(tr: ExampleTrace, value: float) -> set[Position]:
    out: set[Position] = set()
    for i, n in enumerate(calls(tr.ep)):
        keyed = [*enumerate(n.args), *n.kwargs.items()]
        for key, a in keyed:
            for p, v in _arg_paths(_literal_view(a, tr), ()):
                if isinstance(v, tuple) and len(v) == 2 and v[0] == "const":
                    v = v[1]
                if _same_float(v, value):
                    out.add((i, key, p))
    return out


def _with_value(fn: Callable[..., Any], values: Mapping[str, Any], name: str, v: Any
                ) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The example with input or module attribute ``name`` set to ``v``."""
    if name in values:
        return fn, {**values, name: v}
    m = copy.deepcopy(fn)
    set_attr_path(m, name, v)  # type: ignore[arg-type]
    return m, dict(values)


def _example_value(fn: Callable[..., Any], values: Mapping[str, Any], name: str) -> Any:
    if name in values:
        v = values[name]
        if isinstance(v, torch.Tensor):
            raise ExampleError(f"wildcard {name!r} is a tensor input; it is a capture already")
        return v
    if isinstance(fn, nn.Module) and has_attr(fn, name):
        return get_attr_path(fn, name)
    raise ExampleError(f"wildcard {name!r} is neither an input of the example nor an attribute "
                       f"of it (inputs: {sorted(values)})")


def _wildcard_positions(fn: Callable[..., Any], values: Mapping[str, Any], name: str,
                        dialect: TraceDialect, base: ExampleTrace | None = None
                        ) -> tuple[ExampleTrace, set[Position], Any]:
    """Where the value of input or attribute ``name`` lands in the traced graph.

    A float is traced once with a sentinel value near the example and found
    by that value. An int (it may shape the graph) is traced with its example
    value and once more with another value: the literals that changed are its.
    """
    v = _example_value(fn, values, name)
    if isinstance(v, float):
        s = _sentinel(v)
        tr = trace(*_with_value(fn, values, name, s), dialect)
        positions = _positions_equal_to(tr, s)
        if not positions:
            raise ExampleError(f"wildcard {name!r}: its value appears nowhere in the traced graph")
        return tr, positions, v
    if not isinstance(v, int) or isinstance(v, bool):
        raise ExampleError(f"a wildcard needs an int or float example value; {name!r} is {v!r}")
    base = base if base is not None else trace(fn, values, dialect)
    for w in (v + 1, v - 1, 2 * v + 3):
        try:
            other = trace(*_with_value(fn, values, name, w), dialect)
        except ExampleError:
            continue
        changed = _changed_positions(base, other)
        if changed is None:
            raise ExampleError(f"changing {name!r} changes the traced graph's structure, not "
                               "only a literal: it cannot be a wildcard")
        if changed:
            return base, changed, v
    raise ExampleError(f"wildcard {name!r}: its value appears nowhere in the traced graph")


def trace_with_wildcards(fn: Callable[..., Any], values: Mapping[str, Any],
                         names_w: Mapping[str, str], dialect: TraceDialect
                         ) -> tuple[ExampleTrace, dict[Position, str], dict[str, Any]]:
    """One trace of the example, and which of its literals each wildcard is.

    ``names_w`` maps an input or attribute name to the capture it becomes; the
    positions map to capture names, the example values are keyed by capture.
    """
    # floats are traced at a sentinel value: that trace is the base (one trace for all)
    fn_b, values_b = fn, dict(values)
    for w in names_w:
        v = _example_value(fn, values, w)
        if isinstance(v, float):
            fn_b, values_b = _with_value(fn_b, values_b, w, _sentinel(v))
    base = trace(fn_b, values_b, dialect)
    wild_at: dict[Position, str] = {}
    wild_examples: dict[str, Any] = {}
    for w in names_w:
        v = _example_value(fn, values, w)
        if isinstance(v, float):
            positions = _positions_equal_to(base, _sentinel(v))
            if not positions:
                raise ExampleError(f"wildcard {w!r}: its value appears nowhere in the traced "
                                   "graph")
        else:
            _, positions, _ = _wildcard_positions(fn_b, values_b, w, dialect, base)
        for pos in positions:
            if pos in wild_at:
                raise ExampleError(f"wildcards {wild_at[pos]!r} and {w!r} land on one literal")
            wild_at[pos] = names_w[w]
        wild_examples[names_w[w]] = v
    return base, wild_at, wild_examples


def is_selector(w: str, fn: Any = None, values: Mapping[str, Any] | None = None) -> bool:
    """``"view_copy.size"``: an op-argument selector, not an input or (dotted) attribute."""
    if "." not in w or (values is not None and w in values):
        return False
    return not (isinstance(fn, nn.Module) and has_attr(fn, w))


def wildcard_names(wildcards: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """Wildcards as {input, attribute or selector: capture name}."""
    if isinstance(wildcards, Mapping):
        out = dict(wildcards)
    else:
        out = {w: w for w in dict.fromkeys(wildcards)}
    for w, cap in out.items():
        if not is_selector(w) and not cap.isidentifier():
            raise ExampleError(f"wildcard {w!r}: capture name {cap!r} is not an identifier")
        if is_selector(w) and "." not in cap and cap != w:
            raise ExampleError(f"wildcard selector {w!r} matches any value and binds nothing; "
                               "it takes no capture name")
    return out


def selector_matches(sel: str, target: Any, key: Any) -> bool:
    """``"view_copy.size"`` / ``"aten.view_copy.default.size"`` names argument ``key`` of ``target``."""
    opname, _, argname = sel.rpartition(".")
    k = op_key(target) or ""
    if not (k == opname or k.split(".")[1] == opname or k.rsplit(".", 1)[0] == opname
            or k.split(".", 1)[1] == opname):
        return False
    schema = schema_of(target)
    if schema is None:
        return False
    names = [a.name for a in schema.arguments]
    return (key == argname) or (isinstance(key, int) and key < len(names) and names[key] == argname)


def wildcard_value(name: str, example: Any) -> Value:
    """What a wildcard capture matches: any number of the example's kind, bound as ``name``."""
    if isinstance(example, float):
        return any_float(name)
    if isinstance(example, int) and not isinstance(example, bool):
        return integer(name)
    return any_value(name)
