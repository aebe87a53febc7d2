"""The match gate: which accepted matches a lowering may apply (what ``fusionkit bisect`` turns).

Why: to find the one match that makes a lowered program differ from eager, the same
lowering must be repeatable with only some of its matches applied -- LLVM's
``-opt-bisect-limit``, at the granularity of one match. :func:`~fusionkit.apply.rewrite.
apply_matches` is the one place every pass (a ``FusionPass``, the adapters' preprocess
rule passes) applies accepted matches; it asks the gate in force (a context variable;
none: every match is applied, as always) about each match before building anything. A
match the gate declines is not applied at all: the program keeps its ops, as for a
decline, and the pass reports only what it applied.

Matches are numbered in the order the gate first sees them (pass order, then each pass's
order: graph order), by what identifies a match across lowerings of the same program:
rule, root and the names of the nodes it claims (a copy of a program keeps its names, so
a copy the partitioner fuses to predict preprocess gets the same verdict as the program).
A gate made with the numbers of a recorded lowering keeps them; a match it has not seen
gets the next number.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from fusionkit.find.decide import Match
from fusionkit.result import MatchResult, Status, Step

__all__ = ["MatchGate", "MatchKey", "current", "gated", "select"]


@dataclass(frozen=True)
class MatchKey:
    """What identifies a match across lowerings of one program."""

    rule: str
    root: str
    nodes: tuple[str, ...]

    @classmethod
    def of(cls, m: Match) -> MatchKey:
        return cls(m.rule.name, m.root.name, tuple(sorted(n.name for n in m.claimed)))


@dataclass
class MatchGate:
    """Lets a match through when its number is below ``limit`` (None: no limit) and is not
    ``skip``, or is in ``keep``. ``numbers``: the numbering of a recorded lowering, kept."""

    limit: int | None = None
    skip: int | None = None
    numbers: dict[MatchKey, int] = field(default_factory=dict)
    #: numbers always let through (rewrites a backend's lowering needs)
    keep: frozenset[int] = frozenset()
    #: number -> the match as first seen here (rule, root, nodes), for reports
    seen: dict[int, MatchResult] = field(default_factory=dict)
    #: numbers let through / held back, in the order asked (a match asked twice: twice)
    applied: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)

    @classmethod
    def replaying(cls, numbers: Mapping[MatchKey, int], *, limit: int | None = None,
                  skip: int | None = None, keep: frozenset[int] = frozenset()) -> MatchGate:
        return cls(limit, skip, dict(numbers), keep)

    def number(self, m: Match) -> int:
        key = MatchKey.of(m)
        n = self.numbers.get(key)
        if n is None:
            n = self.numbers[key] = len(self.numbers)
        if n not in self.seen:
            self.seen[n] = MatchResult(m.rule.name, m.root, Status.FUSED, Step.FUSED, None,
                                       f"fused: {len(m.claimed)} nodes replaced",
                                       tuple(m.claimed), m)
        return n

    def allows(self, m: Match) -> bool:
        n = self.number(m)
        ok = n in self.keep or ((self.limit is None or n < self.limit) and n != self.skip)
        (self.applied if ok else self.held).append(n)
        return ok


_GATE: contextvars.ContextVar[MatchGate | None] = contextvars.ContextVar("fusionkit_match_gate",
                                                                          default=None)


def current() -> MatchGate | None:
    return _GATE.get()


@contextlib.contextmanager
def gated(gate: MatchGate) -> Iterator[MatchGate]:
    """Apply only the matches ``gate`` allows while the block runs (in this context)."""
    token = _GATE.set(gate)
    try:
        yield gate
    finally:
        _GATE.reset(token)


def select(matches: Sequence[Match]) -> tuple[list[Match], list[Match]]:
    """(the matches to apply, those the gate holds back), each in the given order."""
    gate = _GATE.get()
    if gate is None:
        return list(matches), []
    go: list[Match] = []
    held: list[Match] = []
    for m in matches:
        (go if gate.allows(m) else held).append(m)
    return go, held
