"""Shared pytest setup: the test helpers import as ``models``; profiles for hypothesis."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fusionkit.backends.vulkan_adapter.runtime_probe import RuntimeInventory

sys.path.insert(0, os.path.dirname(__file__))

# strict mode (fusionkit.strict): a rule whose own code raises fails the test
# instead of becoming an "error" decline, so rule bugs cannot hide in the suite;
# tests of the non-strict behaviour pass strict=False explicitly
os.environ.setdefault("FUSIONKIT_STRICT", "1")

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "fusionkit", deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    settings.load_profile("fusionkit")
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    pass


@pytest.fixture(scope="session")
def vulkan_ops() -> None:
    """Registers ``et_vk.*`` (with CPU reference kernels) for tests that run them."""
    pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")



@pytest.fixture(scope="session")
def vulkan_runtime() -> object:
    """The real Vulkan runtime's library path (``bash scripts/vulkan-runtime`` gets it).

    Missing, it *fails* the test under CI (``CI=true`` or ``FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1``,
    which ``.ci/run`` sets) and skips it elsewhere.
    """
    from fusionkit.backends.vulkan_adapter.runtime import find_runtime

    path = find_runtime()
    if path is None:
        why = "no real Vulkan runtime: run `bash scripts/vulkan-runtime`"
        if os.environ.get("CI") == "true" or os.environ.get("FUSIONKIT_REQUIRE_VULKAN_RUNTIME") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def probed(vulkan_runtime: Path) -> RuntimeInventory:
    """The inventory of the real Vulkan runtime (its operators and shader variants),
    probed once per runtime and cached beside it."""
    from fusionkit.backends.vulkan_adapter.runtime_probe import inventory

    inv = inventory(vulkan_runtime)
    assert inv is not None
    return inv
