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
own. It also installs the colleague-owned :mod:`.constant_serializer` (constants
that are views serialized as themselves, not as their whole base storage).
:func:`uninstall` puts the very same entry objects back (and uninstalls the
serializer if this install put it in). Both are
idempotent; ``install()`` also works as a context manager that restores the
previous state on exit. ``install()`` refuses to patch an ExecuTorch version
the adapter was not tested with.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from fusionkit import hooks
from fusionkit.hooks import Installation, UnsupportedExecuTorchError

from . import constant_serializer

__all__ = [
    "NOT_TAKEN_OVER",
    "TAKEN_OVER_PATTERNS",
    "TESTED_EXECUTORCH_VERSIONS",
    "Installation",
    "UnsupportedExecuTorchError",
    "executorch_version",
    "install",
    "is_installed",
    "uninstall",
]

#: ExecuTorch versions whose Vulkan pattern registry this module was verified against
TESTED_EXECUTORCH_VERSIONS: frozenset[str] = hooks.TESTED_EXECUTORCH

#: stock Vulkan pattern name -> the fusionkit rule(s) that replace it. Every entry
#: listed here is removed from ExecuTorch's registry by :func:`install`; its
#: fusions are made by these rules, in ``transform_passes()`` and, through the
#: patched ``replace_all_fusable_subgraphs``, inside ``FusePatternsPass`` (so in
#: ``VulkanBackend.preprocess`` too). A stock pattern NOT listed here keeps
#: running as ExecuTorch wrote it (see :data:`NOT_TAKEN_OVER`).
TAKEN_OVER_PATTERNS: dict[str, str] = {
    "rms_norm": "fusionkit.passes.rms_norm.rms_norm_rule",
    "quantized_unary": "fusionkit.passes.vulkan.quantized_unary.quantized_unary_rule",
    "quantized_binary": "fusionkit.passes.vulkan.quantized_binary.quantized_binary_rule",
    "quantized_pixel_shuffle":
        "fusionkit.passes.vulkan.quantized_pixel_shuffle.quantized_pixel_shuffle_rule",
    "select_as_symint": "fusionkit.passes.vulkan.select_as_symint.select_as_symint_rule",
    "torchao_quantized_embedding":
        "fusionkit.passes.vulkan.quantized_embedding.torchao_quantized_embedding_rule",
    "quantized_embedding": "fusionkit.passes.vulkan.quantized_embedding.quantized_embedding_rule",
    "export_llama_rope": "fusionkit.passes.vulkan.rope.rope_rule",
    "hf_rope": "fusionkit.passes.vulkan.rope_hf.hf_rope_rule",
    "causal_sdpa": "fusionkit.passes.vulkan.sdpa.causal_sdpa_rule",
    # routes q8ta_linear(_gemv), linear_q8ta_q8csw, linear_q4gsw, linear_dq8ca_q4gsw
    # (torchao dynamic per-token activations); mm/addmm/linear and batch-1 bmm anchors
    "quantized_linear": "fusionkit.passes.vulkan.quantized_linear.quantized_linear_rules",
    "quantized_convolution":
        "fusionkit.passes.vulkan.quantized_convolution.quantized_convolution_rule",
}

#: stock pattern name -> why it is not taken over yet (its stock detector still runs);
#: empty: with :func:`install` in effect no entry of ExecuTorch 1.5.1's registry runs
NOT_TAKEN_OVER: dict[str, str] = {}

_REGISTRY_MODULE = "executorch.backends.vulkan.patterns.pattern_registry"
_PATTERNS_MODULE = "executorch.backends.vulkan.patterns"

_lock = threading.RLock()
#: the entries removed from the registry while installed (None: not installed)
_saved: dict[str, Any] | None = None
#: whether our install() also installed the constant serializer (so uninstall() undoes it)
_serializer_installed_here = False
#: the stock ``patterns.replace_all_fusable_subgraphs`` while ours is in its place
_stock_replace_all: Any = None
#: matches fusionkit applied through the patched ``replace_all_fusable_subgraphs``, by rule
FUSED_IN_FUSE_PATTERNS_PASS: dict[str, int] = {}


def _replace_all_fusable_subgraphs(ep: Any, graph_module: Any) -> int:
    """Stand-in for ``patterns.replace_all_fusable_subgraphs`` (what ``FusePatternsPass`` calls).

    fusionkit's rules fuse the ExportedProgram (every match decided with its
    constraints first); then the stock function runs for the registry entries
    that are left (none, when every pattern is taken over). Returns the number
    of fusions, as the stock function does.
    """
    from fusionkit.finder import find_matches
    from fusionkit.rewrite import apply_matches

    from .partitioner import fusion_rules

    if ep is None or ep.graph_module is not graph_module:
        raise RuntimeError(
            "fusionkit's FusePatternsPass stand-in needs the ExportedProgram whose graph it "
            "fuses (set `_exported_program` to the program owning this graph module)"
        )
    # inside a graph-module pass the pass manager owns the signature and state
    # dict: fuse without adding (folding) or removing constants
    ms = find_matches(ep, fusion_rules(), structural_declines=False, allow_folding=False)
    if ms.accepted:
        apply_matches(ep, ms.accepted, drop_dead_constants=False)
    for m in ms.accepted:
        FUSED_IN_FUSE_PATTERNS_PASS[m.rule.name] = FUSED_IN_FUSE_PATTERNS_PASS.get(m.rule.name, 0) + 1
    stock = _stock_replace_all
    rest = stock(ep, graph_module) if stock is not None and _registry() else 0
    return len(ms.accepted) + int(rest)


def executorch_version() -> str | None:
    found = hooks.installed_executorch_version()
    return None if found == "not installed" else found


def _check_version() -> None:
    hooks.check_executorch_version(
        f"fusionkit.backends.vulkan_adapter (takes over {sorted(TAKEN_OVER_PATTERNS)} in "
        f"{_REGISTRY_MODULE}.fusable_patterns)", found=executorch_version())


def _registry() -> dict[str, Any]:
    # importing the package registers every stock pattern into the dict
    importlib.import_module("executorch.backends.vulkan.patterns")
    module = importlib.import_module(_REGISTRY_MODULE)
    registry: dict[str, Any] = module.fusable_patterns
    return registry


def is_installed() -> bool:
    return _saved is not None


def install() -> Installation:
    """Take over the stock Vulkan patterns fusionkit reimplements (idempotent).

    Raises :class:`UnsupportedExecuTorchError` on an untested ExecuTorch version.
    """
    global _saved, _serializer_installed_here
    with _lock:
        if _saved is not None:
            return Installation(uninstall, False)
        _check_version()
        registry = _registry()
        missing = [name for name in TAKEN_OVER_PATTERNS if name not in registry]
        if missing:
            raise UnsupportedExecuTorchError(
                f"the stock Vulkan pattern registry has no {missing} entry; this ExecuTorch "
                "build does not look like the one the adapter was tested with"
            )
        saved = {name: registry.pop(name) for name in TAKEN_OVER_PATTERNS}
        try:
            # the correct Vulkan constant serializer (views serialized as themselves,
            # not as their whole base storage); a no-op if it is already installed
            serializer_here = constant_serializer.install().installed_here
        except BaseException:
            registry.update(saved)
            raise
        global _stock_replace_all
        patterns: Any = importlib.import_module(_PATTERNS_MODULE)
        _stock_replace_all = patterns.replace_all_fusable_subgraphs
        patterns.replace_all_fusable_subgraphs = _replace_all_fusable_subgraphs
        _saved = saved
        _serializer_installed_here = serializer_here
        return Installation(uninstall, True)


def uninstall() -> None:
    """Restore the stock Vulkan patterns (idempotent)."""
    global _saved, _serializer_installed_here
    with _lock:
        if _saved is None:
            return
        if _serializer_installed_here:
            constant_serializer.uninstall()
            _serializer_installed_here = False
        global _stock_replace_all
        if _stock_replace_all is not None:
            stock_patterns: Any = importlib.import_module(_PATTERNS_MODULE)
            stock_patterns.replace_all_fusable_subgraphs = _stock_replace_all
            _stock_replace_all = None
        registry = _registry()
        for name, entry in _saved.items():
            registry.setdefault(name, entry)
        _saved = None
