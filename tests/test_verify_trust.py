"""A ``verify`` you can trust (issue 42, items 1-3).

* A case that crashes the process (a signal, an abort) never ends the caller: cases run in
  a worker process, restarted after a crash, and the verdict is "cannot check: OP crashed
  on CASE" with the case to reproduce it.
* An environment failure (a backend tool missing) is "cannot check" with the reason, never
  "different"; an XNNPACK rule's check imports nothing of Arm's (``tosa_serializer`` is an
  Arm extra).
* Draws find dimension mix-ups: held-out rules that reduce, normalise or transpose over the
  wrong dims, drop an operand or get a constant wrong are "different" with a
  counterexample, their right twins "equal", and the report says what was covered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from fusionkit import DtypeIn, Rule, capture, op, ref, replace_with
from fusionkit.authoring import verify as verify_module
from fusionkit.authoring.verify import (
    CANNOT_CHECK,
    CRASH,
    DIFFERENT,
    EQUAL,
    UNAVAILABLE,
    verify,
    verify_rules,
)
from fusionkit.rule import OpSemantics

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not verify_module._can_isolate(), reason="cases run in a forked worker on Linux")

X = capture("x")


def _neg_as_mul(mul: Any = None) -> Rule:
    """-x as x * -1; ``mul``: the kernel its backend states ``aten.mul.Tensor`` computes."""
    kernels = OpSemantics(kernel_references={} if mul is None else {"aten.mul.Tensor": mul})
    return Rule("neg_as_mul", op("aten.neg.default", X), replace_with("aten.mul.Tensor", ref("x"), -1.0),
                [DtypeIn("x", {torch.float32})], semantics=kernels)


def _segfault_on_matrices(a: Any, b: Any) -> Any:
    """``aten.mul.Tensor`` as a kernel that crashes the process on an operand of rank 2 or more."""
    if isinstance(a, torch.Tensor) and a.dim() >= 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    return a * b


# ---------------------------------------------------------------------------- isolation


def test_a_kernel_that_segfaults_is_cannot_check_naming_the_op_and_the_case(monkeypatch: Any) -> None:
    """The replacement's op crashes (SIGSEGV) on a matrix: this process lives on, the verdict
    names the op, the signal and a case on which it crashes (a rank >= 2 operand)."""
    v = verify(_neg_as_mul(_segfault_on_matrices), cases=4, max_examples=60)
    assert v.status == CANNOT_CHECK and v.cause == CRASH, v
    assert v.reason.startswith("aten.mul.Tensor crashed (SIGSEGV) on x: user input float32"), v.reason
    assert "while running the rewritten program" in v.reason, v.reason
    assert 1 <= len(v.crashes) <= verify_module.MAX_CRASHES + 1
    for crash in v.crashes:  # each recorded case is one the kernel crashes on: it reproduces
        (x,) = crash["case"]["inputs"].values()
        assert len(x["shape"]) >= 2 and x["values"] != "(left out)", crash
        assert crash["op"] == "aten.mul.Tensor" and crash["signal"] == "SIGSEGV"
        assert torch.tensor(x["values"]).shape == tuple(x["shape"])
    json.dumps(v.to_dict())  # (the record is JSON)


@pytest.fixture(scope="module")
def aborting() -> Any:
    import crashing_rules

    return crashing_rules


def test_an_op_that_aborts_while_the_pattern_is_built_is_cannot_check(aborting: Any) -> None:
    """A custom op whose kernel calls ``os.abort()`` on more than one element: the eager build
    of the pattern's subgraph crashes the worker (SIGABRT), not this process; one-element
    cases still compare."""
    v = verify(aborting.aborting_rule(), cases=2, max_examples=60)
    assert v.status == CANNOT_CHECK and v.cause == CRASH, v
    assert v.reason.startswith("fusionkit_crash_test.neg_or_abort.default crashed (SIGABRT) on x: "), v.reason
    assert "while building the pattern's subgraph" in v.reason, v.reason
    sizes = [torch.tensor(c["case"]["inputs"]["x"]["values"]).numel() for c in v.crashes]
    assert sizes and all(n > 1 for n in sizes), sizes


def test_one_worker_serves_many_rules_and_is_restarted_after_a_crash(aborting: Any) -> None:
    """``verify_rules``: the rules before and after the crashing one are verified (equal) in
    the worker that replaces the crashed one."""
    got = verify_rules(aborting.rules(), cases=2, max_examples=40)
    assert [v.rule for v in got] == ["abs_as_abs", "neg_or_abort_as_neg", "neg_as_mul"]
    assert [v.status for v in got] == [EQUAL, CANNOT_CHECK, EQUAL], [v.summary() for v in got]
    assert got[1].cause == CRASH and not got[0].crashes and not got[2].crashes


def test_the_command_survives_a_crashing_rule(aborting: Any, capsys: Any) -> None:
    from fusionkit.app.cli import main

    assert main(["verify", "crashing_rules:rules", "--cases", "2"]) == 0
    out = capsys.readouterr().out
    assert "neg_or_abort_as_neg: cannot check" in out and "crashed (SIGABRT)" in out, out
    assert "3 rule(s): 2 equal, 0 different, 1 cannot check" in out, out


def test_in_process_verification_stays_available(monkeypatch: Any) -> None:
    """``isolate=False`` runs the cases here (a hook set in this process sees them)."""
    seen: list[int] = []
    rule = _neg_as_mul(lambda a, b: seen.append(1) or a * b)
    assert verify(rule, cases=2, max_examples=30, isolate=False).status == EQUAL
    assert seen


# ---------------------------------------------------------------- whose fault it is


def _raises_import_error(a: Any, b: Any) -> Any:
    raise ModuleNotFoundError("No module named 'some_backend_tool'")


def test_a_missing_tool_is_cannot_check_not_different(monkeypatch: Any) -> None:
    """An op of the replacement whose implementation imports a module this environment lacks:
    the environment's failure, "cannot check" naming the module, never "different"."""
    v = verify(_neg_as_mul(_raises_import_error), cases=2, max_examples=30)
    assert v.status == CANNOT_CHECK and v.cause == UNAVAILABLE, v
    assert "No module named 'some_backend_tool'" in v.reason, v.reason


def test_node_semantics_apply_only_to_the_rules_of_their_pipeline() -> None:
    """Arm's quantized-convolution semantics (which import Arm's passes, and with them
    ``tosa_serializer``) are for Arm's DyT sites only; XNNPACK's convolutions are torch's."""
    from fusionkit.passes.registry import rule_set

    by_name = {r.name: r for s in ("xnnpack", "arm") for r in rule_set(s)}
    for name in ("xnnpack_decompose_batch_norm", "xnnpack_conv_batch_norm", "xnnpack_conv1d_as_conv2d"):
        assert verify_module._node_semantics_of(by_name[name]) == {}, name
    assert "aten.convolution.default" in verify_module._node_semantics_of(
        by_name["arm_fold_dyt_affine_into_conv"])


_WITHOUT_TOSA = textwrap.dedent("""
    import json, sys

    class NoTosa:  # tosa-tools not installed: its serializer cannot be imported
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "tosa_serializer":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTosa())
    from fusionkit.authoring.verify import verify_rules
    from fusionkit.passes.registry import registered

    out = {}
    for name in ("xnnpack", "arm"):
        rules, unbuilt = [], []
        for f in registered():  # (an Arm rule naming a TOSA op cannot be built without the tool)
            if name in f.sets:
                try:
                    rules.extend(f.rules())
                except Exception as e:
                    unbuilt.append(f"{f.qualname}: {type(e).__name__}")
        before = set(sys.modules)
        got = verify_rules(rules, cases=2, max_examples=30, isolate=False)
        arm = sorted(m for m in set(sys.modules) - before
                     if m.startswith(("executorch.backends.arm", "tosa_serializer", "tosa.")))
        out[name] = {"verdicts": [v.to_dict() for v in got], "imported": arm, "unbuilt": unbuilt}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def without_tosa() -> dict[str, Any]:
    """Every XNNPACK and Arm rule verified in a process where ``tosa_serializer`` is missing."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TOSA], capture_output=True, text=True,
                          cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_without_tosa_tools_no_xnnpack_verdict_is_different_or_imports_arm(without_tosa: dict[str, Any]) -> None:
    got = without_tosa["xnnpack"]
    assert got["unbuilt"] == [] and len(got["verdicts"]) >= 15, got["unbuilt"]
    assert got["imported"] == [], got["imported"]  # no module of Arm's reached
    by_rule = {v["rule"]: v for v in got["verdicts"]}
    assert by_rule["xnnpack_decompose_batch_norm"]["status"] == EQUAL, by_rule["xnnpack_decompose_batch_norm"]
    for v in got["verdicts"]:
        assert v["status"] != DIFFERENT, v
        assert "tosa" not in v["reason"].lower(), v


def test_without_tosa_tools_arm_rules_are_cannot_check_for_the_missing_tool(without_tosa: dict[str, Any]) -> None:
    """Arm's rules that need its serializer say so ("unavailable"); none is "different".
    (Those whose pattern names a TOSA op cannot be built at all without the tool.)"""
    verdicts = without_tosa["arm"]["verdicts"]
    assert len(verdicts) >= 5 and without_tosa["arm"]["unbuilt"], without_tosa["arm"]["unbuilt"]
    assert all(v["status"] != DIFFERENT for v in verdicts), [v for v in verdicts if v["status"] == DIFFERENT]
    for v in verdicts:  # a verdict naming the missing tool blames the environment
        if "tosa_serializer" in v["reason"]:
            assert v["status"] == CANNOT_CHECK and v["cause"] == UNAVAILABLE, v


# ------------------------------------------------------------------ dimension mix-ups


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[Any, Any]]:
    """Each held-out (wrong, right) pair of ``tests/dimension_rules.py``, verified in one worker."""
    from dimension_rules import PAIRS

    rules = [r for pair in PAIRS.values() for r in pair]
    got = verify_rules(rules, cases=6, max_examples=150)
    return {what: (got[2 * i], got[2 * i + 1]) for i, what in enumerate(PAIRS)}


_WHAT = ("sum over dim -2", "softmax over dim -2", "mean summed over dim -2", "mean counting dim -2",
         "rms norm over dim -2", "transpose of the wrong pair", "a view for a transpose",
         "a dropped operand", "a wrong constant")


@pytest.mark.parametrize("what", _WHAT)
def test_a_held_out_wrong_rule_is_different_and_its_twin_equal(pairs: dict[str, Any], what: str) -> None:
    wrong, right = pairs[what]
    assert wrong.status == DIFFERENT and wrong.counterexample is not None, wrong.summary()
    assert wrong.counterexample.inputs and wrong.counterexample.reason
    assert right.status == EQUAL and right.cases >= 6, right.summary()


def test_the_wrong_pair_of_dims_is_found_on_a_cube(pairs: dict[str, Any]) -> None:
    """A transpose of the wrong pair keeps the output shape only where the dims are equal:
    the counterexample is a cube with sizes > 1."""
    wrong, _ = pairs["transpose of the wrong pair"]
    (shape,) = [i["shape"] for i in wrong.counterexample.inputs.values()]
    assert len(shape) == 3 and len(set(shape)) == 1 and shape[0] > 1, shape


def test_a_size_read_from_the_wrong_dim_is_found_on_distinct_sizes(pairs: dict[str, Any]) -> None:
    """A mean that counts dim -2 is right on squares: found where the last two dims differ."""
    wrong, _ = pairs["mean counting dim -2"]
    (shape,) = [i["shape"] for i in wrong.counterexample.inputs.values()]
    assert shape[-1] != shape[-2], shape


def test_the_report_says_what_was_covered(pairs: dict[str, Any]) -> None:
    """An equal verdict names the ranks, the dims > 1 of each operand, how many cases had
    distinct sizes, square sizes and broadcasting, and the dtypes."""
    _, right = pairs["sum over dim -2"]
    cov = right.coverage
    assert cov["ranks"] and set(cov["ranks"]) <= {2, 3, 4}
    assert {-1, -2} <= set(cov["dims_over_1"]["x"]), cov
    assert cov["distinct"] >= 1 and "square" in cov and "broadcast" in cov, cov
    assert "dims > 1: x -1, -2" in right.reason and "distinct" in right.reason, right.reason
    assert right.to_dict()["coverage"] == json.loads(json.dumps(right.to_dict()))["coverage"]


def test_draws_cover_ranks_0_to_5_broadcasts_distinct_and_square_shapes() -> None:
    """An unconstrained binary op: the compared cases span ranks 0 to 5, broadcast one
    operand against the other, give some operand dims of distinct sizes > 1 and some equal."""
    y = capture("y")
    rule = Rule("add_commuted", op("aten.add.Tensor", X, y), replace_with("aten.add.Tensor", ref("y"), ref("x")),
                [DtypeIn("x", {torch.float32}), DtypeIn("y", {torch.float32})])
    v = verify(rule, cases=60, max_examples=200)
    assert v.status == EQUAL, v
    cov = v.coverage
    assert cov["ranks"] == [0, 1, 2, 3, 4, 5], cov
    assert cov["distinct"] >= 10 and cov["square"] >= 5 and cov["broadcast"] >= 5, cov
    assert -5 in cov["dims_over_1"]["x"] and -5 in cov["dims_over_1"]["y"], cov
