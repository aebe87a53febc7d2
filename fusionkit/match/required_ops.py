"""Whether every match of a pattern holds a node of one of some ops.

A rule group that cannot match without, say, a dequantize states so
(:class:`~fusionkit.find.finder.DeferredRules` ``needs``), and a program without one never
pays for building its patterns; whether the patterns require it is read from them, so a
statement a pattern does not back is an error, not a lost match.
"""

from __future__ import annotations

from fusionkit.match.pattern import (
    Also,
    Alt,
    Named,
    Op,
    Outputs,
    Pattern,
    PatternVisitor,
    Seq,
    Through,
)

__all__ = ["requires_one_of"]


class _Requires(PatternVisitor[bool]):
    """True when every match holds a node whose op is one of ``keys``."""

    def __init__(self, keys: frozenset[str]) -> None:
        self.keys = keys

    def generic(self, p: Pattern) -> bool:
        return False  # a capture or a literal claims no node

    def visit_op(self, p: Op) -> bool:
        return p.targets <= self.keys or any(
            a.accept(self) for a in (*p.args, *p.kwargs.values()))

    def visit_alt(self, p: Alt) -> bool:
        return all(o.accept(self) for o in p.options)  # whichever option matched

    def visit_named(self, p: Named) -> bool:
        return p.inner.accept(self)

    def visit_through(self, p: Through) -> bool:
        return p.inner.accept(self)  # the pass-through ops are optional

    def visit_also(self, p: Also) -> bool:
        return p.pattern.accept(self)

    def visit_outputs(self, p: Outputs) -> bool:
        return any(c.accept(self) for c in p.children())

    def visit_seq(self, p: Seq) -> bool:
        return any(i.accept(self) for i in p.items)


def requires_one_of(pattern: Pattern, keys: frozenset[str]) -> bool:
    """Whether every match of ``pattern`` holds a node whose op key is in ``keys``."""
    return pattern.accept(_Requires(frozenset(keys)))
