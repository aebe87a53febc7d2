"""A traced example graph turned into the pattern DSL's objects.

Each op call becomes :func:`~fusionkit.match.pattern.op` of its arguments'
patterns; placeholders become captures (named after the parameter or module
attribute they stand for); a node used twice is bound once and referenced by
name. Literals stay exact except where a wildcard landed
(:mod:`fusionkit.authoring.wildcards`). Casts are the DSL's job: every operand
may pass ``through`` the allowed casts, so one trace serves programs with and
without them; a number in a tensor position matches its float32 rounding, so
one pattern serves the ATen and the edge spelling (where ``to_edge`` lifted it
into a 0-d constant).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.fx import Node

from fusionkit.authoring.example_trace import (
    Dialect,
    ExampleError,
    ExampleTrace,
    calls,
    capture_name,
    is_tensor_arg,
    output_nodes,
)
from fusionkit.authoring.multi_output import further_outputs
from fusionkit.authoring.wildcards import (
    Position,
    is_selector,
    selector_matches,
    trace_with_wildcards,
    wildcard_value,
)
from fusionkit.match.pattern import (
    Pattern,
    Value,
    any_value,
    capture,
    lit,
    one_of,
    op,
    seq,
    through,
)
from fusionkit.targets import op_key, resolve_op

__all__ = ["TracedPattern", "pattern_of"]


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


def _flat_nodes(a: Any) -> Iterable[Node]:
    """The graph nodes in an argument (nested lists, tuples and dicts included)."""
    if isinstance(a, Node):
        yield a
    elif isinstance(a, (list, tuple)):
        for x in a:
            yield from _flat_nodes(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from _flat_nodes(x)


@dataclass
class _Converter:
    """Turns the nodes of one trace into patterns: the nodes used twice (bound by name)
    are counted first; the selectors that matched an argument are noted as it goes."""

    tr: ExampleTrace
    wild_at: Mapping[Position, str]
    wild_examples: Mapping[str, Any]
    selectors: frozenset[str]
    casts: frozenset[str]
    narrowing: bool = False
    index: dict[Node, int] = field(default_factory=dict)
    shared: set[Node] = field(default_factory=set)
    used_selectors: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.index = {n: i for i, n in enumerate(calls(self.tr.ep))}

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
                name = capture_name(n.name)
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
            p = p.bind(capture_name(n.name))
        return p

    def arg(self, n: Node, i: int, key: Any, a: Any, path: tuple[Any, ...] = ()) -> Any:
        wild = self.wild_at.get((i, key, path))
        if wild is not None:
            v = wildcard_value(wild, self.wild_examples[wild])
            return self.through(v) if self.casts and v.tensor_ok else v
        if not path:
            for sel in self.selectors:
                if selector_matches(sel, n.target, key) and not isinstance(a, Node):
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
            if p.capture_name() in self.tr.module_tensors:
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
                and is_tensor_arg(n.target, key):
            v = _number(a)
            return self.through(v) if self.casts else v
        return a


@dataclass(frozen=True)
class TracedPattern:
    """The pattern of one example, the trace it was read from, its output names."""

    pattern: Pattern
    trace: ExampleTrace
    outputs: tuple[str, ...]


def pattern_of(fn: Callable[..., Any], values: Mapping[str, Any], *, dialect: Dialect,
               wildcards: Mapping[str, str], casts: Iterable[str],
               output_names: Sequence[str] | None, narrowing: bool = False) -> TracedPattern:
    """The pattern of example ``fn`` at ``values`` (inputs by parameter name).

    ``wildcards`` as :func:`~fusionkit.authoring.wildcards.wildcard_names` gives
    them; ``casts`` the ops every operand may pass through; ``output_names`` the
    capture names of the outputs (default: none for one output, ``out0``, ... for several).
    """
    selectors = {w for w in wildcards if is_selector(w, fn, values)}
    base, wild_at, wild_examples = trace_with_wildcards(
        fn, values, {w: c for w, c in wildcards.items() if w not in selectors}, dialect)
    cast_keys = frozenset(op_key(resolve_op(c)) or c for c in casts)
    conv = _Converter(base, wild_at, wild_examples, frozenset(selectors), cast_keys, narrowing)
    outs = output_nodes(base.ep)
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
    pattern: Pattern = primary
    if len(outs) > 1:
        pattern = further_outputs(primary, outs[1:], names[1:], base,
                                  lambda o: (conv.node(o), conv.skip_casts(o)))
    unused = selectors - conv.used_selectors
    if unused:
        raise ExampleError(f"wildcard selector(s) {sorted(unused)} match no literal argument")
    return TracedPattern(pattern, base, names)
