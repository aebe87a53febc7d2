"""The match phase as one pipeline: find every match and decide it, with the
ExportedProgram at hand. Nothing here modifies the program.

:func:`find_matches` runs four stages, each in its own module, in this order, and no
stage calls back into this one (``tests/test_architecture.py`` walks a pass and checks):

1. **targets** (:mod:`fusionkit.targets`): each call node's op key, and the rules
   rooted at that op, by priority (:meth:`RuleIndex.for_target`);
2. **gates** (:mod:`fusionkit.match.gates`): a rule is not searched at a node where its
   gate proves the search would fail before any reportable progress;
3. **matcher** (:mod:`fusionkit.match.matcher`): each rule's pattern compiled for searching;
4. **decide** (:mod:`fusionkit.find.decide`): in graph order, each candidate searched and
   each binding decided: accepted (a :class:`Match`) or declined with a reason.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from fusionkit import events
from fusionkit.edit.meta_cache import keys_remembered
from fusionkit.find.decide import (
    DECLINE_STEPS,
    Candidate,
    Match,
    MatchSet,
    Settings,
    decide_in_order,
)
from fusionkit.find.executable import ExecutionTarget, ReplacementCheck
from fusionkit.match.gates import GATE_DEPTH, Gate, GateLike, gate_of, specialize
from fusionkit.match.matcher import CompiledPattern, compile_pattern
from fusionkit.match.required_ops import requires_one_of
from fusionkit.match.shape_guards import guards_suppressed
from fusionkit.program import ProgramLike, as_exported_program
from fusionkit.program_inputs import ProgramInputs
from fusionkit.rule import Rule
from fusionkit.strict import strict_mode
from fusionkit.targets import graph_op_keys, op_key

__all__ = ["DECLINE_STEPS", "DeferredRules", "Match", "MatchSet", "RuleIndex", "find_matches"]

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
class DeferredRules:
    """Rules built the first time a searched program holds one of their root ops.

    Building a rule set's patterns is a fixed cost of the first lowering in a process;
    a program pays only for the rules rooted at ops it holds. ``roots`` must name every
    op key the built rules are rooted at (a rule rooted elsewhere is an error when built).
    ``needs``: op keys of which every match of every rule holds a node (a quantized
    linear's quantize / dequantize; an error when built if a pattern does not require
    one): a program holding none of them neither builds nor searches the group, so a
    float program is not told it nearly matched a quantized pattern (with every near miss
    wanted, it is searched as if ``needs`` were empty).
    """

    roots: frozenset[str]
    build: Callable[[], Sequence[Rule]]
    #: what the rules are, for messages (a factory's qualified name)
    label: str = ""
    needs: frozenset[str] = frozenset()


class RuleIndex:
    """Rules grouped by the op key of their root, in priority order (built once).

    ``deferred``: rule groups built when a program first holds one of their root ops
    (:class:`DeferredRules`); :attr:`rules` builds them all.
    """

    def __init__(self, rules: Iterable[Rule], deferred: Iterable[DeferredRules] = ()) -> None:
        self._eager: tuple[Rule, ...] = tuple(rules)
        #: deferred groups in order; None once built (their rules are in ``_built``)
        self._pending: list[DeferredRules | None] = list(deferred)
        self._built: list[tuple[Rule, ...]] = [() for _ in self._pending]
        self._pending_keys: dict[str, list[int]] = defaultdict(list)
        for i, d in enumerate(self._pending):
            for key in d.roots:  # type: ignore[union-attr]
                self._pending_keys[key].append(i)
        self._entries: dict[str, list[tuple[int, int, Rule]]] = defaultdict(list)
        self._names: set[str] = set()
        self._by_key: dict[str, tuple[Rule, ...]] = {}
        self._add(self._eager, 0)
        #: for_target memo by target object (looked up once per distinct target of a graph)
        self._by_target: dict[Any, tuple[Rule, ...]] = {}
        self._thresholds: dict[Rule, int] = {}
        self._gates: dict[Rule, GateLike | None] = {}
        self._replacement_checks: dict[tuple[Rule, ExecutionTarget | None], ReplacementCheck] = {}
        #: the op keys of the program being searched (:meth:`admit`); None: every group's
        #: ``needs`` counts as held
        self._present: frozenset[str] | None = None
        #: whether some group states ``needs``; a built one's rules -> its ``needs``
        self._needy = any(d.needs for d in self._pending if d is not None)
        self._needs_of: dict[Rule, frozenset[str]] = {}

    def admit(self, present: frozenset[str] | None) -> None:
        """The op keys of the program about to be searched (None: as if it held every
        group's ``needs``): a group whose ``needs`` it lacks is not built or searched."""
        if present != self._present and self._needy:
            self._by_target.clear()  # a needy group's eligibility may have changed
        self._present = present

    def _eligible(self, i: int) -> bool:
        d = self._pending[i]
        return (d is None or not d.needs or self._present is None
                or not d.needs.isdisjoint(self._present))

    @property
    def rules(self) -> tuple[Rule, ...]:
        """Every rule, the deferred ones built (in the order they were given)."""
        for i in range(len(self._pending)):
            self._build(i)
        return (*self._eager, *(r for group in self._built for r in group))

    def _add(self, rules: Sequence[Rule], first: int, roots: frozenset[str] | None = None,
             label: str = "") -> None:
        names = [r.name for r in rules]
        dupes = sorted({n for n in names if names.count(n) > 1 or n in self._names})
        if dupes:
            raise ValueError(f"duplicate rule names: {dupes}")
        for order, r in enumerate(rules, first):
            if roots is not None and not r.root_keys <= roots:
                raise ValueError(f"rule {r.name!r} of {label or 'a deferred group'} is rooted at "
                                 f"{sorted(r.root_keys - roots)}, which its roots "
                                 f"{sorted(roots)} do not name")
            for key in r.root_keys:
                self._entries[key].append((-r.priority, order, r))
                self._by_key[key] = tuple(e[2] for e in sorted(
                    self._entries[key], key=lambda t: (t[0], t[1])))
        self._names.update(names)

    def _build(self, i: int) -> None:
        d = self._pending[i]
        if d is None:
            return
        self._pending[i] = None
        built = tuple(d.build())
        if d.needs:
            unbacked = [r.name for r in built if not requires_one_of(r.pattern, d.needs)]
            if unbacked:
                raise ValueError(f"rules {unbacked} of {d.label or 'a deferred group'} can "
                                 f"match without a node of {sorted(d.needs)}, which the "
                                 "group states every match holds")
            self._needs_of.update((r, d.needs) for r in built)
        # orders after every eager rule, groups in the order given
        self._add(built, (i + 1) << 20, d.roots, d.label)
        self._built[i] = built
        self._by_target.clear()  # a group rooted at several ops changes their lookups

    def compiled(self, rule: Rule) -> CompiledPattern:
        """The rule's pattern compiled for searching (once per pattern object, process-wide)."""
        return compile_pattern(rule.pattern)

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
        waiting = self._pending_keys.pop(key, None)
        if waiting:
            ready = [i for i in waiting if self._eligible(i)]
            if len(ready) < len(waiting):  # the rest: built when a program holds their needs
                self._pending_keys[key] = [i for i in waiting if i not in ready]
            for i in ready:
                self._build(i)
        rules = self._by_key.get(key, ())
        present = self._present
        if self._needs_of and present is not None:  # built for an earlier program
            rules = tuple(r for r in rules if (n := self._needs_of.get(r)) is None
                          or not n.isdisjoint(present))
        return rules

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
    (:class:`~fusionkit.find.executable.ReplacementCheck`, memoised by the
    captures' metadata): one that raises or returns the wrong thing is declined
    with step ``error``, one creating an op that could not run on ``target``
    (default: ExecuTorch's CPU runtime, see
    :class:`~fusionkit.find.executable.ExecutionTarget`) with step
    ``executable``. ``check_replacements=False`` skips this (for callers that
    know every node is delegated already).
    """
    begun = time.perf_counter()
    ep = as_exported_program(ep, who="find_matches()")
    index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)
    graph = ep.graph_module.graph
    present = graph_op_keys(graph)
    # 1. targets: the rules rooted at each call node's op, by priority (of the rules that
    #    need an op, those whose needs the program holds)
    index.admit(None if all_near_misses else present)
    rooted = [(n, found) for n in graph.nodes
              if n.op == "call_function" and (found := index.for_target(n.target))]
    # 2. gates: each try the gate lets by (or the exception it raised, reported at the try);
    #    every try when every near miss is wanted
    tried = ([(n, tuple((r, None) for r in rs)) for n, rs in rooted] if all_near_misses
             else _gated(index, rooted, present))
    # 3. matcher: every rule rooted in the graph compiled (once per pattern, process-wide)
    compiled = {r: index.compiled(r) for r in {r: None for _, rs in rooted for r in rs}}
    candidates: list[Candidate] = [
        (n, tuple((r, compiled[r], gate_error) for r, gate_error in tries))
        for n, tries in tried]
    # 4. decide: in graph order, search each candidate and decide its bindings
    checks = ({r: index.replacement_check(r, target) for r in compiled}
              if check_replacements else None)
    # (each captured value's metadata key, which memoised checks ask for, computed once)
    with keys_remembered(), guards_suppressed(graph):
        result = decide_in_order(ep, candidates, Settings(
            ProgramInputs(ep), {r: index.threshold(r) for r in compiled}, checks,
            structural_declines=structural_declines, allow_folding=allow_folding,
            all_near_misses=all_near_misses, strict=strict_mode(strict)))
    events.decided(result, time.perf_counter() - begun)
    return result


def _gated(index: RuleIndex, rooted: Sequence[tuple[Node, Sequence[Rule]]],
           present: frozenset[str]) -> list[tuple[Node, tuple[tuple[Rule, Exception | None], ...]]]:
    """Of each node's rules, those whose gate (specialized to the graph's op keys
    ``present``: the same verdicts, less work) lets the node by, or raised there."""
    checks: dict[Rule, Any] = {}
    for _, rs in rooted:
        for r in rs:
            if r not in checks:
                gate = index.gate(r)
                if gate is not None:
                    gate = specialize(gate, present)
                checks[r] = (None if gate is None else
                             gate.operands_check if isinstance(gate, Gate) else gate.check)
    out = []
    for node, rs in rooted:
        tries: list[tuple[Rule, Exception | None]] = []
        for r in rs:
            check = checks[r]
            try:
                if check is not None and not check(node):
                    continue  # the search would fail before any reportable progress
            except Exception as e:
                tries.append((r, e))
                continue
            tries.append((r, None))
        if tries:
            out.append((node, tuple(tries)))
    return out
