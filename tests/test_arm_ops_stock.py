"""ExecuTorch's own Arm tests with fusionkit's Arm adapter installed (a fixed subset).

``executorch/backends/arm/test`` ships in the 1.5.1 wheel; its tests lower with Arm's
tester and stock ``TOSAPartitioner`` and run the program on the TOSA reference model
against eager. Here they run in a subprocess with
``stock_arm_tests.fusionkit_arm_plugin``: ``arm_adapter.install()`` for the whole run (the
``"arm"`` rules in place of the stock fusions, process-wide) and every TOSA preprocess
twinned with the stock passes on a copy, whose flatbuffer must be byte-identical.

:data:`SUBSET` is five tests that lower through the whole TOSA pipeline with the
patterns of the fusions taken over (Arm's own pass tests mostly run a stock pass class
directly, ``PassPipeline``, which the takeover does not touch). ``FUSIONKIT_ARM_OPS_SUITE=0``
leaves it out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tosa_reference_model")
_SPEC = importlib.util.find_spec("executorch.backends.arm.test")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("ExecuTorch's Arm tests are not installed", allow_module_level=True)

HERE = Path(__file__).parent
ARM_TESTS = Path(next(iter(_SPEC.submodule_search_locations)))

#: test (under executorch/backends/arm/test) -> the taken-over pass whose rule it runs
SUBSET: dict[str, str] = {
    "misc/test_conv_relu_residual_add.py::"
    "test_conv_relu_residual_add_tosa_INT[per_channel_quantization=true]":
        "FuseQuantizedActivationPass (conv + relu, int8)",
    "ops/test_hardtanh.py::test_hardtanh_tosa_INT[rand]":
        "FuseQuantizedActivationPass / FuseConsecutiveClampsPass",
    "ops/test_slice.py::test_slice_tensor_tosa_FP[ones_slice_3]": "FuseConsecutiveSlicesPass",
    "passes/test_rescale_optimization.py::"
    "test_fuse_consecutive_rescales_tosa_INT_lstm_gate_pattern_pipeline":
        "FuseConsecutiveRescalesPass (its LSTM-gate regression)",
    "passes/test_remove_safe_softmax_guard_pass.py::"
    "test_sdpa_safe_softmax_guard_remove_removes_guard_before_tosa_lowering":
        "RemoveSafeSoftmaxGuardPass (policy REMOVE)",
}

#: taken-over passes a rule must have fused at least once in the subset
MUST_FUSE = ("FuseQuantizedActivationPass", "RemoveSafeSoftmaxGuardPass")


@pytest.mark.skipif(os.environ.get("FUSIONKIT_ARM_OPS_SUITE") == "0",
                    reason="ExecuTorch's Arm tests left out (FUSIONKIT_ARM_OPS_SUITE=0)")
def test_arms_own_tests_pass_with_the_rules_and_give_stocks_tosa(tmp_path: Path) -> None:
    spy = tmp_path / "arm_spy.json"
    env = {**os.environ, "FUSIONKIT_ARM_SPY": str(spy),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    tests = [str(ARM_TESTS / t) for t in SUBSET]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "stock_arm_tests.fusionkit_arm_plugin", *tests],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    record = json.loads(spy.read_text())
    assert record["finished"], proc.stdout[-2000:]
    assert set(record["outcomes"].values()) == {"passed"}, record["reasons"]
    assert len(record["outcomes"]) == len(SUBSET), proc.stdout[-2000:]
    assert proc.returncode == 0, proc.stdout[-2000:]
    twins = record["twins"]
    assert twins["twin_errors"] == []
    assert twins["preprocess_calls"] >= len(SUBSET)
    assert twins["identical"] == twins["preprocess_calls"], twins["mismatches"]
    assert twins["restored"]  # uninstall() put ExecuTorch's own _transform back
    for name in MUST_FUSE:
        assert record["rules"][name]["fused"] >= 1, (name, record["rules"])
