"""Per-object memos: things derived from a pattern or a gate, kept for the last few hundred.

An adapter builds its rules once but a new :class:`~fusionkit.find.finder.RuleIndex` per
pass; compiling a pattern or a gate costs more than a search, so the compiled form is
remembered by the identity of its source object. The entry holds the object itself,
so an id reused after the object died is never mistaken for it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["PerObject"]

_V = TypeVar("_V")


class PerObject(Generic[_V]):
    """``compute(obj, *extra)`` remembered by ``(id(obj), *extra)``, least recently used out."""

    def __init__(self, compute: Callable[..., _V], size: int = 256) -> None:
        self._compute = compute
        self._size = size
        self._memo: OrderedDict[tuple[Hashable, ...], tuple[Any, _V]] = OrderedDict()

    def __call__(self, obj: Any, *extra: Hashable) -> _V:
        key = (id(obj), *extra)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is obj:
            self._memo.move_to_end(key)
            return hit[1]
        value = self._compute(obj, *extra)
        self._memo[key] = (obj, value)
        if len(self._memo) > self._size:
            self._memo.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._memo)
