"""Listeners told what every search decided and every application fused, process-wide.

Why: a launcher (``fusionkit exec``) puts fusionkit into a pipeline it does not own and
must say, at the end, what fusionkit did there; the passes run deep inside ExecuTorch's
own lowering, where no report object is handed back. A listener is called after
:func:`~fusionkit.find.finder.find_matches` decides (with its
:class:`~fusionkit.find.decide.MatchSet`) and after
:func:`~fusionkit.apply.rewrite.apply_matches` applies (with the applied matches). A
listener that raises is dropped from that call's notice, never from the lowering.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["applied", "decided", "listen", "unlisten"]

#: (on_decided(match_set, seconds), on_applied(matches, seconds)) pairs
_LISTENERS: list[tuple[Callable[[Any, float], None], Callable[[Sequence[Any], float], None]]] = []
_LOCK = threading.Lock()


def listen(on_decided: Callable[[Any, float], None],
           on_applied: Callable[[Sequence[Any], float], None]) -> None:
    """Call ``on_decided(match_set, seconds)`` after every search, ``on_applied(matches,
    seconds)`` after every application (the seconds each took), in this process, until
    :func:`unlisten`."""
    with _LOCK:
        _LISTENERS.append((on_decided, on_applied))


def unlisten(on_decided: Callable[[Any, float], None]) -> None:
    with _LOCK:
        _LISTENERS[:] = [pair for pair in _LISTENERS if pair[0] is not on_decided]


def decided(match_set: Any, seconds: float) -> None:
    for on_decided, _ in tuple(_LISTENERS):
        try:
            on_decided(match_set, seconds)
        except Exception:  # a listener never breaks a lowering
            pass


def applied(matches: Sequence[Any], seconds: float) -> None:
    for _, on_applied in tuple(_LISTENERS):
        try:
            on_applied(matches, seconds)
        except Exception:  # a listener never breaks a lowering
            pass
