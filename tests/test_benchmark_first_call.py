"""Section 7 of the benchmark (the Vulkan pass list's first call in a fresh process) runs.

Its smoke form (``--sections 7 --quick``: one fresh process per path, 8 blocks) must
report both paths side by side and what each fused; timing is never asserted here (the
full run, ``python -m benchmarks --sections 7``, is where its targets are judged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_first_call_section_runs_both_paths_in_fresh_processes(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--sections", "7", "--json", str(out_json)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== 7. the Vulkan pass list's first call" in proc.stdout
    data = json.loads(out_json.read_text())
    fc = data["first_call"]
    fk, stock = fc["paths"]["fusionkit"], fc["paths"]["stock"]
    assert fc["blocks"] == 8 and fk["nodes"] == stock["nodes"]
    # what each path did on its first call: every constant-weight norm fused by fusionkit,
    # the AdaLN ones (weight computed from an input) declined; stock fuses both
    assert fk["fused_rms_norms"] == 8
    assert stock["fused_rms_norms"] == 16
    for r in (fk, stock):
        assert r["first_s"] > 0 and len(r["first_s_all"]) == 1 and r["later_s_all"]
    assert sorted(fk["per_size_s"]) == ["4", "8"] and fk["ms_per_block"] is not None
    names = {t["target"]: t["status"] for t in data["targets"]}
    assert names["first pass-list call within 2x of later calls @64 blocks"] == "SKIPPED"
