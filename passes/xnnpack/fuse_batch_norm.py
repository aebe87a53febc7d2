"""Convolution or linear -> inference batch norm, folded into the weight and bias.

Takes over ``FuseBatchNormPass`` (``_passes/fuse_batch_norm.py``, ExecuTorch 1.5.1), which
XNNPACK's preprocess runs as Vulkan's does: the same stock class, so the same rules, those
of :mod:`fusionkit.passes.vulkan.batch_norm` (written for the Vulkan half of issue 25;
what they check inline and what the stock pass forgot is stated there: every folded
operand a constant, training-mode batch norm declined, folded weights named per match so
two convolutions sharing a weight keep their own). One difference for XNNPACK: its
payload carries each node's debug handle, and the stock pass rewrites the conv / linear
in place, so the folded op keeps that node's metadata (not the batch norm's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch.fx import Node

from fusionkit import PythonReplacement, Rewriter, Rule
from fusionkit.passes.registry import register_rules
from fusionkit.passes.vulkan.batch_norm import STOCK_PASS, batch_norm_rules

from ._common import keep_provenance

#: the Vulkan set's replacements, by rule name (built on first use)
_SHARED: dict[str, Any] = {}


def _keeping_provenance(rw: Rewriter, c: Mapping[str, Any], rule: str) -> Node:
    if not _SHARED:
        _SHARED.update((r.name, r.replacement) for r in batch_norm_rules())
    out: Node = _SHARED[rule].build(rw, c)
    folded = [n for n in rw.created if n.op == "call_function"][-1]  # the new conv / linear
    keep_provenance(folded, c["op"])
    return out


def _fold_conv(rw: Rewriter, c: Mapping[str, Any]) -> Node:
    return _keeping_provenance(rw, c, "conv_batch_norm")


def _fold_linear(rw: Rewriter, c: Mapping[str, Any]) -> Node:
    return _keeping_provenance(rw, c, "linear_batch_norm")


@register_rules("xnnpack", takes_over=STOCK_PASS)
def fuse_batch_norm_rules() -> list[Rule]:
    """conv -> batch norm and linear -> batch norm (the Vulkan set's rules, fresh objects)."""
    folds = {"conv_batch_norm": _fold_conv, "linear_batch_norm": _fold_linear}
    out = []
    for r in batch_norm_rules():
        rep = r.replacement
        assert r.name in folds, r.name
        out.append(dataclasses.replace(
            r, name=f"xnnpack_{r.name}",
            replacement=PythonReplacement(folds[r.name], frozenset(rep.captures()) | {"op"})))
    return out
