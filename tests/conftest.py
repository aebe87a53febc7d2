"""Shared pytest setup: the test helpers import as ``models``; profiles for hypothesis."""

from __future__ import annotations

import os
import sys

import pytest

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

