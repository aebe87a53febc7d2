"""Gates: O(1) necessary conditions that let the finder skip most searches.

Most nodes with a rule's root op are not the root of a match (every ``mul`` is a
candidate RMSNorm). A gate looks at a node's operands – a few levels down, through
pass-through ops and into list operands – and says "the structural search cannot
match here". The finder skips a search on a failed gate only when the search would
also have failed before claiming as many nodes as the rule's near-miss threshold, so
gating never changes what :func:`~fusionkit.find.finder.find_matches` returns, accepted
or declined (``tests/test_finder_gate.py`` compares gated and ungated results).

:func:`specialize` narrows a gate to the op keys one graph contains
(:func:`graph_op_keys`): a key set is only ever tested against nodes of that graph,
so intersecting it with the graph's keys changes no verdict, and a level whose keys
are all absent from the graph compiles to a constant – a rule for quantized linears
costs almost nothing on a float model.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeAlias

from torch.fx import Node

from fusionkit.match.memo import PerObject
from fusionkit.match.pattern import (
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
from fusionkit.targets import OP_KEY_MEMO, graph_op_keys, op_key

__all__ = [
    "GATE_DEPTH",
    "AnyGate",
    "Gate",
    "GateLike",
    "ThroughGate",
    "gate_of",
    "graph_op_keys",
    "specialize",
]

#: the most pattern levels a gate looks at (root, its operand, that operand's operand, ...);
#: a rule's gate is also kept shallower than its near-miss threshold
GATE_DEPTH = 6

#: what a gate can be: an op's operands, alternatives, or a pass-through before an op
GateLike: TypeAlias = "Gate | AnyGate | ThroughGate"


class _ClaimsNothing(PatternVisitor[bool]):
    """A capture or a literal (possibly bound to a name) matches without claiming a node."""

    def generic(self, p: Pattern) -> bool:
        return False

    def visit_named(self, p: Named) -> bool:
        return p.inner.accept(self)

    def visit_capture(self, p: Capture) -> bool:
        return True

    def visit_value(self, p: Value) -> bool:
        return True


class _ListItems(PatternVisitor["tuple[Pattern, ...] | None"]):
    """The element patterns of a list operand (:func:`~fusionkit.match.pattern.seq`), else None."""

    def generic(self, p: Pattern) -> tuple[Pattern, ...] | None:
        return None

    def visit_seq(self, p: Seq) -> tuple[Pattern, ...] | None:
        return p.items


class _FreePassThrough(PatternVisitor["frozenset[str] | None"]):
    """The ops of a ``through(ops, <claims nothing>)`` operand: it claims no node unless its
    value is one of them. None for any other operand."""

    def generic(self, p: Pattern) -> frozenset[str] | None:
        return None

    def visit_through(self, p: Through) -> frozenset[str] | None:
        return p.ops if claims_nothing(p.inner) else None


def claims_nothing(p: Pattern) -> bool:
    """Whether ``p`` matches without claiming a node (a capture or a literal)."""
    return p.accept(_ClaimsNothing())


@dataclass(frozen=True)
class Gate:
    """A necessary condition for the root op pattern to match, checked in O(1).

    Of the root ``Op``'s operands, the first whose pattern names the ops its
    value must be (``root_keys``) is checked against the graph — and, one level
    down, the same for that operand's pattern; the operands before each checked
    one must be captures/literals, which claim no node. When the check fails for
    every operand order, the structural search would fail there too, with at
    most :attr:`depth` nodes claimed; the finder skips the search only when that
    is below the rule's near-miss threshold, so :func:`find_matches` returns the
    same result, only faster (most nodes with the root's op are not the root of
    a match).
    """

    targets: frozenset[str]  # the ops the gated node itself must be
    index: int
    keys: frozenset[str]
    commutative: bool
    nargs: int
    inner: GateLike | None = None
    #: the operand is a list (``cat``'s tensors): it must have ``items`` elements, and
    #: element ``item`` is the one checked (the elements before it claim nothing)
    item: int | None = None
    items: int = 0
    #: operands before the checked one that are ``through(ops, capture)``: they claim
    #: nothing unless their value is one of ``ops`` – then the gate lets the node by
    free: tuple[tuple[int, frozenset[str]], ...] = ()

    @property
    def depth(self) -> int:
        return 1 + (self.inner.depth if self.inner is not None else 0)

    @staticmethod
    def of(pattern: Pattern, levels: int = GATE_DEPTH) -> GateLike | None:
        return pattern.accept(_GateOf(levels))

    def may_match(self, node: Node) -> bool:
        return self.check(node)

    @cached_property
    def check(self) -> Callable[[Node], bool]:
        """:meth:`may_match` as one closure over this gate's sets (it runs per graph node)."""
        targets, operands = self.targets, self.operands_check
        if not targets:  # specialized to a graph without the op
            return _never

        def check(node: Node) -> bool:
            try:
                key = OP_KEY_MEMO[node.target]
            except (KeyError, TypeError):
                key = op_key(node.target)
            return key in targets and operands(node)  # else another option's op
        return check

    @cached_property
    def operands_check(self) -> Callable[[Node], bool]:
        """:meth:`check` for a node already known to have one of :attr:`targets` (the
        finder's per-op rule lists guarantee it at the root): only the operands."""
        index, keys, nargs = self.index, self.keys, self.nargs
        if not keys and not self.free:  # specialized to a graph without the operand's ops

            def short(node: Node) -> bool:
                return len(node.args) < nargs  # operands by keyword or default: search
            return short
        other = 1 - index if self.commutative and nargs >= 2 and index < 2 else None
        inner = self.inner.check if self.inner is not None else None
        item, items = self.item, self.items

        def ok(v: Any) -> bool:
            if item is not None:  # the search fails at a list of another length too
                if not isinstance(v, (list, tuple)) or len(v) != items:
                    return False
                v = v[item]
            if not isinstance(v, Node) or v.op != "call_function":
                return False
            try:
                key = OP_KEY_MEMO[v.target]
            except (KeyError, TypeError):
                key = op_key(v.target)
            return key in keys and (inner is None or inner(v))

        free = self.free

        def passes_through(v: Any, ops: frozenset[str]) -> bool:
            if not isinstance(v, Node) or v.op != "call_function":
                return False
            try:
                return OP_KEY_MEMO[v.target] in ops
            except (KeyError, TypeError):
                return op_key(v.target) in ops

        def check(node: Node) -> bool:
            args = node.args
            if len(args) < nargs:
                return True  # operands by keyword or default: let the search decide
            if free and any(passes_through(args[j], ops) for j, ops in free):
                return True  # a pass-through before the checked operand would be claimed
            if ok(args[index]):
                return True
            if other is None or args[0] is args[1]:
                return False
            if free and any(passes_through(args[1 - j if j < 2 else j], ops) for j, ops in free):
                return True  # the same, in the swapped order
            return ok(args[other])
        return check


@dataclass(frozen=True)
class ThroughGate:
    """The gate of ``through(ops, inner)`` below the root: a pass-through op (a cast)
    lets the value by (the search may look through it: not checked further); any
    other node is matched by ``inner`` itself, so ``inner``'s gate applies to it."""

    ops: frozenset[str]
    inner: GateLike

    @staticmethod
    def build(p: Through, inner: GateLike | None) -> ThroughGate | None:
        return None if inner is None else ThroughGate(p.ops, inner)

    @property
    def targets(self) -> frozenset[str]:
        return self.ops | self.inner.targets

    @property
    def depth(self) -> int:
        return self.inner.depth

    def may_match(self, node: Node) -> bool:
        return self.check(node)

    @cached_property
    def check(self) -> Callable[[Node], bool]:
        ops, inner = self.ops, self.inner.check
        if not ops:  # specialized to a graph without the pass-through ops
            return inner

        def check(node: Node) -> bool:
            try:
                key = OP_KEY_MEMO[node.target]
            except (KeyError, TypeError):
                key = op_key(node.target)
            return key in ops or inner(node)
        return check


class _GateOf(PatternVisitor["GateLike | None"]):
    """The gate of a pattern (see :meth:`Gate.of`), looking at most ``levels`` op levels down."""

    def __init__(self, levels: int) -> None:
        self.levels = levels

    def generic(self, p: Pattern) -> GateLike | None:
        return None

    def visit_named(self, p: Named) -> GateLike | None:
        return p.inner.accept(self)

    def visit_outputs(self, p: Outputs) -> GateLike | None:
        # a multi-output pattern fails where its primary (matched first) fails
        return p.primary.accept(self)

    def visit_alt(self, p: Alt) -> GateLike | None:
        # alternatives at the root: skippable only if every option fails at the root
        gates = [Gate.of(o, self.levels) for o in p.options]
        if any(g is None for g in gates):
            return None
        return AnyGate.build(tuple(g for g in gates if g is not None))

    def visit_through(self, p: Through) -> GateLike | None:
        return ThroughGate.build(p, Gate.of(p.inner, self.levels))

    def visit_op(self, p: Op) -> GateLike | None:
        levels = self.levels
        if levels < 1:
            return None
        free: list[tuple[int, frozenset[str]]] = []
        for i, a in enumerate(p.args):
            item: int | None = None
            elements = a.accept(_ListItems())
            if elements is not None:  # a list operand: gate on its first element that names ops
                for j, element in enumerate(elements):
                    if element.root_keys() is not None:
                        item = j
                        break
                    if not claims_nothing(element):
                        return None
                if item is None:
                    return None
            checked = elements[item] if item is not None and elements is not None else a
            keys = checked.root_keys()
            if keys is not None:
                inner = Gate.of(checked, levels - 1) if levels > 1 else None
                items = len(elements) if elements is not None else 0
                return Gate(p.targets, i, keys, p.commutative, len(p.args), inner, item, items,
                            tuple(free))
            ops = a.accept(_FreePassThrough())
            if ops is not None:
                free.append((i, ops))  # claims nothing unless its value is a pass-through op
            elif not claims_nothing(a):
                return None
        return None


@dataclass(frozen=True)
class AnyGate:
    """The gate of alternatives: some option's gate must pass.

    Options are looked up by the node's op, so alternatives rooted at different
    ops (``mm | addmm | linear``) cost one dictionary lookup, not one check each.
    """

    options: tuple[GateLike, ...]
    by_key: Mapping[str, tuple[GateLike, ...]] = field(default_factory=dict, compare=False)

    @staticmethod
    def build(options: tuple[GateLike, ...]) -> AnyGate:
        by_key: dict[str, list[GateLike]] = defaultdict(list)
        for g in options:
            for key in g.targets:
                by_key[key].append(g)
        return AnyGate(options, {k: tuple(v) for k, v in by_key.items()})

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(self.by_key)

    @property
    def depth(self) -> int:
        return max(g.depth for g in self.options)

    def may_match(self, node: Node) -> bool:
        return self.check(node)

    @cached_property
    def check(self) -> Callable[[Node], bool]:
        """:meth:`may_match` as one closure: the options for the node's op, tried in turn."""
        by_key = {k: tuple(g.check for g in v) for k, v in self.by_key.items()}
        if not by_key:  # specialized to a graph without any option's op
            return _never

        def check(node: Node) -> bool:
            try:
                key = OP_KEY_MEMO[node.target]
            except (KeyError, TypeError):
                key = op_key(node.target)
            checks = by_key.get(key or "")
            if checks is None:
                return False
            for c in checks:
                if c(node):
                    return True
            return False
        return check


def _never(node: Node) -> bool:
    return False


def _all_keys(gate: GateLike) -> frozenset[str]:
    if isinstance(gate, Gate):
        out = gate.targets | gate.keys
        for _, ops in gate.free:
            out |= ops
        return out | (_all_keys(gate.inner) if gate.inner is not None else frozenset())
    if isinstance(gate, ThroughGate):
        return gate.ops | _all_keys(gate.inner)
    out = frozenset[str]()
    for o in gate.options:
        out |= _all_keys(o)
    return out


def _specialize(gate: GateLike, present: frozenset[str]) -> GateLike:
    if isinstance(gate, Gate):
        inner = gate.inner
        return replace(gate, targets=gate.targets & present, keys=gate.keys & present,
                       inner=None if inner is None else _specialize(inner, present),
                       free=tuple((j, ops & present) for j, ops in gate.free if ops & present))
    if isinstance(gate, ThroughGate):
        return ThroughGate(gate.ops & present, _specialize(gate.inner, present))
    return AnyGate.build(tuple(_specialize(o, present) for o in gate.options))


_SPECIALIZED: PerObject[GateLike] = PerObject(_specialize)
_ALL_KEYS: PerObject[frozenset[str]] = PerObject(_all_keys)


def specialize(gate: GateLike, present: frozenset[str]) -> GateLike:
    """``gate`` for a graph whose op keys are ``present`` (:func:`graph_op_keys`).

    Every key set is intersected with ``present``: a gate only tests keys of
    nodes of the graph, which are all in ``present``, so every verdict is the
    same; what changes is the cost – an operand whose ops the graph lacks is
    rejected without looking. Remembered per gate and relevant keys.
    """
    return _SPECIALIZED(gate, present & _ALL_KEYS(gate))


_GATES: PerObject[GateLike | None] = PerObject(lambda pattern, levels: Gate.of(pattern, levels))


def gate_of(pattern: Pattern, levels: int) -> GateLike | None:
    """``Gate.of(pattern, levels)``, remembered for the last few hundred patterns (by
    identity), with its compiled checks: an adapter builds its rules once but a new
    index per pass."""
    return _GATES(pattern, levels)
