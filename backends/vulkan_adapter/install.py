"""Explicit, reversible takeover of the stock Vulkan patterns fusionkit reimplements.

ExecuTorch 1.5.1's Vulkan backend keeps its fusions in one global dict,
``executorch.backends.vulkan.patterns.pattern_registry.fusable_patterns``. Both
``VulkanPartitioner.partition`` (via ``get_all_fusable_subgraphs``: every node a
detector claims is treated as supported, unchecked) and
``VulkanBackend.preprocess`` (via ``FusePatternsPass`` ->
``replace_all_fusable_subgraphs``: the rewrite) iterate that dict at call time.
Its ``rms_norm`` detector fuses *any* multiply after a decomposed RMSNorm,
including ones whose weight is not a constant, which the runtime then aborts on.

:func:`install` removes the entries listed in :data:`TAKEN_OVER_PATTERNS` from
that dict (fusionkit's ``transform_passes()`` does their job, with
constraints), so neither the partitioner nor preprocess fuses anything on its
own. It also puts fusionkit rules in place of six of ``VulkanBackend.preprocess``'s
rewrite passes (:mod:`.preprocess_rules`), gates the passes left (:mod:`.pass_gates`),
installs :mod:`.constant_serializer` (constants that are views serialized as
themselves, not as their whole base storage) and :mod:`.boundary_dim_order` (a delegate
input or output whose dim order is not contiguous is converted inside the delegate, where
the runtime's contiguous-order copies need it). Everything is one
:class:`~fusionkit.integration.hooks.PatchSet`, :data:`PATCHES`, and as in every adapter (one
skeleton, :class:`~fusionkit.integration.adapter.Adapter`) :func:`install` / :func:`uninstall` /
:func:`is_installed` are its own methods:
:func:`uninstall` puts the very same entry objects back, in their order (and uninstalls
the serializer if this install put it in). Both are idempotent; ``install()`` also works
as a context manager that restores the previous state on exit. ``install()`` refuses to
patch an ExecuTorch version the adapter was not tested with.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from fusionkit import run_rules
from fusionkit.backends import quantize_step
from fusionkit.integration import hooks, runtime_assertions
from fusionkit.integration.adapter import Adapter
from fusionkit.integration.hooks import REMOVE, Installation, UnsupportedExecuTorchError
from fusionkit.integration.trace_residue import release_last_trace
from fusionkit.passes.registry import taken_over_patterns

from . import (
    boundary_dim_order,
    broken_conditions,
    constant_serializer,
    declared_inputs,
    fusable_subgraphs,
    int_only_partitions,
    missing_operators,
    mutated_buffers,
    pass_gates,
    preprocess_rules,
)
from .delegation import with_delegation_check
from .rule_ops import rule_index

__all__ = [
    "ADAPTER",
    "FUSED_IN_FUSE_PATTERNS_PASS",
    "PATCHES",
    "TAKEN_OVER_PATTERNS",
    "Installation",
    "UnsupportedExecuTorchError",
    "executorch_version",
    "install",
    "is_installed",
    "uninstall",
]

#: stock Vulkan pattern name -> the fusionkit rule(s) that replace it. Every entry
#: listed here is removed from ExecuTorch's registry by :func:`install`; its
#: fusions are made by these rules, in ``transform_passes()`` and, through the
#: patched ``replace_all_fusable_subgraphs``, inside ``FusePatternsPass`` (so in
#: ``VulkanBackend.preprocess`` too). A stock pattern NOT listed here keeps
#: running as ExecuTorch wrote it (in ExecuTorch 1.5.1 there is none).
TAKEN_OVER_PATTERNS: dict[str, str] = taken_over_patterns("vulkan")

_REGISTRY_MODULE = "executorch.backends.vulkan.patterns.pattern_registry"
_PATTERNS_MODULE = "executorch.backends.vulkan.patterns"
_PARTITIONER_MODULE = "executorch.backends.vulkan.partitioner.vulkan_partitioner"

#: matches fusionkit applied through the patched ``replace_all_fusable_subgraphs``, by rule
FUSED_IN_FUSE_PATTERNS_PASS: dict[str, int] = {}


def _replace_all_fusable_subgraphs(ep: Any, graph_module: Any) -> int:
    """Stand-in for ``patterns.replace_all_fusable_subgraphs`` (what ``FusePatternsPass`` calls).

    fusionkit's rules fuse the ExportedProgram (every match decided with its
    constraints first); then the stock function runs for the registry entries
    that are left (none, when every pattern is taken over). Returns the number
    of fusions, as the stock function does.
    """
    if ep is None or ep.graph_module is not graph_module:
        raise RuntimeError(
            "fusionkit's FusePatternsPass stand-in needs the ExportedProgram whose graph it "
            "fuses (set `_exported_program` to the program owning this graph module)"
        )
    release_last_trace()  # the stock function traces its rope patterns here
    # inside a graph-module pass the pass manager owns the signature and state
    # dict: fuse without adding (folding) or removing constants
    # the runtime's conditions are checked here too: a fusion the runtime would abort on
    # is never made, before or inside preprocess
    # (each rule built the first time a delegated graph holds its root op)
    rules = rule_index(lambda r: with_delegation_check(r, None))
    applied = run_rules(ep, rules, structural_declines=False, allow_folding=False,
                        drop_dead_constants=False).applied
    for m in applied:  # a replacement that failed (non-strict) is not a fusion
        FUSED_IN_FUSE_PATTERNS_PASS[m.rule.name] = FUSED_IN_FUSE_PATTERNS_PASS.get(m.rule.name, 0) + 1
    stock = PATCHES.original(importlib.import_module(_PATTERNS_MODULE),
                               "replace_all_fusable_subgraphs")
    rest = stock(ep, graph_module) if _registry() else 0
    return len(applied) + int(rest)


def executorch_version() -> str | None:
    found = hooks.installed_executorch_version()
    return None if found == "not installed" else found


def _registry() -> dict[str, Any]:
    # importing the package registers every stock pattern into the dict
    importlib.import_module(_PATTERNS_MODULE)
    module = importlib.import_module(_REGISTRY_MODULE)
    registry: dict[str, Any] = module.fusable_patterns
    return registry


def _patches() -> list[tuple[Any, str, Any]]:
    registry = _registry()
    missing = [name for name in TAKEN_OVER_PATTERNS if name not in registry]
    if missing:
        raise UnsupportedExecuTorchError(
            f"the stock Vulkan pattern registry has no {missing} entry; this ExecuTorch "
            "build does not look like the one the adapter was tested with"
        )
    patterns = importlib.import_module(_PATTERNS_MODULE)
    partitioner = importlib.import_module(_PARTITIONER_MODULE).VulkanPartitioner
    # the partitioner delegates the nodes of the matches fusionkit will fuse, as it
    # delegated the stock detectors' (:mod:`.fusable_subgraphs`)
    stock_fusable = patterns.get_all_fusable_subgraphs
    return [*((registry, name, REMOVE) for name in TAKEN_OVER_PATTERNS),
            (patterns, "replace_all_fusable_subgraphs", _replace_all_fusable_subgraphs),
            (patterns, "get_all_fusable_subgraphs",
             functools.partial(fusable_subgraphs.fusable_subgraphs, stock_fusable)),
            (partitioner, "partition",
             fusable_subgraphs.partition_with_program(
                 int_only_partitions.partition_without_int_only(
                     mutated_buffers.partition_keeping_buffers(
                         runtime_assertions.partition_keeping_assertions(
                             broken_conditions.partition_keeping_broken_conditions_off(
                                 missing_operators.partition_keeping_missing_operators_off(
                                     partitioner.partition)), "vulkan")))))]


#: the adapter's patch set: the pattern takeover, the constant serializer, the declared
#: inputs (:mod:`.declared_inputs`), the pass gates,
#: the preprocess rules, the delegate boundary's dim orders (:mod:`.boundary_dim_order`) and
#: the quantize step's conv + batch-norm fold (:mod:`fusionkit.backends.quantize_step`);
#: VulkanBackend.preprocess runs under it for this adapter's partitions only
ADAPTER = Adapter(
    f"fusionkit.backends.vulkan_adapter (takes over {sorted(TAKEN_OVER_PATTERNS)} in "
    f"{_REGISTRY_MODULE}.fusable_patterns)",
    patches=_patches, parts=(constant_serializer.PATCHES, declared_inputs.PATCHES,
                             pass_gates.PATCHES,
                             preprocess_rules.PATCHES, boundary_dim_order.PATCHES,
                             quantize_step.PATCHES),
    backend=("executorch.backends.vulkan.vulkan_preprocess", "VulkanBackend"), marker=b"vulkan")
PATCHES = ADAPTER.patches

install = ADAPTER.install
uninstall = ADAPTER.uninstall
is_installed = ADAPTER.is_installed
