"""Stage 4 of the match phase: search each candidate in graph order and decide it.

The finder (:mod:`fusionkit.find.finder`) hands this stage the candidates its earlier
stages left: each call node with, by priority, the rules rooted at its op whose gate lets
it by, their compiled patterns. Here, node by node in graph order, each rule's pattern is
searched (:mod:`fusionkit.match.matcher`); every structural binding is checked against
the nodes already claimed, the no-escape rule, a multi-output match's placement, the
rule's constraints and its replacement; the first binding that passes becomes an accepted
:class:`Match`, claiming its nodes. Otherwise the near miss becomes a declined
:class:`~fusionkit.result.MatchResult`
that says which step failed, at which node, and why. Nothing here modifies the program.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.check.constraints import CheckContext
from fusionkit.find.executable import ReplacementCheck
from fusionkit.find.returned_values import forget as forget_returned
from fusionkit.find.returned_values import returned_value_refusal
from fusionkit.match.matcher import Binding, CompiledPattern, PredicateError
from fusionkit.match.pattern import output_names
from fusionkit.program_inputs import ProgramInputs
from fusionkit.result import MatchResult
from fusionkit.rule import Rule
from fusionkit.targets import is_assertion, writes_to

__all__ = ["DECLINE_STEPS", "Candidate", "Match", "MatchSet", "Settings",
           "decide_in_order"]

#: how many structural bindings per root are checked before giving up
MAX_BINDINGS_PER_ROOT = 32


@dataclass(frozen=True)
class Match:
    """An accepted match: every constraint held; the replacement will run.

    ``insert_before`` is where the replacement goes, decided here with the rest:
    the replacement's nodes are inserted immediately before this node. It comes
    after every input of the match and before every user of every output (for a
    multi-output match it may differ from ``root``), is never a node an earlier
    accepted match claims, and assumes the matches are applied in the order of
    :attr:`MatchSet.accepted` (an earlier match's replacement sits right before
    its own ``insert_before``). None only for matches built by hand: use ``root``.
    """

    rule: Rule
    root: Node
    captures: Mapping[str, Any]
    claimed: tuple[Node, ...]
    folds: Mapping[str, Node] = field(default_factory=dict)
    insert_before: Node | None = None

    def __str__(self) -> str:
        folded = f" (folds {', '.join(f'{k}=`{v.name}`' for k, v in self.folds.items())})" if self.folds else ""
        return f"{self.rule.name} at `{self.root.name}`: {len(self.claimed)} nodes{folded}"


#: the steps a decline can name besides a constraint's ``kind`` (``custom:NAME``
#: for a :class:`~fusionkit.check.constraints.Custom`): ``error`` is a rule's own code
#: raising (counted apart from the other declines), ``placement`` a multi-output
#: match with no single point for its replacement, ``executable`` a replacement
#: creating an op the program could not run (:mod:`fusionkit.find.executable`)
DECLINE_STEPS: tuple[str, ...] = ("structure", "overlap", "escape", "placement", "executable",
                                  "error")


@dataclass
class MatchSet:
    """What one search decided: the accepted matches and the declined ones.

    ``declined`` holds every decline; :attr:`errors` the ones whose step is
    ``error`` (a rule's code raised), which reports count apart.
    """

    accepted: list[Match] = field(default_factory=list)
    declined: list[MatchResult] = field(default_factory=list)

    @property
    def errors(self) -> list[MatchResult]:
        return [d for d in self.declined if d.step == "error"]


def _decline(rule: str, root: Node, step: str, node: Node, reason: str,
             claimed: tuple[Node, ...] = ()) -> MatchResult:
    return MatchResult.fail(rule, root, step, reason, node, claimed)


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


class _Positions:
    """Graph order, built on the first multi-output match of a search (never changes)."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.nodes = list(ep.graph_module.graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}


def _place(rule: Rule, root: Node, b: Binding, outputs: tuple[str, ...],
           claimed_by: Mapping[Node, Match], pos: _Positions) -> Node | MatchResult:
    """The node before which the replacement of a multi-output match can go.

    Positions of nodes an earlier match claims are those of its replacement
    (just before its ``insert_before``). The root itself is preferred; else
    the latest free position before the first user of an output.
    """
    order, inside = pos.order, set(b.claimed)

    def at(n: Node) -> float:
        owner = claimed_by.get(n)
        if owner is not None and owner.insert_before is not None:
            return order[owner.insert_before] - 0.5
        return float(order[n])

    lo, lo_node = -1.0, None
    inputs = {i for n in b.claimed for i in n.all_input_nodes if i not in inside}
    inputs |= {v for v in b.captures.values() if isinstance(v, Node) and v not in inside}
    for i in inputs:
        p = at(i)
        if p > lo:
            lo, lo_node = p, i
    hi, hi_node, hi_out = float(len(pos.nodes) - 1), None, root
    for out in (root, *(b.captures[name] for name in outputs)):
        for u in out.users:
            if u in inside:
                continue
            p = at(u)
            if p < hi:
                hi, hi_node, hi_out = p, u, out
    if hi <= lo:
        assert lo_node is not None and hi_node is not None
        return _decline(rule.name, root, "placement", hi_node,
                       f"no point in the graph is after every input and before every user: "
                       f"output `{hi_out.name}` is used by `{hi_node.name}`, which comes before "
                       f"input `{lo_node.name}` is computed")
    place: Node | None = None
    if lo < order[root] <= hi:
        place = root
    else:
        for k in range(int(hi), int(lo), -1):  # latest free position first
            cand = pos.nodes[k]
            if cand.op == "placeholder":
                break
            if cand not in claimed_by:
                place = cand
                break
    if place is None:
        return _decline(rule.name, root, "placement", root,
                       "every position after the match's inputs and before its outputs' users "
                       "belongs to another match")
    if place is not root:  # the replacement reads its inputs at another time: no write between
        a, z = sorted((order[place], order[root]))
        for n in pos.nodes[a:z]:
            if n not in inside and writes_to(n, inputs):
                return _decline(rule.name, root, "placement", n,
                               f"the replacement would go before `{place.name}`, but `{n.name}` "
                               "writes in place to one of its inputs in between")
    return place


def _decide(rule: Rule, root: Node, b: Binding, ep: ExportedProgram, inputs: ProgramInputs,
            claimed_by: Mapping[Node, Match], allow_folding: bool = True,
            positions: Callable[[], _Positions] | None = None,
            strict: bool = False, any_moved: bool = False,
            replacement_check: Callable[[Rule], ReplacementCheck] | None = None
            ) -> Match | MatchResult:
    for n in b.claimed:
        owner = claimed_by.get(n)
        if owner is not None:
            return _decline(rule.name, root, "overlap", n,
                           f"`{n.name}` already belongs to the {owner.rule.name} match at "
                           f"`{owner.root.name}`", b.claimed)
    outputs = output_names(rule.pattern)
    if not rule.allow_escape:
        esc = _escaping_user(b, root, outputs)
        if esc is not None:
            inner, user = esc
            return _decline(rule.name, root, "escape", inner,
                           f"intermediate `{inner.name}` is also used by `{user.name}` outside "
                           "the match; fusing would have to compute it twice", b.claimed)
    place: Node = root
    if outputs or any_moved:  # else the root is after every input, before every user
        where = _place(rule, root, b, outputs, claimed_by,
                       positions() if positions is not None else _Positions(ep))
        if isinstance(where, MatchResult):
            return where
        place = where
    ctx = CheckContext(ep, inputs, root, b.captures, allow_folding=allow_folding, rule=rule.name)
    for c in rule.constraints:
        try:
            failure: MatchResult | None = c.check(ctx)
        except Exception as e:
            if strict:
                e.add_note(f"fusionkit: in constraint {c.kind} of rule {rule.name!r} at "
                           f"`{root.name}` (strict mode)")
                raise
            name = getattr(c, "name", None)
            label = f"constraint {c.kind}" + (f" {name!r}" if isinstance(name, str) else "")
            return MatchResult.from_exception(rule.name, root, label, e)
        if failure is not None:
            return MatchResult.of(failure, rule=rule.name, root=root, claimed=b.claimed)
    if replacement_check is not None:  # last: it builds the replacement (memoised)
        olds = (root, *(b.captures[name] for name in outputs))
        bad = replacement_check(rule).verdict(ctx, olds, strict)
        if bad is not None:  # a verdict shared by matches alike: made this match's result
            return MatchResult.of(bad.result(rule.name, root, b.claimed))
    # last of all: a value the program returns stays returned exactly (records the rewiring)
    returned = returned_value_refusal(ctx, rule, (root, *(b.captures[n] for n in outputs)),
                                      b.claimed)
    if returned is not None:
        return MatchResult.of(returned)
    return Match(rule, root, dict(b.captures), b.claimed, dict(ctx.folds), place)


_ENOUGH = object()  # the search's result when MAX_BINDINGS_PER_ROOT bindings were all declined


class _Decider:
    """The search's continuation: decide each binding; the first accepted one ends it.

    Keeps the first decline (an error decline replaces a plain one) for the
    report, and stops the search after :data:`MAX_BINDINGS_PER_ROOT` bindings.
    """

    __slots__ = ("args", "first_decline", "root", "rule", "seen")

    def __init__(self, rule: Rule, root: Node, *args: Any) -> None:
        self.rule, self.root, self.args = rule, root, args
        self.seen = 0
        self.first_decline: MatchResult | None = None

    def __call__(self, b: Binding) -> Match | object | None:
        if self.seen >= MAX_BINDINGS_PER_ROOT:
            return _ENOUGH
        self.seen += 1
        outcome = _decide(self.rule, self.root, b, *self.args)
        if isinstance(outcome, Match):
            return outcome
        first = self.first_decline
        if first is None or (outcome.is_error and not first.is_error):
            self.first_decline = outcome
        return None


#: one node to decide and, by priority, each rule to try there: the rule, its compiled
#: pattern and the exception its gate raised at the node (None: the gate let it by)
Candidate = tuple[Node, tuple[tuple[Rule, CompiledPattern, Exception | None], ...]]


@dataclass(frozen=True)
class Settings:
    """What :func:`decide_in_order` needs besides the candidates (see
    :func:`~fusionkit.find.finder.find_matches` for the options)."""

    inputs: ProgramInputs
    #: each rule's near-miss threshold (structural progress that makes a failure reportable)
    thresholds: Mapping[Rule, int]
    #: each rule's replacement check (None: replacements are not checked)
    replacement_checks: Mapping[Rule, ReplacementCheck] | None
    structural_declines: bool = True
    allow_folding: bool = True
    all_near_misses: bool = False
    strict: bool = False


def decide_in_order(ep: ExportedProgram, candidates: Sequence[Candidate], s: Settings
                    ) -> MatchSet:
    """Every candidate searched and decided in graph order; a node an earlier accepted
    match claims is not tried, and the first rule accepted at a node ends its tries."""
    try:
        return _decide_each(ep, candidates, s)
    finally:
        # the search's record of returned values holds its inputs (a cycle): dropped here,
        # the program is freed with its last reference, not by the cyclic collector
        forget_returned(s.inputs)


def _decide_each(ep: ExportedProgram, candidates: Sequence[Candidate], s: Settings
                 ) -> MatchSet:
    checks = s.replacement_checks
    checker = None if checks is None else checks.__getitem__
    inputs, strict = s.inputs, s.strict
    result = MatchSet()
    claimed_by: dict[Node, Match] = {}
    cache: list[_Positions] = []
    any_moved = False  # an accepted replacement goes elsewhere than before its root

    def positions() -> _Positions:
        if not cache:
            cache.append(_Positions(ep))
        return cache[0]

    for node, tries in candidates:
        if node in claimed_by:
            continue
        for rule, pattern, gate_error in tries:
            during = "the pattern's gate"
            try:
                if gate_error is not None:
                    raise gate_error
                during = "matching the pattern"
                decided = _Decider(rule, node, ep, inputs, claimed_by, s.allow_folding,
                                   positions, strict, any_moved, checker)
                accepted, failure = pattern.search(node, inputs, decided, claimed_by)
                first_decline = decided.first_decline
                if accepted is _ENOUGH:
                    accepted = None
            except Exception as e:
                error: Exception = e
                if isinstance(e, PredicateError):  # report the predicate's own exception
                    during, error = e.where, e.error
                if strict:
                    error.add_note(f"fusionkit: {during} of rule {rule.name!r} at "
                                   f"`{node.name}` (strict mode)")
                    if error is e:
                        raise
                    raise error from None
                result.declined.append(MatchResult.from_exception(rule.name, node, during, error))
                continue
            if accepted is not None:
                result.accepted.append(accepted)
                any_moved = any_moved or accepted.insert_before is not accepted.root
                for n in accepted.claimed:
                    claimed_by[n] = accepted
                break
            if first_decline is not None:
                result.declined.append(first_decline)
            elif s.structural_declines and failure.progress >= (
                    1 if s.all_near_misses else s.thresholds[rule]):
                near_miss = failure.result(rule.name)
                if near_miss is not None:  # always: progress >= 1 means an attempt failed
                    result.declined.append(MatchResult.of(near_miss))
    return result
