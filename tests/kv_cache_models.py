"""The KV-cache attention test model shared by the Vulkan tests: Llama-style decode
attention, in-place cache updates (``llama.update_cache`` x2) then a causal
``llama.custom_sdpa`` over the caches.

The ``llama.*`` ops are registered by ``executorch.extension.llm.custom_ops.custom_ops``,
which a test imports before it exports or runs the model.
"""

from __future__ import annotations

import torch

__all__ = ["KVAttention"]


class KVAttention(torch.nn.Module):
    """Caches of 16 positions, 2 kv heads of 8: ``k, v`` are ``(1, seq, 2, 8)``, ``q``
    ``(1, seq, h, 8)`` (``h`` a multiple of 2), ``pos`` a 1-element tensor, the first
    position written (below 12).

    ``read_pos``: where the sdpa reads (None: ``pos``, as the causal_sdpa fusion needs;
    another value is its near miss). ``read_per_op``: each op reads ``pos[0].item()``
    itself, as ExecuTorch's llama attention does (three nodes of one value)."""

    def __init__(self, read_pos: int | None = None, read_per_op: bool = False) -> None:
        super().__init__()
        self.register_buffer("kc", torch.zeros(1, 16, 2, 8))
        self.register_buffer("vc", torch.zeros(1, 16, 2, 8))
        self.read_pos = read_pos
        self.read_per_op = read_per_op

    def _start(self, pos: torch.Tensor) -> int:
        start = pos[0].item()
        torch._check(start >= 0)
        torch._check(start < 12)
        return start

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                pos: torch.Tensor) -> torch.Tensor:
        start = self._start(pos)
        torch.ops.llama.update_cache(k, self.kc, start)
        torch.ops.llama.update_cache(v, self.vc, self._start(pos) if self.read_per_op else start)
        if self.read_pos is not None:
            start = self.read_pos
        elif self.read_per_op:
            start = self._start(pos)
        return torch.ops.llama.custom_sdpa(q, self.kc, self.vc, start, None, 0.0, True)
