"""How benchmark figures are printed: aligned tables, milliseconds, ratios, targets.

Shared by every section (``run``, ``zoo_e2e``) so a figure reads the same wherever it
is printed; nothing here measures anything.
"""

from __future__ import annotations

from collections.abc import Sequence


def fmt_table(rows: list[list[str]], head: list[str]) -> str:
    cells = [head, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
           for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.1f}"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else (f"{r:.0f}x" if r >= 100 else f"{r:.2f}x")


def fmt_spread(vals: Sequence[float]) -> str:
    return f"{min(vals):.2f}-{max(vals):.2f}" if len(vals) > 1 else "(1 run)"


class Targets:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, name: str, met: bool | None, detail: str) -> None:
        status = "SKIPPED" if met is None else ("MET" if met else "MISSED")
        self.rows.append((name, status, detail))

    def render(self) -> str:
        lines = ["== targets =="]
        w = max(len(n) for n, _, _ in self.rows)
        for name, status, detail in self.rows:
            lines.append(f"  [{status:7}] {name.ljust(w)}  {detail}")
        return "\n".join(lines)
