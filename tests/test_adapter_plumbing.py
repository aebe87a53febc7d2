"""The adapters' plumbing is one piece each: one install story, one takeover, one way to a rule set.

* Every adapter declares one :class:`~fusionkit.integration.hooks.PatchSet` (``PATCHES``,
  including the sets of its parts); its ``install`` / ``uninstall`` / ``is_installed`` are
  that set's own methods.
* Both adapters' preprocess takeovers are a
  :class:`~fusionkit.integration.preprocess_takeover.Takeover`: rules built once, a
  switch per thread, counts from every thread.
* ``fusionkit.passes.rule_set(name)`` is the one way to get a rule set.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import pytest

from fusionkit.backends import vulkan_adapter as vk
from fusionkit.backends import xnnpack_adapter as xa
from fusionkit.integration.preprocess_takeover import Takeover
from fusionkit.passes import rule_set

VK_INSTALL = importlib.import_module("fusionkit.backends.vulkan_adapter.install")
XA_INSTALL = importlib.import_module("fusionkit.backends.xnnpack_adapter.install")


def _parts(adapter: Any) -> list[Any]:
    if adapter is xa:
        return [xa.serializer.SERIALIZER_PATCHES, xa.preprocess_rules.PATCHES,
                importlib.import_module("fusionkit.backends.xnnpack_adapter.pass_gates").PATCHES]
    return [vk.constant_serializer.PATCHES, vk.preprocess_rules.PATCHES,
            importlib.import_module("fusionkit.backends.vulkan_adapter.pass_gates").PATCHES,
            vk.boundary_dim_order.PATCHES]


@pytest.mark.parametrize("adapter", [vk, xa], ids=["vulkan", "xnnpack"])
def test_an_adapter_installs_its_one_patch_set_with_its_parts(adapter: Any) -> None:
    patches = adapter.PATCHES
    assert (adapter.install, adapter.uninstall, adapter.is_installed) == (
        patches.install, patches.uninstall, patches.is_installed)
    parts = _parts(adapter)
    before = [p.is_installed() for p in parts]
    with adapter.install() as handle:
        assert adapter.is_installed() and all(p.is_installed() for p in parts)
    if handle.installed_here:
        assert not adapter.is_installed()
        assert [p.is_installed() for p in parts] == before


def test_a_part_installs_alone_through_the_same_methods() -> None:
    cs = vk.constant_serializer
    assert (cs.install, cs.uninstall, cs.is_installed) == (
        cs.PATCHES.install, cs.PATCHES.uninstall, cs.PATCHES.is_installed)


def _names(rules: Any) -> list[str]:
    return [r.name for r in rules]


def test_the_adapters_serve_no_other_way_to_a_rule_set() -> None:
    assert _names(rule_set("vulkan"))
    rules_module = importlib.import_module("fusionkit.backends.vulkan_adapter.rules")
    for module, name in ((vk, "fusion_rules"), (rules_module, "fusion_rules"),
                         (rules_module, "built_rules"), (xa.serializer, "install"),
                         (xa.preprocess_rules, "TAKEOVER"), (VK_INSTALL, "TAKEOVER")):
        assert not hasattr(module, name), (module.__name__, name)


@pytest.mark.parametrize("module", [vk.preprocess_rules, xa.preprocess_rules],
                         ids=["vulkan", "xnnpack"])
def test_both_takeovers_are_one_takeover(module: Any) -> None:
    takeover = module.RULE_PASSES
    assert isinstance(takeover, Takeover)
    assert takeover.stock_passes == module.TAKEN_OVER_PASSES and takeover.stock_passes
    stock_pass = next(iter(takeover))
    assert module.rules_for(stock_pass) is module.rules_for(stock_pass)  # built once
    assert module.rules_for(stock_pass)


def test_a_takeover_is_switched_off_for_its_thread_only_and_counts_every_thread() -> None:
    built: list[str] = []
    takeover = Takeover({"StockPass": "factory"}, lambda name: built.append(name) or [],
                        count_keys=("runs", "fused"))
    assert takeover.rules_for("StockPass") == () and takeover.rules_for("StockPass") == ()
    assert built == ["StockPass"]
    seen: list[bool] = []

    def other() -> None:
        seen.append(takeover.is_enabled())
        takeover.count("StockPass", "fused", 2)

    with takeover.disabled():
        assert not takeover.is_enabled()
        t = threading.Thread(target=other)
        t.start()
        t.join()
        takeover.count("StockPass", "runs")
    assert takeover.is_enabled() and seen == [True]
    assert takeover.counts() == {"StockPass": {"runs": 1, "fused": 2}}
    takeover.reset_counts()
    assert takeover.counts() == {}


class _Owner:
    value = "stock"


def _set(name: str, *, includes: tuple[Any, ...] = ()) -> Any:
    from fusionkit.integration.hooks import PatchSet

    return PatchSet(f"fusionkit (test {name})", lambda: [(_Owner, "value", name)] if not includes
                    else [], includes=includes)


def test_a_set_shared_by_two_includers_stays_until_the_last_lets_go() -> None:
    shared = _set("shared")
    first, second = _set("first", includes=(shared,)), _set("second", includes=(shared,))
    first.install()
    second.install()
    first.uninstall()
    assert shared.is_installed() and _Owner.value == "shared"  # second still holds it
    second.uninstall()
    assert not shared.is_installed() and _Owner.value == "stock"


def test_a_set_installed_directly_outlives_its_includers_and_uninstalls_directly() -> None:
    shared = _set("shared")
    first = _set("first", includes=(shared,))
    shared.install()
    with first.install():
        assert shared.is_installed()
    assert shared.is_installed() and _Owner.value == "shared"
    first.install()
    shared.uninstall()  # a direct uninstall takes it out now, holders or not
    assert _Owner.value == "stock"
    first.uninstall()
    assert not shared.is_installed() and _Owner.value == "stock"


def test_the_adapters_share_the_serde_and_quantize_step_sets_safely() -> None:
    from fusionkit.backends import quantize_step
    from fusionkit.integration.spilled_data import SERDE_PATCHES

    shared = [SERDE_PATCHES, quantize_step.PATCHES]
    before = (xa.is_installed(), vk.is_installed(), [p.is_installed() for p in shared])
    if before[0] or before[1]:
        pytest.skip("an adapter is installed process-wide already")
    xa.install()
    vk.install()
    try:
        xa.uninstall()
        assert all(p.is_installed() for p in shared)  # Vulkan still needs them
    finally:
        xa.uninstall()
        vk.uninstall()
    assert [p.is_installed() for p in shared] == before[2]
