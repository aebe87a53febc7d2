"""What ExecuTorch's KV-cache kernels compute, in torch, for ``fusionkit verify``.

The ``llama.*`` ops' CPU kernels are C++ (``extension/llm/custom_ops``: ``op_update_cache.cpp``,
``op_sdpa.cpp``) that abort the process on operands they refuse, so the verifier runs these
functions in their place (``register_kernel_reference``). ``tests/test_kernel_references.py``
holds each to the C++ kernel, and the fused op to the real Vulkan runtime.

Layouts are ExecuTorch's: ``q`` ``[B, S, H, D]``, projections ``[B, S, H_kv, D]``, caches
``[B, max_S, H_kv, D]``; ``H`` a multiple of ``H_kv`` (grouped-query attention: query head
``h`` reads kv head ``h // (H / H_kv)``).
"""

from __future__ import annotations

import math

import torch

from fusionkit.passes.registry import OpSemantics

__all__ = ["custom_sdpa_kernel", "sdpa_with_kv_cache_kernel", "update_cache_kernel"]


def _check_window(cache: torch.Tensor, start_pos: int, seq_len: int) -> None:
    """The kernels' own bounds check (``validate_cache_params``): they abort past it."""
    if not 0 <= start_pos < cache.size(1) or start_pos + seq_len > cache.size(1):
        raise ValueError(f"start_pos {start_pos} + seq_len {seq_len} outside a cache of "
                         f"{cache.size(1)} positions")


def update_cache_kernel(value: torch.Tensor, cache: torch.Tensor, start_pos: int) -> torch.Tensor:
    """``cache[:, start_pos:start_pos + S] = value`` in place (``update_cache_impl``: one
    memcpy of ``value``'s S rows per batch line). The op's result is a 1-element tensor the
    kernel never writes (uninitialised memory): a program must not read it, so it is zeros
    here."""
    if value.dim() != 4 or cache.dim() != 4 or value.shape[0] != cache.shape[0] \
            or value.shape[2:] != cache.shape[2:] or value.dtype != cache.dtype:
        raise ValueError(f"update_cache: value {tuple(value.shape)} {value.dtype} does not fit "
                         f"the cache {tuple(cache.shape)} {cache.dtype}")
    _check_window(cache, int(start_pos), value.size(1))
    cache[:, int(start_pos):int(start_pos) + value.size(1)] = value
    return value.new_zeros((1,))


def custom_sdpa_kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int,
                       attn_mask: torch.Tensor | None = None, drpout_p: float = 0.0,
                       is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention of the S queries at positions ``start_pos..start_pos + S - 1`` over the
    caches (``custom_sdpa_out_impl`` -> ``cpu_flash_attention``): without a mask the keys are
    ``cache[:, :start_pos + S]`` and, causal, query ``i`` reads keys ``<= start_pos + i``;
    with a 2-D float mask ``[S, max_S]`` the keys are the whole cache and the mask is added
    to the scores (a mask and ``is_causal`` together are refused). ``scale`` defaults to
    ``1 / sqrt(D)``; ``drpout_p`` is not applied (the kernel takes no generator). The scores
    are accumulated in float32 and the result cast to q's dtype."""
    if attn_mask is not None and is_causal:
        raise ValueError("custom_sdpa: attn_mask and is_causal cannot be set at the same time")
    b, s, h, d = q.shape
    h_kv = k_cache.size(2)
    if k_cache.shape != v_cache.shape or k_cache.size(0) != b or k_cache.size(3) != d or h % h_kv:
        raise ValueError(f"custom_sdpa: q {tuple(q.shape)} does not fit the caches "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    start_pos = int(start_pos)
    _check_window(k_cache, start_pos, s)
    keys = k_cache.size(1) if attn_mask is not None else start_pos + s
    # [B, H, S, D] x [B, H, L, D], each kv head repeated for its group of query heads
    qt = q.float().transpose(1, 2)
    kt = k_cache[:, :keys].float().transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    vt = v_cache[:, :keys].float().transpose(1, 2).repeat_interleave(h // h_kv, dim=1)
    scores = (qt @ kt.transpose(-1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(d))
    if attn_mask is not None:
        scores = scores + attn_mask.float()
    elif is_causal:
        rows = torch.arange(s).unsqueeze(1) + start_pos
        scores = scores.masked_fill(torch.arange(keys).unsqueeze(0) > rows, -math.inf)
    out = torch.softmax(scores, dim=-1) @ vt
    return out.transpose(1, 2).to(q.dtype).contiguous()


def sdpa_with_kv_cache_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                              v_cache: torch.Tensor, start_pos: int, seq_len: int,
                              attn_mask: torch.Tensor | None = None, drpout_p: float = 0.0,
                              is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Both cache updates, then ``custom_sdpa`` over the caches (``sdpa_with_kv_cache_out``).
    ``seq_len`` is only bounds-checked (``start_pos + seq_len <= max_S``): the updates copy
    all of ``k``'s and ``v``'s S rows and the attention takes S from ``q``."""
    _check_window(k_cache, int(start_pos), int(seq_len))
    update_cache_kernel(k, k_cache, start_pos)
    update_cache_kernel(v, v_cache, start_pos)
    return custom_sdpa_kernel(q, k_cache, v_cache, start_pos, attn_mask, drpout_p, is_causal, scale)


#: what the llama kernels compute, for fusionkit.verify (their C++ kernels abort on operands
#: they refuse): the SDPA rule carries it
SEMANTICS = OpSemantics(kernel_references={"llama.update_cache.default": update_cache_kernel,
                                           "llama.custom_sdpa.default": custom_sdpa_kernel,
                                           "llama.sdpa_with_kv_cache.default": sdpa_with_kv_cache_kernel},
                        unsafe_kernels={"llama": "its C++ kernel aborts the process on operands it refuses"})
