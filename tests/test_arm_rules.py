"""The Arm rules' constraints on the graphs Arm's own pass tests build by hand (no lowering):
what each accepts, what it declines and why, and where stock's pass fuses what it should
not."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("executorch.backends.arm.tosa.dialect")

import executorch.backends.arm.tosa.dialect  # noqa: F401  (registers tosa.*)
from executorch.backends.arm.tosa.specification import (
    TosaLoweringContext,
    TosaSpecification,
)
from executorch.exir.dialects._ops import ops as exir_ops

from fusionkit.passes.arm import consecutive_rescales, consecutive_slices
from fusionkit.passes.families import clamp_chain

RESCALE = exir_ops.backend.tosa.RESCALE.default
SLICE = exir_ops.backend.tosa.SLICE.default
CONST_SHAPE = exir_ops.backend.tosa.CONST_SHAPE.default
INT = TosaSpecification.create_from_string("TOSA-1.0+INT")
FP = TosaSpecification.create_from_string("TOSA-1.0+FP")


def _rescale(graph: torch.fx.Graph, x: torch.fx.Node, dtype: torch.dtype, scale: float,
             in_zp: int = 0, out_zp: int = 0, **kwargs: Any) -> torch.fx.Node:
    node = graph.create_node("call_function", RESCALE, (x, dtype, [scale], in_zp, out_zp),
                             kwargs)
    node.meta["val"] = torch.ones((1,), dtype=dtype)
    return node


def _pair(r1_scale: float, r2_scale: float, *, zp: int = 0, r1_kwargs: Any = None,
          r2_kwargs: Any = None) -> tuple[torch.fx.GraphModule, torch.fx.Node, torch.fx.Node]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.ones((1,), dtype=torch.int32)
    r1 = _rescale(graph, x, torch.int8, r1_scale, 0, zp, **(r1_kwargs or {}))
    r2 = _rescale(graph, r1, torch.int32, r2_scale, zp, 0, **(r2_kwargs or {}))
    graph.output(r2)
    return torch.fx.GraphModule({}, graph), r1, r2


def _identity(r1: torch.fx.Node, r2: torch.fx.Node) -> str | None:
    return consecutive_rescales._identity_pair(None, r1, r2, *r2.args[1:])  # type: ignore[arg-type]


def _stock_rescales_fuse(gm: torch.fx.GraphModule) -> bool:
    from executorch.backends.arm._passes import FuseConsecutiveRescalesPass

    with TosaLoweringContext(INT):
        return bool(FuseConsecutiveRescalesPass().call(gm).modified)


@pytest.mark.parametrize("scales", [(0.5, 2.0), (0.25, 4.0), (0.125, 8.0)])
def test_an_identity_rescale_pair_is_accepted(scales: tuple[float, float]) -> None:
    gm, r1, r2 = _pair(*scales, zp=-3)
    assert _identity(r1, r2) is None
    assert _stock_rescales_fuse(gm)  # stock fuses it too


def test_a_rescale_pair_that_is_no_identity_is_declined_with_the_reason() -> None:
    _, r1, r2 = _pair(0.5, 3.0)
    assert "compose to 1.5" in str(_identity(r1, r2))
    gm, r1, r2 = _pair(0.5, 2.0)
    r2.update_arg(3, 5)  # reads another zero point than r1 writes
    assert "writes zero point 0" in str(_identity(r1, r2))
    assert not _stock_rescales_fuse(gm)


def test_a_rescale_pair_disagreeing_on_signedness_is_declined_where_stock_fuses() -> None:
    # r1 writes uint8, r2 reads the same bits as int8: 200 written is -56
    # read, so the pair is no identity; stock compares the numbers alone and fuses it
    gm, r1, r2 = _pair(0.5, 2.0, zp=0, r1_kwargs={"output_unsigned": True})
    assert "writes unsigned values" in str(_identity(r1, r2))
    assert _stock_rescales_fuse(gm)


def _slices(x_shape: tuple[int, ...], start1: list[int], size1: list[int], start2: list[int],
            size2: list[int]) -> tuple[torch.fx.GraphModule, torch.fx.Node]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.ones(x_shape)

    def const(shape: list[int]) -> torch.fx.Node:
        n = graph.create_node("call_function", CONST_SHAPE, (shape,))
        n.meta["val"] = shape
        return n

    inner = graph.create_node("call_function", SLICE, (x, const(start1), const(size1)))
    inner.meta["val"] = torch.ones(size1)
    outer = graph.create_node("call_function", SLICE, (inner, const(start2), const(size2)))
    outer.meta["val"] = torch.ones(size2)
    graph.output(outer)
    return torch.fx.GraphModule({}, graph), outer


def _window(outer: torch.fx.Node) -> str | None:
    return consecutive_slices._fusable(None, *outer.args)  # type: ignore[arg-type]


def _stock_slices_fuse(gm: torch.fx.GraphModule) -> bool:
    from executorch.backends.arm._passes import FuseConsecutiveSlicesPass

    with TosaLoweringContext(FP):
        return bool(FuseConsecutiveSlicesPass().call(gm).modified)


def test_a_slice_of_a_slice_is_accepted() -> None:
    gm, outer = _slices((1, 8, 8), [0, 1, 0], [1, 6, 8], [0, 0, 2], [1, 6, 3])
    assert _window(outer) is None
    assert _stock_slices_fuse(gm)


def test_a_slice_window_outside_its_input_is_declined_where_stock_fuses() -> None:
    # the outer slice reaches past the inner one's input: stock sums the starts on trust
    gm, outer = _slices((1, 8, 8), [0, 4, 0], [1, 4, 8], [0, 3, 0], [1, 3, 8])
    assert "leaves [0, 8)" in str(_window(outer))
    assert _stock_slices_fuse(gm)
    gm, outer = _slices((8, 8), [0, 1, 0], [1, 6, 8], [0, 0, 2], [1, 6, 3])
    assert "rank 2" in str(_window(outer))


BOUND = st.one_of(st.none(), st.floats(-4, 4, allow_nan=False, width=32))


@given(BOUND, BOUND, BOUND, BOUND)
def test_the_composed_clamp_is_the_two_clamps(lo1: Any, hi1: Any, lo2: Any, hi2: Any) -> None:
    x = torch.linspace(-5, 5, 101)
    if (lo1 is None and hi1 is None) or (lo2 is None and hi2 is None):
        return  # torch.clamp needs a bound
    lo, hi = clamp_chain.lower(lo1, lo2), clamp_chain.upper(hi1, hi2)
    if lo is not None and hi is not None and lo > hi:
        return  # declined (empty range)
    want = torch.clamp(torch.clamp(x, lo1, hi1), lo2, hi2)
    assert torch.equal(torch.clamp(x, lo, hi), want)
