"""The drop-in pass: find, decide, apply — for ``to_edge_transform_and_lower``.

``FusionPass(rules)`` is an ExecuTorch ``ExportedProgramPassBase``. Because
matching and every constraint run in one phase before anything changes,
``modified`` is True exactly when a replacement was applied; a run that fuses
nothing leaves the graph untouched (no recompile, no retrace).
"""

from __future__ import annotations

from collections.abc import Iterable

from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram

from fusionkit.finder import RuleIndex, find_matches
from fusionkit.report import FusionReport, RuleReport
from fusionkit.rewrite import apply_matches
from fusionkit.rule import Rule

__all__ = ["FusionPass"]


class FusionPass(ExportedProgramPassBase):
    """Applies ``rules`` to an ExportedProgram (ATen or edge dialect)."""

    def __init__(self, rules: Iterable[Rule], name: str = "fusionkit") -> None:
        self.index = RuleIndex(rules)  # validates names, indexes by root op, once
        self.name = name
        #: report of the most recent run
        self.report = FusionReport({r.name: RuleReport(r.name) for r in self.index.rules})
        #: reports of every run, in order
        self.history: list[FusionReport] = []

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.index.rules

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        ms = find_matches(exported_program, self.index)
        self.report = FusionReport.from_matches([r.name for r in self.rules], ms)
        self.history.append(self.report)
        if not ms.accepted:
            return ExportedProgramPassResult(exported_program, False)
        apply_matches(exported_program, ms.accepted)
        return ExportedProgramPassResult(exported_program, True)

    def __repr__(self) -> str:
        return f"FusionPass({self.name!r}, rules={[r.name for r in self.rules]})"
