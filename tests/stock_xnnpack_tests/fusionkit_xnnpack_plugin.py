"""pytest plugin: ExecuTorch's own XNNPACK op tests with fusionkit's XNNPACK adapter installed.

Loaded with ``-p stock_xnnpack_tests.fusionkit_xnnpack_plugin`` when running test files of
``executorch/backends/xnnpack/test/ops`` (they ship in the 1.5.1 wheel; nothing in
site-packages is edited). Those tests lower with ExecuTorch's Tester and stock
``XnnpackPartitioner``, serialize, run the ``.pte`` through the pybindings runtime and
compare with eager PyTorch. The plugin

* calls ``fusionkit.backends.xnnpack_adapter.install()`` before any test module is
  imported (``FUSIONKIT_XNNPACK_MODE=stock`` leaves it out: the baseline), so every
  lowering serializes constants through fusionkit and runs XNNPACK's preprocess passes
  through the gates of :mod:`fusionkit.backends.xnnpack_adapter.pass_gates`; ``uninstall()`` at the end, checking
  that ExecuTorch's own objects are back;
* with ``FUSIONKIT_XNNPACK_TWIN=1`` runs every ``XnnpackBackend.preprocess`` three times
  more before the real call, each on a deep copy: with the gates disabled, with the
  rules disabled (the stock pattern passes run instead of
  :mod:`fusionkit.backends.xnnpack_adapter.preprocess_rules`), and with fusionkit
  uninstalled (ExecuTorch's own preprocess), and compares each with the real result
  (delegate bytes, named data, debug handles): the gates must change no byte, the rules
  none either, and fusionkit's serializer none for constants that own their storage;
* with ``FUSIONKIT_XNNPACK_SEED=s`` seeds ``random`` and ``torch`` before each test (the
  op tests draw weights, inputs and the dynamic batch size at random, unseeded);
* keeps the tests whose index in the collected order is ``k`` modulo ``n`` when
  ``FUSIONKIT_SHARD=k/n`` is set;
* writes to the JSON file named by ``FUSIONKIT_XNNPACK_SPY``: the tests selected, each
  test's outcome (with the reason of any non-pass) and time, how often each pass ran and
  was skipped in each test, :func:`fusionkit.integration.pass_gating.counts` for the
  whole run, and the twin comparisons; rewritten after each test (``finished`` false until
  the run ends), so a run stopped early still leaves what it ran.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

MODE = os.environ.get("FUSIONKIT_XNNPACK_MODE", "fusionkit")
TWIN = os.environ.get("FUSIONKIT_XNNPACK_TWIN") == "1"

SELECTED: list[str] = []
OUTCOMES: dict[str, str] = {}
REASONS: dict[str, str] = {}
SECONDS: dict[str, float] = {}
GATES_BY_TEST: dict[str, dict[str, dict[str, int]]] = {}
RULES_BY_TEST: dict[str, dict[str, dict[str, int]]] = {}
STATE: dict[str, Any] = {"current": None, "installed_at_start": False, "before": {},
                         "rules_before": {}}
TWINS: dict[str, Any] = {"preprocess_calls": 0, "identical": 0, "mismatches": [],
                         "stock_identical": 0, "stock_mismatches": [],
                         "rules_off_identical": 0, "rules_off_mismatches": []}
_SAVED: dict[str, Any] = {}


def test_key(item: Any) -> str:
    """``file.py::Class::test`` (independent of the rootdir pytest picks)."""
    cls = getattr(item, "cls", None)
    parts = [Path(str(item.fspath)).name, *([cls.__name__] if cls is not None else []),
             item.name]
    return "::".join(parts)


# ----------------------------------------------------------------------------- twin


def _named_data(out: Any) -> Any:
    """A comparable form of a ``NamedDataStoreOutput`` (bytes per key, alignment, layout)."""
    if out is None:
        return None

    def entries(table: dict[str, Any]) -> dict[str, Any]:
        return {key: (bytes(out.buffers[e.buffer_index]) if isinstance(
                    out.buffers[e.buffer_index], bytes) else out.buffers[e.buffer_index].to_bytes(),
                      e.alignment, repr(e.tensor_layout))
                for key, e in table.items()}

    return (entries(out.pte_data),
            {f: entries(t) for f, t in out.external_data.items()})


def _difference(reference: Any, gated: Any) -> str | None:
    if reference.processed_bytes != gated.processed_bytes:
        return (f"processed_bytes differ ({len(reference.processed_bytes)} vs "
                f"{len(gated.processed_bytes)} bytes)")
    if _named_data(reference.data_store_output) != _named_data(gated.data_store_output):
        return "named data differs"
    if reference.debug_handle_map != gated.debug_handle_map:
        return "debug_handle_map differs"
    return None


def _install_twin() -> None:
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from fusionkit.integration import pass_gating

    original = XnnpackBackend.__dict__["preprocess"]
    _SAVED["preprocess"] = original
    orig = original.__func__

    def preprocess(edge_program: Any, compile_specs: Any) -> Any:
        stock = None
        if MODE == "fusionkit":  # ExecuTorch's own preprocess, fusionkit taken out
            from fusionkit.backends import xnnpack_adapter

            xnnpack_adapter.uninstall()
            try:
                stock = orig(copy.deepcopy(edge_program), compile_specs)
            finally:
                xnnpack_adapter.install()
        twin = copy.deepcopy(edge_program)
        with pass_gating.disabled():
            reference = orig(twin, compile_specs)
        rules_off = None
        if MODE == "fusionkit":  # fusionkit installed, the stock pattern passes instead of rules
            from fusionkit.backends.xnnpack_adapter import preprocess_rules

            with preprocess_rules.disabled():
                rules_off = orig(copy.deepcopy(edge_program), compile_specs)
        result = orig(edge_program, compile_specs)
        TWINS["preprocess_calls"] += 1
        diff = _difference(reference, result)
        if diff is None:
            TWINS["identical"] += 1
        else:
            TWINS["mismatches"].append({"test": STATE["current"], "difference": diff})
        if rules_off is not None:
            diff = _difference(rules_off, result)
            if diff is None:
                TWINS["rules_off_identical"] += 1
            else:
                TWINS["rules_off_mismatches"].append({"test": STATE["current"],
                                                      "difference": diff})
        if stock is not None:
            diff = _difference(stock, result)
            if diff is None:
                TWINS["stock_identical"] += 1
            else:
                TWINS["stock_mismatches"].append({"test": STATE["current"], "difference": diff})
        return result

    XnnpackBackend.preprocess = staticmethod(preprocess)  # type: ignore[method-assign]


def _uninstall_twin() -> None:
    if "preprocess" in _SAVED:
        from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

        XnnpackBackend.preprocess = _SAVED.pop("preprocess")  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- hooks


def pytest_configure(config: Any) -> None:
    passes = importlib.import_module("executorch.backends.xnnpack._passes")
    _SAVED["_transform"] = passes._transform
    if MODE == "fusionkit":
        from fusionkit.backends import xnnpack_adapter
        from fusionkit.backends.xnnpack_adapter import serializer
        from fusionkit.integration import pass_gating

        xnnpack_adapter.install()
        pass_gating.reset_counts()
        nv = importlib.import_module("executorch.backends.xnnpack.operators.node_visitor")
        STATE["installed_at_start"] = (
            xnnpack_adapter.is_installed()
            and nv.NodeVisitor.get_serialized_buffer_index is serializer.get_serialized_buffer_index
            and getattr(passes._transform, "__wrapped__", None) is _SAVED["_transform"])
    if TWIN:
        _install_twin()


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: shard and record what runs
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    shard = os.environ.get("FUSIONKIT_SHARD")
    if shard:
        k, n = (int(v) for v in shard.split("/"))
        keep = [it for i, it in enumerate(items) if i % n == k]
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep
    SELECTED.extend(test_key(it) for it in items)


def _gate_totals() -> dict[str, dict[str, int]]:
    if MODE != "fusionkit":
        return {}
    from fusionkit.integration import pass_gating

    return pass_gating.counts()


def _rule_totals() -> dict[str, dict[str, int]]:
    if MODE != "fusionkit":
        return {}
    from fusionkit.backends.xnnpack_adapter import preprocess_rules

    return preprocess_rules.counts()


def pytest_runtest_setup(item: Any) -> None:
    STATE["current"] = test_key(item)
    seed = os.environ.get("FUSIONKIT_XNNPACK_SEED")
    if seed:  # the same weights, inputs and random batch sizes in every run (stock or ours)
        import random

        import torch

        random.seed(int(seed))
        torch.manual_seed(int(seed))
    STATE["before"] = _gate_totals()
    STATE["rules_before"] = _rule_totals()


def pytest_runtest_teardown(item: Any) -> None:
    rules_before, rules_now = STATE["rules_before"], _rule_totals()
    RULES_BY_TEST[test_key(item)] = {
        name: {k: c[k] - rules_before.get(name, {}).get(k, 0) for k in ("runs", "fused")}
        for name, c in rules_now.items()
        if any(c[k] != rules_before.get(name, {}).get(k, 0) for k in ("runs", "fused"))}
    before, now = STATE["before"], _gate_totals()
    delta: dict[str, dict[str, int]] = {}
    for name, c in now.items():
        d = {o: c[o] - before.get(name, {}).get(o, 0) for o in ("ran", "skipped")}
        if any(d.values()):
            delta[name] = d
    GATES_BY_TEST[test_key(item)] = delta
    _write(None, now)


def pytest_runtest_logreport(report: Any) -> None:
    key = STATE["current"] or report.nodeid
    SECONDS[key] = round(SECONDS.get(key, 0.0) + report.duration, 2)
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            outcome = "xpassed" if xfail else "passed"
        elif report.skipped:
            outcome = "xfailed" if xfail else "skipped"
        else:
            outcome = "failed"
    elif report.skipped and report.when == "setup":
        outcome = "skipped"
    elif report.failed:
        outcome = "error"
    else:
        return
    OUTCOMES[key] = outcome
    if outcome != "passed":
        text = str(report.longrepr) if report.longrepr is not None else ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        REASONS[key] = (getattr(report, "wasxfail", "") or (lines[-1] if lines else ""))[:500]


def _write(restored: bool | None, gates: dict[str, dict[str, int]]) -> None:
    """The record so far (``finished`` false, ``restored_at_end`` None: written after each
    test, so a run stopped before its end still leaves the tests it ran), or the final one."""
    out = os.environ.get("FUSIONKIT_XNNPACK_SPY")
    if not out:
        return
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump({"mode": MODE, "installed_at_start": STATE["installed_at_start"],
                   "restored_at_end": restored, "finished": restored is not None,
                   "selected": SELECTED, "outcomes": OUTCOMES,
                   "reasons": REASONS, "seconds": SECONDS, "gates_by_test": GATES_BY_TEST,
                   "gate_counts": gates,
                   "rules_by_test": RULES_BY_TEST, "rule_counts": _rule_totals(),
                   "twin": TWINS if TWIN else None}, f, indent=1, sort_keys=True)
    os.replace(tmp, out)


def pytest_unconfigure(config: Any) -> None:
    _uninstall_twin()
    gates = _gate_totals()
    restored = True
    if MODE == "fusionkit":
        from fusionkit.backends import xnnpack_adapter

        xnnpack_adapter.uninstall()
        passes = importlib.import_module("executorch.backends.xnnpack._passes")
        restored = not xnnpack_adapter.is_installed() and passes._transform is _SAVED["_transform"]
    _write(restored, gates)
