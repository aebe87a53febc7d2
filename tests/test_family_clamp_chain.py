"""The clamp-chain family (``passes/families/clamp_chain.py``): the composed range is the
pair's, value for value, and both backends using it read their bounds through it."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from fusionkit.passes.families import clamp_chain

_BOUND = st.one_of(st.none(), st.integers(-4, 4), st.floats(-4, 4, allow_nan=False))


def _clamp(x: torch.Tensor, lo: Any, hi: Any) -> torch.Tensor:
    return torch.clamp(x, min=lo, max=hi) if (lo, hi) != (None, None) else x


@given(_BOUND, _BOUND, _BOUND, _BOUND)
def test_the_composed_clamp_is_the_pair(lo1: Any, hi1: Any, lo2: Any, hi2: Any) -> None:
    x = torch.linspace(-6, 6, 97, dtype=torch.float64)
    if lo1 is not None and hi1 is not None and lo1 > hi1:
        lo1, hi1 = hi1, lo1  # each clamp on its own is a range
    if lo2 is not None and hi2 is not None and lo2 > hi2:
        lo2, hi2 = hi2, lo2
    rng = clamp_chain.compose(lo1, hi1, lo2, hi2)
    pair = _clamp(_clamp(x, lo1, hi1), lo2, hi2)
    if rng is None:
        # empty: the pair is a constant (the second clamp's bound nearest the first range)
        assert pair.unique().numel() == 1
        assert "is empty" in clamp_chain.empty_reason(lo1, hi1, lo2, hi2)
    else:
        assert torch.equal(_clamp(x, *rng), pair)


def test_of_equal_bounds_the_first_is_kept_as_written() -> None:
    assert type(clamp_chain.lower(0, 0.0)) is int and type(clamp_chain.upper(1.0, 1)) is float
    assert clamp_chain.not_numbers(("min", 0), ("max", None)) is None
    assert "is not a number" in str(clamp_chain.not_numbers(("max", True)))


def test_xnnpack_keeps_its_spelling_of_unbounded() -> None:
    from fusionkit.passes.xnnpack import fuse_activation

    relu = SimpleNamespace(output_min=0, output_max="+inf")
    # relu then hardtanh(0, inf): both unbounded above, the first ("+inf") kept as written
    assert fuse_activation._combined(relu, 0.0, math.inf) == (0, "+inf")
    assert fuse_activation._combined(relu, -1.0, 1.0) == (0, 1.0)
    assert fuse_activation._combined(SimpleNamespace(output_min=2, output_max=3), -1.0,
                                     1.0) is None
