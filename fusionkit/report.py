"""What a fusion pass did, per rule: fused counts, declines by reason, and errors.

An *error* is a decline whose step is ``error``: the rule's own code raised
(a constraint, a value predicate, a replacement). It is counted apart from the
ordinary declines — a decline is the model not fitting the rule; an error is a
bug in the rule — so a report never hides one among the other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fusionkit.find.finder import Match, MatchSet
from fusionkit.result import MatchResult

__all__ = ["FusionReport", "RuleReport", "decline_record", "match_record", "text_table"]


def match_record(m: Match) -> dict[str, Any]:
    """An accepted match in the one JSON shape of a result (:meth:`MatchResult.record`),
    plus the constants it folds."""
    return {"rule": m.rule.name, "root": m.root.name, "status": "fused", "step": "fused",
            "node": None, "reason": f"fused: {len(m.claimed)} nodes replaced",
            "nodes": [n.name for n in m.claimed],
            "folded": {k: v.name for k, v in m.folds.items()}}


def decline_record(d: MatchResult) -> dict[str, Any]:
    """A declined match in the one JSON shape of a result (:meth:`MatchResult.record`)."""
    return d.record()


def text_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
               right: Sequence[int] = ()) -> str:
    """A plain aligned table; columns listed in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        return "  ".join(parts).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


@dataclass
class RuleReport:
    """One rule's outcome. ``declines`` holds every decline, errors included."""

    rule: str
    fused: int = 0
    folded: int = 0
    declines: list[MatchResult] = field(default_factory=list)

    def declines_by_step(self) -> Counter[str]:
        return Counter(d.step for d in self.declines)

    @property
    def errors(self) -> list[MatchResult]:
        """Declines whose step is ``error``: the rule's code raised."""
        return [d for d in self.declines if d.step == "error"]

    @property
    def declined(self) -> int:
        """How many declines are not errors."""
        return sum(1 for d in self.declines if d.step != "error")


@dataclass
class FusionReport:
    """Per-rule outcome of one pass run. ``str()`` gives an aligned table.

    ``declined`` holds every decline in graph order; :attr:`errors` the ones
    whose step is ``error``, which the table and :meth:`to_dict` count apart.
    """

    rules: dict[str, RuleReport] = field(default_factory=dict)
    accepted: list[Match] = field(default_factory=list)
    declined: list[MatchResult] = field(default_factory=list)

    @classmethod
    def from_matches(cls, rule_names: list[str], ms: MatchSet) -> FusionReport:
        rep = cls({n: RuleReport(n) for n in rule_names}, list(ms.accepted), list(ms.declined))
        for m in ms.accepted:
            r = rep.rules[m.rule.name]
            r.fused += 1
            r.folded += len(m.folds)
        for d in ms.declined:
            rep.rules.setdefault(d.rule, RuleReport(d.rule)).declines.append(d)
        return rep

    @property
    def total_fused(self) -> int:
        return sum(r.fused for r in self.rules.values())

    @property
    def errors(self) -> list[MatchResult]:
        """Declines whose step is ``error`` (a rule's code raised), in graph order."""
        return [d for d in self.declined if d.step == "error"]

    def merge(self, other: FusionReport) -> None:
        for name, r in other.rules.items():
            mine = self.rules.setdefault(name, RuleReport(name))
            mine.fused += r.fused
            mine.folded += r.folded
            mine.declines.extend(r.declines)
        self.accepted.extend(other.accepted)
        self.declined.extend(other.declined)

    def to_dict(self) -> dict[str, Any]:
        by_rule = [{"rule": r.rule, "fused": r.fused, "folded_constants": r.folded,
                    "declined": [decline_record(d) for d in r.declines if d.step != "error"],
                    "errors": [decline_record(d) for d in r.errors]}
                   for r in self.rules.values()]
        return {"rules": by_rule, "accepted": [match_record(m) for m in self.accepted],
                "errors": len(self.errors)}

    def __str__(self) -> str:
        """An aligned table of the rules that found something, then every decline and error."""
        active = [r for r in self.rules.values() if r.fused or r.declines]
        rows = [(r.rule, r.fused, r.folded, r.declined, len(r.errors)) for r in active]
        lines = [text_table(("rule", "fused", "folded", "declined", "errors"), rows,
                            right=(1, 2, 3, 4))]
        idle = len(self.rules) - len(active)
        if idle:
            lines.append(f"({idle} more rule{'s' if idle > 1 else ''} found no candidate)")
        for d in self.declined:
            lines.append(f"  {'ERROR in' if d.step == 'error' else 'declined'} {d.line()}")
        return "\n".join(lines)
