"""ExecuTorch's own Vulkan pass tests, run with fusionkit's adapter installed.

``executorch/backends/vulkan/test/test_vulkan_passes.py`` ships in the 1.5.1
wheel. It is run here in a subprocess (so its registry edits and imports stay
out of this process) through pytest with the plugin
``stock_vulkan_tests.fusionkit_adapter_plugin``, which spies on every entry of
ExecuTorch's pattern registry and then installs the adapter. Every test must
pass, no stock detector/replacement of a taken-over pattern may have run, and
fusionkit must have made the fusions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

vk = pytest.importorskip("executorch.backends.vulkan")
pytest.importorskip("torchao")

from fusionkit.backends.vulkan_adapter import TAKEN_OVER_PATTERNS  # noqa: E402

STOCK_TESTS = Path(next(iter(vk.__path__))) / "test" / "test_vulkan_passes.py"
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def stock_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    spy = tmp_path_factory.mktemp("stock") / "spy.json"
    env = {**os.environ, "FUSIONKIT_STOCK_SPY": str(spy),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(STOCK_TESTS), "-q", "-p", "no:cacheprovider",
         "-p", "stock_vulkan_tests.fusionkit_adapter_plugin", "-W", "ignore"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path_factory.mktemp("cwd")),
        timeout=600,
    )
    data = json.loads(spy.read_text()) if spy.exists() else {}
    return proc, data


def test_stock_vulkan_pass_tests_pass_with_fusionkit(stock_run) -> None:  # type: ignore[no-untyped-def]
    proc, _ = stock_run
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "11 passed" in proc.stdout, tail


def test_stock_detectors_of_taken_over_patterns_never_ran(stock_run) -> None:  # type: ignore[no-untyped-def]
    _, data = stock_run
    calls = data["stock_calls"]
    ran = {k: v for k, v in calls.items() if k.split(".")[0] in TAKEN_OVER_PATTERNS}
    assert ran == {}


def test_every_stock_pattern_is_taken_over(stock_run) -> None:  # type: ignore[no-untyped-def]
    _, data = stock_run
    assert data["stock_calls"] == {}
    import executorch.backends.vulkan.patterns  # noqa: F401  registers every stock pattern
    from executorch.backends.vulkan.patterns.pattern_registry import fusable_patterns

    # every entry of ExecuTorch's registry (installed or not, here) has a fusionkit rule
    assert set(fusable_patterns) <= set(TAKEN_OVER_PATTERNS), set(fusable_patterns)
