"""Stock preprocess passes replaced by fusionkit rules: what every backend shares.

Why: an adapter runs some of its backend's stock preprocess passes as rules (rule
factories registered with ``takes_over=<stock pass class name>``). How a rule pass is put
in the stock pass's place is the backend's own (its pass manager); which passes are taken
over, their rules built once per process, the per-thread switch that runs the stock
passes instead (for comparisons) and the counts of what the rule passes did are the same
everywhere, and are a :class:`Takeover`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager

from fusionkit.integration.preprocess_state import Tally, ThreadSwitch
from fusionkit.rule import Rule

__all__ = ["Takeover"]


class Takeover:
    """One backend's stock passes run as rules.

    ``stock_passes``: stock pass class name -> the rule factory replacing it (what the
    rule registry's ``taken_over_patterns`` gives); ``rules``: the rules replacing one
    stock pass, fresh (called once per pass and process); ``count_keys``: what a rule
    pass counts per run (see :meth:`count`).
    """

    def __init__(self, stock_passes: Mapping[str, str], rules: Callable[[str], Iterable[Rule]],
                 count_keys: tuple[str, ...] = ("runs", "fused")) -> None:
        self.stock_passes: dict[str, str] = dict(stock_passes)
        self._make_rules = rules
        self._built: dict[str, tuple[Rule, ...]] = {}
        self._lock = threading.Lock()
        self._switch = ThreadSwitch(default=True)
        self._tally = Tally(count_keys)

    def __contains__(self, stock_pass: object) -> bool:
        return stock_pass in self.stock_passes

    def __iter__(self) -> Iterator[str]:
        return iter(self.stock_passes)

    def rules_for(self, stock_pass: str) -> tuple[Rule, ...]:
        """The rules replacing one stock pass (built once per process)."""
        with self._lock:
            rules = self._built.get(stock_pass)
            if rules is None:
                rules = self._built[stock_pass] = tuple(self._make_rules(stock_pass))
        return rules

    def is_enabled(self) -> bool:
        """Whether rules replace the stock passes in this thread (True unless
        :meth:`disabled`)."""
        return self._switch.is_on()

    def disabled(self) -> AbstractContextManager[None]:
        """The stock passes run (in this thread) while the block runs, installed or not."""
        return self._switch.turned(False)

    def count(self, stock_pass: str, key: str, n: int = 1) -> None:
        self._tally.add(stock_pass, key, n)

    def counts(self) -> dict[str, dict[str, int]]:
        """Stock pass name -> {count key: n} since :meth:`reset_counts`, every thread."""
        return self._tally.snapshot()

    def reset_counts(self) -> None:
        self._tally.reset()
