"""The drop-in pass: find, decide, apply — for ``to_edge_transform_and_lower``.

``FusionPass(rules)`` is an ExecuTorch ``ExportedProgramPassBase``. Because
matching and every constraint run in one phase before anything changes,
``modified`` is True exactly when a replacement was applied; a run that fuses
nothing leaves the graph untouched (no recompile, no retrace). Every replacement is built first, in a scratch graph, while the matches are
decided (:mod:`fusionkit.check.executable`): one that raises is declined with
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
from fusionkit.check.executable import ExecutionTarget
from fusionkit.match.finder import MatchSet, RuleIndex, find_matches
from fusionkit.program import ProgramLike, as_exported_program
from fusionkit.report import FusionReport, RuleReport
from fusionkit.rule import Rule
from fusionkit.strict import strict_mode

__all__ = ["FusionPass"]

log = logging.getLogger("fusionkit")


class FusionPass(ExportedProgramPassBase):
    """Applies ``rules`` to an ExportedProgram (ATen or edge dialect)."""

    def __init__(self, rules: Iterable[Rule], name: str = "fusionkit", *,
                 strict: bool | None = None, target: ExecutionTarget | None = None) -> None:
        self.index = RuleIndex(rules)  # validates names, indexes by root op, once
        self.name = name
        #: where the program will run (None: ExecuTorch's CPU runtime and the ops
        #: the shipped backends' registries list; see ExecutionTarget)
        self.target = target
        #: None: read ``FUSIONKIT_STRICT`` at each run
        self.strict = strict
        #: report of the most recent run
        self.report = FusionReport({r.name: RuleReport(r.name) for r in self.index.rules})
        #: reports of every run, in order
        self.history: list[FusionReport] = []

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.index.rules

    def call(self, exported_program: ProgramLike) -> ExportedProgramPassResult:
        """Apply the rules to ``exported_program`` in place (an ``ExportedProgram``, or the
        program of an ``EdgeProgramManager``)."""
        exported_program = as_exported_program(exported_program, who="FusionPass", rewrite=True)
        strict = strict_mode(self.strict)
        ms = find_matches(exported_program, self.index, strict=strict, target=self.target)
        if ms.accepted:
            applied = apply_matches(exported_program, ms.accepted, strict=strict)
            if applied.failed:
                ms = MatchSet(applied.applied,
                              [*ms.declined, *(f.result() for f in applied.failed)])
        self.report = FusionReport.from_matches([r.name for r in self.rules], ms)
        self.history.append(self.report)
        for d in ms.declined:
            if d.step == "error":
                log.warning("%s: %s", self.name, d)
            elif d.step == "executable":
                log.info("%s: %s", self.name, d)
        return ExportedProgramPassResult(exported_program, bool(ms.accepted))

    def __repr__(self) -> str:
        return f"FusionPass({self.name!r}, rules={[r.name for r in self.rules]})"

