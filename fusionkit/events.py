"""Listeners told what every search decided and every application fused, process-wide.

Why: a launcher (``fusionkit exec``) puts fusionkit into a pipeline it does not own and
must say, at the end, what fusionkit did there; the passes run deep inside ExecuTorch's
own lowering, where no report object is handed back. A listener is called after
:func:`~fusionkit.match.finder.find_matches` decides (with its
:class:`~fusionkit.match.decide.MatchSet`) and after
:func:`~fusionkit.apply.rewrite.apply_matches` applies (with the applied matches). A
listener that raises is dropped from that call's notice, never from the lowering.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["applied", "decided", "listen", "unlisten"]

#: (on_decided(match_set), on_applied(matches)) pairs
_LISTENERS: list[tuple[Callable[[Any], None], Callable[[Sequence[Any]], None]]] = []
_LOCK = threading.Lock()


def listen(on_decided: Callable[[Any], None], on_applied: Callable[[Sequence[Any]], None]) -> None:
    """Call ``on_decided(match_set)`` after every search, ``on_applied(matches)`` after
    every application, in this process, until :func:`unlisten`."""
    with _LOCK:
        _LISTENERS.append((on_decided, on_applied))


def unlisten(on_decided: Callable[[Any], None]) -> None:
    with _LOCK:
        _LISTENERS[:] = [pair for pair in _LISTENERS if pair[0] is not on_decided]


def decided(match_set: Any) -> None:
    for on_decided, _ in tuple(_LISTENERS):
        try:
            on_decided(match_set)
        except Exception:  # a listener never breaks a lowering
            pass


def applied(matches: Sequence[Any]) -> None:
    if not matches:
        return
    for _, on_applied in tuple(_LISTENERS):
        try:
            on_applied(matches)
        except Exception:  # a listener never breaks a lowering
            pass
