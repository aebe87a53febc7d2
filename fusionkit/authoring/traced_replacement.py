"""A replacement written as a function: traced once, replayed at each match.

``rule_from_functions(..., replacement=lambda x, weight, eps: ...)`` traces that
function at the pattern's example captures into replayable steps (op, arguments
referring to captures and earlier steps). One call of captures with no int in it
is data (:class:`~fusionkit.rule.CallOp`, printable as YAML); anything else is a
:class:`~fusionkit.rule.PythonReplacement` that replays the steps through the
Rewriter — re-traced at a match's own shapes when they differ from the example's,
since code such as ``F.layer_norm(x, (x.shape[-1],))`` bakes a size into the trace.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.export.graph_signature import InputKind
from torch.fx import Node

from fusionkit.authoring.example_trace import (
    Dialect,
    ExampleError,
    ExampleModule,
    TraceDialect,
    calls,
    is_tensor_arg,
    output_nodes,
    signature_of,
)
from fusionkit.authoring.wildcards import trace_with_wildcards
from fusionkit.rule import CallOp, PythonReplacement, Ref, Replacement
from fusionkit.targets import op_key

__all__ = ["ShapeSpecializedWarning", "Steps", "replacement_from_function"]


class ShapeSpecializedWarning(UserWarning):
    """A traced replacement whose code fixes the size of one of its arguments: matches of
    other sizes are declined (step ``error``) rather than fused."""


#: the dialect a replacement is traced in, per rule dialect: the ops ``to_edge``
#: makes (core ATen: ``native_layer_norm`` for ``layer_norm``, ``silu`` decomposed),
#: custom ops (``et_vk.*``) kept as they are
_REPLACEMENT_DIALECT: dict[str, TraceDialect] = {"edge": "edge", "aten": "core"}

#: traced calls in order: (op, args, kwargs), arguments as Ref / _Step / _ConstTensor / literals
Steps = tuple[tuple[Any, tuple[Any, ...], dict[str, Any]], ...]


@dataclass(frozen=True)
class _Step:
    """The result of the ``index``-th step."""

    index: int


@dataclass(frozen=True)
class _ConstTensor:
    """A constant the trace lifted (added to the program when replayed)."""

    tensor: torch.Tensor


def _replacement_steps(fn: Callable[..., Any], values: Mapping[str, Any], wild: set[str],
                       dialect: TraceDialect) -> tuple[Steps, tuple[Any, ...]]:
    """The traced replacement as replayable steps and the outputs they return."""
    params = list(values)
    tr, wild_at, _ = trace_with_wildcards(fn, values, {p: p for p in params if p in wild},
                                          dialect)
    traced_calls = calls(tr.ep)
    env: dict[Node, Any] = {}

    def lower(a: Any, i: int | None, key: Any, path: tuple[Any, ...] = ()) -> Any:
        if i is not None and (i, key, path) in wild_at:
            return Ref(wild_at[(i, key, path)])
        if isinstance(a, Node):
            if a.op == "placeholder":
                if a.name in tr.names:
                    return Ref(tr.names[a.name])
                t = tr.lifted[a.name]
                # a scalar to_edge lifted into a tensor argument stays a tensor there
                # (``add.Tensor(x, 1e-5)`` is refused by the edge verifier)
                tensor_arg = (i is not None and not path
                              and is_tensor_arg(traced_calls[i].target, key))
                return t.item() if t.dim() == 0 and not tensor_arg else _ConstTensor(t)
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(lower(x, i, key, (*path, j)) for j, x in enumerate(a))
        return a

    steps: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    for i, n in enumerate(traced_calls):
        args = tuple(lower(a, i, k) for k, a in enumerate(n.args))
        kwargs = {k: lower(v, i, k) for k, v in n.kwargs.items()}
        env[n] = _Step(len(steps))
        steps.append((n.target, args, kwargs))
    return tuple(steps), tuple(lower(o, None, None) for o in output_nodes(tr.ep))


def _has_ints(a: Any) -> bool:
    """Whether an int literal (a size, a dim: possibly derived from a shape) is in ``a``."""
    if isinstance(a, bool):
        return False
    if isinstance(a, int):
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_ints(x) for x in a)
    if isinstance(a, dict):
        return any(_has_ints(x) for x in a.values())
    return False


def _literal_params(values: Mapping[str, Any], wild: set[str]) -> list[str]:
    """Replacement parameters bound to a literal capture that is no wildcard: traced as
    that one value, so a match with another value needs another trace."""
    return [p for p, v in values.items() if not isinstance(v, torch.Tensor) and p not in wild]


def _has_steps(a: Any) -> bool:
    if isinstance(a, (_Step, _ConstTensor)):
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_steps(x) for x in a)
    if isinstance(a, dict):
        return any(_has_steps(x) for x in a.values())
    return False


def _refs(a: Any) -> Iterable[str]:
    if isinstance(a, Ref):
        yield a.name
    elif isinstance(a, (list, tuple)):
        for x in a:
            yield from _refs(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from _refs(x)


def _replay(rw: Any, captures: Mapping[str, Any], steps: Steps, outs: tuple[Any, ...]) -> Any:
    """Replay traced steps through the Rewriter: the same ops, on the match's captures."""
    made: list[Any] = []

    def res(a: Any) -> Any:
        if isinstance(a, Ref):
            return captures[a.name]
        if isinstance(a, _Step):
            return made[a.index]
        if isinstance(a, _ConstTensor):
            return rw.constant(f"from_example_{id(a.tensor)}", a.tensor)
        if isinstance(a, (list, tuple)):
            return type(a)(res(x) for x in a)
        return a

    for target, args, kwargs in steps:
        if target is operator.getitem:
            made.append(rw.getitem(res(args[0]), args[1]))
        else:
            made.append(rw.call(target, *res(args), **{k: res(v) for k, v in kwargs.items()}))
    got = [res(o) for o in outs]
    return got[0] if len(got) == 1 else tuple(got)


def _signature(values: Mapping[str, Any], wild: frozenset[str]) -> tuple[Any, ...] | None:
    """What a trace of the replacement depends on: each tensor's shape and dtype, each
    literal that is no wildcard. None when a shape is symbolic (no concrete retrace)."""
    out: list[Any] = []
    for p, v in values.items():
        if isinstance(v, Node):
            v = v.meta.get("val")
        if isinstance(v, torch.Tensor):
            if not all(type(d) is int for d in v.shape):
                return None
            out.append((p, "T", tuple(v.shape), v.dtype))
        elif p in wild:
            out.append((p, "W"))
        else:
            try:
                hash(v)
            except TypeError:
                v = repr(v)
            out.append((p, "V", v))
    return tuple(out)


def _example_like(v: Any, example: Any) -> Any:
    """A value to trace the replacement with in place of the match's capture ``v``."""
    if isinstance(v, Node):
        v = v.meta.get("val")
    if isinstance(v, torch.Tensor):
        return torch.ones(tuple(int(d) for d in v.shape), dtype=v.dtype)
    if isinstance(v, Node) or v is None:
        return example
    return v


def _describe_signature(key: tuple[Any, ...]) -> str:
    parts = []
    for item in key:
        if item[1] == "T":
            parts.append(f"{item[0]}: {str(item[3]).removeprefix('torch.')}{list(item[2])}")
        elif item[1] == "V":
            parts.append(f"{item[0]}={item[2]!r}")
    return ", ".join(parts) or "captures"


class _TracedReplacement(PythonReplacement):
    """A traced replacement, replayed node by node through the Rewriter.

    The trace of the example is what a match of the example's shapes replays; a
    match with other shapes (or another literal capture) replays a trace of the
    replacement at *its* captures' shapes and dtypes, made once per such
    signature — so ``F.layer_norm(x, (x.shape[-1],))`` traced at width 16 builds
    ``[32]`` at width 32. A trace that fails at a match's shapes raises
    :class:`ExampleError` naming them, which the finder reports as the match's
    decline (step ``error``) before anything changes.
    """

    def __init__(self, fn: Callable[..., Any], values: Mapping[str, Any], wild: frozenset[str],
                 dialect: TraceDialect, steps: Steps, outs: tuple[Any, ...]) -> None:
        example_key = _signature(values, wild)
        traces: dict[Any, tuple[Steps, tuple[Any, ...]] | ExampleError] = {
            example_key: (steps, outs)}
        name = getattr(fn, "__name__", type(fn).__name__)

        def trace_for(captures: Mapping[str, Any]) -> tuple[Steps, tuple[Any, ...]]:
            now = {p: captures.get(p) for p in values}
            key = _signature(now, wild)
            if key is None:  # symbolic shapes: the example's trace is the best there is
                key = example_key
            found = traces.get(key)
            if found is None:
                at = {p: values[p] if p in wild else _example_like(now[p], values[p])
                      for p in values}
                try:
                    found = _replacement_steps(fn, at, set(wild), dialect)
                    if len(found[1]) != len(outs):
                        raise ExampleError(f"returns {len(found[1])} values, not {len(outs)}")
                except ExampleError as e:
                    found = ExampleError(
                        f"the replacement {name} cannot be traced at this match's "
                        f"{_describe_signature(key or ())}: {e}")
                traces[key] = found
            if isinstance(found, ExampleError):
                raise found
            return found

        def build(rw: Any, captures: Mapping[str, Any]) -> Any:
            steps_now, outs_now = trace_for(captures)
            return _replay(rw, captures, steps_now, outs_now)

        super().__init__(build, frozenset(_refs(steps)) | frozenset(values))
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "outs", outs)
        object.__setattr__(self, "traces", traces)


def replacement_from_function(fn: Callable[..., Any], examples: Mapping[str, Any],
                              wild: set[str], outputs: int, dialect: Dialect = "edge"
                              ) -> Replacement:
    """The replacement ``fn`` computes, its parameters read as captures of the pattern.

    ``examples`` holds each capture's example value, ``wild`` the wildcard
    captures (their literal is not baked into the trace), ``outputs`` how many
    values the pattern returns. A :class:`_TracedReplacement` whose code may fix
    a size carries ``specialized`` (``{argument: {dim: size}}``, see
    :func:`_specialized_dims`).
    """
    sig = signature_of(fn)
    params = list(sig.parameters)
    missing = [p for p in params if p not in examples]
    if missing:
        raise ExampleError(f"replacement parameter(s) {missing} name no capture of the pattern "
                           f"(captures: {sorted(examples)})")
    values = {p: examples[p] for p in params}
    traced_in = _REPLACEMENT_DIALECT[dialect]
    steps, outs = _replacement_steps(fn, values, wild, traced_in)
    if len(outs) != outputs:
        raise ExampleError(f"the replacement returns {len(outs)} values, the pattern has "
                           f"{outputs} outputs")
    if (len(steps) == 1 and outputs == 1 and isinstance(outs[0], _Step)
            and not _has_steps(steps[0][1:]) and steps[0][0] is not operator.getitem
            and not _has_ints(steps[0][1:]) and not _literal_params(values, wild)):
        target, args, kwargs = steps[0]  # one call of captures and no int: data, not code
        return CallOp(op_key(target) or str(target), args, kwargs)
    rep = _TracedReplacement(fn, values, frozenset(wild), traced_in, steps, outs)
    if _has_ints(steps):  # a literal that may come from a shape: which sizes are fixed?
        object.__setattr__(rep, "specialized", _specialized_dims(fn, values))
    return rep


def _specialized_dims(fn: Callable[..., Any], values: Mapping[str, Any]
                      ) -> dict[str, dict[int, int]]:
    """Tensor arguments whose size the replacement's code fixes: ``{name: {dim: size}}``.

    The replacement is exported once more with every dimension symbolic; a
    dimension export had to make a constant (``F.layer_norm(x, (16,))``, a
    ``view(2, 16)``) is one the code fixes. Size-0/1 dimensions are not judged
    (export always fixes those). Empty when nothing is fixed or export cannot say.
    """
    from torch.export import Dim

    names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    fixed = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
    args = tuple(values[k] for k in names)
    dims = (tuple({i: Dim.AUTO for i in range(t.dim())} for t in args),)
    try:
        ep = torch.export.export(ExampleModule(fn, names, fixed).eval(), args,
                                 dynamic_shapes=dims, strict=False)
    except Exception:
        return {}
    out: dict[str, dict[int, int]] = {}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user = [spec.arg.name for spec in ep.graph_signature.input_specs
            if spec.kind == InputKind.USER_INPUT]
    by_name = {n.name: n for n in placeholders}
    for name, ph_name, example in zip(names, user, args, strict=False):
        val = by_name[ph_name].meta.get("val")
        for i, (d, size) in enumerate(zip(getattr(val, "shape", ()), example.shape,
                                          strict=False)):
            if size > 1 and (type(d) is int or (isinstance(d, torch.SymInt)
                                                and d.node.expr.is_number)):
                out.setdefault(name, {})[i] = int(size)
    return out
