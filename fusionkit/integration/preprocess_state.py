"""Per-thread switches and process-wide counts of fusionkit's preprocess plumbing.

Why: the pass gates and the rule takeovers both run inside a backend's ``preprocess``,
where nothing fusionkit calls surrounds them; a test or comparison turns them off for its
own thread only (another thread's lowering goes on as it was), and reads afterwards what
they did in every thread. :class:`ThreadSwitch` is the first, :class:`Tally` the second.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["Tally", "ThreadSwitch"]


class ThreadSwitch:
    """A flag each thread sees as ``default`` until a :meth:`turned` block sets it."""

    def __init__(self, default: bool) -> None:
        self.default = default
        self._state = threading.local()

    def is_on(self) -> bool:
        return getattr(self._state, "on", self.default)  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def turned(self, on: bool) -> Iterator[None]:
        """The flag is ``on`` in this thread while the block runs (then as it was)."""
        before = self.is_on()
        self._state.on = on
        try:
            yield
        finally:
            self._state.on = before


class Tally:
    """name -> {key: n} added up from every thread since :meth:`reset`; each name starts
    with every key of ``keys`` at 0."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}

    def add(self, name: str, key: str, n: int = 1) -> None:
        with self._lock:
            c = self._counts.setdefault(name, dict.fromkeys(self.keys, 0))
            c[key] += n

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {k: dict(v) for k, v in self._counts.items()}

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
