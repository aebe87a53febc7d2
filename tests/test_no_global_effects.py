"""Using fusionkit changes only the lowering it is part of (issue 14, seen failure 3).

In one process, for both backends: a stock lowering gives a byte-identical ``.pte``
before and after a fusionkit lowering, and every ExecuTorch object fusionkit may
patch is the very same object afterwards. A process-wide change happens only
through an explicit ``install()``, and ``uninstall()`` restores ExecuTorch exactly.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
    VulkanPartitioner as StockVulkanPartitioner,
)
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as StockXnnpackPartitioner,
)
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
from rmsnorm_models import D, GemmaPlusOne

import fusionkit.backends.vulkan_adapter as vk
import fusionkit.backends.xnnpack_adapter as xa
from fusionkit.backends.vulkan_adapter import pass_gates as vulkan_gates
from fusionkit.backends.xnnpack_adapter import pass_gates as xnnpack_gates
from fusionkit.integration import pass_gating
from fusionkit.integration.scoped import MARKER_KEY


class ViewWeightLinear(torch.nn.Module):
    """A linear whose fp16 weight is a view into a packed tensor (stock serializes it wrong)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("w", torch.randn(3, D, D).half()[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.w)


def _patchable_objects() -> dict[str, Any]:
    """Every ExecuTorch object one of fusionkit's hooks may replace, by name."""
    import executorch.backends.vulkan.patterns  # noqa: F401  registers the stock patterns
    from executorch.backends.vulkan.patterns.pattern_registry import fusable_patterns

    objects: dict[str, Any] = {f"registry[{k}]": v for k, v in fusable_patterns.items()}
    objects["registry order"] = tuple(fusable_patterns)
    # the adapters' patch sets (vk.PATCHES, xa.PATCHES) and every set they include
    for patches in (vk.PATCHES, vk.constant_serializer.PATCHES, xa.serializer.SERIALIZER_PATCHES,
                    vulkan_gates.PATCHES, xnnpack_gates.PATCHES,
                    vk.preprocess_rules.PATCHES, xa.preprocess_rules.PATCHES,
                    vk.boundary_dim_order.PATCHES):
        for owner, name, _ in patches._patches():
            if not isinstance(owner, dict):
                objects[f"{getattr(owner, '__name__', owner)}.{name}"] = vars(owner).get(
                    name, getattr(owner, name))
    for module, cls in (("executorch.backends.vulkan.vulkan_preprocess", "VulkanBackend"),
                        ("executorch.backends.xnnpack.xnnpack_preprocess", "XnnpackBackend")):
        owner = getattr(importlib.import_module(module), cls)
        objects[f"{cls}.preprocess"] = vars(owner)["preprocess"]
    return objects


def _pte(ep: Any, partitioner: Any, passes: Any = None) -> bytes:
    prog = to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[partitioner])
    return bytes(prog.to_executorch().buffer)


@pytest.fixture(scope="module")
def gemma() -> tuple[Any, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = GemmaPlusOne()
    inputs = (torch.randn(2, D),)
    return torch.export.export(model, inputs), inputs


@pytest.fixture(scope="module")
def view_linear() -> tuple[Any, torch.nn.Module, tuple[torch.Tensor, ...]]:
    model = ViewWeightLinear()
    inputs = (torch.randn(2, D).half(),)
    return torch.export.export(model, inputs), model, inputs


def test_vulkan_stock_lowering_is_identical_before_and_after_fusionkit(gemma: Any) -> None:
    ep, _ = gemma
    vk.uninstall()
    objects_before = _patchable_objects()
    stock_before = _pte(ep, StockVulkanPartitioner())
    assert vk.check(stock_before), "stock must still show its runtime-abort problem"

    ours = _pte(ep, vk.VulkanPartitioner(), vk.transform_passes())
    assert vk.check(ours) == []
    assert ours != stock_before

    assert _pte(ep, StockVulkanPartitioner()) == stock_before
    assert _patchable_objects() == objects_before
    assert not vk.is_installed() and not vk.partitioner.PREPROCESS_SCOPE.is_dispatching()


def test_vulkan_fusionkit_partitions_are_marked_stock_ones_are_not() -> None:
    ours = vk.VulkanPartitioner()
    assert [s.key for s in ours.delegation_spec.compile_specs].count(MARKER_KEY) == 1
    assert MARKER_KEY not in [s.key for s in StockVulkanPartitioner().delegation_spec.compile_specs]


def test_vulkan_explicit_install_is_process_wide_and_uninstall_restores(gemma: Any) -> None:
    ep, _ = gemma
    vk.uninstall()
    objects_before = _patchable_objects()
    stock = _pte(ep, StockVulkanPartitioner())
    with vk.install():
        taken_over = _pte(ep, StockVulkanPartitioner())
        assert vk.check(taken_over) == []  # the stock partitioner now lowers without the abort
    assert _patchable_objects() == objects_before
    assert _pte(ep, StockVulkanPartitioner()) == stock


def test_xnnpack_stock_lowering_is_identical_before_and_after_fusionkit(view_linear: Any) -> None:
    ep, model, inputs = view_linear
    xa.uninstall()
    objects_before = _patchable_objects()
    stock_before = _pte(ep, StockXnnpackPartitioner())
    ours = _pte(ep, xa.XnnpackPartitioner())  # no transform passes: the serializer alone
    assert _pte(ep, StockXnnpackPartitioner()) == stock_before
    assert _patchable_objects() == objects_before
    assert not xa.is_installed() and not xa.partitioner.PREPROCESS_SCOPE.is_dispatching()

    expected = model(*inputs)
    run = lambda pte: _load_for_executorch_from_buffer(pte).forward(inputs)[0]  # noqa: E731
    assert torch.allclose(run(ours), expected, atol=1e-2), "fusionkit's lowering is right"
    assert not torch.allclose(run(stock_before), expected, atol=1e-2), "stock's view bug"


def test_xnnpack_explicit_install_fixes_stock_until_uninstall(view_linear: Any) -> None:
    ep, model, inputs = view_linear
    xa.uninstall()
    stock = _pte(ep, StockXnnpackPartitioner())
    with xa.install():
        fixed = _pte(ep, StockXnnpackPartitioner())
    out = _load_for_executorch_from_buffer(fixed).forward(inputs)[0]
    assert torch.allclose(out, model(*inputs), atol=1e-2)
    assert _pte(ep, StockXnnpackPartitioner()) == stock


def test_a_failed_fusionkit_lowering_leaves_stock_untouched(gemma: Any) -> None:
    """Partitioned but never preprocessed: the dispatcher stays transparent to stock."""
    ep, _ = gemma
    stock = _pte(ep, StockVulkanPartitioner())
    from executorch.exir import to_edge

    edge = to_edge(ep).exported_program()
    vk.VulkanPartitioner().partition(edge)  # a lowering that stops after partitioning
    assert _pte(ep, StockVulkanPartitioner()) == stock
    vk.partitioner.PREPROCESS_SCOPE.reset()
    assert not vk.partitioner.PREPROCESS_SCOPE.is_dispatching()


@pytest.mark.parametrize("backend", ["vulkan", "xnnpack"])
def test_pass_gating_acts_on_fusionkit_partitions_only(gemma: Any, backend: str) -> None:
    """Stock lowerings run every preprocess pass; a fusionkit lowering skips some, and
    afterwards ExecuTorch's ``_transform`` names are the stock objects again."""
    ep, _ = gemma
    adapter, stock = ((vk, StockVulkanPartitioner) if backend == "vulkan"
                      else (xa, StockXnnpackPartitioner))
    adapter.uninstall()
    objects_before = _patchable_objects()
    pass_gating.reset_counts()
    _pte(ep, stock())
    assert pass_gating.counts() == {}, "a stock lowering never reaches the gates"
    _pte(ep, adapter.VulkanPartitioner() if backend == "vulkan" else adapter.XnnpackPartitioner())
    seen = pass_gating.counts()
    assert sum(c["skipped"] for c in seen.values()) > 0 and sum(c["ran"] for c in seen.values()) > 0
    pass_gating.reset_counts()
    _pte(ep, stock())
    assert pass_gating.counts() == {}
    assert _patchable_objects() == objects_before
