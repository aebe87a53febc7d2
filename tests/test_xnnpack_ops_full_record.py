"""The op-suite plugin's seed and per-test record, and the figures written from a record
(``tests/xnnpack_ops_full_record.py``), on a two-test file run through pytest in a child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("executorch.backends.xnnpack")

import xnnpack_ops_full_record as record

HERE = Path(__file__).parent

TWO_TESTS = '''
import json, os, random
import torch

def test_draws():
    out = os.environ["DRAWS"]
    with open(out, "w") as f:
        json.dump([random.randint(1, 10**9), torch.rand(3).tolist()], f)

def test_sees_the_first_recorded():
    spy = json.load(open(os.environ["FUSIONKIT_XNNPACK_SPY"]))
    assert spy["finished"] is False
    assert spy["outcomes"] == {"test_two.py::test_draws": "passed"}
    assert False, "Difference: max: 0.5, abs: 0.0625, mean abs error: 0.01."
'''


def _run(folder: Path, seed: str | None) -> tuple[dict, list]:  # type: ignore[type-arg]
    folder.mkdir()
    (folder / "test_two.py").write_text(TWO_TESTS)
    env = {**os.environ, "FUSIONKIT_XNNPACK_SPY": str(folder / "spy.json"),
           "FUSIONKIT_XNNPACK_MODE": "stock", "FUSIONKIT_XNNPACK_TWIN": "0",
           "DRAWS": str(folder / "draws.json"),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("FUSIONKIT_XNNPACK_SEED", None)
    env.pop("FUSIONKIT_SHARD", None)
    if seed is not None:
        env["FUSIONKIT_XNNPACK_SEED"] = seed
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "test_two.py", "-q", "-p", "no:cacheprovider",
         "-p", "stock_xnnpack_tests.fusionkit_xnnpack_plugin", "-W", "ignore"],
        capture_output=True, text=True, env=env, cwd=str(folder), timeout=600)
    (folder / "stdout.txt").write_text(proc.stdout)
    return json.loads((folder / "spy.json").read_text()), json.loads(
        (folder / "draws.json").read_text())


def test_seeded_runs_draw_the_same_and_the_record_is_written_per_test(tmp_path: Path) -> None:
    spy_a, draws_a = _run(tmp_path / "a", "7")
    _spy_b, draws_b = _run(tmp_path / "b", "7")
    _spy_c, draws_c = _run(tmp_path / "c", None)
    assert draws_a == draws_b  # the same seed: the same random batch size and tensor
    assert draws_c != draws_a
    # the second test read the record written after the first (it asserts that itself:
    # had it not, its failure line would not be the one it raises)
    assert spy_a["finished"] is True and spy_a["restored_at_end"] is True
    assert spy_a["outcomes"] == {"test_two.py::test_draws": "passed",
                                 "test_two.py::test_sees_the_first_recorded": "failed"}
    stdout = (tmp_path / "a" / "stdout.txt").read_text()
    assert "Difference: max: 0.5, abs: 0.0625" in stdout
    assert record._abs_errors(stdout) == {"test_sees_the_first_recorded": 0.0625}
    # the figures: one shard folder, the failure carried over with its reason
    out = tmp_path / "figs"
    (out / "shard-0").mkdir(parents=True)
    (out / "shard-0" / "spy.json").write_text(json.dumps(spy_a))
    fig = record.summarize(out)
    assert fig["total"]["tests"] == 2
    assert fig["total"]["outcomes"] == {"passed": 1, "failed": 1}
    assert list(fig["total"]["not_passed"]) == ["test_two.py::test_sees_the_first_recorded"]
    assert fig["shards"][0]["finished"] is True
    text = record.markdown(fig, [])
    assert "test_sees_the_first_recorded" in text and "did not finish" not in text
    # a record cut after the first test: reported as not finished, with what it ran
    spy_cut = {**spy_a, "finished": False, "restored_at_end": None,
               "outcomes": {"test_two.py::test_draws": "passed"}}
    (out / "shard-0" / "spy.json").write_text(json.dumps(spy_cut))
    fig = record.summarize(out)
    assert fig["shards"][0]["tests_run"] == 1
    assert fig["total"]["outcomes"] == {"passed": 1, "not recorded": 1}
    assert "1 of 2 tests recorded" in record.markdown(fig, [])
