"""Shared helpers of the Vulkan pattern tests: edge export, fuse, inspect."""

from __future__ import annotations

from typing import Any

import torch
from executorch.exir import EdgeCompileConfig, to_edge

from fusionkit import find_matches
from fusionkit.apply.rewrite import apply_matches
from fusionkit.passes import rule_set
from fusionkit.targets import op_key

qd = torch.ops.quantized_decomposed
I8 = torch.int8


def edge(m: torch.nn.Module, args: tuple[Any, ...], preserve: list[Any] | None = None) -> Any:
    cfg = EdgeCompileConfig(_check_ir_validity=False, preserve_ops=preserve or [])
    return to_edge(torch.export.export(m, args, strict=True), compile_config=cfg).exported_program()


def fuse(ep: Any, rules: list[Any] | None = None) -> Any:
    """Find and apply ``rules`` (default: the ``"vulkan"`` rule set); returns the MatchSet."""
    ms = find_matches(ep, rule_set("vulkan") if rules is None else rules)
    apply_matches(ep, ms.accepted)
    return ms


def ops(ep: Any) -> list[str]:
    return [op_key(n.target) or str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def declined(ms: Any, rule: str) -> list[str]:
    return [f"{d.step}: {d.reason}" for d in ms.declined if d.rule == rule]
