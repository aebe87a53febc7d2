"""Listeners told what every search decided and every application fused, process-wide.

Why: a launcher (``fusionkit exec``) puts fusionkit into a pipeline it does not own and
must say, at the end, what fusionkit did there; the passes run deep inside ExecuTorch's
own lowering, where no report object is handed back. A listener is called after
:func:`~fusionkit.find.finder.find_matches` decides (with its
:class:`~fusionkit.find.decide.MatchSet`) and after
:func:`~fusionkit.apply.rewrite.apply_matches` applies (with the applied matches). A
listener that raises is dropped from that call's notice, never from the lowering.

A third kind of notice, :func:`placed`: an adapter moved a node between a partition and
the CPU program after the backend's own partitioner ran (an op the runtime lacks kept on
the CPU, an assertion moved to the partition computing its symbol), with why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["applied", "decided", "listen", "listen_placements", "placed", "unlisten",
           "unlisten_placements"]

#: (on_decided(match_set, seconds), on_applied(matches, seconds)) pairs
_LISTENERS: list[tuple[Callable[[Any, float], None], Callable[[Sequence[Any], float], None]]] = []
_LOCK = threading.Lock()
#: on_placed(backend, what, why) callables
_PLACEMENT_LISTENERS: list[Callable[[str, str, str], None]] = []


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


def listen_placements(on_placed: Callable[[str, str, str], None]) -> None:
    """Call ``on_placed(backend, what, why)`` for every partition change an adapter makes
    (``what``: e.g. "kept on the CPU: aten.logical_not.default"), until
    :func:`unlisten_placements`."""
    with _LOCK:
        _PLACEMENT_LISTENERS.append(on_placed)


def unlisten_placements(on_placed: Callable[[str, str, str], None]) -> None:
    with _LOCK:
        _PLACEMENT_LISTENERS[:] = [f for f in _PLACEMENT_LISTENERS if f is not on_placed]


def placed(backend: str, what: str, why: str) -> None:
    for on_placed in tuple(_PLACEMENT_LISTENERS):
        try:
            on_placed(backend, what, why)
        except Exception:  # a listener never breaks a lowering
            pass
