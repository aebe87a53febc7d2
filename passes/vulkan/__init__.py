"""Rules that port ExecuTorch's Vulkan pattern registry (installed as ``fusionkit.passes.vulkan``).

One module per stock pattern file of ExecuTorch 1.5.1
(``executorch/backends/vulkan/patterns/``); each rule states the operand
constraints the fused op needs, so a graph the stock detector would have
fused wrongly is declined with a reason. Every factory registers itself in
:mod:`fusionkit.passes.registry` (sets ``"vulkan_patterns"`` and ``"vulkan"``); the
import order below is the rule-set order.
"""

from __future__ import annotations

import importlib

from fusionkit import Rule
from fusionkit.passes import vulkan_delegate  # noqa: F401  (tells the core of et_vk, on import)
from fusionkit.passes.registry import register_rules
from fusionkit.passes.rms_norm import VULKAN_DTYPES, rms_norm_rule


@register_rules("vulkan", takes_over="rms_norm", roots=("aten.mul.Tensor",))
def vulkan_rms_norm_rule() -> Rule:
    """RMSNorm for the Vulkan kernel's dtypes (no bf16 kernels in Vulkan 1.5.1)."""
    return rms_norm_rule(dtypes=VULKAN_DTYPES)


#: the rule modules, in rule-set order; importing one registers its factories
RULE_MODULES: tuple[str, ...] = (
    "quantized_unary", "quantized_binary", "quantized_pixel_shuffle", "select_as_symint",
    "quantized_embedding", "rope", "rope_hf", "sdpa", "quantized_linear",
    "quantized_convolution", "layer_norm_affine",
)
#: rules replacing rewrite passes of ``VulkanBackend.preprocess`` (set ``"vulkan_preprocess"``,
#: run by the adapter inside preprocess, not by ``transform_passes()``)
PREPROCESS_RULE_MODULES: tuple[str, ...] = ("addmm_to_linear", "batch_norm", "conv_clamp",
                                             "fuse_view_copy", "redundant_ops", "view_to_squeeze",
                                             "dtype_promotion", "weight_only_linear", "fold_qdq",
                                             "squeeze_unsqueeze_inputs")
for _module in (*RULE_MODULES, *PREPROCESS_RULE_MODULES):
    importlib.import_module(f"{__name__}.{_module}")


__all__ = ["PREPROCESS_RULE_MODULES", "RULE_MODULES", "vulkan_rms_norm_rule"]
