"""A handful of zoo models on ExecuTorch's real Vulkan runtime: fusionkit's programs
(the runtime-aware partitioner keeps ``aten.logical_not`` off the delegate) equal to
eager; stock's outcomes are recorded with the runtime's own messages."""

from __future__ import annotations

from typing import Any

import pytest
from vulkan_real_programs import ZOO_REAL, Program, run_all, zoo_programs

from fusionkit.backends.vulkan_adapter.runtime_probe import inventory


@pytest.fixture(scope="module")
def programs(vulkan_runtime: Any) -> list[Program]:
    assert inventory(vulkan_runtime) is not None  # the partitioner's "auto" reads the probe
    progs = zoo_programs()
    run_all(progs)
    return progs


def test_fusionkit_zoo_programs_equal_eager_on_the_real_runtime(programs: list[Program]) -> None:
    ours = [p for p in programs if p.path == "fusionkit"]
    assert [p.name for p in ours] == list(ZOO_REAL)
    bad = [p.describe() for p in ours if p.lower_error or p.outcome != "ok"]
    assert not bad, bad


def test_stock_zoo_programs_fail_only_with_the_runtimes_own_message(
        programs: list[Program]) -> None:
    stock = [p for p in programs if p.path == "stock"]
    for p in stock:
        assert p.lower_error is None, p.describe()
        if p.outcome == "refused":
            assert p.real is not None and p.real.message, p.describe()
    # the seed bug reaches real models: Gemma's 1 + w RMSNorm is refused in prepack
    gemma = next(p for p in stock if p.name == "gemma")
    assert gemma.outcome == "refused", gemma.describe()
