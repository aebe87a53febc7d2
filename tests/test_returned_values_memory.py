"""A search's record of the values its matches rewire does not keep programs alive.

:mod:`fusionkit.find.returned_values` records, per search, what each accepted match makes of
the values the program returns. That record was a module-level table keyed weakly by the
search's ``ProgramInputs``, whose values held the search's contexts, each holding those
very inputs and the program: every program fusionkit ever searched stayed alive, with each
of its constants, until the process ended. Through ``export_llm`` on Vulkan, the program
``VulkanBackend.preprocess`` fuses holds a copy of every delegated weight (Qwen3 at 2
layers: +594 MiB at the end against stock, the output projection's copy). After a search
or a lowering is dropped, nothing of its programs may stay reachable.
"""

from __future__ import annotations

import gc
import weakref

import torch
from executorch.exir import to_edge_transform_and_lower
from torch.export import ExportedProgram

from fusionkit import Rule, capture, find_matches, op, ref, replace_with
from fusionkit.backends import vulkan_adapter


class _Reciprocal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(64, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * torch.reciprocal(self.w)) @ self.w


class _Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16))
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return self.lin(y)


def _live_programs() -> int:
    gc.collect()
    return sum(isinstance(o, ExportedProgram) for o in gc.get_objects())


def test_a_dropped_search_leaves_its_program_unreachable() -> None:
    rule = Rule(name="reciprocal_mul",
                pattern=op("aten.mul.Tensor", capture("x"),
                           op("aten.reciprocal.default", capture("y"))),
                replacement=replace_with("aten.div.Tensor", ref("x"), ref("y")))
    ep = torch.export.export(_Reciprocal(), (torch.randn(64, 64),))
    found = find_matches(ep, [rule])
    assert len(found.accepted) == 1  # the accepted match's rewiring was recorded
    program, weight = weakref.ref(ep), weakref.ref(ep.state_dict["w"])
    del ep, found
    gc.collect()
    assert program() is None
    assert weight() is None


def test_a_dropped_vulkan_lowering_leaves_no_more_programs_alive_than_stock() -> None:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as StockVulkanPartitioner,
    )

    def lower(fusionkit: bool) -> bytes:
        ep = torch.export.export(_Norm(), (torch.randn(2, 16),))
        if fusionkit:
            prog = to_edge_transform_and_lower(
                ep, transform_passes=vulkan_adapter.transform_passes(),
                partitioner=[vulkan_adapter.VulkanPartitioner()])
        else:
            prog = to_edge_transform_and_lower(ep, partitioner=[StockVulkanPartitioner()])
        return bytes(prog.to_executorch().buffer)

    def kept(fusionkit: bool) -> int:
        before = _live_programs()
        assert lower(fusionkit)
        return _live_programs() - before

    assert lower(True) and lower(False)  # process-wide caches (rules, patterns) built here
    # torch's fake-tensor dispatch cache keeps each delegate call's lowered module, and
    # with it the partition's program, in either lowering; every other program fusionkit's
    # lowering made (transform passes, partition, preprocess) is gone
    assert kept(True) <= kept(False)
