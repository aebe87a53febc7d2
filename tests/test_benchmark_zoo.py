"""Benchmark section 6 (end-to-end over the model zoo): it runs, books every stage, and
its aggregate is computed from the per-model figures; a path that fails is reported.

Timing values are not asserted (noisy machines); the full run is where targets are judged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import zoo_e2e  # noqa: E402
from benchmarks.harness import STAGES  # noqa: E402
from benchmarks.output import Targets  # noqa: E402

#: the cheapest zoo model to lower four ways (one linear + a norm)
SMALL = "adaln_rms"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out_json = tmp_path_factory.mktemp("zoo") / "zoo.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--sections", "6", "--zoo-models", SMALL,
         "--zoo-pairs", "1", "--zoo-no-warmup", "--zoo-takeover-off", "--json", str(out_json)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out_json.read_text())


def test_zoo_section_prints_stages_ratios_and_targets(smoke: tuple[str, dict[str, Any]]) -> None:
    out, data = smoke
    assert "== 6. end-to-end over the model zoo" in out
    for backend in ("vulkan", "xnnpack"):
        assert f"{backend}: where a lowering's time goes" in out
        assert f"{backend} aggregate over 1 of {len(zoo_e2e.zoo_names())} zoo models" in out
        assert f"{backend} preprocess, stock passes (takeover off) -> fusionkit rules: " in out
    header = next(line for line in out.splitlines() if line.startswith("model path"))
    assert header.split()[2:2 + len(STAGES)] == list(STAGES)
    assert sum(line.startswith(f"{SMALL} ") for line in out.splitlines()) >= 2 + 6  # rows
    zoo_targets = [t for t in data["targets"] if t["target"].startswith("zoo: ")]
    assert [t["target"].split()[1] for t in zoo_targets] == ["vulkan", "xnnpack"]
    assert {t["status"] for t in zoo_targets} <= {"MET", "MISSED"}


def test_zoo_json_keeps_every_sample_and_derives_the_ratios(
        smoke: tuple[str, dict[str, Any]]) -> None:
    _, data = smoke
    assert "partial" not in data  # the per-model checkpoints were replaced by the final write
    zoo = data["zoo_e2e"]
    assert zoo["models"] == [SMALL] and zoo["pairs"] == 1
    assert list(zoo["backends"]) == ["vulkan", "xnnpack"]
    for b in zoo["backends"].values():
        rec = b["models"][SMALL]
        assert rec["errors"] == {"stock": None, "adapter": None, "takeover_off": None}, rec["errors"]
        for label in ("stock", "adapter", "takeover_off"):
            (sample,) = rec["samples"][label]
            assert all(sample[k] >= 0.0 for k in STAGES), sample
            assert math.isclose(sample["total"], sum(sample[k] for k in STAGES))
            assert sample["preprocess"] > 0.0 and sample["lower"] > 0.0
            assert rec["stages"][label]["total"] == sample["total"]
        # stock lowers without transform passes: no fusion, no checks around them
        assert rec["samples"]["stock"][0]["fusion"] == 0.0
        assert rec["samples"]["stock"][0]["verify"] == 0.0
        ratio = rec["adapter_cpu_s"] / rec["stock_cpu_s"]
        assert rec["ratio"] == pytest.approx(ratio)
        assert rec["pair_ratios"] == [pytest.approx(ratio)]
        # preprocess before (stock passes, takeover off) / after (rules), from the samples
        after, before = (rec["samples"][k][0]["preprocess"] for k in ("adapter", "takeover_off"))
        assert rec["preprocess_after_before"] == [pytest.approx(after / before)]
        agg = b["aggregate"]
        assert agg["models"] == [SMALL]
        for key in ("sum_ratio", "median_ratio", "gmean_ratio", "ratio_min", "ratio_max"):
            assert agg[key] == pytest.approx(ratio)
    # the zoo's record of what stock Vulkan gets wrong travels with the figures
    assert zoo["backends"]["vulkan"]["models"][SMALL]["stock_program_unusable"]
    assert zoo["backends"]["xnnpack"]["models"][SMALL]["stock_program_unusable"] is None


def _timing(lower: float) -> dict[str, float]:
    t = {k: 0.0 for k in STAGES}
    t.update(edge=lower / 2, preprocess=lower / 2, lower=lower, wall_lower=lower)
    t["total"] = sum(t[k] for k in STAGES)
    return t


def test_a_failing_path_is_reported_once_and_left_out_of_the_aggregate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No lowering here: ``lower_once`` is replaced by one whose stock fails on one model."""
    calls: list[tuple[str, str, str]] = []
    names = ["adaln_rms", "resnet", "convnext"]
    modules: dict[int, str] = {}

    def fake_lower(module: Any, inputs: Any, backend: str, label: str,
                   adapters: Any) -> dict[str, float]:
        name = modules[id(module)]
        calls.append((backend, name, label))
        if name == "resnet" and label == "stock":
            raise RuntimeError("stock cannot lower this\nsecond line")
        cost = {"adaln_rms": 1.0, "resnet": 5.0, "convnext": 4.0}[name]
        return _timing(cost if label == "stock" else cost * (0.5 if name == "adaln_rms" else 0.25))

    import zoo_models

    real_factory = {n: zoo_models.BY_NAME[n].factory for n in names}

    def tagging(name: str) -> Any:
        def factory() -> Any:
            module, inputs = real_factory[name]()
            modules[id(module)] = name
            return module, inputs
        return factory

    for n in names:  # ZooModel is frozen: swap the table's entries
        monkeypatch.setitem(zoo_models.BY_NAME, n,
                            dataclasses.replace(zoo_models.BY_NAME[n], factory=tagging(n)))
    monkeypatch.setattr(zoo_e2e, "lower_once", fake_lower)
    seen: list[list[str]] = []
    out = zoo_e2e.bench_zoo(names, pairs=2, warmup=False, log=lambda s: None,
                            checkpoint=lambda o: seen.append(list(o["backends"]["xnnpack"]["models"])))
    assert seen == [names[:1], names[:2], names]  # a run cut short keeps whole models

    for backend in ("vulkan", "xnnpack"):
        b = out["backends"][backend]
        err = b["models"]["resnet"]["errors"]["stock"]
        assert err == "RuntimeError: stock cannot lower this"  # one line
        assert b["models"]["resnet"]["ratio"] is None
        assert calls.count((backend, "resnet", "stock")) == 1  # not retried
        assert calls.count((backend, "resnet", "adapter")) == 2
        agg = b["aggregate"]
        assert agg["models"] == ["adaln_rms", "convnext"]
        assert agg["sum_ratio"] == pytest.approx((0.5 + 1.0) / (1.0 + 4.0))
        assert agg["median_ratio"] == pytest.approx((0.5 + 0.25) / 2)
        assert agg["gmean_ratio"] == pytest.approx(math.sqrt(0.5 * 0.25))
        assert (agg["ratio_min"], agg["ratio_max"]) == (0.25, 0.5)
    # pairs alternate which path runs first, offset per model
    adaln = [c[2] for c in calls if c[0] == "vulkan" and c[1] == "adaln_rms"]
    assert adaln == ["stock", "adapter", "adapter", "stock"]
    resnet = [c[2] for c in calls if c[0] == "vulkan" and c[1] == "resnet"]
    assert resnet == ["adapter", "stock", "adapter"]  # 2nd model: adapter first; no retry

    targets = Targets()
    zoo_e2e.add_targets(out, targets)
    (vk, xnn) = targets.rows
    assert vk[1] == "MET" and xnn[1] == "MET"  # 0.30x against 0.4x and 1.0x
    assert "not compared: resnet" in vk[2]
    assert f"2 of {len(zoo_e2e.zoo_names())} models" in vk[2]


def test_readme_table_from_the_json(smoke: tuple[str, dict[str, Any]]) -> None:
    _, data = smoke
    table = zoo_e2e.markdown(data["zoo_e2e"]).splitlines()
    (row,) = [line for line in table if line.startswith(f"| {SMALL} |")]
    ratios = [data["zoo_e2e"]["backends"][b]["models"][SMALL]["ratio"] for b in zoo_e2e.BACKENDS]
    assert [c.strip() for c in row.split("|")[1:-1]][3::3] == [f"{r:.2f}x" for r in ratios]
    assert any(line.startswith("| **sum(adapter)/sum(stock)** |") for line in table)
