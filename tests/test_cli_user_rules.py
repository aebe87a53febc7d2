"""The command line with a user's own rules and models (issue 23, point 5).

A rule module and a spec in the user's directory, run the way a user runs them:
``fusionkit explain mymodel:factory --spec mine.yaml`` from that directory (a
subprocess of the installed command, so nothing of the test's ``sys.path``
helps). The user's rule is reported when it nearly matches, whatever the
near-miss threshold; ``--rule R`` shows R alone without ``--at``; a mistyped op,
key, constraint or rule name is answered with the closest valid ones and the
file, line and field at fault.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fusionkit.app.cli import main

MODEL = '''
import math
import torch


class TanhGelu(torch.nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * torch.pow(x, 3))))


def factory():
    return TanhGelu(), (torch.randn(2, 16),)
'''

GELU_SPEC = '''
version: 1
rules:
  - name: my_gelu
    pattern:
      op: aten.mul.Tensor
      args:
        - {op: aten.mul.Tensor, args: [{capture: x}, 0.5]}
        - op: aten.add.Tensor
          args:
            - op: aten.tanh.default
              args:
                - op: aten.mul.Tensor
                  args:
                    - op: aten.add.Tensor
                      args:
                        - {capture: x}
                        - op: aten.mul.Tensor
                          args: [{op: aten.pow.Tensor_Scalar, args: [{capture: x}, 3]}, CUBIC]
                    - 0.7978845608028654
            - 1.0
    replacement: {op: aten.gelu.default, args: [{ref: x}], kwargs: {approximate: tanh}}
'''


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("user")
    (d / "mymodel.py").write_text(MODEL)
    (d / "gelu.yaml").write_text(GELU_SPEC.replace("CUBIC", "0.044715"))
    (d / "gelu_typo.yaml").write_text(GELU_SPEC.replace("CUBIC", "0.04472"))
    return d


def _installed(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fusionkit")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "fusionkit.app.cli", *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_explain_finds_a_factory_in_the_current_directory_and_reports_the_users_near_miss(
        user_dir: Path) -> None:
    r = _installed("explain", "mymodel:factory", "--backend", "xnnpack", "--spec",
                   "gelu_typo.yaml", "--json", cwd=user_dir)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["accepted"] == []
    (decline,) = [d for d in data["declined"] if d["rule"] == "my_gelu"]
    assert decline["step"] == "structure"
    assert "expected == 0.04472, got 0.0447149" in decline["reason"]
    assert "float32 constant" in decline["reason"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_explain_rule_without_at_shows_that_rule_alone(
        user_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.chdir(user_dir)
    code, out, err = _run(capsys, "explain", "mymodel:factory", "--backend", "vulkan",
                          "--spec", "gelu.yaml", "--json")
    assert code == 0, err
    every = json.loads(out)
    assert [a["rule"] for a in every["accepted"]] == ["my_gelu"]
    code, out, err = _run(capsys, "explain", "mymodel:factory", "--backend", "vulkan",
                          "--spec", "gelu_typo.yaml", "--rule", "my_gelu", "--json")
    assert code == 0, err
    only = json.loads(out)
    rules = {r["rule"] for r in [*only["accepted"], *only["declined"], *only["errors"]]}
    assert rules == {"my_gelu"}
    # every near miss of the rule, however early it failed (the multiplies that are no GELU)
    assert len(only["declined"]) >= 2
    code, out, err = _run(capsys, "explain", "mymodel:factory", "--backend", "vulkan",
                          "--spec", "gelu.yaml", "--rule", "my_gelu")
    assert code == 0, err
    assert "1 fused" in out and "(rule my_gelu)" in out
    rows = [line for line in out.splitlines()[1:] if line.strip() and not line.startswith("-")]
    assert all(line.split()[0] in ("rule", "my_gelu") for line in rows), out


def _spec_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str
                ) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    code, _, err = _run(capsys, "specs", "validate", str(path))
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    return err


SILU = """
    version: 1
    rules:
      - name: silu
        pattern:
          op: aten.mul.Tensor
          args: [{capture: x}, {op: OP, args: [{capture: x}]}]
        constraints: [CONSTRAINT]
        replacement: {op: aten.mul.Tensor, args: [{ref: x}, {ref: x}]}
    """


@pytest.mark.parametrize("case, edit, expected", [
    ("op", ("OP", "aten.sigmod.default"),
     [":7: rules[0].pattern.args[1].op:", "'aten.sigmod.default' does not resolve",
      "did you mean aten.sigmoid.default"]),
    ("pattern_key", ("{capture: x}, {op: OP", "{captur: x}, {op: OP"),
     [":7: rules[0].pattern.args[0]:", "not a pattern node: unknown key `captur`",
      "did you mean `capture`?"]),
    ("op_field", ("args: [{capture: x}]}", "arg: [{capture: x}]}"),
     [":7: rules[0].pattern.args[1].arg:", "unknown key `arg`", "did you mean `args`",
      "valid here: args, bind, commutative, kwargs, op, strict_defaults"]),
    ("constraint", ("CONSTRAINT", "{dtyp: {capture: x, dtypes: [float32]}}"),
     [":8: rules[0].constraints[0]:", "unknown constraint `dtyp`", "did you mean `dtype`?"]),
    ("constraint_field", ("CONSTRAINT", "{dtype: {capture: x, dtype: [float32]}}"),
     [":8: rules[0].constraints[0].dtype.dtype:", "unknown key `dtype`",
      "did you mean `dtypes`?"]),
    ("rule_key", ("        pattern:", "        patern:"),
     [":5: rules[0].patern:", "unknown key `patern`; did you mean `pattern`?"]),
])
def test_a_typo_in_a_spec_names_the_place_and_the_closest_valid_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
        edit: tuple[str, str], expected: list[str]) -> None:
    text = SILU.replace(*edit).replace("OP", "aten.sigmoid.default")
    text = text.replace("CONSTRAINT", "{dtype: {capture: x, dtypes: [float32]}}")
    err = _spec_error(tmp_path, capsys, f"{case}.yaml", text)
    assert f"{case}.yaml" in err
    for part in expected:
        assert part in err, (part, err)


def test_load_model_resolves_from_the_current_directory_only_while_loading(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusionkit.app.model_loader import ModelError, load_model

    here = str(user_dir)
    monkeypatch.chdir(user_dir)
    # what the installed `fusionkit` script sees: its own directory, not the user's
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", here)])
    monkeypatch.delitem(sys.modules, "mymodel", raising=False)
    loaded = load_model("mymodel:factory")
    assert loaded.module is not None and type(loaded.module).__name__ == "TanhGelu"
    assert here not in sys.path  # not left behind
    with pytest.raises(ModelError, match=r"cannot import .*looked in the current directory"):
        load_model("nosuchmodule_here:factory")


def test_import_ref_of_a_spec_resolves_from_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusionkit.specs.trust import import_ref

    (tmp_path / "my_checks.py").write_text("def always(ctx):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_checks", raising=False)
    fn: Any = import_ref("my_checks:always")
    assert fn(None) is None and str(tmp_path) not in sys.path
