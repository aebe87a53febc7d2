"""CI smoke run of the benchmark: it runs end to end and reports its targets.

Timing targets are *not* asserted here (CI machines are noisy); the full run,
``python -m benchmarks``, is where they are judged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_runs_and_reports_targets(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--json", str(out_json)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "== targets ==" in out
    for section in ("== 1. matching", "== 2. the fusion pass when nothing matches",
                    "== 5. applying fusions"):
        assert section in out
    data = json.loads(out_json.read_text())
    assert {t["status"] for t in data["targets"]} <= {"MET", "MISSED", "SKIPPED"}
    # correctness (not timing): a graph with only AdaLN norms is left untouched
    noop = data["noop"]
    assert noop["fusionkit_fused"] == 0 and not noop["fusionkit_modified"]
    assert noop["fusionkit_recompiles"] == 0 and noop["fusionkit_retraces"] == 0
    assert noop["graph_unchanged"]
    # the mixed graphs have constant-weight norms (fused) and AdaLN norms (declined)
    for rec in data["matching"].values():
        assert rec["fusionkit_fused"] > 0 and rec["fusionkit_declined"] > 0
    # applying: every constant-weight norm of the norm-chain graphs is fused, all-or-nothing
    for count, rec in data["apply"]["sizes"].items():
        assert rec["fusions"] == int(count) and rec["apply_ms_per_fusion"] > 0


def test_arm_lowering_section_records_what_each_path_produced() -> None:
    """Section 8 (Arm TOSA lowering, stock vs the adapter) on one model, one pair: both
    paths delegate the whole model to one TOSA flatbuffer, and the adapter's (its rules in
    the taken-over passes' place) is byte-identical to stock's for conv/hardtanh/relu."""
    pytest.importorskip("executorch.backends.arm.tosa.partitioner")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.arm_lowering import FP, measure

    out = measure([FP], 1, models=["conv_hardtanh_relu"], warmup=False)
    row = out["specs"][FP]["models"]["conv_hardtanh_relu"]
    assert row["delegates"] == {"stock": 1, "fusionkit": 1}
    assert row["tosa_bytes"]["stock"] > 0
    assert row["byte_identical"]
    assert row["tosa_sha256_12"]["stock"] == row["tosa_sha256_12"]["fusionkit"]
    assert len(row["stock_s_all"]) == len(row["fusionkit_s_all"]) == len(row["pair_ratios"]) == 1
