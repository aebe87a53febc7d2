"""Vulkan ``SqueezeUnsqueezeInputs`` as a fusionkit rule (issue 25).

ExecuTorch 1.5.1's ``VulkanBackend.preprocess`` runs ``SqueezeUnsqueezeInputs`` between
``FoldQDQPass`` and ``FuseViewCopyTransform``; the adapter runs the rule of
``passes/vulkan/squeeze_unsqueeze_inputs.py`` in its place. Checked here:

* the rule's test of which shapes to squeeze is the stock pass's ``should_squeeze``, on
  every shape of rank 1 to 5 with dims in {1, 2, 3};
* generated held-out programs (hypothesis, derandomized: a relu or gelu on a rank-3 /
  rank-4 value with size-1 dims, after another op, with one or two users, sometimes viewed
  after) lowered with the rules and with the stock passes: the ``.pte`` files are
  byte-identical, or stock's lowering dies where the rule fixes a stock bug; ours runs
  equal to eager on the real Vulkan runtime (one child for the module) and the simulator;
* the stock bugs, each shown: a ``gelu(approximate="tanh")`` on such a shape (stock hands
  the op's keyword arguments to its views and its retrace dies) and a batch dim known only
  at run time (stock bakes the symbolic size into the view's shape, and the Vulkan graph
  builder cannot serialize it). The rule lowers both; they run equal to eager.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim
from vulkan_runtime_oracle import run_real, session

import fusionkit.backends.vulkan_adapter as vk
from fusionkit import find_matches
from fusionkit.backends.vulkan_adapter import preprocess_rules as pr
from fusionkit.backends.vulkan_adapter.partitioner import PREPROCESS_SCOPE
from fusionkit.passes.vulkan.squeeze_unsqueeze_inputs import should_squeeze, squeezed

STOCK = "SqueezeUnsqueezeInputs"
TOL = 1e-5
#: the real runtime's gelu shader computes the tanh approximation whatever ``approximate``
#: says (measured: 2.4e-7 from it, 4.7e-4 from erf; stock's byte-identical program the same,
#: and a gelu the pass leaves alone too); the simulator computes the tanh form as well
REAL_GELU_ERF_TOL = 1e-3
real_vulkan = session()

#: stock's failures the rule fixes: what brings it -> the message stock dies with
GELU_TANH_DIES = r"view_copy\(\) expected at most 2 argument\(s\) but received 3"
DYNAMIC_DIES = r"Cannot add value for list \[s\d+"


# ----------------------------------------------------------------------- the stock test


def test_should_squeeze_is_the_stock_test() -> None:
    from executorch.backends.vulkan._passes.squeeze_unsqueeze_inputs import (
        SqueezeUnsqueezeInputs,
    )

    stock = SqueezeUnsqueezeInputs()
    shapes = [list(s) for r in range(1, 6) for s in itertools.product((1, 2, 3), repeat=r)]
    differ = [s for s in shapes if should_squeeze(s) != stock.should_squeeze(None, s)]
    assert not differ, differ
    assert sum(should_squeeze(s) for s in shapes) == 48  # of 363 (the stock test says so too)
    assert squeezed([2, 1, 1, 1]) == [2, 1] and squeezed([1, 4, 1, 8]) == [4, 8]


# ----------------------------------------------------------------------- the programs


@dataclass(frozen=True)
class Case:
    shape: tuple[int, ...]
    act: str  # relu | gelu | gelu_tanh
    two_users: bool = False  # the activation's input is read by the output too
    view_after: bool = False  # the activation's output is flattened
    dynamic_batch: bool = False

    def describe(self) -> str:
        bits = [self.act, str(list(self.shape))]
        bits += [b for b, on in (("two users", self.two_users), ("view after", self.view_after),
                                 ("dynamic batch", self.dynamic_batch)) if on]
        return " ".join(bits)


class Net(nn.Module):
    def __init__(self, case: Case) -> None:
        super().__init__()
        self.case = case

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.5 - 0.25
        a = torch.relu(y) if self.case.act == "relu" else F.gelu(
            y, approximate="tanh" if self.case.act == "gelu_tanh" else "none")
        if self.case.view_after:
            a = a.flatten(1)
            y = y.flatten(1)
        return a + y if self.case.two_users else a * 0.5


@dataclass
class Lowered:
    pte: bytes = b""
    program: Any = None
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    error: str | None = None


def _inputs(case: Case, batch: int | None = None) -> tuple[torch.Tensor]:
    shape = (batch, *case.shape[1:]) if batch is not None else case.shape
    return (torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape))),)


def lower(case: Case, rules: bool) -> Lowered:
    from executorch.exir import to_edge_transform_and_lower

    dyn = {"x": {0: Dim("batch", min=2, max=8)}} if case.dynamic_batch else None
    ep = torch.export.export(Net(case), _inputs(case), dynamic_shapes=dyn)
    out = Lowered()
    pr.reset_counts()
    with contextlib.nullcontext() if rules else pr.disabled():
        try:
            prog = to_edge_transform_and_lower(copy.deepcopy(ep),
                                               transform_passes=vk.transform_passes(),
                                               partitioner=[vk.VulkanPartitioner()])
            out.pte = bytes(prog.to_executorch().buffer)
        except Exception as e:  # stock's may be a stock bug; ours fails the test
            cause: BaseException = e
            while cause.__cause__ or cause.__context__:
                cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
            out.error = f"{type(e).__name__}: {e} | {type(cause).__name__}: {cause}"[:1200]
            PREPROCESS_SCOPE.reset()
            return out
    out.program, out.counts = prog, pr.counts()
    return out


def _eager(case: Case, x: tuple[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return Net(case)(*x)  # type: ignore[no-any-return]


def _fires(case: Case) -> bool:
    return should_squeeze(list(case.shape)) and not case.dynamic_batch


def _stock_bug(case: Case) -> str | None:
    """The message stock's lowering dies with on this case, if it brings a stock bug."""
    if case.dynamic_batch and should_squeeze(list(case.shape)):
        return DYNAMIC_DIES
    if case.act == "gelu_tanh" and _fires(case):
        return GELU_TANH_DIES
    return None


_dims = st.sampled_from((1, 1, 2, 3, 5))


@st.composite
def cases(draw: Any) -> Case:
    rank = draw(st.sampled_from((3, 4)))
    shapes = st.tuples(*(_dims for _ in range(rank)))
    # mostly shapes the pass squeezes, now and then one it leaves alone
    fire = draw(st.integers(0, 3)) != 0
    shape = draw(shapes.filter(lambda s: should_squeeze(list(s)) == fire))
    return Case(shape, draw(st.sampled_from(("relu", "gelu", "gelu_tanh"))),
                two_users=draw(st.booleans()), view_after=draw(st.integers(0, 3)) == 3)


def draw_cases(n: int = 8) -> list[Case]:
    drawn: list[Case] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=cases())
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    # whatever was drawn: the pass fires on each op, and once on a shape it leaves alone
    fixed = [Case((4, 1, 8), "relu"), Case((2, 1, 3, 3), "gelu", two_users=True),
             Case((1, 3, 1, 5), "gelu_tanh", view_after=True), Case((1, 3, 4, 4), "relu")]
    return list(dict.fromkeys([*drawn, *fixed]))


@pytest.fixture(scope="module")
def lowered() -> list[tuple[Case, Lowered, Lowered]]:
    return [(c, lower(c, True), lower(c, False)) for c in draw_cases()]


def test_the_cases_reach_the_rule(lowered: Any) -> None:
    fired = [c for c, _, _ in lowered if _fires(c)]
    assert {c.act for c in fired} == {"relu", "gelu", "gelu_tanh"}
    assert any(len(c.shape) == 3 for c in fired) and any(len(c.shape) == 4 for c in fired)
    assert any(not _fires(c) for c, _, _ in lowered)


def test_payloads_identical_to_stock_or_a_stock_bug_fixed(lowered: Any) -> None:
    bad, identical, identical_fired, fixed = [], 0, 0, 0
    for case, ours, stock in lowered:
        what = case.describe()
        if ours.error is not None:
            bad.append(f"{what}: our lowering died: {ours.error}")
            continue
        got = ours.counts[STOCK]
        if got["stock_runs"] or got["runs"] < 1:
            bad.append(f"{what}: the rule pass did not run in the stock pass's place: {got}")
        # each activation is rewritten once (the rebuilt one's input is squeezed already)
        if got["fused"] != (1 if _fires(case) else 0):
            bad.append(f"{what}: fused {got['fused']}")
        bug = _stock_bug(case)
        if bug is not None:
            if stock.error is None or not re.search(bug, stock.error):
                bad.append(f"{what}: stock was expected to die ({bug}): {stock.error}")
            fixed += 1
        elif stock.error is not None:
            bad.append(f"{what}: stock died unexpectedly: {stock.error}")
        elif ours.pte != stock.pte:
            bad.append(f"{what}: the .pte differs from stock's")
        else:
            identical += 1
            identical_fired += _fires(case)
    print(f"\nfigures: {len(lowered)} programs, {sum(_fires(c) for c, _, _ in lowered)} "
          f"where the pass fires; identical to stock {identical} ({identical_fired} firing), "
          f"stock dies {fixed}")
    assert not bad, "\n".join(bad)
    assert identical_fired >= 3 and fixed >= 1, (identical_fired, fixed)


def test_ours_equal_eager_on_the_real_runtime_and_the_simulator(
        lowered: Any, real_vulkan: Any) -> None:
    bad = []
    for case, ours, _ in lowered:
        x = _inputs(case)
        want = _eager(case, x)
        sim = vk.simulate(ours.program, *x)
        sim = sim[0] if isinstance(sim, (tuple, list)) else sim
        tol = REAL_GELU_ERF_TOL if case.act == "gelu" else TOL
        if not torch.allclose(sim, want, atol=tol, rtol=tol):
            bad.append(f"{case.describe()}: simulator {float((sim - want).abs().max()):.3g}")
        got = run_real(real_vulkan, ours.pte, list(x))
        if got is not None and not torch.allclose(got[0], want, atol=tol, rtol=tol):
            bad.append(f"{case.describe()}: real runtime {float((got[0] - want).abs().max()):.3g}")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------- stock's faults


def test_gelu_tanh_lowers_where_stock_dies(real_vulkan: Any) -> None:
    """Stock calls ``view_copy(x, shape, approximate='tanh')``: its retrace dies."""
    case = Case((3, 1, 8), "gelu_tanh")
    stock = lower(case, False)
    assert stock.error is not None and re.search(GELU_TANH_DIES, stock.error), stock.error
    ours = lower(case, True)
    assert ours.error is None and ours.counts[STOCK]["fused"] == 1
    x = _inputs(case)
    got = run_real(real_vulkan, ours.pte, list(x))
    if got is not None:
        torch.testing.assert_close(got[0], _eager(case, x), atol=TOL, rtol=TOL)


def test_a_run_time_batch_is_declined_where_stock_dies(real_vulkan: Any) -> None:
    """Stock squeezes ``(s0, 1, 8)`` to the view shape ``[s0, 8]`` and back to
    ``[s0, 1, 8]``, a symbolic size as a literal: the graph builder cannot add that list.
    The rule declines (the relu runs unsqueezed); the program runs for every batch."""
    case = Case((4, 1, 8), "relu", dynamic_batch=True)
    stock = lower(case, False)
    assert stock.error is not None and re.search(DYNAMIC_DIES, stock.error), stock.error
    ours = lower(case, True)
    assert ours.error is None
    assert ours.counts[STOCK]["fused"] == 0 and ours.counts[STOCK]["declined"] == 1
    # the decline says why, on the program the rule saw
    ep = torch.export.export(Net(case), _inputs(case),
                             dynamic_shapes={"x": {0: Dim("batch", min=2, max=8)}})
    from executorch.exir import to_edge

    edge = to_edge(ep).exported_program()
    declined = find_matches(edge, list(pr.rules_for(STOCK)), structural_declines=False,
                            check_replacements=False).declined
    assert [d.root.name for d in declined] and "run-time shape" in declined[0].reason
    for batch in (2, 5, 8):
        x = _inputs(case, batch)
        got = run_real(real_vulkan, ours.pte, list(x))
        if got is not None:
            torch.testing.assert_close(got[0], _eager(case, x), atol=TOL, rtol=TOL)
