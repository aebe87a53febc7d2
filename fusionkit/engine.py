"""The one engine: find, decide, apply, report -- every place that runs rules calls it.

:func:`run_rules` is the loop that :class:`~fusionkit.fusion_pass.FusionPass`, the
backends' preprocess rule passes and the quantize step's fold share: find every match
of a rule set in one phase (:func:`~fusionkit.find.finder.find_matches`: every
constraint, and what the target can run, decided before anything changes), apply the
accepted ones all or nothing (:func:`~fusionkit.apply.rewrite.apply_matches`), and
report a replacement that still failed as a decline with step ``error``. What the
places running rules did differently is a parameter here, each documented below, so the
difference is stated where it is used:

* ``rounds``: how many find-and-apply rounds at most (a rewrite can make the next one
  possible: an ``mm`` that became ``linear`` may be followed by an identity view); the
  run stops at the first round that applies nothing. A transform pass runs one round;
  a backend's preprocess pass standing in for a stock loop, until a fixpoint;
* ``stop_on_failure``: stop after a round in which a replacement failed (it was undone
  alone) or a match was held back, rather than try it again in the next round;
* ``target``: where the rewritten program runs: what a replacement may create
  (:class:`~fusionkit.find.executable.ExecutionTarget`; a backend's refusal function is
  a :class:`~fusionkit.find.executable.Delegate` of it);
* ``structural_declines``, ``allow_folding``, ``check_replacements``: what the find
  phase reports and may plan (see :func:`~fusionkit.find.finder.find_matches`); a
  graph-module pass cannot add constants (``allow_folding=False``);
* ``drop_dead_constants``: whether constants left unused go (a graph-module pass's
  manager owns the signature: it keeps them);
* ``sweep_dead_code``: FX dead-code elimination after the rules -- ``"never"``,
  ``"always"`` (a stock pass that sweeps on every run), ``"if_fused"`` (only when a
  rule applied);
* ``on_found``: called with each round's decisions before they are applied, for a
  caller that reads the declined nodes while they are in the graph;
* ``strict``: a rule's own code raising is re-raised, with the program restored
  (``None``: the ``FUSIONKIT_STRICT`` setting), else it is a decline.

The result, a :class:`RuleRun`, has the matches (applied and declined), each round's
outcome, and ``modified``: True exactly when the program changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from torch.fx import Node

from fusionkit.apply.rewrite import apply_matches
from fusionkit.find.executable import ExecutionTarget
from fusionkit.find.finder import Match, MatchSet, RuleIndex, find_matches
from fusionkit.program import ProgramLike, as_exported_program
from fusionkit.report import FusionReport
from fusionkit.rule import Rule
from fusionkit.strict import strict_mode

__all__ = ["Round", "RuleRun", "Sweep", "run_rules"]

#: when :func:`run_rules` sweeps dead code after the rules
Sweep = Literal["never", "always", "if_fused"]


@dataclass(frozen=True)
class Round:
    """One find-and-apply round: what the find phase decided, and what came of it.

    ``outcome.accepted`` are the matches applied (``new_roots``: the node each one's
    replacement put in its root's place, in the same order); ``outcome.declined`` the
    find phase's declines and then the replacements that failed (step ``error``).
    """

    found: MatchSet
    outcome: MatchSet
    new_roots: tuple[Node, ...] = ()
    #: replacements that raised (undone alone) in this round
    failed: int = 0
    #: accepted matches the match gate held back (``fusionkit bisect``): not applied
    held: int = 0


@dataclass
class RuleRun:
    """What :func:`run_rules` did: its rounds, in order, and whether the program changed."""

    rounds: list[Round] = field(default_factory=list)
    #: True exactly when the program changed (a replacement applied, dead code swept)
    modified: bool = False

    @property
    def applied(self) -> list[Match]:
        """Every match applied, round after round."""
        return [m for r in self.rounds for m in r.outcome.accepted]

    @property
    def new_roots(self) -> list[Node]:
        """The node each :attr:`applied` match's replacement put in its root's place."""
        return [n for r in self.rounds for n in r.new_roots]

    @property
    def fused(self) -> int:
        return sum(len(r.outcome.accepted) for r in self.rounds)

    @property
    def matches(self) -> MatchSet:
        """Applied matches of every round; the declines of the last round (what is left
        declined in the program) and the replacements that failed in earlier ones."""
        if not self.rounds:
            return MatchSet()
        *earlier, last = self.rounds
        failed = [d for r in earlier for d in r.outcome.declined[len(r.found.declined):]]
        return MatchSet(self.applied, [*failed, *last.outcome.declined])

    def report(self, rule_names: Iterable[str]) -> FusionReport:
        """The per-rule report (every rule in ``rule_names`` listed, fused or not)."""
        return FusionReport.from_matches(list(rule_names), self.matches)


def run_rules(program: ProgramLike, rules: Sequence[Rule] | RuleIndex, *,
              target: ExecutionTarget | None = None, strict: bool | None = None,
              rounds: int = 1, stop_on_failure: bool = False,
              structural_declines: bool = True, allow_folding: bool = True,
              check_replacements: bool = True, drop_dead_constants: bool = True,
              sweep_dead_code: Sweep = "never",
              on_found: Callable[[MatchSet], object] | None = None) -> RuleRun:
    """Find, decide and apply ``rules`` on ``program`` in place; see the module for each
    parameter. ``program``: an ``ExportedProgram`` (or a program manager: its program).
    An empty rule list runs no round (the sweep still runs)."""
    ep = as_exported_program(program, who="run_rules()", rewrite=True)
    strict = strict_mode(strict)
    run = RuleRun()
    if not isinstance(rules, RuleIndex):
        rules = list(rules)
        rounds = rounds if rules else 0
        rules = RuleIndex(rules)  # validated and indexed once for every round
    for _ in range(rounds):
        found = find_matches(ep, rules, strict=strict, target=target,
                             structural_declines=structural_declines,
                             allow_folding=allow_folding, check_replacements=check_replacements)
        if on_found is not None:
            on_found(found)
        if not found.accepted:
            run.rounds.append(Round(found, found))
            break
        done = apply_matches(ep, found.accepted, drop_dead_constants=drop_dead_constants,
                             strict=strict)
        outcome = MatchSet(done.applied, [*found.declined, *(f.result() for f in done.failed)])
        run.rounds.append(Round(found, outcome, tuple(done.new_roots), len(done.failed),
                                len(done.held)))
        if not done.applied or (stop_on_failure and (done.failed or done.held)):
            break
    fused = run.fused
    if sweep_dead_code == "always" or (sweep_dead_code == "if_fused" and fused):
        gm = ep.graph_module
        if gm.graph.eliminate_dead_code():  # (applying marked the code stale already)
            gm.recompile()
            run.modified = True
    run.modified = run.modified or bool(fused)
    return run
