"""How the command line and the demo show matches and reports: rows, JSON, text.

One place for the presentation of :class:`~fusionkit.find.finder.MatchSet` and
:class:`~fusionkit.report.FusionReport`, so ``explain``, ``lower`` and the demo
print the same thing; the JSON records are the core's (:mod:`fusionkit.report`).
"""

from __future__ import annotations

from typing import Any

from fusionkit.find.finder import MatchSet
from fusionkit.report import FusionReport, decline_record, match_record, text_table
from fusionkit.result import MatchResult

__all__ = ["LEGEND", "PREPROCESS_FOLDS", "explain_json", "explain_rows", "lower_text",
           "preprocess_lines", "report_text", "why_not_text"]


def _graph_order(ms: MatchSet) -> dict[Any, int]:
    roots = [m.root for m in ms.accepted] + [d.root for d in ms.declined]
    return {n: i for i, n in enumerate(roots[0].graph.nodes)} if roots else {}


def explain_rows(ms: MatchSet) -> list[tuple[str, ...]]:
    """One row per match, in graph order: rule, verdict, root, step, node, reason."""
    order = _graph_order(ms)
    items: list[tuple[int, tuple[str, ...]]] = []
    for m in ms.accepted:
        folded = ", ".join(f"{k} folded from `{v.name}`" for k, v in m.folds.items())
        items.append((order.get(m.root, 0), (m.rule.name, "fused", m.root.name, "-", "-",
                                             folded or f"{len(m.claimed)} nodes")))
    for d in ms.declined:  # a rule whose own code raised is an "error", not a decline
        verdict = "error" if d.step == "error" else "declined"
        items.append((order.get(d.root, 0), (d.rule, verdict, d.root.name, d.step,
                                             d.node.name if d.node is not None else "-", d.reason)))
    items.sort(key=lambda t: t[0])
    return [row for _, row in items]


def explain_json(ms: MatchSet) -> dict[str, Any]:
    """The accepted and declined matches as JSON records; rule errors listed apart."""
    return {"accepted": [match_record(m) for m in ms.accepted],
            "declined": [decline_record(d) for d in ms.declined if d.step != "error"],
            "errors": [decline_record(d) for d in ms.errors]}


def report_text(report: FusionReport) -> str:
    """A pass report as a table of the rules that fused or declined something (or whose
    code raised), then one line per decline and rule error; an explicit line when no rule
    found anything."""
    active = [r for r in report.rules.values() if r.fused or r.declines]
    idle = len(report.rules) - len(active)
    if not active:
        return (f"no fusion rule matched ({len(report.rules)} rule"
                f"{'' if len(report.rules) == 1 else 's'} tried)")
    rows = [(r.rule, r.fused, r.folded, r.declined, len(r.errors)) for r in active]
    lines = [text_table(["rule", "fused", "folded consts", "declined", "errors"], rows,
                        right=(1, 2, 3, 4))]
    if idle:
        lines.append(f"({idle} more rule{'s' if idle > 1 else ''} matched nothing)")
    for d in report.declined:
        verdict = "ERROR in" if d.step == "error" else "declined"
        lines.append(f"  {verdict} {d.rule} at `{d.root.name}` ({d.step}): {d.reason}")
    return "\n".join(lines)


#: preprocess rewrites that fold one op into another's constants, and what they fold
PREPROCESS_FOLDS: dict[str, str] = {
    "FuseBatchNormPass": "conv + batch norm: the norm folded into the conv's weight and bias",
    "FuseBatchNorm2dPass": "conv + batch norm: the norm folded into the conv's weight and bias",
    "FoldQDQPass": "quantize/dequantize pairs folded",
}

#: the one line that says what the words of ``lower``'s report mean
LEGEND = ("legend: fused = a matched op pattern replaced by one op; folded = a constant "
          "computed now from parameters (a cast or `1.0 + weight`, a batch norm into its conv); "
          "declined = a match left as plain ops, with the reason; error = the rule's own code "
          "raised")


def preprocess_lines(preprocess: dict[str, dict[str, int]]) -> list[str]:
    """What the backend's preprocess rewrites (stock passes run as rules) changed, one line
    per pass that changed or declined something."""
    lines = []
    for name, c in preprocess.items():
        fused, declined = c.get("fused", 0), c.get("declined", 0)
        what = PREPROCESS_FOLDS.get(name)
        done = f"{fused} folded ({what})" if what else f"{fused} rewritten"
        lines.append(f"  {name}: {done}" + (f", {declined} declined" if declined else ""))
    return lines


def lower_text(report: FusionReport, preprocess: dict[str, dict[str, int]], backend: str) -> str:
    """``fusionkit lower``: the fusion rules that matched or declined, the folds and rewrites
    done in the backend's preprocess, a line when nothing changed, and the legend."""
    if report.rules:
        lines = [f"fusion rules ({backend}, before partitioning):", report_text(report)]
    else:
        lines = [f"fusion rules ({backend}, before partitioning): none (this adapter's rules "
                 "run in preprocess)"]
    pre = preprocess_lines(preprocess)
    if pre:
        lines.append(f"in {backend} preprocess (ExecuTorch's rewrites, run as fusionkit rules):")
        lines.extend(pre)
    else:
        lines.append(f"in {backend} preprocess: nothing rewritten or folded by fusionkit's rules")
    if not report.total_fused and not any(c.get("fused", 0) for c in preprocess.values()):
        lines.append("nothing was fused or folded: the program is lowered as exported")
    lines.append(LEGEND)
    return "\n".join(lines)


def why_not_text(w: MatchResult) -> str:
    """``fusionkit explain --rule R --at NODE``: the verdict, then the evidence, one per line."""
    head = {"fused": "fused here", "inside": "not here: the node belongs to another match",
            "declined": "declined here", "error": "declined here: the rule's own code raised",
            "not_root": "never tried here"}[w.status]
    lines = [f"{w.rule} at `{w.root.name}`: {head}", f"  step:   {w.step}"]
    if w.node is not None:
        lines.append(f"  node:   `{w.node.name}`")
    lines.append(f"  reason: {w.reason}")
    if w.claimed and w.status != "fused":
        what = "matched before it stopped" if w.step == "structure" else "matched"
        lines.append(f"  {what}: {', '.join(f'`{n.name}`' for n in w.claimed)}")
    return "\n".join(lines)
