"""``fusionkit explain`` and ``lower`` show rule errors and placement declines (issue 14).

A spec holds a rule whose custom check raises and a two-output rule with no
single point for its replacement. Without strict mode, explaining the model
shows the first as an ``error`` (apart from the declines, with the exception
type and message) and the second as a ``placement`` decline; a pass still
succeeds and its report counts the error apart. In strict mode the rule's exception
propagates instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = '''
import torch


class Crossed(torch.nn.Module):
    def forward(self, x):
        s = torch.sin(x)
        t = s * 3
        return x + t, s, torch.cos(x)


def factory():
    return Crossed(), (torch.randn(2, 4),)


def boom(ctx):
    raise ZeroDivisionError("rule bug in the check")


def never(rw, c):
    raise AssertionError("a declined match is never replaced")
'''

SPEC = '''version: 1
rules:
- name: cos_check
  pattern: {op: aten.cos.default, args: [{capture: x}]}
  constraints: [{custom: {fn: "engine_cli_model:boom", name: boom, reads: [x]}}]
  replacement: {op: aten.cos.default, args: [{ref: x}]}
- name: crossed
  pattern:
    outputs: {op: aten.add.Tensor, args: [{capture: x}, {capture: t}]}
    also: [{name: s, pattern: {op: aten.sin.default, args: [{capture: x}]}, near: x}]
  replacement: {fn: "engine_cli_model:never", reads: [x, t]}
'''


def _run(tmp_path: Path, *args: str, strict: str = "0") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FUSIONKIT_STRICT": strict,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "fusionkit.app.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("engine_cli")
    (d / "engine_cli_model.py").write_text(MODEL)
    (d / "spec.yaml").write_text(SPEC)
    return d


def _explain(files: Path, *more: str, strict: str = "0") -> subprocess.CompletedProcess[str]:
    return _run(files, "explain", "engine_cli_model:factory", "--spec", "spec.yaml",
                "--allow-module", "engine_cli_model", *more, strict=strict)


def test_explain_shows_error_and_placement(files: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:  # most of each run is importing torch
        table, as_json = pool.map(lambda more: _explain(files, *more), [(), ("--json",)])
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    (err,) = data["errors"]
    assert (err["rule"], err["step"], err["error_type"]) == ("cos_check", "error",
                                                             "ZeroDivisionError")
    assert "rule bug in the check" in err["reason"] and "custom" in err["reason"]
    (placed,) = [d for d in data["declined"] if d["rule"] == "crossed"]
    assert placed["step"] == "placement" and placed["node"] == "aten_mul_tensor", placed
    assert all(d["step"] != "error" for d in data["declined"])

    assert table.returncode == 0, table.stderr
    assert "1 rule error" in table.stdout.splitlines()[0]
    rows = [ln.split() for ln in table.stdout.splitlines()]
    assert ["cos_check", "error", "aten_cos_default", "error"] in [r[:4] for r in rows]
    assert ["crossed", "declined", "aten_add_tensor", "placement",
            "aten_mul_tensor"] in [r[:5] for r in rows]


def test_pass_report_counts_the_error_apart_and_strict_raises(
        files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from fusionkit import FusionPass
    from fusionkit.app.present import report_text
    from fusionkit.specs import load_specs

    monkeypatch.syspath_prepend(str(files))
    rules = load_specs([files / "spec.yaml"], allow_modules=["engine_cli_model"])
    import engine_cli_model

    module, inputs = engine_cli_model.factory()
    ep = torch.export.export(module, inputs)
    before = ep.graph_module.code
    p = FusionPass(rules, strict=False)
    assert p(ep).modified is False and ep.graph_module.code == before
    text = report_text(p.report)
    (row,) = [ln.split() for ln in text.splitlines() if ln.startswith("cos_check")]
    assert row[1:] == ["0", "0", "0", "1"]  # fused, folded, declined, errors
    assert any(ln.strip().startswith("ERROR in cos_check") for ln in text.splitlines())
    assert [d.step for d in p.report.errors] == ["error"]
    with pytest.raises(ZeroDivisionError, match="rule bug"):
        FusionPass(rules, strict=True)(ep)
