"""``fusionkit bisect`` (issue 43, item 5): the one match whose removal makes a lowered
program equal eager, found on the backend's runtime.

A user's spec plants one wrong rule (``silu_off`` rewrites ``x * sigmoid(x)`` into
``sigmoid(x)``) beside a correct one (``reciprocal_mul``: ``x * reciprocal(y)`` into
``x / y``, three matches) in a small model; bisect must name the planted rule and its
match on XNNPACK (``portable_lib``), on Vulkan (the real runtime when there is one, else
the payload simulator) and on Arm's TOSA reference model. A correct program has nothing to
bisect; a difference that is there with no match applied is not a fusion's; a wrong rule
matching twice is no single match. The commands run in-process from the user's directory;
each scenario runs once per module.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fusionkit.app import cli

MODELS = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)

    def forward(self, x, y):
        a = x * torch.reciprocal(y)
        b = self.l1(a)
        b = b * torch.sigmoid(b)
        c = self.l2(b) * torch.reciprocal(y)
        return torch.relu(c) * torch.reciprocal(y + 2.0)


class TwoSilu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(16, 16)

    def forward(self, x):
        a = x * torch.sigmoid(x)
        b = self.l1(a)
        return b * torch.sigmoid(b)


class ConvSilu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x, y):
        a = self.bn(self.conv(x))
        a = a * torch.sigmoid(a)
        return a * torch.reciprocal(y)


def conv_silu():
    return ConvSilu().eval(), (torch.randn(1, 3, 8, 8), torch.rand(1, 4, 6, 6) + 0.5)


def net():
    return Net().eval(), (torch.randn(2, 16), torch.rand(2, 16) + 0.5)


def two_silu():
    return TwoSilu().eval(), (torch.randn(2, 16),)
'''

RECIPROCAL = '''
- name: reciprocal_mul
  pattern:
    op: aten.mul.Tensor
    args: [{capture: x}, {op: aten.reciprocal.default, args: [{capture: y}]}]
  replacement: {op: aten.div.Tensor, args: [{ref: x}, {ref: y}]}
'''

SILU_OFF = '''
- name: silu_off
  pattern:
    op: aten.mul.Tensor
    args: [{capture: x}, {op: aten.sigmoid.default, args: [{capture: x}]}]
  replacement: {op: aten.sigmoid.default, args: [{ref: x}]}
'''

#: the planted culprit: rule, root and claimed nodes in the edge program of ``net``
CULPRIT = {"rule": "silu_off", "root": "aten_mul_tensor_1",
           "nodes": ["aten_mul_tensor_1", "aten_sigmoid_default"]}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bisect")
    (d / "bisectmodels").mkdir()
    (d / "bisectmodels" / "__init__.py").write_text("")
    (d / "bisectmodels" / "tiny.py").write_text(MODELS)
    (d / "planted.yaml").write_text("version: 1\nrules:" + RECIPROCAL + SILU_OFF)
    (d / "right.yaml").write_text("version: 1\nrules:" + RECIPROCAL)
    (d / "silu_off.yaml").write_text("version: 1\nrules:" + SILU_OFF)
    return d


@contextlib.contextmanager
def _in(d: Path) -> Iterator[None]:
    """The user's directory, and their models package forgotten afterwards."""
    before = Path.cwd()
    os.chdir(d)
    try:
        yield
    finally:
        os.chdir(before)
        for name in [m for m in sys.modules if m.split(".")[0] == "bisectmodels"]:
            del sys.modules[name]


def bisect(d: Path, *argv: str) -> tuple[int, str]:
    """``fusionkit bisect ARGV`` from ``d``: exit status and standard output."""
    out = io.StringIO()
    with _in(d), contextlib.redirect_stdout(out):
        code = cli.main(["bisect", *argv])
    return code, out.getvalue()


def _lowerings_bound(matches: int) -> int:
    """Every match, none, the binary search, the confirmation."""
    return 3 + math.ceil(math.log2(matches))


# ------------------------------------------------------------------ XNNPACK (portable_lib)


@pytest.fixture(scope="module")
def xnnpack_found(user_dir: Path) -> tuple[int, str]:
    return bisect(user_dir, "bisectmodels.tiny:net", "--backend", "xnnpack",
                  "--spec", "planted.yaml")


def test_xnnpack_names_the_planted_rule_and_match(xnnpack_found: tuple[int, str]) -> None:
    code, out = xnnpack_found
    assert code == 0, out
    lines = out.splitlines()
    assert "(4 matches applied), run on ExecuTorch's portable_lib (XNNPACK)" in lines[0]
    assert lines[1].startswith("  differs from eager (max |program - eager| ")
    assert lines[1].endswith("with match 1: equal, with matches 1-2: differs")
    assert lines[2] == ("culprit: match 2 of 4, rule silu_off at `aten_mul_tensor_1` "
                        "(your spec, before partitioning)")
    # the explanation, as `fusionkit explain --rule R --at NODE` prints it
    assert lines[3:6] == ["  silu_off at `aten_mul_tensor_1`: fused here",
                          "    step:   fused", "    reason: fused: 2 nodes replaced"]
    assert lines[6] == "    nodes:  `aten_mul_tensor_1`, `aten_sigmoid_default`"
    assert lines[7] == ("  see: fusionkit explain bisectmodels.tiny:net --spec planted.yaml "
                        "--backend xnnpack --rule silu_off --at aten_mul_tensor_1")
    assert lines[8].startswith("  confirmed: every match but this one is equal to eager")
    # every match, none, two halvings, the confirmation: five lowerings, each run
    assert lines[9].startswith("5 lowerings, 5 runs in ")
    assert 5 <= _lowerings_bound(4)


def test_explain_at_the_named_node_says_the_same(
        user_dir: Path, xnnpack_found: tuple[int, str]) -> None:
    out = io.StringIO()
    with _in(user_dir), contextlib.redirect_stdout(out):
        code = cli.main(["explain", "bisectmodels.tiny:net", "--spec", "planted.yaml",
                         "--backend", "xnnpack", "--rule", "silu_off", "--at",
                         "aten_mul_tensor_1"])
    assert code == 0
    assert [f"  {ln}" for ln in out.getvalue().splitlines()] == \
        xnnpack_found[1].splitlines()[3:6]


def test_a_correct_program_has_nothing_to_bisect(user_dir: Path) -> None:
    code, out = bisect(user_dir, "bisectmodels.tiny:net", "--backend", "xnnpack",
                       "--spec", "right.yaml")
    assert code == 0, out
    lines = out.splitlines()
    assert "(3 matches applied)" in lines[0]
    assert lines[1].startswith("  equal to eager (") and lines[1].endswith(
        "): nothing to bisect")
    assert lines[2].startswith("1 lowering, 1 run in ")


def test_a_difference_without_any_match_is_not_a_fusion(user_dir: Path) -> None:
    """XNNPACK's linear sums in another order than eager: with no tolerance the program
    differs with every match removed too."""
    code, out = bisect(user_dir, "bisectmodels.tiny:net", "--backend", "xnnpack",
                       "--spec", "right.yaml", "--atol", "0", "--rtol", "0", "--json")
    assert code == 1, out
    report = json.loads(out)
    assert report["outcome"] == "not_a_fusion" and report["culprit"] is None
    assert [t["what"] for t in report["trials"]] == ["every match", "no match"]
    assert [t["equal"] for t in report["trials"]] == [False, False]
    assert report["lowerings"] == report["runs"] == 2


def test_a_preprocess_rewrite_the_lowering_needs_stays_applied(user_dir: Path) -> None:
    """XNNPACK's partitioner delegates a batch norm only because preprocess folds it into
    its conv: without that fold the lowering fails, so bisect keeps it and bisects over the
    matches before partitioning."""
    code, out = bisect(user_dir, "bisectmodels.tiny:conv_silu", "--backend", "xnnpack",
                       "--spec", "planted.yaml", "--json")
    assert code == 0, out
    r = json.loads(out)
    assert [(a["rule"], a["stage"]) for a in r["applied"]] == [
        ("silu_off", "your spec, before partitioning"),
        ("reciprocal_mul", "your spec, before partitioning"),
        ("xnnpack_conv_batch_norm", "xnnpack preprocess, in a delegate's graph")]
    assert r["kept"] == 1 and "batch_norm" in r["kept_because"]
    assert [(t["what"], t["equal"], t["ran"]) for t in r["trials"][:3]] == [
        ("every match", False, True), ("no match", False, False),
        ("no match but the 1 in preprocess", True, True)]
    assert r["outcome"] == "found"
    assert {k: r["culprit"][k] for k in ("rule", "root", "number")} == {
        "rule": "silu_off", "root": "aten_mul_tensor", "number": 1}


def test_a_wrong_rule_matching_twice_is_no_single_match(user_dir: Path) -> None:
    code, out = bisect(user_dir, "bisectmodels.tiny:two_silu", "--backend", "xnnpack",
                       "--spec", "silu_off.yaml")
    assert code == 1, out
    assert "first match that makes it differ: match 1 of 2, rule silu_off" in out
    assert "but every match but this one still differs" in out
    assert "no single match explains the difference" in out


# ------------------------------------------------------------------ Vulkan


@pytest.fixture(scope="module")
def vulkan_found(user_dir: Path) -> dict[str, Any]:
    """On the real Vulkan runtime when there is one (else the payload simulator)."""
    code, out = bisect(user_dir, "bisectmodels.tiny:net", "--backend", "vulkan",
                       "--spec", "planted.yaml", "--json")
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


def test_vulkan_names_the_planted_rule_and_match(vulkan_found: dict[str, Any]) -> None:
    from fusionkit.backends.vulkan_adapter.runtime import find_runtime

    r = vulkan_found
    real = find_runtime() is not None
    assert r["runtime"].startswith("the real Vulkan runtime" if real
                                   else "the Vulkan payload simulator")
    assert r["outcome"] == "found"
    c = r["culprit"]
    assert {k: c[k] for k in CULPRIT} == CULPRIT
    assert c["number"] == 2 and c["stage"] == "your spec, before partitioning"
    assert c["status"] == "fused" and c["reason"] == "fused: 2 nodes replaced"
    # the spec's four matches come first (before partitioning), then Vulkan's preprocess ones
    spec = [(a["rule"], a["root"]) for a in r["applied"][:4]]
    assert spec == [("reciprocal_mul", "aten_mul_tensor"), ("silu_off", "aten_mul_tensor_1"),
                    ("reciprocal_mul", "aten_mul_tensor_2"),
                    ("reciprocal_mul", "aten_mul_tensor_3")]
    assert all(a["stage"] == "vulkan preprocess, in a delegate's graph"
               for a in r["applied"][4:])
    assert r["matches"] == len(r["applied"]) > 4
    assert r["lowerings"] == r["runs"] <= _lowerings_bound(r["matches"])
    assert [t["what"] for t in r["trials"]][:2] == ["every match", "no match"]
    # with every match held back (Vulkan's preprocess ones too) the program runs and is equal
    assert r["trials"][1]["ran"] and r["trials"][1]["equal"]
    assert r["trials"][-1] == {**r["trials"][-1], "what": "every match but 2", "equal": True}


def test_vulkan_simulator_says_nothing_to_bisect_for_a_correct_program(user_dir: Path) -> None:
    code, out = bisect(user_dir, "bisectmodels.tiny:net", "--backend", "vulkan",
                       "--spec", "right.yaml", "--simulator")
    assert code == 0, out
    assert "run on the Vulkan payload simulator" in out.splitlines()[0]
    assert "nothing to bisect" in out


def test_vulkan_without_a_real_runtime_runs_on_the_simulator(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusionkit.backends.vulkan_adapter.runtime import RUNTIME_ENV

    monkeypatch.setenv(RUNTIME_ENV, str(user_dir / "no_runtime.so"))
    code, out = bisect(user_dir, "bisectmodels.tiny:net", "--backend", "vulkan",
                       "--spec", "right.yaml", "--json")
    assert code == 0, out
    r = json.loads(out)
    assert r["runtime"] == "the Vulkan payload simulator (no real Vulkan runtime found)"
    assert r["outcome"] == "equal" and r["lowerings"] == 1


# ------------------------------------------------------------------ Arm (TOSA reference model)


def test_arm_names_the_planted_rule_and_match(user_dir: Path) -> None:
    pytest.importorskip("tosa_reference_model")
    pytest.importorskip("executorch.backends.arm.tosa.partitioner")
    code, out = bisect(user_dir, "bisectmodels.tiny:net", "--backend", "arm",
                       "--spec", "planted.yaml", "--json")
    assert code == 0, out
    r = json.loads(out)
    assert r["runtime"].startswith("the TOSA reference model")
    assert r["outcome"] == "found" and r["matches"] == 4
    assert {k: r["culprit"][k] for k in CULPRIT} == CULPRIT
    assert r["lowerings"] == r["runs"] == 5


# ------------------------------------------------------------------ the gate itself


def test_a_held_back_match_leaves_the_program_correct(user_dir: Path) -> None:
    """The gate lets the first match through and holds the wrong one back: the pass reports
    one fusion and the program computes what eager does."""
    from executorch.exir import to_edge

    from fusionkit import FusionPass
    from fusionkit.apply.gate import MatchGate, gated
    from fusionkit.specs import load_specs

    sys.path.insert(0, str(user_dir))
    try:
        from bisectmodels.tiny import net
    finally:
        sys.path.remove(str(user_dir))
        for name in [m for m in sys.modules if m.split(".")[0] == "bisectmodels"]:
            del sys.modules[name]
    module, inputs = net()
    p = FusionPass(load_specs([str(user_dir / "planted.yaml")]))
    ep = to_edge(torch.export.export(module, inputs)).exported_program()
    gate = MatchGate(limit=1)
    with gated(gate):
        result = p.call(ep)
    assert result.modified and p.report.total_fused == 1
    assert gate.applied == [0] and gate.held == [1, 2, 3]
    assert [m.rule for m in gate.seen.values()] == ["reciprocal_mul", "silu_off",
                                                    "reciprocal_mul", "reciprocal_mul"]
    torch.testing.assert_close(ep.module()(*inputs), module(*inputs))
    ops = [str(n.target) for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    assert sum("div" in o for o in ops) == 1 and sum("sigmoid" in o for o in ops) == 1
    # nothing let through: nothing changed, and the pass says so
    p2 = FusionPass(load_specs([str(user_dir / "planted.yaml")]))
    ep2 = to_edge(torch.export.export(module, inputs)).exported_program()
    with gated(MatchGate(limit=0)):
        assert not p2.call(ep2).modified
    assert p2.report.total_fused == 0


# ------------------------------------------------------------------ user mistakes


@pytest.mark.parametrize(("argv", "names"), [
    (["missing.pt2", "--backend", "xnnpack"], "missing.pt2"),
    (["bisectmodels.tiny:nothere", "--backend", "xnnpack"], "bisectmodels.tiny:nothere"),
    (["bisectmodels.tiny:net", "--backend", "xnnpack", "--spec", "none.yaml"], "none.yaml"),
    (["bisectmodels.tiny:net", "--backend", "xnnpack", "--atol", "-1"], "--atol -1"),
    (["bisectmodels.tiny:net", "--backend", "xnnpack", "--simulator"], "--simulator"),
    (["bisectmodels.tiny:net", "--backend", "vulkan", "--timeout", "0"], "--timeout 0"),
])
def test_a_bad_input_is_one_line_exit_2(user_dir: Path, argv: list[str], names: str,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    with _in(user_dir):
        code = cli.main(["bisect", *argv])
    _out, err = capfd.readouterr()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fusionkit: error: ") and names in err
