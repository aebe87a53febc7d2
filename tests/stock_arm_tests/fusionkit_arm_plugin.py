"""pytest plugin: ExecuTorch's own Arm tests with fusionkit's Arm adapter installed.

Loaded with ``-p stock_arm_tests.fusionkit_arm_plugin`` when running test files of
``executorch/backends/arm/test`` (they ship in the 1.5.1 wheel; nothing in site-packages
is edited). The plugin

* calls ``fusionkit.backends.arm_adapter.install()`` before any test module is imported
  (``FUSIONKIT_ARM_MODE=stock`` leaves it out: the baseline), so every Arm lowering runs
  the ``"arm"`` rules in place of the stock fusions they take over; ``uninstall()`` at the
  end, checking that ExecuTorch's ``ArmPassManager._transform`` is back;
* twins every ``TOSABackend._preprocess`` (TOSA, and Ethos-U / VGF through it): a deep copy
  of the partition is first preprocessed with the rules disabled (the stock passes), and
  its TOSA flatbuffer compared with the real call's, byte for byte;
* writes to the JSON file named by ``FUSIONKIT_ARM_SPY``: each test's outcome (with the
  reason of a non-pass) and time, the twin comparisons (which tests differ), and
  :func:`~fusionkit.backends.arm_adapter.preprocess_rules.counts` for the whole run;
  rewritten after each test, so a run stopped early still leaves what it ran.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

MODE = os.environ.get("FUSIONKIT_ARM_MODE", "fusionkit")
OUTCOMES: dict[str, str] = {}
REASONS: dict[str, str] = {}
SECONDS: dict[str, float] = {}
STATE: dict[str, Any] = {"current": None}
TWINS: dict[str, Any] = {"preprocess_calls": 0, "identical": 0, "mismatches": [],
                         "twin_errors": []}
_SAVED: dict[str, Any] = {}


def _write(finished: bool = False) -> None:
    path = os.environ.get("FUSIONKIT_ARM_SPY")
    if not path:
        return
    from fusionkit.backends.arm_adapter import preprocess_rules

    Path(path).write_text(json.dumps({
        "mode": MODE, "finished": finished, "outcomes": OUTCOMES, "reasons": REASONS,
        "seconds": SECONDS, "twins": TWINS, "rules": preprocess_rules.counts()}, indent=1))


def _twinned(stock: Any) -> Any:
    from fusionkit.backends.arm_adapter import preprocess_rules

    def _preprocess(edge_program: Any, compile_spec: Any, *args: Any, **kwargs: Any) -> Any:
        twin = None
        try:
            copied = copy.deepcopy(edge_program)
            with preprocess_rules.disabled():
                twin = stock(copied, copy.deepcopy(compile_spec), *args, **kwargs)
        except Exception as e:  # the stock twin itself failed: recorded, the real call goes on
            TWINS["twin_errors"].append([STATE["current"], f"{type(e).__name__}: {e}"[:300]])
        result = stock(edge_program, compile_spec, *args, **kwargs)
        if twin is not None:
            TWINS["preprocess_calls"] += 1
            if bytes(twin.processed_bytes) == bytes(result.processed_bytes):
                TWINS["identical"] += 1
            else:
                TWINS["mismatches"].append(STATE["current"])
        return result

    return _preprocess


def pytest_configure(config: Any) -> None:
    if MODE == "stock":
        return
    from executorch.backends.arm.tosa.backend import TOSABackend

    from fusionkit.backends import arm_adapter

    arm_adapter.install()
    raw = TOSABackend.__dict__["_preprocess"]
    _SAVED["preprocess"] = raw
    TOSABackend._preprocess = staticmethod(_twinned(raw.__func__))  # type: ignore[method-assign]


def pytest_unconfigure(config: Any) -> None:
    if MODE == "stock":
        _write(finished=True)
        return
    from executorch.backends.arm._passes.arm_pass_manager import ArmPassManager
    from executorch.backends.arm.tosa.backend import TOSABackend

    from fusionkit.backends import arm_adapter

    TOSABackend._preprocess = _SAVED["preprocess"]  # type: ignore[method-assign]
    patched = ArmPassManager.__dict__["_transform"]
    arm_adapter.uninstall()
    restored = ArmPassManager.__dict__["_transform"]
    TWINS["restored"] = restored is getattr(patched, "__wrapped__", None)
    _write(finished=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    STATE["current"] = item.nodeid.split("/")[-1]
    yield
    _write()


def pytest_runtest_logreport(report: Any) -> None:
    key = report.nodeid.split("/")[-1]
    if report.when == "call" or (report.when == "setup" and not report.passed):
        OUTCOMES[key] = report.outcome
        SECONDS[key] = round(report.duration, 2)
        if not report.passed:
            REASONS[key] = str(report.longrepr)[-400:]
