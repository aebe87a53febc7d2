"""Rules from example code: trace the PyTorch code a fusion replaces into a pattern.

A backend author has the model code (``LlamaRMSNorm.forward``, a RoPE helper),
not the edge-dialect op names it lowers to. :func:`rule_from_functions` runs
that code through ``torch.export`` (and ``to_edge`` for the edge dialect) and
turns the traced graph into the same :mod:`fusionkit.match.pattern` objects a
hand-written rule is made of, so the result prints as DSL code
(:func:`fusionkit.authoring.python_source.to_python`) and as YAML, and is matched,
explained and rewritten like any other rule.

Choices that differ from Inductor's ``register_replacement``:

* literals stay exact: a traced ``[-1]``, ``2`` or ``1e-6`` matches only that
  value. Inductor's serialized patterns turned int literals into wildcards and
  silently rewrote attention with other arguments (pytorch#195320). A wildcard
  is an explicit opt-in (``wildcards={"eps"}``): the named input is traced a
  second time with another value and exactly the literals that changed become
  one named capture;
* operand order and dtype casts are the DSL's job (commutative ops match both
  orders; casts are ``through(CASTS, ...)``), so one pattern is traced, not one
  per permutation;
* ``0-d`` constants that ``to_edge`` lifts out of scalars are literals that also
  accept such a constant, so one pattern serves both dialects' spellings.
"""

from __future__ import annotations

import copy
import inspect
import math
import operator
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node

from fusionkit.check.constraints import Constraint, PrepackableConstant
from fusionkit.match.pattern import (
    CASTS,
    Also,
    Alt,
    Capture,
    Outputs,
    Pattern,
    Value,
    any_float,
    any_value,
    capture,
    lit,
    one_of,
    op,
    seq,
    through,
    where,
)
from fusionkit.match.targets import is_assertion, op_key, resolve_op, schema_of
from fusionkit.rule import CallOp, PythonReplacement, Ref, Replacement, Rule

__all__ = ["ExampleError", "ShapeSpecializedWarning", "pattern_from_function",
           "rule_from_functions"]

Dialect = Literal["edge", "aten"]
#: what a trace is lowered to: a rule's dialect, or core ATen (``aten`` plus
#: ``to_edge``'s decompositions, still an ATen program)
TraceDialect = Literal["edge", "aten", "core"]
ParamPolicy = Literal["constant", "foldable", "any"]


class ExampleError(ValueError):
    """Example code that cannot become a rule as asked (says what to change)."""


class ShapeSpecializedWarning(UserWarning):
    """A traced replacement whose code fixes the size of one of its arguments: matches of
    other sizes are declined (step ``error``) rather than fused."""


# ------------------------------------------------------------------------ tracing


@dataclass
class _Trace:
    """One traced example: the program and what each placeholder stands for."""

    ep: ExportedProgram
    #: placeholder node name -> capture name (user inputs, module tensors)
    names: dict[str, str]
    #: placeholder node name -> value of a lifted constant that is not a module tensor
    lifted: dict[str, torch.Tensor]
    #: capture name -> example value (tensors, and the example literal of a wildcard)
    examples: dict[str, Any]
    #: capture names of module parameters/buffers
    module_tensors: list[str]


class _Call(nn.Module):
    """``fn(**tensors, **fixed)`` as a module, so export sees only the tensors."""

    def __init__(self, fn: Callable[..., Any], tensor_names: Sequence[str],
                 fixed: Mapping[str, Any]) -> None:
        super().__init__()
        if isinstance(fn, nn.Module):
            self.inner = fn  # its parameters and buffers are named inner.*
        else:
            self.fn = fn
        self.tensor_names = tuple(tensor_names)
        self.fixed = dict(fixed)

    def forward(self, *tensors: torch.Tensor) -> Any:
        fn = self.inner if hasattr(self, "inner") else self.fn
        return fn(**dict(zip(self.tensor_names, tensors, strict=True)), **self.fixed)


def _signature_of(fn: Callable[..., Any]) -> inspect.Signature:
    target = fn.forward if isinstance(fn, nn.Module) else fn
    return inspect.signature(target)


def _bind_inputs(fn: Callable[..., Any], inputs: Sequence[Any] | Mapping[str, Any]
                 ) -> dict[str, Any]:
    sig = _signature_of(fn)
    try:
        bound = (sig.bind(**inputs) if isinstance(inputs, Mapping) else sig.bind(*inputs))
    except TypeError as e:
        raise ExampleError(f"example inputs do not fit {getattr(fn, '__name__', fn)}{sig}: {e}"
                           ) from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _export(fn: Callable[..., Any], values: Mapping[str, Any], dialect: TraceDialect
            ) -> tuple[ExportedProgram, list[str]]:
    tensor_names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    fixed = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
    module = _Call(fn, tensor_names, fixed).eval()
    args = tuple(values[k] for k in tensor_names)
    try:
        ep = torch.export.export(module, args, strict=False)
        if dialect == "edge":
            from executorch.exir import EdgeCompileConfig, to_edge

            cfg = EdgeCompileConfig(_check_ir_validity=False)
            ep = to_edge(ep, compile_config=cfg).exported_program()
        elif dialect == "core":
            from executorch.exir.tracer import _default_decomposition_table

            ep = ep.run_decompositions(_default_decomposition_table())
    except Exception as e:  # export's own error, with the example named
        raise ExampleError(f"cannot trace {getattr(fn, '__name__', type(fn).__name__)} "
                           f"({dialect} dialect): {type(e).__name__}: {e}") from e
    return ep, tensor_names


def _capture_name(fqn: str) -> str:
    """``inner.layers.0.weight`` -> ``layers_0_weight`` (a capture name is an identifier)."""
    name = re.sub(r"\W", "_", fqn.removeprefix("inner."))
    return name if name.isidentifier() else f"t_{name}"


def _trace(fn: Callable[..., Any], values: Mapping[str, Any], dialect: TraceDialect
           ) -> _Trace:
    ep, tensor_names = _export(fn, values, dialect)
    module_fqns = set()
    if isinstance(fn, nn.Module):
        module_fqns = {f"inner.{k}" for k, _ in fn.named_parameters()}
        module_fqns |= {f"inner.{k}" for k, _ in fn.named_buffers()}
    names: dict[str, str] = {}
    lifted: dict[str, torch.Tensor] = {}
    examples: dict[str, Any] = {k: v for k, v in values.items()}
    module_tensors: list[str] = []
    user_i = 0
    state = {**ep.state_dict, **ep.constants}
    for spec in ep.graph_signature.input_specs:
        pname = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            names[pname] = tensor_names[user_i]
            user_i += 1
        elif spec.target in module_fqns:
            cname = _capture_name(spec.target)
            names[pname] = cname
            module_tensors.append(cname)
            examples[cname] = state[spec.target]
        elif spec.target is not None and spec.target in state:
            lifted[pname] = state[spec.target]
        else:
            names[pname] = _capture_name(pname)
    return _Trace(ep, names, lifted, examples, module_tensors)


# ----------------------------------------------------------- wildcards by re-tracing


def _calls(ep: ExportedProgram) -> list[Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function" and not is_assertion(n)]


def _literal_view(a: Any, tr: _Trace) -> Any:
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


#: a position of a literal in a traced graph: (call index, argument key, path in a list)
Position = tuple[int, Any, tuple[Any, ...]]


def _changed_positions(a: _Trace, b: _Trace) -> set[Position] | None:
    """Literal positions that differ between two traces of one code, None if the structure differs."""
    ca, cb = _calls(a.ep), _calls(b.ep)
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


def _set_attr_path(m: nn.Module, path: str, v: Any) -> None:
    *parents, last = path.split(".")
    for p in parents:
        m = getattr(m, p)
    setattr(m, last, v)


def _get_attr_path(m: Any, path: str) -> Any:
    for p in path.split("."):
        m = getattr(m, p)
    return m


def _sentinel(v: float) -> float:
    """A float near ``v`` (same sign and size, so the code takes the same path) that no
    other literal of the trace will equal."""
    return v * (1 + 1.2345678e-3) + (1.2345678e-9 if v >= 0 else -1.2345678e-9)


def _same_float(a: Any, b: float) -> bool:
    return (isinstance(a, float) and math.isfinite(a)
            and abs(a - b) <= 1e-6 * max(abs(a), abs(b)))


def _positions_equal_to(tr: _Trace, value: float) -> set[Position]:
    out: set[Position] = set()
    for i, n in enumerate(_calls(tr.ep)):
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
    _set_attr_path(m, name, v)  # type: ignore[arg-type]
    return m, dict(values)


def _example_value(fn: Callable[..., Any], values: Mapping[str, Any], name: str) -> Any:
    if name in values:
        v = values[name]
        if isinstance(v, torch.Tensor):
            raise ExampleError(f"wildcard {name!r} is a tensor input; it is a capture already")
        return v
    if isinstance(fn, nn.Module) and _has_attr(fn, name):
        return _get_attr_path(fn, name)
    raise ExampleError(f"wildcard {name!r} is neither an input of the example nor an attribute "
                       f"of it (inputs: {sorted(values)})")


def _wildcard_positions(fn: Callable[..., Any], values: Mapping[str, Any], name: str,
                        dialect: TraceDialect, base: _Trace | None = None
                        ) -> tuple[_Trace, set[Position], Any]:
    """Where the value of input or attribute ``name`` lands in the traced graph.

    A float is traced once with a sentinel value near the example and found
    by that value. An int (it may shape the graph) is traced with its example
    value and once more with another value: the literals that changed are its.
    """
    v = _example_value(fn, values, name)
    if isinstance(v, float):
        s = _sentinel(v)
        tr = _trace(*_with_value(fn, values, name, s), dialect)
        positions = _positions_equal_to(tr, s)
        if not positions:
            raise ExampleError(f"wildcard {name!r}: its value appears nowhere in the traced graph")
        return tr, positions, v
    if not isinstance(v, int) or isinstance(v, bool):
        raise ExampleError(f"a wildcard needs an int or float example value; {name!r} is {v!r}")
    base = base if base is not None else _trace(fn, values, dialect)
    for w in (v + 1, v - 1, 2 * v + 3):
        try:
            other = _trace(*_with_value(fn, values, name, w), dialect)
        except ExampleError:
            continue
        changed = _changed_positions(base, other)
        if changed is None:
            raise ExampleError(f"changing {name!r} changes the traced graph's structure, not "
                               "only a literal: it cannot be a wildcard")
        if changed:
            return base, changed, v
    raise ExampleError(f"wildcard {name!r}: its value appears nowhere in the traced graph")


# ---------------------------------------------------------------- graph -> pattern


def _wildcard_value(name: str, example: Any) -> Value:
    if isinstance(example, float):
        return any_float(name)
    if isinstance(example, int) and not isinstance(example, bool):
        import fusionkit.match.pattern as dsl

        integer = getattr(dsl, "integer", None)  # the vocabulary's int matcher, where it exists
        if integer is not None:
            return integer(name)  # type: ignore[no-any-return]
        return where(lambda v: isinstance(v, int) and not isinstance(v, bool),
                     "an int literal", name=name)
    return any_value(name)


def _number(v: Any) -> Value:
    """An exact number in a tensor position (``x + 1e-6``), literal or lifted 0-d constant.

    ``to_edge`` lifts such a scalar into a float32 constant, so ``1e-6`` is met
    as ``9.99999997e-07`` in edge programs and as ``1e-6`` in ATen ones: a
    float matches its value, its float32 rounding, and the shortest decimal
    that rounds to the same float32 (what the code wrote) — nothing else.
    """
    if not isinstance(v, float) or not math.isfinite(v):
        return lit(v, tensor_ok=True)
    import numpy as np

    f32 = float(np.float32(v))
    spellings = sorted({v, f32, float(str(np.float32(v)))})
    if len(spellings) == 1:
        return lit(v, tensor_ok=True)
    return one_of(spellings, tensor_ok=True)


def _is_tensor_arg(target: Any, key: Any) -> bool:
    schema = schema_of(target)
    if schema is None:
        return False
    args = schema.arguments
    arg = (args[key] if isinstance(key, int) and key < len(args)
           else next((a for a in args if a.name == key), None))
    return arg is not None and isinstance(arg.type, torch.TensorType)


def _selector_matches(sel: str, target: Any, key: Any) -> bool:
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


@dataclass
class _Converter:
    tr: _Trace
    wild_at: Mapping[Position, str]
    wild_examples: Mapping[str, Any]
    selectors: frozenset[str]
    casts: frozenset[str]
    narrowing: bool = False
    index: dict[Node, int] = field(default_factory=dict)
    shared: set[Node] = field(default_factory=set)
    bound: set[Node] = field(default_factory=set)
    used_selectors: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.index = {n: i for i, n in enumerate(_calls(self.tr.ep))}

    def through(self, p: Pattern) -> Pattern:
        """``p`` behind any number of casts (narrowing ones too when the author says so)."""
        return through(self.casts, p, narrowing=self.narrowing) if self.narrowing \
            else through(self.casts, p)

    def skip_casts(self, a: Any) -> Any:
        while (self.casts and isinstance(a, Node) and a.op == "call_function"
               and op_key(a.target) in self.casts and a.args):
            a = a.args[0]
        return a

    def count_uses(self, roots: Sequence[Node]) -> None:
        uses: dict[Node, int] = {}
        seen: set[Node] = set()

        def visit(n: Node) -> None:
            if n in seen:
                return
            seen.add(n)
            for a in _flat_nodes((n.args, n.kwargs)):
                a = self.skip_casts(a)
                if a.op == "call_function":
                    uses[a] = uses.get(a, 0) + 1
                    visit(a)

        for r in roots:
            r = self.skip_casts(r)
            uses[r] = uses.get(r, 0) + 1
            visit(r)
        self.shared = {n for n, k in uses.items() if k > 1}

    def node(self, n: Node) -> Pattern:
        n = self.skip_casts(n)
        if n.op == "placeholder":
            name = self.tr.names.get(n.name)
            if name is None:  # a lifted constant that is not a module tensor
                t = self.tr.lifted[n.name]
                if t.dim() == 0:
                    return _number(t.item())
                name = _capture_name(n.name)
            return capture(name)
        if n.op != "call_function":
            raise ExampleError(f"cannot turn `{n.name}` ({n.op}) into a pattern")
        key = op_key(n.target)
        if key is None:
            raise ExampleError(f"`{n.name}` calls {n.target}, which is not an operator overload")
        i = self.index[n]
        args = [self.arg(n, i, k, a) for k, a in enumerate(n.args)]
        kwargs = {k: self.arg(n, i, k, a) for k, a in n.kwargs.items()}
        p: Pattern = op(key, *args, **kwargs)
        if n in self.shared:
            p = p.bind(_capture_name(n.name))
        return p

    def arg(self, n: Node, i: int, key: Any, a: Any, path: tuple[Any, ...] = ()) -> Any:
        wild = self.wild_at.get((i, key, path))
        if wild is not None:
            v = _wildcard_value(wild, self.wild_examples[wild])
            return self.through(v) if self.casts and v.tensor_ok else v
        if not path:
            for sel in self.selectors:
                if _selector_matches(sel, n.target, key) and not isinstance(a, Node):
                    self.used_selectors.add(sel)
                    return any_value()
        if isinstance(a, Node):
            inner = self.skip_casts(a)
            if inner.op == "placeholder" and inner.name in self.tr.lifted:
                t = self.tr.lifted[inner.name]
                if t.dim() == 0:
                    v = _number(t.item())
                    return self.through(v) if self.casts else v
            p = self.node(a)
            if isinstance(p, Capture) and p.name in self.tr.module_tensors:
                # a cast of a module tensor is a constant expression: the parameter
                # policy (fold or decline) judges it, so it stays part of the capture
                return p
            return self.through(p) if self.casts else p
        if isinstance(a, (list, tuple)):
            items = [self.arg(n, i, key, x, (*path, j)) for j, x in enumerate(a)]
            if any(isinstance(x, Pattern) for x in items):
                return seq(*items)
            return list(items)
        if isinstance(a, (int, float)) and not isinstance(a, bool) and not path \
                and _is_tensor_arg(n.target, key):
            v = _number(a)
            return self.through(v) if self.casts else v
        return a


def _flat_nodes(a: Any) -> Iterable[Node]:
    if isinstance(a, Node):
        yield a
    elif isinstance(a, (list, tuple)):
        for x in a:
            yield from _flat_nodes(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from _flat_nodes(x)


def _output_nodes(ep: ExportedProgram) -> list[Any]:
    out = next(n for n in ep.graph.nodes if n.op == "output")
    return list(out.args[0])


def _distance(src: Node, dst: Node, limit: int = 64) -> int | None:
    frontier, seen = [src], {src}
    for d in range(1, limit):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u is dst:
                    return d
                if u not in seen:
                    seen.add(u)
                    nxt.append(u)
        frontier = nxt
    return None


@dataclass(frozen=True)
class _Traced:
    pattern: Pattern
    trace: _Trace
    outputs: tuple[str, ...]


def _trace_with_wildcards(fn: Callable[..., Any], values: Mapping[str, Any],
                          names_w: Mapping[str, str], dialect: TraceDialect
                          ) -> tuple[_Trace, dict[Position, str], dict[str, Any]]:
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
    base = _trace(fn_b, values_b, dialect)
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


def _pattern_of(fn: Callable[..., Any], values: Mapping[str, Any], *, dialect: Dialect,
                wildcards: Mapping[str, str], casts: Iterable[str],
                output_names: Sequence[str] | None, narrowing: bool = False) -> _Traced:
    selectors = {w for w in wildcards if _is_selector(w, fn, values)}
    base, wild_at, wild_examples = _trace_with_wildcards(
        fn, values, {w: c for w, c in wildcards.items() if w not in selectors}, dialect)
    cast_keys = frozenset(op_key(resolve_op(c)) or c for c in casts)
    conv = _Converter(base, wild_at, wild_examples, frozenset(selectors), cast_keys, narrowing)
    outs = _output_nodes(base.ep)
    for o in outs:
        if not isinstance(o, Node) or conv.skip_casts(o).op != "call_function":
            raise ExampleError(f"output {o} of the example is not computed by an op "
                               "(a rule's outputs must be op results)")
    names = tuple(output_names) if output_names is not None else (
        () if len(outs) == 1 else tuple(f"out{i}" for i in range(len(outs))))
    if names and len(names) != len(outs):
        raise ExampleError(f"output_names has {len(names)} names for {len(outs)} outputs")
    conv.count_uses(outs)
    primary = conv.node(outs[0])
    if names:
        primary = primary.bind(names[0])
    unused = selectors - conv.used_selectors
    pattern: Pattern = primary
    if len(outs) > 1:
        others = []
        bound_caps = primary.captures()
        for o, nm in zip(outs[1:], names[1:], strict=True):
            pat = conv.node(o)
            root = conv.skip_casts(o)
            best: tuple[int, str] | None = None
            for ph in base.ep.graph.nodes:
                cname = base.names.get(ph.name)
                if ph.op != "placeholder" or cname is None or cname not in bound_caps:
                    continue
                d = _distance(ph, root)
                if d is not None and (best is None or d < best[0]):
                    best = (d, cname)
            if best is None:
                raise ExampleError(f"output {nm!r} shares no input with the first output; "
                                   "a multi-output rule needs one to find it from")
            others.append(Also(nm, pat, best[1], max(12, best[0] + 4)))
            bound_caps |= pat.captures() | {nm}
        pattern = Outputs(primary, tuple(others))
    unused |= selectors - conv.used_selectors
    if unused:
        raise ExampleError(f"wildcard selector(s) {sorted(unused)} match no literal argument")
    return _Traced(pattern, base, names)


def _has_attr(m: Any, path: str) -> bool:
    try:
        _get_attr_path(m, path)
        return True
    except AttributeError:
        return False


def pattern_from_function(fn: Callable[..., Any], example_inputs: Sequence[Any],
                          *, dialect: Dialect = "edge",
                          wildcards: Iterable[str] | Mapping[str, str] = (),
                          casts: Iterable[str] = CASTS,
                          output_names: Sequence[str] | None = None) -> Pattern:
    """The pattern of one example function (see :func:`rule_from_functions`)."""
    values = _bind_inputs(fn, example_inputs)
    return _pattern_of(fn, values, dialect=dialect, wildcards=_wildcard_names(wildcards),
                       casts=casts,
                       output_names=output_names).pattern


# --------------------------------------------------------------------- replacement

#: the dialect a replacement is traced in, per rule dialect: the ops ``to_edge``
#: makes (core ATen: ``native_layer_norm`` for ``layer_norm``, ``silu`` decomposed),
#: custom ops (``et_vk.*``) kept as they are
_REPLACEMENT_DIALECT: dict[str, TraceDialect] = {"edge": "edge", "aten": "core"}

Steps = tuple[tuple[Any, tuple[Any, ...], dict[str, Any]], ...]


def _replacement_steps(fn: Callable[..., Any], values: Mapping[str, Any], wild: set[str],
                       dialect: TraceDialect) -> tuple[Steps, tuple[Any, ...]]:
    """The traced replacement as replayable steps and the outputs they return."""
    params = list(values)
    tr, wild_at, _ = _trace_with_wildcards(fn, values, {p: p for p in params if p in wild},
                                           dialect)
    calls = _calls(tr.ep)
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
                              and _is_tensor_arg(calls[i].target, key))
                return t.item() if t.dim() == 0 and not tensor_arg else _ConstTensor(t)
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(lower(x, i, key, (*path, j)) for j, x in enumerate(a))
        return a

    steps: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    for i, n in enumerate(calls):
        args = tuple(lower(a, i, k) for k, a in enumerate(n.args))
        kwargs = {k: lower(v, i, k) for k, v in n.kwargs.items()}
        env[n] = _Step(len(steps))
        steps.append((n.target, args, kwargs))
    return tuple(steps), tuple(lower(o, None, None) for o in _output_nodes(tr.ep))


def _replacement_from_function(fn: Callable[..., Any], examples: Mapping[str, Any],
                               wild: set[str], outputs: int, dialect: Dialect = "edge"
                               ) -> Replacement:
    sig = _signature_of(fn)
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
        ep = torch.export.export(_Call(fn, names, fixed).eval(), args, dynamic_shapes=dims,
                                 strict=False)
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


@dataclass(frozen=True)
class _Step:
    index: int


@dataclass(frozen=True)
class _ConstTensor:
    tensor: torch.Tensor


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


def _describe_signature(key: tuple[Any, ...]) -> str:
    parts = []
    for item in key:
        if item[1] == "T":
            parts.append(f"{item[0]}: {str(item[3]).removeprefix('torch.')}{list(item[2])}")
        elif item[1] == "V":
            parts.append(f"{item[0]}={item[2]!r}")
    return ", ".join(parts) or "captures"


# ----------------------------------------------------------------------- the rule


def _param_constraints(names: Sequence[str], policy: ParamPolicy) -> list[Constraint]:
    if policy == "any":
        return []
    return [PrepackableConstant(n, fold=(policy == "foldable")) for n in names]


def rule_from_functions(
    search_fn: Callable[..., Any] | Sequence[Callable[..., Any]],
    replacement: str | Callable[..., Any] | Replacement,
    example_inputs: Sequence[Any],
    *,
    name: str,
    constraints: Iterable[Constraint] = (),
    wildcards: Iterable[str] | Mapping[str, str] = (),
    dialect: Dialect = "edge",
    casts: Iterable[str] = CASTS,
    narrowing: bool = False,
    parameters: ParamPolicy = "constant",
    output_names: Sequence[str] | None = None,
    priority: int = 0,
    description: str = "",
) -> Rule:
    """A :class:`~fusionkit.rule.Rule` whose pattern is traced from example code.

    ``search_fn``: a function or ``nn.Module`` computing what to find, or a list
    of them (alternatives, e.g. ``x * x`` and ``x.pow(2)`` spellings).
    ``example_inputs``: its arguments (a tuple, or a list of tuples, one per
    search function); tensor arguments become captures named after the
    parameters, other arguments exact literals unless named in ``wildcards``.
    A module's parameters and buffers become captures named after them
    (dots -> ``_``) with ``parameters``: ``"constant"`` (must be a constant of
    the program), ``"foldable"`` (or foldable into one), ``"any"``.
    ``wildcards``: parameter or module-attribute names (``"eps"``) whose value
    becomes a capture of that name, or ``"op.arg"`` selectors
    (``"view_copy.size"``) whose literals match any value.
    ``replacement``: an op name (called with the search function's parameters in
    order), a function of capture names to trace, or a Replacement.
    ``casts``: ops every operand may pass through (``()`` keeps casts as traced);
    value-preserving ones only, unless ``narrowing`` (fp32 -> fp16 too: right when
    the fused op computes in the input's dtype, as the RMSNorm kernel does).
    """
    fns: list[Callable[..., Any]] = (
        list(search_fn) if isinstance(search_fn, (list, tuple))
        else [search_fn])  # type: ignore[list-item]
    if not fns:
        raise ExampleError("rule_from_functions needs at least one search function")
    per_fn = (list(example_inputs) if isinstance(example_inputs, list)
              and all(isinstance(e, (tuple, dict)) for e in example_inputs)
              and len(example_inputs) == len(fns) and len(fns) > 1 else
              [example_inputs] * len(fns))
    wild = _wildcard_names(wildcards)
    traced = [
        _pattern_of(f, _bind_inputs(f, ex), dialect=dialect, wildcards=wild, casts=casts,
                    output_names=output_names, narrowing=narrowing)
        for f, ex in zip(fns, per_fn, strict=True)
    ]
    pattern = _merge([t.pattern for t in traced])
    first = traced[0].trace
    examples = dict(first.examples)
    wild_names: set[str] = set()
    for w, cap in wild.items():
        if w in examples or not _is_selector(w, fns[0]):
            wild_names.add(cap)
            if w in examples:
                examples[cap] = examples[w]
            elif isinstance(fns[0], nn.Module) and _has_attr(fns[0], w):
                examples[cap] = _get_attr_path(fns[0], w)
    n_out = max(1, len(_output_nodes(first.ep)))
    rep: Replacement
    if isinstance(replacement, Replacement):
        rep = replacement
    elif isinstance(replacement, str):
        if isinstance(fns[0], nn.Module):
            raise ExampleError("an op-name replacement needs a search *function* (its parameters "
                               "are the op's arguments); for a module pass a function or "
                               "replace_with(...)")
        params = list(_signature_of(fns[0]).parameters)
        values = _bind_inputs(fns[0], per_fn[0])
        args = [Ref(p) if isinstance(values[p], torch.Tensor)
                else Ref(wild[p]) if p in wild else values[p] for p in params]
        rep = CallOp(replacement, tuple(args))
    elif callable(replacement):
        rep = _replacement_from_function(replacement, examples, wild_names, n_out, dialect)
        for arg, dims in (getattr(rep, "specialized", None) or {}).items():
            fixed = ", ".join(f"dim {d} must be {n}" for d, n in sorted(dims.items()))
            warnings.warn(ShapeSpecializedWarning(
                f"rule {name!r}: the replacement's argument {arg!r} is shape-specialized "
                f"({fixed}: its code fixes that size); a match of another size is declined "
                "(step error), not fused"), stacklevel=2)
    else:
        raise ExampleError(f"replacement must be an op name, a function or a Replacement, "
                           f"not {type(replacement).__name__}")
    needed = rep.captures()
    for t in traced:
        missing = needed - t.pattern.captures()
        if missing:
            raise ExampleError(f"the replacement reads {sorted(missing)}, which not every "
                               "search function binds")
    module_tensors = list(dict.fromkeys(n for t in traced for n in t.trace.module_tensors))
    cons = [*_param_constraints(module_tensors, parameters), *constraints]
    return Rule(name=name, pattern=pattern, replacement=rep, constraints=cons,
                priority=priority, description=description or
                f"traced from {', '.join(getattr(f, '__name__', type(f).__name__) for f in fns)}")


def _is_selector(w: str, fn: Any = None, values: Mapping[str, Any] | None = None) -> bool:
    """``"view_copy.size"``: an op-argument selector, not an input or (dotted) attribute."""
    if "." not in w or (values is not None and w in values):
        return False
    return not (isinstance(fn, nn.Module) and _has_attr(fn, w))


def _wildcard_names(wildcards: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """Wildcards as {input, attribute or selector: capture name}."""
    if isinstance(wildcards, Mapping):
        out = dict(wildcards)
    else:
        out = {w: w for w in dict.fromkeys(wildcards)}
    for w, cap in out.items():
        if not _is_selector(w) and not cap.isidentifier():
            raise ExampleError(f"wildcard {w!r}: capture name {cap!r} is not an identifier")
        if _is_selector(w) and "." not in cap and cap != w:
            raise ExampleError(f"wildcard selector {w!r} matches any value and binds nothing; "
                               "it takes no capture name")
    return out


def _merge(patterns: Sequence[Pattern]) -> Pattern:
    if len(patterns) == 1:
        return patterns[0]
    if all(isinstance(p, Outputs) for p in patterns):
        outs = [p for p in patterns if isinstance(p, Outputs)]
        n = len(outs[0].others)
        if any(len(o.others) != n for o in outs):
            raise ExampleError("alternative search functions return different numbers of outputs")
        others = []
        for k in range(n):
            alts = [o.others[k] for o in outs]
            if len({(a.name, a.near) for a in alts}) != 1:
                raise ExampleError("alternative search functions find their further outputs "
                                   "from different inputs")
            others.append(Also(alts[0].name, _merge([a.pattern for a in alts]), alts[0].near,
                               max(a.max_depth for a in alts)))
        return Outputs(_merge([o.primary for o in outs]), tuple(others))
    if any(isinstance(p, Outputs) for p in patterns):
        raise ExampleError("alternative search functions return different numbers of outputs")
    opts: list[Pattern] = []
    for p in patterns:
        opts.extend(p.options if isinstance(p, Alt) else (p,))
    return Alt(tuple(opts))

