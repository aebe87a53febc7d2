"""Run a serialized ``.pte`` with ExecuTorch's CPU runtime (XNNPACK included)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["max_abs_error", "run_pte"]


def run_pte(pte: bytes, inputs: Sequence[Any]) -> list[torch.Tensor]:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    module = _load_for_executorch_from_buffer(pte)
    return list(module.forward(tuple(inputs)))


def max_abs_error(got: Any, want: Any) -> float:
    """Largest absolute difference over (possibly nested) outputs, computed in fp64."""
    gl = list(got) if isinstance(got, (list, tuple)) else [got]
    wl = list(want) if isinstance(want, (list, tuple)) else [want]
    if len(gl) != len(wl):
        return float("inf")
    worst = 0.0
    for g, w in zip(gl, wl, strict=True):
        diff = (g.detach().double() - w.detach().double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst
