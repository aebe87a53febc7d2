"""Multi-output examples: the further outputs of a trace, and alternatives merged.

An example that returns several values becomes an :class:`~fusionkit.match.pattern.Outputs`
pattern: the first output is the root, each further one an
:class:`~fusionkit.match.pattern.Also` found downstream of the input nearest to it
(the matcher searches forwards from that capture, a few steps further than the
example needed). Several search functions (spellings of one computation) merge
into one pattern: alternatives at the root, and output by output for
multi-output ones, which must agree on how many outputs there are and where each
is found from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch.fx import Node

from fusionkit.authoring.example_trace import ExampleError, ExampleTrace
from fusionkit.match.pattern import Also, Outputs, Pattern, PatternVisitor

__all__ = ["further_outputs", "merge_alternatives"]


def _distance(src: Node, dst: Node, limit: int = 64) -> int | None:
    """Steps through users from ``src`` to ``dst`` (None if not within ``limit``)."""
    frontier, seen = [src], {src}
    for d in range(1, limit):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u is dst:
                    return d
                if u not in seen:
                    seen.add(u)
                    nxt.append(u)
        frontier = nxt
    return None


def further_outputs(primary: Pattern, outs: Sequence[Node], names: Sequence[str],
                    tr: ExampleTrace, convert: Callable[[Node], tuple[Pattern, Node]]
                    ) -> Outputs:
    """``primary`` and one :class:`Also` per further output node of ``tr``.

    ``convert`` turns an output node into its pattern and the op node it is rooted
    at (past casts); each is found from the nearest input the earlier outputs bind.
    """
    others = []
    bound_caps = primary.captures()
    for o, nm in zip(outs, names, strict=True):
        pat, root = convert(o)
        best: tuple[int, str] | None = None
        for ph in tr.ep.graph.nodes:
            cname = tr.names.get(ph.name)
            if ph.op != "placeholder" or cname is None or cname not in bound_caps:
                continue
            d = _distance(ph, root)
            if d is not None and (best is None or d < best[0]):
                best = (d, cname)
        if best is None:
            raise ExampleError(f"output {nm!r} shares no input with the first output; "
                               "a multi-output rule needs one to find it from")
        others.append(Also(nm, pat, best[1], max(12, best[0] + 4)))
        bound_caps |= pat.captures() | {nm}
    return Outputs(primary, tuple(others))


class _AsOutputs(PatternVisitor["Outputs | None"]):
    """A multi-output pattern as itself; a one-output pattern (any other kind) as None."""

    def generic(self, p: Pattern) -> Outputs | None:
        return None

    def visit_outputs(self, p: Outputs) -> Outputs | None:
        return p


def merge_alternatives(patterns: Sequence[Pattern]) -> Pattern:
    """One pattern matching what any of ``patterns`` (traced alternatives) matches."""
    if len(patterns) == 1:
        return patterns[0]
    multi = [p.accept(_AsOutputs()) for p in patterns]
    outs = [m for m in multi if m is not None]
    if outs and len(outs) < len(patterns):
        raise ExampleError("alternative search functions return different numbers of outputs")
    if outs:
        n = len(outs[0].others)
        if any(len(o.others) != n for o in outs):
            raise ExampleError("alternative search functions return different numbers of outputs")
        others = []
        for k in range(n):
            alts = [o.others[k] for o in outs]
            if len({(a.name, a.near) for a in alts}) != 1:
                raise ExampleError("alternative search functions find their further outputs "
                                   "from different inputs")
            others.append(Also(alts[0].name, merge_alternatives([a.pattern for a in alts]),
                               alts[0].near, max(a.max_depth for a in alts)))
        return Outputs(merge_alternatives([o.primary for o in outs]), tuple(others))
    merged = patterns[0]
    for p in patterns[1:]:
        merged = merged | p  # alternatives of alternatives flatten into one Alt
    return merged
