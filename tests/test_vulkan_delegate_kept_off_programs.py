"""The programs of ExecuTorch's delegate tests that install() keeps wholly on the CPU
(``vulkan_delegate_stock.KEPT_OFF``) compute what eager computes.

Those tests stop in ExecuTorch's own ``check_vk_delegation`` (the program has no Vulkan
delegate left); here the same tests run past that check (``cpu_only``), so that each one's
own comparison with eager, at every input size it tries, judges the program: in the test
run (the simulator as the runtime, which refuses inputs the program does not plan for) and
on ExecuTorch's runtime in a child process (the real Vulkan runtime's, which runs these
programs with its CPU kernels).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("executorch.backends.vulkan")

from vulkan_delegate_stock import KEPT_OFF, requires_opt_in, run_shard


@requires_opt_in
def test_kept_off_programs_equal_eager_at_every_size(tmp_path: Path) -> None:
    proc, data = run_shard(0, tmp_path, real=True, only=sorted(KEPT_OFF), shards=1,
                           cpu_only=True)
    out = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, out
    assert f"{len(KEPT_OFF)} passed" in proc.stdout, out
    assert set(data["cpu_only"]) == set(KEPT_OFF), data["cpu_only"]
    if "real_error" in data:
        assert os.environ.get("FUSIONKIT_REQUIRE_VULKAN_RUNTIME") != "1", data["real_error"]
        return
    real = data["real"]
    assert {r["test"] for r in real} == set(KEPT_OFF), real
    bad = [r for r in real if r["real"] != "ok" or r["sim"] != "ok"]
    assert not bad, bad
    # each test's inputs of other sizes than the example ran too
    assert sum(r["test"] == "test_vulkan_backend_dynamic_arange_start" for r in real) == 3
