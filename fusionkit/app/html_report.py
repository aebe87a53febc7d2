"""``fusionkit explain --html``: one self-contained page picturing every match.

Each fused and each declined match is drawn as the graph around it: the nodes
the rule matched (green when fused, amber when declined), the node at fault
(red, thick border), the root (double border), one step of context in grey,
and the reason as the drawing's caption. A backend author sees at a glance
which operand broke a pattern instead of reading node names in a table.

Layout is Graphviz's ``dot`` (``-Tsvg``): the standard layered layout for
dataflow graphs, maintained for decades, installed by ``scripts/bootstrap``
(Debian ``graphviz``). Its SVG is inlined, so the page needs no network, no
script and no external stylesheet.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torch.fx import Node

from fusionkit.authoring.verify import Verification
from fusionkit.find.finder import Match, MatchSet
from fusionkit.result import MatchResult, Status
from fusionkit.targets import op_key

__all__ = ["GraphvizMissing", "Item", "render_html", "render_svg", "write_html"]

#: how many steps of context around the matched nodes are drawn
CONTEXT = 1
#: the most context nodes drawn per side of one match (a wide fan-out is elided)
MAX_CONTEXT = 12

FUSED, DECLINED, FAULT, CONTEXT_FILL = "#b7e4c7", "#ffe08a", "#ff6b6b", "#f1f3f5"


class GraphvizMissing(RuntimeError):
    """Graphviz's ``dot`` is not installed (``bash scripts/bootstrap`` installs it)."""


@dataclass(frozen=True)
class Item:
    """One drawing: a fused match or a declined one."""

    rule: str
    root: Node
    verdict: str  # "fused", "declined", or "error" (a rule's own code raised)
    step: str
    fault: Node | None
    reason: str
    matched: tuple[Node, ...]

    @staticmethod
    def of(x: Match | MatchResult) -> Item:
        if isinstance(x, Match):
            folded = ", ".join(f"{k} folded from `{v.name}`" for k, v in x.folds.items())
            return Item(x.rule.name, x.root, "fused", "fused", None,
                        folded or f"{len(x.claimed)} nodes replaced", tuple(x.claimed))
        verdict = {Status.FUSED: "fused", Status.ERROR: "error"}.get(x.status, "declined")
        # what it matched, the root always drawn (why_not's verdict: the node asked about)
        matched = x.claimed if x.root in x.claimed else (x.root, *x.claimed)
        return Item(x.rule, x.root, verdict, x.step, x.node, x.reason, matched)


def _label(n: Node) -> str:
    if n.op == "call_function":
        key = op_key(n.target) or str(getattr(n.target, "__name__", n.target))
        return f"{n.name}\n{key.removeprefix('aten.')}"
    return f"{n.name}\n({n.op})"


def _dot_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _wrap(text: str, width: int = 90) -> str:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return "\n".join(lines)


def _neighbourhood(core: Sequence[Node]) -> list[Node]:
    inside = dict.fromkeys(core)
    ring: dict[Node, None] = {}
    frontier = list(core)
    for _ in range(CONTEXT):
        nxt: list[Node] = []
        for n in frontier:
            ins = [a for a in n.all_input_nodes if a not in inside and a not in ring]
            outs = [u for u in n.users if u not in inside and u not in ring and u.op != "output"]
            for m in (ins + outs)[:MAX_CONTEXT]:
                ring[m] = None
                nxt.append(m)
        frontier = nxt
    return [*inside, *ring]


def item_dot(item: Item, prefix: str = "") -> str:
    """The Graphviz source of one item's drawing (SVG element ids ``{prefix}node-{name}``)."""
    core = list(dict.fromkeys([*item.matched, *([item.fault] if item.fault is not None else [])]))
    nodes = _neighbourhood(core)
    drawn = set(nodes)
    ids = {n: f"n{i}" for i, n in enumerate(nodes)}
    matched = set(item.matched)
    lines = [
        "digraph G {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, labelloc=t, '
        f"label={_dot_str(_wrap(f'{item.rule} at {item.root.name}: {item.step}: {item.reason}'))}];",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, '
        f'fillcolor="{CONTEXT_FILL}", color="#adb5bd"];',
        '  edge [color="#868e96", arrowsize=0.6];',
    ]
    fill = FUSED if item.verdict == "fused" else DECLINED
    for n in nodes:
        attrs = [f"label={_dot_str(_label(n))}", f"id={_dot_str(f'{prefix}node-{n.name}')}",
                 f"tooltip={_dot_str(n.name)}"]
        if n is item.fault:
            attrs += [f'fillcolor="{FAULT}"', 'color="#c92a2a"', "penwidth=3"]
        elif n in matched:
            attrs += [f'fillcolor="{fill}"', 'color="#495057"']
        if n is item.root:
            attrs += ["peripheries=2"]
        lines.append(f"  {ids[n]} [{', '.join(attrs)}];")
    for n in nodes:
        for a in n.all_input_nodes:
            if a in drawn:
                style = "" if (a in matched and n in matched) else ' [style=dashed]'
                lines.append(f"  {ids[a]} -> {ids[n]}{style};")
    lines.append("}")
    return "\n".join(lines)


def render_svg(dot_source: str) -> str:
    """``dot -Tsvg`` of ``dot_source``: an ``<svg>`` element (no XML prolog)."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing("Graphviz `dot` is not installed (apt-get install graphviz; "
                              "`bash scripts/bootstrap` does it)")
    out = subprocess.run([exe, "-Tsvg"], input=dot_source.encode(), capture_output=True,
                         check=False, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"dot failed: {out.stderr.decode(errors='replace').strip()}")
    svg = out.stdout.decode()
    return svg[svg.index("<svg"):]


_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 2em; color: #212529; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { border: 1px solid #dee2e6; padding: 4px 8px; text-align: left; vertical-align: top; }
.fused { background: #b7e4c7; } .declined { background: #ffe08a; } .error { background: #ffc9c9; }
figure { margin: 1em 0; border: 1px solid #dee2e6; padding: 1em; overflow-x: auto; }
figcaption { font-size: 0.9em; margin-bottom: 0.5em; }
.legend span { display: inline-block; padding: 2px 8px; margin-right: 6px; border: 1px solid #adb5bd; }
.verify-equal { background: #d1e7dd; } .verify-different { background: #f8d7da; font-weight: bold; }
.verify-cannot-check { background: #fff3cd; }
"""


def _section(i: int, item: Item) -> str:
    esc = html.escape
    fault = f" at fault: <code>{esc(item.fault.name)}</code>;" if item.fault is not None else ""
    svg = render_svg(item_dot(item, prefix=f"item-{i}-"))
    return (f'<section class="match" id="item-{i}" data-rule="{esc(item.rule)}" '
            f'data-verdict="{item.verdict}" data-root="{esc(item.root.name)}">\n'
            f"<h2>{i}. <code>{esc(item.rule)}</code> {item.verdict} at "
            f"<code>{esc(item.root.name)}</code></h2>\n<figure>\n"
            f'<figcaption><b>{esc(item.step)}</b>:{fault} <span class="reason">'
            f"{esc(item.reason)}</span></figcaption>\n{svg}\n</figure>\n</section>")


def _verified(v: Verification | None) -> str:
    """A rule's verification status as a table cell (``fusionkit explain --verify``)."""
    if v is None:
        return "<td>-</td>"
    return (f'<td class="verify-{v.status.replace(" ", "-")}" title="{html.escape(str(v))}">'
            f"{html.escape(v.verdict)}</td>")


def _verification_section(results: Mapping[str, Verification]) -> str:
    esc = html.escape
    rows = "\n".join(f'<tr><td><code>{esc(n)}</code></td>{_verified(v)}<td>{v.cases}</td>'
                     f"<td>{esc(v.reason)}"
                     + "".join(f"<br><b>never fires on {esc(b)}</b>: {esc(why)}"
                               for b, why in v.never_fires.items())
                     + (f"<pre>{esc(str(v.counterexample))}</pre>" if v.counterexample else "")
                     + "</td></tr>" for n, v in results.items())
    return ('<h2 id="verification">Verification (<code>fusionkit verify</code>)</h2>\n'
            "<table><tr><th>rule</th><th>status</th><th>cases</th><th>why</th></tr>\n"
            f"{rows}\n</table>")


def render_html(items: Iterable[Item], title: str = "fusionkit explain",
                verifications: Mapping[str, Verification] | None = None) -> str:
    """The page: a summary table, then one drawing per item, in graph order.

    ``verifications`` (rule name -> :func:`~fusionkit.authoring.verify.verify`'s result)
    adds each rule's verification status to the table and a section listing them."""
    esc = html.escape
    its = list(items)
    checked = verifications or {}
    verified_head = "<th>verified</th>" if verifications is not None else ""
    rows = "\n".join(
        f'<tr class="{it.verdict}"><td><a href="#item-{i}">{i}</a></td><td>{esc(it.rule)}</td>'
        f"<td>{it.verdict}</td><td><code>{esc(it.root.name)}</code></td><td>{esc(it.step)}</td>"
        f"<td>{esc(it.fault.name) if it.fault is not None else '-'}</td><td>{esc(it.reason)}</td>"
        + (_verified(checked.get(it.rule)) if verifications is not None else "") + "</tr>"
        for i, it in enumerate(its, 1))
    fused = sum(it.verdict == "fused" for it in its)
    body = "\n".join(_section(i, it) for i, it in enumerate(its, 1))
    legend = (f'<p class="legend"><span style="background:{FUSED}">matched, fused</span>'
              f'<span style="background:{DECLINED}">matched, declined</span>'
              f'<span style="background:{FAULT}">node at fault</span>'
              f'<span style="background:{CONTEXT_FILL}">context</span> double border: root; '
              "dashed edge: into or out of the match</p>")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>\n"
            f"<h1>{esc(title)}</h1>\n<p>{fused} fused, {len(its) - fused} declined.</p>\n{legend}\n"
            "<table><tr><th>#</th><th>rule</th><th>verdict</th><th>root</th><th>step</th>"
            f"<th>node at fault</th><th>reason</th>{verified_head}</tr>\n{rows}\n</table>\n"
            + (_verification_section(verifications) + "\n" if verifications else "")
            + f"{body}\n"
            "</body></html>\n")
    return page


def items_of(ms: MatchSet) -> list[Item]:
    """Every accepted and declined match of ``ms`` as items, in graph order."""
    all_items = [Item.of(m) for m in ms.accepted] + [Item.of(d) for d in ms.declined]
    if not all_items:
        return []
    order = {n: i for i, n in enumerate(all_items[0].root.graph.nodes)}
    return sorted(all_items, key=lambda it: (order.get(it.root, 0), it.verdict != "fused"))


def write_html(path: str, items: Iterable[Item], title: str = "fusionkit explain",
               verifications: Mapping[str, Verification] | None = None) -> None:
    page = render_html(items, title, verifications)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)

