"""Rules that port ExecuTorch's Vulkan pattern registry (installed as ``fusionkit.passes.vulkan``).

One module per stock pattern file of ExecuTorch 1.5.1
(``executorch/backends/vulkan/patterns/``); each rule states the operand
constraints the fused op needs, so a graph the stock detector would have
fused wrongly is declined with a reason. :func:`vulkan_rules` returns them all
(rms_norm lives in :mod:`fusionkit.passes.rms_norm`).
"""

from __future__ import annotations

from fusionkit.rule import Rule


def vulkan_rules() -> list[Rule]:
    """Fresh rule objects for every ported Vulkan pattern except rms_norm."""
    from .quantized_binary import quantized_binary_rule
    from .quantized_convolution import quantized_convolution_rule
    from .quantized_embedding import quantized_embedding_rule, torchao_quantized_embedding_rule
    from .quantized_linear import quantized_linear_rules
    from .quantized_pixel_shuffle import quantized_pixel_shuffle_rule
    from .quantized_unary import quantized_unary_rule
    from .rope import rope_rule
    from .rope_hf import hf_rope_rule
    from .sdpa import causal_sdpa_rule
    from .select_as_symint import select_as_symint_rule

    return [
        quantized_unary_rule(),
        quantized_binary_rule(),
        quantized_pixel_shuffle_rule(),
        select_as_symint_rule(),
        torchao_quantized_embedding_rule(),
        quantized_embedding_rule(),
        rope_rule(),
        hf_rope_rule(),
        causal_sdpa_rule(),
        *quantized_linear_rules(),
        quantized_convolution_rule(),
    ]


__all__ = ["vulkan_rules"]
