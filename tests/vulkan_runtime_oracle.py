"""The real Vulkan runtime as a second oracle for tests that prove a lowering with the simulator.

A test module declares a module-scoped fixture from :func:`session` and, after its
simulator check, calls :func:`assert_real` with the same program, inputs and expected
outputs. With a runtime present, every program of the module runs in one child process
(:class:`~fusionkit.backends.vulkan_adapter.runtime.RuntimeSession`: the runtime loads once
per module) and must equal the expectation there too. Without one the simulator stays the
only oracle — unless ``FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1`` (CI) or ``CI=true``: then a
missing runtime fails the module's tests instead of passing them on the simulator alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

from fusionkit.backends.vulkan_adapter import runtime as rt


def required() -> bool:
    return (os.environ.get("FUSIONKIT_REQUIRE_VULKAN_RUNTIME") == "1"
            or os.environ.get("CI") == "true")


def session(timeout: float = 300.0) -> Callable[[], Iterator[rt.RuntimeSession | None]]:
    """A module-scoped fixture: the module's child process, or None without a runtime."""

    @pytest.fixture(scope="module")
    def real_vulkan() -> Iterator[rt.RuntimeSession | None]:
        if rt.find_runtime() is None:
            if required():
                pytest.fail("no real Vulkan runtime (FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1 / CI): "
                            "run `bash scripts/vulkan-runtime`")
            yield None
            return
        with rt.RuntimeSession(timeout=timeout) as s:
            yield s

    return real_vulkan


def pte_of(program: Any) -> bytes:
    """The .pte bytes of an EdgeProgramManager, an ExecutorchProgramManager or bytes."""
    if isinstance(program, (bytes, bytearray)):
        return bytes(program)
    if hasattr(program, "to_executorch"):
        program = program.to_executorch()
    return bytes(program.buffer)


def run_real(real: rt.RuntimeSession | None, program: Any,
             inputs: Sequence[Any]) -> list[Any] | None:
    """The program's outputs on the real runtime (None without one); a refusal fails."""
    if real is None:
        return None
    flat = [x for x in pytree.tree_leaves(list(inputs))]
    res = real.run(pte_of(program), flat)
    assert res.ok, f"the real Vulkan runtime {res.status}: {res.message}\n{res.stderr[-2000:]}"
    return list(res.outputs or [])


def assert_real(real: rt.RuntimeSession | None, program: Any, inputs: Sequence[Any],
                expected: Any, *, atol: float, rtol: float) -> list[Any] | None:
    """The program on the real runtime equals ``expected`` (every output leaf)."""
    got = run_real(real, program, inputs)
    if got is None:
        return None
    want = [w for w in pytree.tree_leaves(expected) if isinstance(w, torch.Tensor)]
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol,
                                   msg=lambda m: f"on the real Vulkan runtime: {m}")
    return got


def lower_one_way(model: torch.nn.Module, args: tuple[Any, ...], path: str) -> tuple[Any, Any]:
    """``model`` lowered for Vulkan by stock ExecuTorch 1.5.1 (``path="stock"``: fusionkit's
    adapter and serializer uninstalled first; the caller restores them) or by fusionkit's
    drop-in: ``(ExecutorchProgramManager, partitioner)``."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as StockVulkanPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower

    import fusionkit.backends.vulkan_adapter as vk
    from fusionkit.backends.vulkan_adapter import constant_serializer

    ep = torch.export.export(model, args)
    part: Any
    if path == "stock":
        vk.uninstall()
        constant_serializer.uninstall()
        part = StockVulkanPartitioner()
        edge = to_edge_transform_and_lower(ep, partitioner=[part])
    else:
        part = vk.VulkanPartitioner()
        edge = to_edge_transform_and_lower(
            ep, transform_passes=vk.transform_passes(partitioner=part), partitioner=[part])
    return edge.to_executorch(), part


def simulated_or_condition(et: Any, args: Sequence[Any]) -> Any:
    """The simulator's flat outputs for ``et``, or the runtime condition / the argument that
    is not a constant it stopped on (the program is unloaded after, so the next case starts
    from its serialized state)."""
    import fusionkit.backends.vulkan_adapter as vk
    from fusionkit.backends.vulkan_adapter.inspect.simulator import (
        NotConstantError,
        RuntimeConditionError,
        unload,
    )

    try:
        return pytree.tree_leaves(vk.simulate(et, *args))
    except (RuntimeConditionError, NotConstantError) as e:
        return e
    finally:
        unload(et)


@contextlib.contextmanager
def adapter_state_restored() -> Iterator[None]:
    """Whether fusionkit's Vulkan adapter and serializer are installed, as it was before the
    block (:func:`lower_one_way`'s stock path uninstalls both)."""
    import fusionkit.backends.vulkan_adapter as vk
    from fusionkit.backends.vulkan_adapter import constant_serializer

    was_installed, serializer_was = vk.is_installed(), constant_serializer.is_installed()
    try:
        yield
    finally:
        vk.uninstall()
        (constant_serializer.install if serializer_was else constant_serializer.uninstall)()
        if was_installed:
            vk.install()
