"""How ``benchmarks/export_llm.py`` measures a side: the kernel's figures for one child,
the allocator setting given to both sides, each side's own spread. (The exports
themselves are the benchmark's to run, not this suite's.)"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks import export_llm as bench

#: holds ~200 MiB live, then exits with 3 unless the fixed mmap threshold reached it
_CHILD = ("import os, sys; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
          "sys.exit(0 if os.environ.get('MALLOC_MMAP_THRESHOLD_') == '131072' else 3)")


def test_a_child_is_measured_by_the_kernel_with_the_allocator_setting(tmp_path: Path) -> None:
    """Measured from a process holding more than the child (the benchmark writes GBs of
    checkpoint first): the child's own peak, not this process's."""
    import torch

    ballast = torch.ones(768 * 2**18)  # 768 MiB resident here
    ballast += 1
    fixed = bench._run([sys.executable, "-c", _CHILD], tmp_path,
                       bench.ALLOCATORS["fixed-mmap"])
    del ballast
    assert fixed["exit"] == 0
    assert 200 <= fixed["peak_rss_mib"] < 400, fixed
    assert fixed["cpu_s"] > 0 and fixed["wall_s"] >= fixed["cpu_s"] * 0.5
    default = bench._run([sys.executable, "-c", _CHILD], tmp_path, bench.ALLOCATORS["default"])
    assert default["exit"] == 3  # the default runs with the caller's environment


def test_a_side_spread_is_its_largest_peak_over_its_smallest() -> None:
    rows = [{"peak_rss_mib": 6574.0}, {"peak_rss_mib": 8060.0}, {"peak_rss_mib": 7000.0}]
    assert bench.spread_of(rows) == 8060.0 / 6574.0
    assert bench.spread_of(rows[:1]) == 1.0
