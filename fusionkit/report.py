"""What a fusion pass did, per rule: fused counts and declines by reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fusionkit.finder import Decline, Match, MatchSet

__all__ = ["FusionReport", "RuleReport"]


@dataclass
class RuleReport:
    rule: str
    fused: int = 0
    folded: int = 0
    declines: list[Decline] = field(default_factory=list)

    def declines_by_step(self) -> Counter[str]:
        return Counter(d.step for d in self.declines)


@dataclass
class FusionReport:
    """Per-rule outcome of one pass run. ``str()`` gives an aligned table."""

    rules: dict[str, RuleReport] = field(default_factory=dict)
    accepted: list[Match] = field(default_factory=list)
    declined: list[Decline] = field(default_factory=list)

    @classmethod
    def from_matches(cls, rule_names: list[str], ms: MatchSet) -> FusionReport:
        rep = cls({n: RuleReport(n) for n in rule_names}, list(ms.accepted), list(ms.declined))
        for m in ms.accepted:
            r = rep.rules[m.rule.name]
            r.fused += 1
            r.folded += len(m.folds)
        for d in ms.declined:
            rep.rules[d.rule].declines.append(d)
        return rep

    @property
    def total_fused(self) -> int:
        return sum(r.fused for r in self.rules.values())

    def merge(self, other: FusionReport) -> None:
        for name, r in other.rules.items():
            mine = self.rules.setdefault(name, RuleReport(name))
            mine.fused += r.fused
            mine.folded += r.folded
            mine.declines.extend(r.declines)
        self.accepted.extend(other.accepted)
        self.declined.extend(other.declined)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rules": [
                {
                    "rule": r.rule,
                    "fused": r.fused,
                    "folded_constants": r.folded,
                    "declined": [
                        {"root": d.root.name, "step": d.step,
                         "node": d.node.name if d.node is not None else None,
                         "reason": d.reason}
                        for d in r.declines
                    ],
                }
                for r in self.rules.values()
            ],
            "accepted": [
                {"rule": m.rule.name, "root": m.root.name,
                 "nodes": [n.name for n in m.claimed],
                 "folded": {k: v.name for k, v in m.folds.items()}}
                for m in self.accepted
            ],
        }

    def __str__(self) -> str:
        """An aligned table of the rules that found something, then every decline."""
        active = [r for r in self.rules.values() if r.fused or r.declines]
        rows = [("rule", "fused", "folded", "declined")]
        rows += [(r.rule, str(r.fused), str(r.folded), str(len(r.declines))) for r in active]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                 for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        idle = len(self.rules) - len(active)
        if idle:
            lines.append(f"({idle} more rule{'s' if idle > 1 else ''} found no candidate)")
        for d in self.declined:
            lines.append(f"  declined {d}")
        return "\n".join(lines)
