"""Two clamps in a row as one: ``clamp(clamp(x, lo1, hi1), lo2, hi2)`` is
``clamp(x, max(lo1, lo2), min(hi1, hi2))``.

The composition is exact when the composed range is not empty (a missing bound is
unbounded); when it is empty (``max(lo1, lo2) > min(hi1, hi2)``) the pair is a constant,
not a clamp, and no backend's single clamp computes it (``clamp`` with min > max is not
associative), so the match is declined. Where the backends' stock passes meet a chain:

* Arm's ``FuseConsecutiveClampsPass`` fuses two adjacent clamps (after
  ``ConvertToClampPass`` made every relu / hardtanh one): :mod:`fusionkit.passes.arm.
  consecutive_clamps`;
* XNNPACK's ``FuseActivationPass`` fuses each relu / hardtanh into the op before it, so in
  ``conv -> relu -> hardtanh`` both land on the conv: stock overwrites the first range with
  the second; :mod:`fusionkit.passes.xnnpack.fuse_activation` composes them here.

Vulkan's ``FuseClampPass`` folds one activation into ``conv_with_clamp`` and never meets a
second one after it (its input is then no convolution): no chain, not a user. The bounds
are numbers or None (unbounded); a backend with another spelling of "unbounded" (XNNPACK's
``"+inf"``) maps it to None and back. Of two equal bounds the first clamp's is kept (its
type, int or float, too), as both stock passes keep it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compose", "empty_reason", "lower", "not_numbers", "upper"]


def lower(a: Any, b: Any) -> Any:
    """The tighter lower bound (None: unbounded); ``a``'s when they are equal."""
    return b if a is None else a if b is None else max(a, b)


def upper(a: Any, b: Any) -> Any:
    """The tighter upper bound (None: unbounded); ``a``'s when they are equal."""
    return b if a is None else a if b is None else min(a, b)


def compose(lo1: Any, hi1: Any, lo2: Any, hi2: Any) -> tuple[Any, Any] | None:
    """The range of ``clamp(clamp(x, lo1, hi1), lo2, hi2)``; None when it is empty."""
    lo, hi = lower(lo1, lo2), upper(hi1, hi2)
    if lo is not None and hi is not None and lo > hi:
        return None
    return lo, hi


def is_bound(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def not_numbers(*bounds: tuple[str, Any]) -> str | None:
    """Why the named bounds are no clamp bounds (each a number or None), or None."""
    for name, v in bounds:
        if not is_bound(v):
            return f"a clamp's {name} bound {v!r} is not a number"
    return None


def empty_reason(lo1: Any, hi1: Any, lo2: Any, hi2: Any) -> str:
    return (f"the composed range [{lower(lo1, lo2)}, {upper(hi1, hi2)}] is empty: the pair "
            "is a constant, no clamp")
