"""Port of ExecuTorch 1.5.1 ``patterns/select_as_symint.py`` (registry: ``select_as_symint``).

``_local_scalar_dense(select_copy(x, dim, index))`` -> ``et_vk.select_as_symint(x, dim, index)``.

Constraints stated (the stock detector checks only the two op names): ``dim``
and ``index`` are int literals (the op's schema takes ``int``), ``x`` is an
integer tensor (the op reads an int) and ``index`` is in range for that dim.
The ``select_copy`` node is only claimed when nothing else uses it.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    DtypeIn,
    PythonReplacement,
    Rewriter,
    Rule,
    capture,
    integer,
    op,
)
from fusionkit.passes.registry import OpSemantics, register_rules

from ._common import constraint, et_vk, shape


def select_as_symint_kernel(x: torch.Tensor, dim: int, index: int) -> int:
    """What the runtime's ``select_as_symint_impl`` gives the graph: the int at ``index``
    along ``dim`` of ``x`` (the op's one registered kernel, a Meta one, only makes a
    symbol)."""
    return int(x.select(dim, index).item())


#: what the kernel computes, for fusionkit.verify
SEMANTICS = OpSemantics(kernel_references={"et_vk.select_as_symint.default": select_as_symint_kernel})


def _select_as_symint_in_range(ctx: CheckContext, x: Node, dim: int, index: int) -> str | None:
    s, d, i = shape(x), dim, index
    if s is None or not -len(s) <= d < len(s):
        return f"dim {d} is out of range for a tensor of shape {s}"
    size = s[d]
    if isinstance(size, int) and not -size <= i < size:
        return f"index {i} is out of range for dim {d} of size {size}"
    return None


def _select_as_symint_build(rw: Rewriter, x: Node, dim: int, index: int) -> Node:
    node = rw.call(et_vk("select_as_symint"), x, dim, index)
    node.meta["val"] = rw.root.meta["val"]  # keep the program's symbol (as the stock pass)
    return node


@register_rules("vulkan_patterns", "vulkan", takes_over="select_as_symint",
                roots=("aten._local_scalar_dense.default",), semantics=SEMANTICS)
def select_as_symint_rule(name: str = "select_as_symint") -> Rule:
    select = op("aten.select_copy.int", capture("x"), integer("dim"), integer("index"))

    in_range = constraint("index_in_range")(_select_as_symint_in_range)
    build = _select_as_symint_build

    return Rule(
        name=name,
        pattern=op("aten._local_scalar_dense.default", select),
        constraints=[in_range, DtypeIn("x", frozenset({torch.int32, torch.int64}))],
        replacement=PythonReplacement(build),
        description="an int read from one element of a tensor into et_vk.select_as_symint",
    )
