"""pytest plugin: run ExecuTorch's own Vulkan pass tests with fusionkit's adapter installed.

Loaded with ``-p stock_vulkan_tests.fusionkit_adapter_plugin``. Before any test
module is imported it wraps every entry of ExecuTorch's pattern registry
(detector, replacement, pattern-graph functions) in a counting spy, then calls
``fusionkit.backends.vulkan_adapter.install()``. At the end it writes what the
spies saw, and what fusionkit fused inside ``FusePatternsPass``, to the JSON
file named by ``FUSIONKIT_STOCK_SPY``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

CALLS: Counter[str] = Counter()


def _spy(label: str, fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
    if fn is None:
        return None

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        CALLS[label] += 1
        return fn(*args, **kwargs)

    return wrapped


def pytest_configure(config: Any) -> None:
    import executorch.backends.vulkan.patterns  # noqa: F401  registers every stock pattern
    from executorch.backends.vulkan.patterns.pattern_registry import fusable_patterns

    for name, entry in fusable_patterns.items():
        entry.detector_fn = _spy(f"{name}.detector", entry.detector_fn)
        entry.create_replacement_fn = _spy(f"{name}.replacement", entry.create_replacement_fn)
        entry.get_graphs_fn = _spy(f"{name}.get_graphs", entry.get_graphs_fn)

    from fusionkit.backends.vulkan_adapter import install

    install()


def pytest_unconfigure(config: Any) -> None:
    out = os.environ.get("FUSIONKIT_STOCK_SPY")
    if not out:
        return
    import importlib

    mod = importlib.import_module("fusionkit.backends.vulkan_adapter.install")
    with open(out, "w") as f:
        json.dump({"stock_calls": dict(CALLS),
                   "fusionkit_fused": dict(mod.FUSED_IN_FUSE_PATTERNS_PASS),
                   "installed": mod.is_installed()}, f)
