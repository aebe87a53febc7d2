"""pytest plugin: every Vulkan preprocess twice, with fusionkit's preprocess rules and without.

Loaded after ``stock_vulkan_tests.simulator_runtime_plugin`` (which installs the takeover)
with ``-p stock_vulkan_tests.preprocess_rules_twin_plugin`` when running ExecuTorch's
Vulkan delegate suite by hand (``python3 tests/vulkan_delegate_stock.py`` does not load
it: it doubles preprocess). Each ``VulkanBackend.preprocess`` first runs on a deep copy
of its program with :func:`~fusionkit.backends.vulkan_adapter.preprocess_rules.disabled`
(the stock passes), then for real (the rules); the two results' payload bytes, named
data and debug handle maps are compared. Written to the JSON file named by
``FUSIONKIT_VULKAN_TWIN_SPY``: preprocess calls, identical ones, each mismatch (test,
what differs), and how often each replaced pass's rules ran, fused and declined.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

TWINS: dict[str, Any] = {"preprocess_calls": 0, "identical": 0, "mismatches": [],
                         "stock_failed": []}
CURRENT: list[str] = [""]


def _named_data(out: Any) -> Any:
    if out is None:
        return None

    def entries(table: dict[str, Any]) -> dict[str, Any]:
        from fusionkit.integration.spilled_data import blob_bytes

        return {key: (blob_bytes(out.buffers[e.buffer_index]), e.alignment, repr(e.tensor_layout))
                for key, e in table.items()}

    return entries(out.pte_data), {f: entries(t) for f, t in out.external_data.items()}


def _difference(reference: Any, result: Any) -> str | None:
    if reference.processed_bytes != result.processed_bytes:
        return (f"processed_bytes differ ({len(reference.processed_bytes)} vs "
                f"{len(result.processed_bytes)} bytes)")
    if _named_data(reference.data_store_output) != _named_data(result.data_store_output):
        return "named data differs"
    if reference.debug_handle_map != result.debug_handle_map:
        return "debug_handle_map differs"
    return None


def pytest_configure(config: Any) -> None:
    from executorch.backends.vulkan.vulkan_preprocess import VulkanBackend

    from fusionkit.backends.vulkan_adapter import preprocess_rules

    preprocess_rules.reset_counts()
    raw = VulkanBackend.__dict__["preprocess"]
    stock = raw.__func__

    def preprocess(cls: Any, program: Any, compile_specs: Any) -> Any:
        reference = None
        try:
            with preprocess_rules.disabled():
                reference = stock(cls, copy.deepcopy(program), compile_specs)
        except Exception as e:  # stock fails where the rules may not: recorded
            TWINS["stock_failed"].append([CURRENT[0], f"{type(e).__name__}: {e}"[:300]])
        result = stock(cls, program, compile_specs)
        TWINS["preprocess_calls"] += 1
        if reference is not None:
            diff = _difference(reference, result)
            if diff is None:
                TWINS["identical"] += 1
            else:
                TWINS["mismatches"].append([CURRENT[0], diff])
        return result

    VulkanBackend.preprocess = classmethod(preprocess)  # type: ignore[method-assign,assignment]


def pytest_runtest_setup(item: Any) -> None:
    CURRENT[0] = item.name


def pytest_unconfigure(config: Any) -> None:
    out = os.environ.get("FUSIONKIT_VULKAN_TWIN_SPY")
    if not out:
        return
    from fusionkit.backends.vulkan_adapter import preprocess_rules

    with open(out, "w") as f:
        json.dump({**TWINS, "rule_counts": preprocess_rules.counts()}, f, indent=1)
