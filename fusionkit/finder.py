"""The one phase: find every match and decide it, with the ExportedProgram at hand.

For each node in graph order, the rules indexed under the node's op are tried
by priority. Each structural binding is checked against the rule's
constraints, the no-escape rule and the nodes already claimed; the first
binding that passes becomes an accepted :class:`Match`. Otherwise the near
miss becomes a :class:`Decline` that says which step failed, at which node,
and why. Nothing here modifies the program.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.constraints import CheckContext, Failure
from fusionkit.matcher import Binding, match_pattern
from fusionkit.pattern import Alt, Capture, Named, Op, Outputs, Pattern, Value, output_names
from fusionkit.program_inputs import ProgramInputs
from fusionkit.rule import Rule
from fusionkit.targets import is_assertion, op_key

__all__ = ["Decline", "Match", "MatchSet", "RuleIndex", "find_matches"]

#: how many structural bindings per root are checked before giving up
MAX_BINDINGS_PER_ROOT = 32
#: a structural failure is a near miss (and reported) only once it has matched at
#: least this many of the pattern's ops (root included), and two thirds of them
MIN_STRUCTURAL_PROGRESS = 3


def _near_miss_threshold(rule: Rule) -> int:
    return max(MIN_STRUCTURAL_PROGRESS, -(-2 * rule.pattern.min_ops() // 3))


@dataclass(frozen=True)
class Match:
    """An accepted match: every constraint held; the replacement will run."""

    rule: Rule
    root: Node
    captures: Mapping[str, Any]
    claimed: tuple[Node, ...]
    folds: Mapping[str, Node] = field(default_factory=dict)

    def __str__(self) -> str:
        folded = f" (folds {', '.join(f'{k}=`{v.name}`' for k, v in self.folds.items())})" if self.folds else ""
        return f"{self.rule.name} at `{self.root.name}`: {len(self.claimed)} nodes{folded}"


@dataclass(frozen=True)
class Decline:
    """A near miss: the rule, where, which step failed, the node at fault, why."""

    rule: str
    root: Node
    step: str  # "structure", "escape", "overlap", or a constraint kind
    node: Node | None
    reason: str
    #: the nodes the rule had matched when it was declined (for pictures)
    claimed: tuple[Node, ...] = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        at = f" [{self.node.name}]" if self.node is not None else ""
        return f"{self.rule} at `{self.root.name}`: {self.step}{at}: {self.reason}"


@dataclass
class MatchSet:
    """What one search decided: the accepted matches and the declined ones."""

    accepted: list[Match] = field(default_factory=list)
    declined: list[Decline] = field(default_factory=list)


class RuleIndex:
    """Rules grouped by the op key of their root, in priority order (built once)."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        names = [r.name for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate rule names: {dupes}")
        by_key: dict[str, list[tuple[int, int, Rule]]] = defaultdict(list)
        for order, r in enumerate(self.rules):
            for key in r.root_keys:
                by_key[key].append((-r.priority, order, r))
        self._by_key = {k: tuple(r for _, _, r in sorted(v, key=lambda t: (t[0], t[1])))
                        for k, v in by_key.items()}
        #: for_target memo by target object (looked up once per graph node)
        self._by_target: dict[Any, tuple[Rule, ...]] = {}
        self._thresholds: dict[Rule, int] = {}
        self._gates: dict[Rule, _Gate | _AnyGate | None] = {}

    def for_target(self, target: Any) -> tuple[Rule, ...]:
        try:
            return self._by_target[target]
        except KeyError:
            pass
        except TypeError:  # unhashable target
            return self._lookup(target)
        rules = self._by_target[target] = self._lookup(target)
        return rules

    def _lookup(self, target: Any) -> tuple[Rule, ...]:
        key = op_key(target)
        if key is None:
            return ()
        return self._by_key.get(key, ())

    def threshold(self, rule: Rule) -> int:
        """:func:`_near_miss_threshold`, computed once per rule."""
        t = self._thresholds.get(rule)
        if t is None:
            t = self._thresholds[rule] = _near_miss_threshold(rule)
        return t

    def gate(self, rule: Rule) -> _Gate | _AnyGate | None:
        """The rule's gate, if skipping on it can never hide a reportable near miss."""
        if rule not in self._gates:
            gate = _Gate.of(rule.pattern)
            usable = gate is not None and self.threshold(rule) > gate.depth
            self._gates[rule] = gate if usable else None
        return self._gates[rule]


def _claims_nothing(p: Pattern) -> bool:
    while isinstance(p, Named):
        p = p.inner
    return isinstance(p, (Capture, Value))


#: how many pattern levels a gate looks at (root, its operand, that operand's operand)
GATE_DEPTH = 2


@dataclass(frozen=True)
class _Gate:
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
    inner: _Gate | _AnyGate | None = None

    @property
    def depth(self) -> int:
        return 1 + (self.inner.depth if self.inner is not None else 0)

    @staticmethod
    def of(pattern: Pattern, levels: int = GATE_DEPTH) -> _Gate | _AnyGate | None:
        p = pattern
        while isinstance(p, (Named, Outputs)):
            # a multi-output pattern fails where its primary (matched first) fails
            p = p.inner if isinstance(p, Named) else p.primary
        if isinstance(p, Alt):
            # alternatives at the root: skippable only if every option fails at the root
            gates = [_Gate.of(o, levels) for o in p.options]
            if any(g is None for g in gates):
                return None
            return _AnyGate.build(tuple(g for g in gates if g is not None))
        if type(p) is not Op or levels < 1:
            return None
        for i, a in enumerate(p.args):
            keys = a.root_keys()
            if keys is not None:
                inner = _Gate.of(a, levels - 1) if levels > 1 else None
                return _Gate(p.targets, i, keys, p.commutative, len(p.args), inner)
            if not _claims_nothing(a):
                return None
        return None

    def may_match(self, node: Node) -> bool:
        if op_key(node.target) not in self.targets:
            return False  # another option's op (alternatives at the root)
        args = node.args
        if len(args) < self.nargs:
            return True  # operands by keyword or default: let the search decide
        if self._ok(args[self.index]):
            return True
        if self.commutative and self.nargs >= 2 and self.index < 2 and args[0] is not args[1]:
            return self._ok(args[1 - self.index])
        return False

    def _ok(self, v: Any) -> bool:
        if not (isinstance(v, Node) and v.op == "call_function" and op_key(v.target) in self.keys):
            return False
        return self.inner is None or self.inner.may_match(v)


@dataclass(frozen=True)
class _AnyGate:
    """The gate of alternatives: some option's gate must pass.

    Options are looked up by the node's op, so alternatives rooted at different
    ops (``mm | addmm | linear``) cost one dictionary lookup, not one check each.
    """

    options: tuple[_Gate | _AnyGate, ...]
    by_key: Mapping[str, tuple[_Gate | _AnyGate, ...]] = field(default_factory=dict,
                                                                compare=False)

    @staticmethod
    def build(options: tuple[_Gate | _AnyGate, ...]) -> _AnyGate:
        by_key: dict[str, list[_Gate | _AnyGate]] = defaultdict(list)
        for g in options:
            for key in g.targets:
                by_key[key].append(g)
        return _AnyGate(options, {k: tuple(v) for k, v in by_key.items()})

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(self.by_key)

    @property
    def depth(self) -> int:
        return max(g.depth for g in self.options)

    def may_match(self, node: Node) -> bool:
        gates = self.by_key.get(op_key(node.target) or "")
        return gates is not None and any(g.may_match(node) for g in gates)


def _escaping_user(b: Binding, root: Node, outputs: tuple[str, ...] = ()
                   ) -> tuple[Node, Node] | None:
    inside = set(b.claimed)
    exempt = {root, *(b.captures[name] for name in outputs)}  # a match's outputs may escape
    for n in b.claimed:
        if n in exempt:
            continue
        for user in n.users:
            if user not in inside and not is_assertion(user):
                return n, user
    return None


def _decide(rule: Rule, root: Node, b: Binding, ep: ExportedProgram, inputs: ProgramInputs,
            claimed_by: Mapping[Node, Match], allow_folding: bool = True) -> Match | Decline:
    for n in b.claimed:
        owner = claimed_by.get(n)
        if owner is not None:
            return Decline(rule.name, root, "overlap", n,
                           f"`{n.name}` already belongs to the {owner.rule.name} match at "
                           f"`{owner.root.name}`", b.claimed)
    if not rule.allow_escape:
        esc = _escaping_user(b, root, output_names(rule.pattern))
        if esc is not None:
            inner, user = esc
            return Decline(rule.name, root, "escape", inner,
                           f"intermediate `{inner.name}` is also used by `{user.name}` outside "
                           "the match; fusing would have to compute it twice", b.claimed)
    ctx = CheckContext(ep, inputs, root, b.captures, allow_folding=allow_folding)
    for c in rule.constraints:
        failure: Failure | None = c.check(ctx)
        if failure is not None:
            return Decline(rule.name, root, failure.constraint, failure.node, failure.reason,
                           b.claimed)
    return Match(rule, root, dict(b.captures), b.claimed, dict(ctx.folds))


def find_matches(ep: ExportedProgram, rules: Sequence[Rule] | RuleIndex,
                 *, structural_declines: bool = True, allow_folding: bool = True,
                 all_near_misses: bool = False) -> MatchSet:
    """Accepted and declined matches of ``rules`` in ``ep``, in graph order.

    A node belongs to at most one accepted match. Near misses are reported:
    a constraint that failed, an intermediate used elsewhere, an overlap, or
    (with ``structural_declines``) a structure that matched at least two thirds
    of the pattern before it failed. ``allow_folding=False`` is for callers that
    cannot add constants to the program (a graph-module pass): a weight that
    would need folding is declined instead. ``all_near_misses`` lifts the
    progress threshold: every structural attempt that matched the root's op is
    reported (``fusionkit explain --all-near-misses``).
    """
    index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)
    inputs = ProgramInputs(ep)
    result = MatchSet()
    claimed_by: dict[Node, Match] = {}
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or node in claimed_by:
            continue
        candidates = index.for_target(node.target)
        for rule in candidates:
            gate = None if all_near_misses else index.gate(rule)
            if gate is not None and not gate.may_match(node):
                continue  # the search below would fail before any reportable progress
            bindings, failure = match_pattern(rule.pattern, node, inputs)
            first_decline: Decline | None = None
            accepted: Match | None = None
            for i, b in enumerate(bindings):
                if i >= MAX_BINDINGS_PER_ROOT:
                    break
                outcome = _decide(rule, node, b, ep, inputs, claimed_by, allow_folding)
                if isinstance(outcome, Match):
                    accepted = outcome
                    break
                if first_decline is None:
                    first_decline = outcome
            if accepted is not None:
                result.accepted.append(accepted)
                for n in accepted.claimed:
                    claimed_by[n] = accepted
                break
            if first_decline is not None:
                result.declined.append(first_decline)
            elif structural_declines and failure.progress >= (
                    1 if all_near_misses else index.threshold(rule)):
                result.declined.append(Decline(rule.name, node, "structure", failure.node,
                                               failure.message, failure.claimed))
    return result
