"""The zoo's assertions, shared by ``test_zoo_decoders.py`` and ``test_zoo_blocks.py``.

Each test module defines a module-scoped, parametrized ``case`` fixture over its half
of :data:`zoo_models.ZOO` and star-imports this module. Lowerings are cached per case
(``lowerings``), so each model is exported once and lowered once along each path.
"""

from __future__ import annotations

from typing import Any

import pytest
from zoo_models import (
    KNOWN_BUGS,
    RUNTIME_NUMERICS,
    STOCK_FAILS,
    TOLERANCE,
    Lowering,
    ZooCase,
    build,
    lower_case,
)

__all__ = [
    "case_fixture",
    "lowerings",
    "test_beyond_stock",
    "test_runtime_numerics",
    "test_vulkan_adapter",
    "test_xnnpack_adapter",
]


def case_fixture(names: list[str]) -> Any:
    @pytest.fixture(scope="module", params=names)
    def case(request: pytest.FixtureRequest) -> ZooCase:
        return build(request.param)

    return case


class Lowerings:
    def __init__(self, case: ZooCase) -> None:
        self.case = case
        self._done: dict[str, Lowering] = {}

    def __getitem__(self, path: str) -> Lowering:
        if path not in self._done:
            self._done[path] = lower_case(self.case, path)
        return self._done[path]


@pytest.fixture(scope="module")
def lowerings(case: ZooCase) -> Lowerings:
    return Lowerings(case)


def _lowered(low: Lowering) -> None:
    if low.error is not None:
        pytest.fail(f"{low.path} lowering failed: {low.error}\n" + "\n".join(low.frames))
    assert low.run_error is None, low.run_error
    assert low.max_error is not None


def _tolerance(case: ZooCase) -> float:
    return TOLERANCE * max(1.0, float(case.eager.abs().max()))  # relative to the output scale


def _known_bug(request: pytest.FixtureRequest, case: ZooCase, path: str) -> None:
    reason = KNOWN_BUGS.get((case.model.name, path))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def test_vulkan_adapter(case: ZooCase, lowerings: Lowerings, request: pytest.FixtureRequest) -> None:
    """transform_passes() + VulkanPartitioner: lowers, nothing the runtime aborts on,
    the payload simulated equals eager; every decline carries its reason."""
    _known_bug(request, case, "vulkan")
    low = lowerings["vulkan"]
    _lowered(low)
    assert low.problems == []
    assert low.delegates >= 1
    err = low.judged_error  # vs eager as the runtime computes it, for RUNTIME_NUMERICS models
    assert err is not None and err <= _tolerance(case), (low.max_error, low.runtime_error)
    assert all(r.split(" — ", 1)[1].strip() for r in low.decline_reasons), low.decline_reasons


def test_xnnpack_adapter(case: ZooCase, lowerings: Lowerings) -> None:
    """transform_passes() + XnnpackPartitioner: the .pte runs in ExecuTorch and equals eager."""
    low = lowerings["xnnpack"]
    _lowered(low)
    assert low.delegates >= 1
    assert low.max_error is not None and low.max_error <= _tolerance(case), low.max_error


def test_beyond_stock(case: ZooCase, lowerings: Lowerings) -> None:
    """Where stock ExecuTorch 1.5.1 fails on a zoo model (``STOCK_FAILS``), it still fails
    the same way, and the adapter's lowering of the same program is right."""
    for (name, backend), expected in STOCK_FAILS.items():
        if name != case.model.name:
            continue
        stock, ours = lowerings[f"{backend}-stock"], lowerings[backend]
        failure = "; ".join(x for x in (stock.error, stock.run_error, *stock.problems) if x)
        assert expected in failure, failure
        assert ours.ok, (ours.error, ours.run_error, ours.problems, ours.max_error)


def test_runtime_numerics(case: ZooCase, lowerings: Lowerings) -> None:
    """A model in ``RUNTIME_NUMERICS`` is judged against eager computed as the Vulkan runtime
    computes: there the adapter's payload agrees; against eager it does not (the entry is
    needed), by no more than the difference of the two references (the runtime's numerics,
    nothing else). Every other model has no second reference."""
    low = lowerings["vulkan"]
    if case.model.name not in RUNTIME_NUMERICS:
        assert case.eager_runtime is None and low.runtime_error is None
        return
    _lowered(low)
    assert case.eager_runtime is not None and low.runtime_error is not None
    tol = _tolerance(case)
    assert low.runtime_error <= tol, low.runtime_error
    assert low.max_error is not None and low.max_error > tol, (low.max_error, tol)
    gap = float((case.eager.float() - case.eager_runtime.float()).abs().max())
    assert low.max_error <= gap + tol, (low.max_error, gap)
