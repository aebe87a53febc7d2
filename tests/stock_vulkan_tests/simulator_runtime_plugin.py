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
  tests selected.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

OPS: Counter[str] = Counter()
CALLS: list[int] = [0]
SELECTED: list[str] = []


class SimulatedModule:
    """What ``_load_for_executorch_from_buffer`` returns: ``run_method`` simulates."""

    def __init__(self, program: Any) -> None:
        self.program = program

    def run_method(self, method: str, inputs: Any) -> list[Any]:
        from torch.utils import _pytree as pytree

        from fusionkit.backends.vulkan_adapter.inspect.simulator import DelegateRun, simulate

        trace: list[DelegateRun] = []
        out = simulate(self.program, *inputs, method=method, trace=trace)
        CALLS[0] += 1
        for run in trace:
            OPS.update(run.ops)
        return list(pytree.tree_leaves(out))


def pytest_configure(config: Any) -> None:
    from fusionkit.backends.vulkan_adapter import install

    install()


def _patch(cls: Any) -> None:
    mod = sys.modules[cls.__module__]
    original = cls.run_delegated_model_and_check_output

    def run_delegated_model_and_check_output(self: Any, et_program: Any, *args: Any,
                                             **kwargs: Any) -> Any:
        saved = mod._load_for_executorch_from_buffer
        mod._load_for_executorch_from_buffer = lambda _buffer: SimulatedModule(et_program)
        try:
            return original(self, et_program, *args, **kwargs)
        finally:
            mod._load_for_executorch_from_buffer = saved

    cls.run_delegated_model_and_check_output = run_delegated_model_and_check_output


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
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


def pytest_unconfigure(config: Any) -> None:
    out = os.environ.get("FUSIONKIT_DELEGATE_SPY")
    if not out:
        return
    with open(out, "w") as f:
        json.dump({"simulate_calls": CALLS[0], "ops": dict(OPS), "selected": SELECTED}, f)
