"""Run a serialized ``.pte`` with ExecuTorch's CPU runtime (XNNPACK included)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["max_abs_error", "run_pte"]


def run_pte(pte: bytes, inputs: Sequence[Any], *, quiet: bool = True) -> list[torch.Tensor]:
    """Load and run ``forward``; ``quiet`` hides the runtime's C-level CPU-probe chatter."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    with _silenced_fds(quiet):
        module = _load_for_executorch_from_buffer(pte)
        return list(module.forward(tuple(inputs)))


@contextlib.contextmanager
def _silenced_fds(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


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
