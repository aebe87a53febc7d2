"""``DelegatedByVulkan`` asks the partitioner once per distinct question (issue 13).

A transformer asks "will the partitioner take this fused node?" once per layer with
the same shapes; the verdict is memoised by the captures' metadata. The memo must
not change a single verdict: the same program lowered with the memo off (an
nn.Module list makes verdicts depend on more than metadata) gives the same fusions
and the same declines.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from executorch.exir import to_edge
from torch import nn

from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes
from fusionkit.backends.vulkan_adapter.delegation import DelegatedByVulkan, PartitionerSupport

logging.getLogger().setLevel(logging.WARNING)


class RMS(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class Stack(nn.Module):
    """RMSNorms of two widths, several layers each ."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.a = nn.ModuleList([RMS(8) for _ in range(layers)])
        self.b = nn.ModuleList([RMS(16) for _ in range(layers)])

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for m in self.a:
            x = m(x)
        for m in self.b:
            y = m(y)
        return x, y


@pytest.fixture(scope="module")
def edge() -> Any:
    ep = torch.export.export(Stack().eval(), (torch.randn(2, 8), torch.randn(2, 16)))
    return to_edge(ep).exported_program()


def _run(edge: Any, partitioner: Any) -> tuple[Any, list[Any], Any]:
    """Run the adapter's pass list on a copy of ``edge``, recording every question asked."""
    program = copy.deepcopy(edge)
    passes = transform_passes(partitioner=partitioner)
    supports = {id(c.support): c.support for p in passes for r in getattr(p, "rules", ())
                for c in r.constraints if isinstance(c, DelegatedByVulkan)}
    assert len(supports) == 1  # one partitioner's view for the whole pass list
    (support,) = supports.values()
    asked: list[Any] = []
    original = support.refusal

    def spy(node: Any) -> str | None:
        asked.append(node)
        return original(node)

    support.refusal = spy  # type: ignore[method-assign]
    for p in passes:
        p(program)
    fusion = next(p for p in passes if hasattr(p, "report"))
    return fusion.report, asked, program


def test_one_question_per_distinct_metadata(edge: Any) -> None:
    report, asked, _ = _run(edge, VulkanPartitioner())
    assert report.total_fused == 8, str(report)
    # per width: the first layer reads a user input, later ones a value that requires
    # grad (another fake tensor): at most two questions per width
    assert 0 < len(asked) <= 4


@pytest.mark.parametrize("blocked", [False, True])
def test_memo_changes_no_verdict(edge: Any, blocked: bool) -> None:
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401  (registers et_vk)
    from executorch.exir.dialects._ops import ops as exir_ops

    blocklist = ([torch.ops.et_vk.rms_norm.default, exir_ops.edge.et_vk.rms_norm.default]
                 if blocked else None)
    memo, asked, prog_memo = _run(edge, VulkanPartitioner(operator_blocklist=blocklist))
    # an nn.Module list makes verdicts read more than metadata: the memo is off
    plain_partitioner = VulkanPartitioner(operator_blocklist=blocklist, nn_module_blocklist=[])
    assert not PartitionerSupport(plain_partitioner).by_metadata
    plain, asked_all, prog_plain = _run(edge, plain_partitioner)
    assert len(asked_all) > len(asked)
    assert memo.total_fused == plain.total_fused == (0 if blocked else 8)
    assert [(d.rule, d.root.name, d.reason) for d in memo.declined] == [
        (d.rule, d.root.name, d.reason) for d in plain.declined]
    if blocked:
        assert len(memo.declined) == 8 and all("rms_norm" in d.reason for d in memo.declined)
    assert str(prog_memo.graph) == str(prog_plain.graph)
