"""pytest plugin: ExecuTorch's Vulkan delegate suite with the simulator as the Vulkan runtime.

Loaded with ``-p stock_vulkan_tests.simulator_runtime_plugin`` when running
``executorch/backends/vulkan/test/test_vulkan_delegate.py`` (it ships in the
1.5.1 wheel; nothing in site-packages is edited). It

* installs fusionkit's takeover (``fusionkit.backends.vulkan_adapter.install()``)
  before the test module is imported, so every lowering in the suite goes
  through fusionkit's fusions;
* wraps ``TestVulkanBackend.run_delegated_model_and_check_output`` so that, for
  the duration of the call, the module's ``_load_for_executorch_from_buffer``
  (the portable runtime, which has no Vulkan backend in the wheel) returns a
  :class:`SimulatedModule` running the test's ``ExecutorchProgramManager``
  through :func:`fusionkit.backends.vulkan_adapter.simulate`. The rest of the
  test (lowering, delegation checks, tolerances, comparison) is ExecuTorch's;
* keeps the tests whose index in the collected order is ``k`` modulo ``n`` when
  ``FUSIONKIT_SHARD=k/n`` is set (the suite is split into shards that run on
  separate workers), and writes what ran to the JSON file named by
  ``FUSIONKIT_DELEGATE_SPY``: simulate calls, the ops the delegates ran, the
  tests selected;
* with ``FUSIONKIT_DELEGATE_REAL=1``, makes ExecuTorch's real Vulkan runtime the oracle
  too (:mod:`stock_vulkan_tests.real_runtime_oracle`): every program a test runs is kept
  with its inputs, the eager outputs and the test's tolerances, and at the end of the
  test run all of them run in one child process on the real runtime (the runtime load is
  the cost, not the programs); what each did, and whether the simulator predicted it,
  goes to the spy file under ``real``;
* with ``FUSIONKIT_DELEGATE_PATH=stock``, leaves fusionkit uninstalled (ExecuTorch's own
  lowering), to compare stock's programs with ours — its Vulkan pattern graphs (constant:
  rope, hf_rope, sdpa, the quantized ones) built once per test run instead of re-exported on
  every partitioner and preprocess call (what makes a stock lowering 3-5x ours; the graphs
  and so the lowerings are the same); ``FUSIONKIT_DELEGATE_ONLY=a,b`` keeps only the named
  tests (the CI subset);
* with ``FUSIONKIT_DELEGATE_CPU_ONLY=1``, lets a test go on past ExecuTorch's
  ``check_vk_delegation`` when its program has no delegate at all (every op kept on the
  CPU), so that the test's own comparison with eager judges the program; each such test is
  named in the spy file under ``cpu_only``.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

from stock_vulkan_tests import real_runtime_oracle as oracle

OPS: Counter[str] = Counter()
CALLS: list[int] = [0]
SELECTED: list[str] = []
CURRENT: list[str] = [""]
CPU_ONLY: list[str] = []


class SimulatedModule:
    """What ``_load_for_executorch_from_buffer`` returns: ``run_method`` simulates."""

    def __init__(self, program: Any) -> None:
        self.program = program
        #: per run_method call: the outputs, or the SimulationError raised
        self.calls: list[Any] = []

    def run_method(self, method: str, inputs: Any) -> list[Any]:
        from torch.utils import _pytree as pytree

        from fusionkit.backends.vulkan_adapter.inspect.simulator import (
            DelegateRun,
            SimulationError,
            simulate,
        )

        trace: list[DelegateRun] = []
        try:
            out = simulate(self.program, *inputs, method=method, trace=trace)
        except SimulationError as e:
            self.calls.append(e)
            raise
        CALLS[0] += 1
        for run in trace:
            OPS.update(run.ops)
        leaves = list(pytree.tree_leaves(out))
        self.calls.append(leaves)
        return leaves


def pytest_configure(config: Any) -> None:
    if os.environ.get("FUSIONKIT_DELEGATE_PATH", "fusionkit") == "stock":
        _pattern_graphs_once()
        return  # ExecuTorch's own lowering; the simulator still stands in for the runtime
    from fusionkit.backends.vulkan_adapter import install

    install()


def _pattern_graphs_once() -> None:
    """Each stock pattern entry's graphs built on first use and handed back after (as
    benchmarks/harness.py's cached run and tests/vulkan_real_programs.py do)."""
    import executorch.backends.vulkan.patterns  # noqa: F401  registers every stock pattern
    from executorch.backends.vulkan.patterns.pattern_registry import fusable_patterns

    for entry in fusable_patterns.values():
        fn = entry.get_graphs_fn
        if fn is None:
            continue
        memo: list[Any] = []

        def once(fn: Any = fn, memo: list[Any] = memo) -> Any:
            if not memo:
                memo.append(list(fn()))
            return memo[0]

        entry.get_graphs_fn = once


def _patch(cls: Any) -> None:
    mod = sys.modules[cls.__module__]
    original = cls.run_delegated_model_and_check_output

    def run_delegated_model_and_check_output(self: Any, et_program: Any, *args: Any,
                                             **kwargs: Any) -> Any:
        saved = mod._load_for_executorch_from_buffer
        sim = SimulatedModule(et_program)
        mod._load_for_executorch_from_buffer = lambda _buffer: sim
        try:
            return original(self, et_program, *args, **kwargs)
        finally:
            mod._load_for_executorch_from_buffer = saved
            if oracle.ENABLED:
                oracle.record(CURRENT[0], original, self, et_program, args, kwargs, sim.calls)

    cls.run_delegated_model_and_check_output = run_delegated_model_and_check_output
    if os.environ.get("FUSIONKIT_DELEGATE_CPU_ONLY") == "1" and hasattr(cls, "check_vk_delegation"):
        check = cls.check_vk_delegation

        def check_vk_delegation(self: Any, et_program: Any) -> Any:
            plans = et_program.executorch_program.execution_plan
            if not any(plan.delegates for plan in plans):
                CPU_ONLY.append(CURRENT[0])
                return None
            return check(self, et_program)

        cls.check_vk_delegation = check_vk_delegation


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    only = os.environ.get("FUSIONKIT_DELEGATE_ONLY")
    if only:
        names = set(only.split(","))
        config.hook.pytest_deselected(items=[it for it in items if it.name not in names])
        items[:] = [it for it in items if it.name in names]
    shard = os.environ.get("FUSIONKIT_SHARD")
    if shard:
        k, n = (int(v) for v in shard.split("/"))
        keep = [it for i, it in enumerate(items) if i % n == k]
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep
    patched: set[Any] = set()
    for item in items:
        SELECTED.append(item.name)
        cls = getattr(item, "cls", None)
        if cls is not None and cls not in patched and hasattr(
                cls, "run_delegated_model_and_check_output"):
            _patch(cls)
            patched.add(cls)


def pytest_runtest_setup(item: Any) -> None:
    CURRENT[0] = item.name


def pytest_unconfigure(config: Any) -> None:
    out = os.environ.get("FUSIONKIT_DELEGATE_SPY")
    if not out:
        return
    data: dict[str, Any] = {"simulate_calls": CALLS[0], "ops": dict(OPS), "selected": SELECTED,
                            "path": os.environ.get("FUSIONKIT_DELEGATE_PATH", "fusionkit"),
                            "cpu_only": CPU_ONLY}
    if oracle.ENABLED:
        data.update(oracle.run_recorded())
    with open(out, "w") as f:
        json.dump(data, f)
