"""The one phase: find every match and decide it, with the ExportedProgram at hand.

For each node in graph order, the rules indexed under the node's op are tried
by priority. Each structural binding is checked against the rule's
constraints, the no-escape rule and the nodes already claimed; the first
binding that passes becomes an accepted :class:`Match`. Otherwise the near
miss becomes a :class:`Decline` that says which step failed, at which node,
and why. Nothing here modifies the program.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.check.constraints import CheckContext
from fusionkit.check.executable import ExecutionTarget, ReplacementCheck
from fusionkit.check.program_inputs import ProgramInputs
from fusionkit.match.gates import GATE_DEPTH, Gate, GateLike, gate_of, graph_op_keys, specialize
from fusionkit.match.matcher import Binding, CompiledPattern, PredicateError, compile_pattern
from fusionkit.match.pattern import output_names
from fusionkit.match.targets import is_assertion, op_key, schema_of
from fusionkit.program import ProgramLike, as_exported_program
from fusionkit.result import MatchResult, Status, Step
from fusionkit.rule import Rule
from fusionkit.strict import strict_mode

__all__ = ["DECLINE_STEPS", "Decline", "Match", "MatchSet", "RuleIndex", "find_matches"]

#: how many structural bindings per root are checked before giving up
MAX_BINDINGS_PER_ROOT = 32
#: a structural failure of a shipped rule is a near miss (and reported) only once it has
#: matched at least this many of the pattern's ops (root included), and two thirds of them
MIN_STRUCTURAL_PROGRESS = 3


#: a user's own rule (not ``shipped``) is reported once it matched this many ops (or all
#: of a smaller pattern's): whatever failed after its root and one more op is a near miss
USER_RULE_PROGRESS = 2


def _near_miss_threshold(rule: Rule) -> int:
    if not rule.shipped:
        return min(USER_RULE_PROGRESS, rule.pattern.min_ops())
    return max(MIN_STRUCTURAL_PROGRESS, -(-2 * rule.pattern.min_ops() // 3))


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
#: creating an op the program could not run (:mod:`fusionkit.check.executable`)
DECLINE_STEPS: tuple[str, ...] = ("structure", "overlap", "escape", "placement", "executable",
                                  "error")


@dataclass(frozen=True, init=False, eq=False)
class Decline(MatchResult):
    """A refused match: a :class:`~fusionkit.result.MatchResult` the finder made.

    Built as ``Decline(rule, root, step, node, reason, claimed, error_type)``;
    ``step == "error"`` (status ``error``) means the rule's own code raised (a
    constraint, a value predicate, a custom check, a replacement): ``error_type``
    names the exception and ``reason`` says where it was raised and its message.
    """

    def __init__(self, rule: str, root: Node, step: str, node: Node | None, reason: str,
                 claimed: tuple[Node, ...] = (), error_type: str | None = None) -> None:
        status = Status.ERROR if step == Step.ERROR else Status.DECLINED
        super().__init__(rule, root, status, step, node, reason, tuple(claimed),
                         None, error_type)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MatchResult):
            return NotImplemented
        return (self.rule, self.at, self.status, self.step, self.node, self.reason,
                self.error_type) == (other.rule, other.at, other.status, other.step,
                                     other.node, other.reason, other.error_type)

    def __hash__(self) -> int:
        return hash((self.rule, self.at, self.step, self.node, self.reason))

    @property
    def root(self) -> Node:
        """The node the rule was tried at (:attr:`at`)."""
        return self.at

    @property
    def claimed(self) -> tuple[Node, ...]:
        """The nodes the rule had matched when it was declined (:attr:`matched`)."""
        return self.matched

    @classmethod
    def of(cls, result: MatchResult, *, rule: str | None = None, root: Node | None = None,
           matched: tuple[Node, ...] | None = None) -> Decline:
        """The finder's decline for a result another layer made (the matcher's near miss,
        a constraint's refusal, a replacement check's verdict): the same step, node and
        reason; rule, root and matched nodes are the result's unless given (a constraint
        knows the node at fault, the finder the match it was checking)."""
        if isinstance(result, Decline) and rule is None and root is None and matched is None:
            return result
        return cls(result.rule if rule is None else rule,
                   result.at if root is None else root, result.step, result.node,
                   result.reason, result.matched if matched is None else matched,
                   result.error_type)

    @classmethod
    def from_exception(cls, rule: str, root: Node, during: str, exc: BaseException,
                       node: Node | None = None) -> Decline:
        """The ``error`` decline for ``exc``, raised by the rule's code ``during`` something."""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
        return cls(rule, root, "error", node if node is not None else root,
                   f"{during} raised {type(exc).__name__}: {message}",
                   error_type=type(exc).__name__)

    def __str__(self) -> str:
        at = f" [{self.node.name}]" if self.node is not None else ""
        return f"{self.rule} at `{self.root.name}`: {self.step}{at}: {self.reason}"


@dataclass
class MatchSet:
    """What one search decided: the accepted matches and the declined ones.

    ``declined`` holds every decline; :attr:`errors` the ones whose step is
    ``error`` (a rule's code raised), which reports count apart.
    """

    accepted: list[Match] = field(default_factory=list)
    declined: list[Decline] = field(default_factory=list)

    @property
    def errors(self) -> list[Decline]:
        return [d for d in self.declined if d.step == "error"]


#: what the finder runs at a node with a given target: (rule, gate check or None,
#: compiled pattern) for each rule rooted at that op, by priority
Plan = tuple[tuple[Rule, Callable[[Node], bool] | None, CompiledPattern], ...]


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
        self._gates: dict[Rule, GateLike | None] = {}
        self._plans_ungated: dict[Any, Plan] = {}
        #: gated plans with the gates for any graph
        self._plans_generic: dict[Any, Plan] = {}
        #: gated plans per target, for graphs with these op keys (the last few graphs)
        self._plans_in: OrderedDict[frozenset[str], dict[Any, Plan]] = OrderedDict()
        self._replacement_checks: dict[tuple[Rule, ExecutionTarget | None], ReplacementCheck] = {}

    def compiled(self, rule: Rule) -> CompiledPattern:
        """The rule's pattern compiled for searching (once per pattern object, process-wide)."""
        return compile_pattern(rule.pattern)

    def plans(self, gated: bool = True, present: frozenset[str] | None = None
              ) -> dict[Any, Plan]:
        """The per-target plans :meth:`plan` fills for these arguments."""
        if not gated:
            return self._plans_ungated
        if present is None:
            return self._plans_generic
        plans = self._plans_in.get(present)
        if plans is None:
            plans = self._plans_in[present] = {}
            if len(self._plans_in) > 8:
                self._plans_in.popitem(last=False)
        return plans

    def plan(self, target: Any, gated: bool = True, present: frozenset[str] | None = None
             ) -> Plan:
        """For each rule of ``for_target(target)``: the rule, its gate check (None: no
        gate, or ``gated`` is False) and its compiled pattern — what the finder runs per node.

        ``present``: the op keys of the graph searched (:func:`~fusionkit.match.gates.graph_op_keys`);
        its gates are specialized to them (same verdicts, less work). Without it, the
        gates are for any graph.
        """
        memo = self.plans(gated, present)
        try:
            return memo[target]
        except KeyError:
            pass
        except TypeError:  # unhashable target
            return self._plan(target, gated, present)
        plan = memo[target] = self._plan(target, gated, present)
        return plan

    def _plan(self, target: Any, gated: bool, present: frozenset[str] | None) -> Plan:
        out = []
        for rule in self.for_target(target):
            gate = self.gate(rule) if gated else None
            if gate is not None and present is not None:
                gate = specialize(gate, present)
            check = (None if gate is None else
                     gate.operands_check if isinstance(gate, Gate) else gate.check)
            out.append((rule, check, self.compiled(rule)))
        return tuple(out)

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

    def replacement_check(self, rule: Rule, target: ExecutionTarget | None = None
                          ) -> ReplacementCheck:
        """The check that the rule's replacement builds and runs on ``target``, one per
        rule and target (its verdicts are memoised across the graphs searched)."""
        key = (rule, target)
        check = self._replacement_checks.get(key)
        if check is None:
            check = self._replacement_checks[key] = ReplacementCheck(rule, target)
        return check

    def gate(self, rule: Rule) -> GateLike | None:
        """The rule's gate, if skipping on it can never hide a reportable near miss."""
        if rule not in self._gates:
            # as deep as possible while a failed gate still means "no reportable progress"
            levels = min(GATE_DEPTH, self.threshold(rule) - 1)
            gate = gate_of(rule.pattern, levels)
            usable = gate is not None and self.threshold(rule) > gate.depth
            self._gates[rule] = gate if usable else None
        return self._gates[rule]


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


def _mutates(n: Node, values: set[Node]) -> bool:
    """Whether ``n`` writes (in place) to one of ``values``."""
    schema = schema_of(n.target) if n.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return False
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
        if isinstance(v, Node) and v in values:
            return True
    return False


def _place(rule: Rule, root: Node, b: Binding, outputs: tuple[str, ...],
           claimed_by: Mapping[Node, Match], pos: _Positions) -> Node | Decline:
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
        return Decline(rule.name, root, "placement", hi_node,
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
        return Decline(rule.name, root, "placement", root,
                       "every position after the match's inputs and before its outputs' users "
                       "belongs to another match")
    if place is not root:  # the replacement reads its inputs at another time: no write between
        a, z = sorted((order[place], order[root]))
        for n in pos.nodes[a:z]:
            if n not in inside and _mutates(n, inputs):
                return Decline(rule.name, root, "placement", n,
                               f"the replacement would go before `{place.name}`, but `{n.name}` "
                               "writes in place to one of its inputs in between")
    return place


def _decide(rule: Rule, root: Node, b: Binding, ep: ExportedProgram, inputs: ProgramInputs,
            claimed_by: Mapping[Node, Match], allow_folding: bool = True,
            positions: Callable[[], _Positions] | None = None,
            strict: bool = False, any_moved: bool = False,
            replacement_check: Callable[[Rule], ReplacementCheck] | None = None
            ) -> Match | Decline:
    for n in b.claimed:
        owner = claimed_by.get(n)
        if owner is not None:
            return Decline(rule.name, root, "overlap", n,
                           f"`{n.name}` already belongs to the {owner.rule.name} match at "
                           f"`{owner.root.name}`", b.claimed)
    outputs = output_names(rule.pattern)
    if not rule.allow_escape:
        esc = _escaping_user(b, root, outputs)
        if esc is not None:
            inner, user = esc
            return Decline(rule.name, root, "escape", inner,
                           f"intermediate `{inner.name}` is also used by `{user.name}` outside "
                           "the match; fusing would have to compute it twice", b.claimed)
    place: Node = root
    if outputs or any_moved:  # else the root is after every input, before every user
        where = _place(rule, root, b, outputs, claimed_by,
                       positions() if positions is not None else _Positions(ep))
        if isinstance(where, Decline):
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
            return Decline.from_exception(rule.name, root, label, e)
        if failure is not None:
            return Decline.of(failure, rule=rule.name, root=root, matched=b.claimed)
    if replacement_check is not None:  # last: it builds the replacement (memoised)
        olds = (root, *(b.captures[name] for name in outputs))
        bad = replacement_check(rule).verdict(ctx, olds, strict)
        if bad is not None:  # a verdict shared by matches alike: made this match's result
            return Decline.of(bad.result(rule.name, root, b.claimed))
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
        self.first_decline: Decline | None = None

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


def find_matches(ep: ProgramLike, rules: Sequence[Rule] | RuleIndex,
                 *, structural_declines: bool = True, allow_folding: bool = True,
                 all_near_misses: bool = False, strict: bool | None = None,
                 target: ExecutionTarget | None = None, check_replacements: bool = True
                 ) -> MatchSet:
    """Accepted and declined matches of ``rules`` in ``ep``, in graph order.

    ``ep``: an ``ExportedProgram``, ``EdgeProgramManager`` or
    ``ExecutorchProgramManager`` (its ``forward`` program).

    A node belongs to at most one accepted match. Near misses are reported:
    a constraint that failed, an intermediate used elsewhere, an overlap, a
    multi-output match with no single point for its replacement (``placement``),
    or (with ``structural_declines``) a structure that matched at least two thirds
    of the pattern before it failed — for a rule of the user's own (not
    ``Rule.shipped``), its root op and one more op. ``allow_folding=False`` is for callers that
    cannot add constants to the program (a graph-module pass): a weight that
    would need folding is declined instead. ``all_near_misses`` lifts the
    progress threshold: every structural attempt that matched the root's op is
    reported (``fusionkit explain --all-near-misses``).

    A rule whose own code raises (a constraint, a value predicate, a custom
    check, the replacement) is declined at that node with step ``error``, and
    the search goes on; with ``strict`` (default: the ``FUSIONKIT_STRICT``
    environment variable) the exception propagates instead.

    Once its constraints hold, a match's replacement is built in a scratch graph
    (:class:`~fusionkit.check.executable.ReplacementCheck`, memoised by the
    captures' metadata): one that raises or returns the wrong thing is declined
    with step ``error``, one creating an op that could not run on ``target``
    (default: ExecuTorch's CPU runtime, see
    :class:`~fusionkit.check.executable.ExecutionTarget`) with step
    ``executable``. ``check_replacements=False`` skips this (for callers that
    know every node is delegated already).
    """
    ep = as_exported_program(ep, who="find_matches()")
    strict = strict_mode(strict)
    index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)

    def replacement_check(rule: Rule) -> ReplacementCheck:
        return index.replacement_check(rule, target)

    checker = replacement_check if check_replacements else None
    inputs = ProgramInputs(ep)
    result = MatchSet()
    claimed_by: dict[Node, Match] = {}
    cache: list[_Positions] = []
    any_moved = False  # an accepted replacement goes elsewhere than before its root

    def positions() -> _Positions:
        if not cache:
            cache.append(_Positions(ep))
        return cache[0]

    graph = ep.graph_module.graph
    gated = not all_near_misses
    present = graph_op_keys(graph) if gated else None
    plans = index.plans(gated, present)
    for node in graph.nodes:
        if node.op != "call_function" or node in claimed_by:
            continue
        try:
            plan = plans[node.target]
        except (KeyError, TypeError):
            plan = index.plan(node.target, gated, present)
        for rule, gate, pattern in plan:
            during = "the pattern's gate"
            try:
                if gate is not None and not gate(node):
                    continue  # the search below would fail before any reportable progress
                during = "matching the pattern"
                decided = _Decider(rule, node, ep, inputs, claimed_by, allow_folding, positions,
                                   strict, any_moved, checker)
                accepted, failure = pattern.search(node, inputs, decided)
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
                result.declined.append(Decline.from_exception(rule.name, node, during, error))
                continue
            if accepted is not None:
                result.accepted.append(accepted)
                any_moved = any_moved or accepted.insert_before is not accepted.root
                for n in accepted.claimed:
                    claimed_by[n] = accepted
                break
            if first_decline is not None:
                result.declined.append(first_decline)
            elif structural_declines and failure.progress >= (
                    1 if all_near_misses else index.threshold(rule)):
                near_miss = failure.result(rule.name)
                if near_miss is not None:  # always: progress >= 1 means an attempt failed
                    result.declined.append(Decline.of(near_miss))
    return result
