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
well as reported in :attr:`FusionPass.report`. The loop itself is
:func:`fusionkit.engine.run_rules`, one round.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult

from fusionkit.engine import run_rules
from fusionkit.find.executable import ExecutionTarget
from fusionkit.find.finder import MatchSet, RuleIndex
from fusionkit.program import ProgramLike, as_exported_program
from fusionkit.report import FusionReport, RuleReport
from fusionkit.rule import Rule

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
        program of an ``EdgeProgramManager``): one round of :func:`~fusionkit.engine.run_rules`."""
        exported_program = as_exported_program(exported_program, who="FusionPass", rewrite=True)
        run = run_rules(exported_program, self.index, strict=self.strict, target=self.target)
        self.record_run(run.matches)
        self.log_declines(run.matches)
        return ExportedProgramPassResult(exported_program, run.modified)

    def log_declines(self, ms: MatchSet) -> None:
        """A rule's error as a warning, a replacement the target cannot run as info."""
        for d in ms.declined:
            if d.step == "error":
                log.warning("%s: %s", self.name, d)
            elif d.step == "executable":
                log.info("%s: %s", self.name, d)

    def __repr__(self) -> str:
        return f"FusionPass({self.name!r}, rules={[r.name for r in self.rules]})"

