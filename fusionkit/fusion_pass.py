"""The drop-in pass: find, decide, apply — for ``to_edge_transform_and_lower``.

``FusionPass(rules)`` is an ExecuTorch ``ExportedProgramPassBase``. Because
matching and every constraint run in one phase before anything changes,
``modified`` is True exactly when a replacement was applied; a run that fuses
nothing leaves the graph untouched (no recompile, no retrace). Every replacement is built first, in a scratch graph, while the matches are
decided (:mod:`fusionkit.find.executable`): one that raises is declined with
step ``error``, one creating an op that could not run where the program runs
(``target``) with step ``executable`` — before the program changes. Applying is
all or nothing (:mod:`fusionkit.apply.rewrite`): a replacement that still raises
is undone and reported as a decline with step ``error`` — or re-raised in
strict mode (``strict=True`` or ``FUSIONKIT_STRICT=1``), with the program
unchanged. Errors are logged (``logging.getLogger("fusionkit")``, warning) as
well as reported in :attr:`FusionPass.report`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

from fusionkit.apply.rewrite import apply_matches
from fusionkit.find.executable import ExecutionTarget
from fusionkit.find.finder import MatchSet, RuleIndex, find_matches
from fusionkit.program import ProgramLike, as_exported_program
from fusionkit.report import FusionReport, RuleReport
from fusionkit.rule import Rule
from fusionkit.strict import strict_mode

__all__ = ["FusionPass"]

log = logging.getLogger("fusionkit")


class FusionPass(ExportedProgramPassBase):
    """Applies ``rules`` to an ExportedProgram (ATen or edge dialect)."""

    def __init__(self, rules: Iterable[Rule] | RuleIndex, name: str = "fusionkit", *,
                 strict: bool | None = None, target: ExecutionTarget | None = None) -> None:
        # validates names, indexes by root op, once (a RuleIndex may defer rule groups
        # until a program holds their root ops: :class:`~fusionkit.find.finder.DeferredRules`)
        self.index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)
        self.name = name
        #: where the program will run (None: ExecuTorch's CPU runtime and the ops
        #: the shipped backends' registries list; see ExecutionTarget)
        self.target = target
        #: None: read ``FUSIONKIT_STRICT`` at each run
        self.strict = strict
        # every run's matches; their reports are made when asked for (a report lists
        # every rule, which builds the deferred ones)
        self._runs: list[MatchSet] = []
        self._reports: list[FusionReport] = []

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.index.rules

    def record_run(self, ms: MatchSet) -> None:
        """Record one run's matches (what :attr:`report` and :attr:`history` show)."""
        self._runs.append(ms)

    @property
    def history(self) -> list[FusionReport]:
        """Reports of every run, in order."""
        names = None
        for ms in self._runs[len(self._reports):]:
            names = names or [r.name for r in self.rules]
            self._reports.append(FusionReport.from_matches(names, ms))
        return list(self._reports)

    @property
    def report(self) -> FusionReport:
        """Report of the most recent run (before any run: every rule, nothing fused)."""
        if not self._runs:
            return FusionReport({r.name: RuleReport(r.name) for r in self.rules})
        return self.history[-1]

    def call(self, exported_program: ProgramLike) -> ExportedProgramPassResult:
        """Apply the rules to ``exported_program`` in place (an ``ExportedProgram``, or the
        program of an ``EdgeProgramManager``)."""
        exported_program = as_exported_program(exported_program, who="FusionPass", rewrite=True)
        strict = strict_mode(self.strict)
        ms = find_matches(exported_program, self.index, strict=strict, target=self.target)
        if ms.accepted:
            applied = apply_matches(exported_program, ms.accepted, strict=strict)
            if applied.failed or applied.held:  # held back by the match gate: not fused
                ms = MatchSet(applied.applied,
                              [*ms.declined, *(f.result() for f in applied.failed)])
        self.record_run(ms)
        for d in ms.declined:
            if d.step == "error":
                log.warning("%s: %s", self.name, d)
            elif d.step == "executable":
                log.info("%s: %s", self.name, d)
        return ExportedProgramPassResult(exported_program, bool(ms.accepted))

    def __repr__(self) -> str:
        return f"FusionPass({self.name!r}, rules={[r.name for r in self.rules]})"

