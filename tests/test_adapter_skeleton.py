"""The one adapter skeleton (:mod:`fusionkit.integration.adapter`), on a toy backend.

A backend module made here (no ExecuTorch lowering): its ``preprocess`` reports whether
the adapter's patch set is in place, and a stock partitioner stands in for ExecuTorch's.
The skeleton must give an adapter the install trio of its patch set, mark its
partitioner's delegation spec, scope the patch set to the marked partitions' preprocess
only, and leave nothing behind once they are preprocessed or when the partitioner's own
check refuses the lowering. The Vulkan and XNNPACK adapters are built on it.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from fusionkit.backends import vulkan_adapter as vk
from fusionkit.backends import xnnpack_adapter as xa
from fusionkit.integration.adapter import Adapter, ScopedPartitioner
from fusionkit.integration.scoped import is_marked

MODULE = "fusionkit_test_toy_backend"


class _Flag:
    value = "stock"


class _Result:
    def __init__(self, tags: int) -> None:
        self.partition_tags = {f"tag{i}": None for i in range(tags)}


class _StockPartitioner:
    """A stand-in for a stock partitioner: a delegation spec, tags as asked."""

    def __init__(self, tags: int = 1, *, name: str = "toy") -> None:
        self.delegation_spec = types.SimpleNamespace(compile_specs=[])
        self.tags = tags
        self.name = name

    def partition(self, exported_program: Any) -> _Result:
        return _Result(self.tags)


@pytest.fixture()
def toy() -> Iterator[tuple[Adapter, type]]:
    module = types.ModuleType(MODULE)
    flag = _Flag()

    class Backend:
        @classmethod
        def preprocess(cls, program: Any, compile_specs: Any) -> str:
            return flag.value

    module.Backend = Backend  # type: ignore[attr-defined]
    sys.modules[MODULE] = module
    adapter = Adapter("toy adapter", patches=lambda: [(flag, "value", "patched")],
                      backend=(MODULE, "Backend"), marker=b"toy")
    try:
        yield adapter, Backend
    finally:
        adapter.reset()
        adapter.uninstall()
        del sys.modules[MODULE]


def _partitioner(adapter: Adapter) -> type:
    class ToyPartitioner(ScopedPartitioner, _StockPartitioner):
        fusionkit_adapter = adapter

    return ToyPartitioner


def test_the_install_trio_is_the_patch_sets(toy: tuple[Adapter, type]) -> None:
    adapter, backend = toy
    assert (adapter.install, adapter.uninstall, adapter.is_installed) == (
        adapter.patches.install, adapter.patches.uninstall, adapter.patches.is_installed)
    with adapter.install() as handle:
        assert handle.installed_here and adapter.is_installed()
        assert backend.preprocess(None, []) == "patched"  # process-wide: unmarked too
        with adapter.install() as inner:
            assert not inner.installed_here
        assert adapter.is_installed()
    assert not adapter.is_installed() and backend.preprocess(None, []) == "stock"


def test_the_partitioner_scopes_the_patches_to_its_partitions(toy: tuple[Adapter, type]) -> None:
    adapter, backend = toy
    stock_preprocess = backend.__dict__["preprocess"]
    partitioner = _partitioner(adapter)(2)
    specs = partitioner.delegation_spec.compile_specs
    assert is_marked(specs, b"toy") and len(specs) == 1
    assert len(partitioner.partition(None).partition_tags) == 2
    assert adapter.preprocess_scope.pending == 2 and adapter.preprocess_scope.is_dispatching()
    assert not adapter.is_installed()
    assert backend.preprocess(None, []) == "stock"  # a stock partitioner's partition
    assert backend.preprocess(None, specs) == "patched"
    assert adapter.preprocess_scope.is_dispatching()  # one marked partition still pending
    assert backend.preprocess(None, compile_specs=specs) == "patched"
    assert not adapter.preprocess_scope.is_dispatching() and not adapter.is_installed()
    assert backend.__dict__["preprocess"] is stock_preprocess  # the very same object back
    assert backend.preprocess(None, specs) == "stock"


def test_the_constructor_is_the_stock_ones(toy: tuple[Adapter, type]) -> None:
    adapter, _ = toy
    cls = _partitioner(adapter)
    assert inspect.signature(cls) == inspect.signature(_StockPartitioner)
    p = cls(3, name="x")
    assert (p.tags, p.name) == (3, "x")


def test_a_refusal_in_the_partitioned_hook_leaves_no_dispatcher(toy: tuple[Adapter, type]) -> None:
    adapter, _ = toy
    seen: list[str] = []

    class Refusing(_partitioner(adapter)):  # type: ignore[misc]
        def __init__(self, *args: Any, extra: str = "", **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.extra = extra

        def _partitioning(self, exported_program: Any) -> Any:
            seen.append("around")
            return adapter.install()  # the Vulkan adapter's way: patches while it partitions

        def _partitioned(self, result: Any) -> Any:
            assert not adapter.is_installed()  # the hook runs after the stock partition
            seen.append("checked")
            raise RuntimeError("refused")

    p = Refusing(extra="e")
    assert p.extra == "e" and is_marked(p.delegation_spec.compile_specs, b"toy")
    with pytest.raises(RuntimeError, match="refused"):
        p.partition(None)
    assert seen == ["around", "checked"]
    assert adapter.preprocess_scope.pending == 0 and not adapter.preprocess_scope.is_dispatching()


@pytest.mark.parametrize("adapter", [vk, xa], ids=["vulkan", "xnnpack"])
def test_both_adapters_are_built_on_the_skeleton(adapter: Any) -> None:
    install = sys.modules[f"{adapter.__name__}.install"]
    skeleton = install.ADAPTER
    assert isinstance(skeleton, Adapter) and adapter.PATCHES is skeleton.patches
    assert adapter.partitioner.PREPROCESS_SCOPE is skeleton.preprocess_scope
    partitioner = adapter.VulkanPartitioner if adapter is vk else adapter.XnnpackPartitioner
    assert issubclass(partitioner, ScopedPartitioner)
    assert partitioner.fusionkit_adapter is skeleton
