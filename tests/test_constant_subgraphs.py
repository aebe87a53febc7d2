"""FoldConstantSubgraphsPass: what stock Vulkan preprocess cannot re-trace is computed at lowering.

The reproducer is three lines of model code: ``arange(n) + 1`` (to_edge lifts the 1 into
a constant whose fake carries its value) feeding ops that a ``cumsum`` (no Vulkan
kernel) cuts off, so the partitioner delegates a subgraph whose only inputs are such
constants, and ``FuseBatchNormPass``'s re-trace in preprocess mixes two fake modes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from hypothesis import given, settings
from hypothesis import strategies as st

from fusionkit.integration.constant_subgraphs import FoldConstantSubgraphsPass


class RelativePositions(torch.nn.Module):
    """Position-derived values next to a Gemma-style ``1 + w`` and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8))
        self.register_buffer("freq", torch.rand(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[-1]) + 1
        rel = (pos.unsqueeze(0) - pos.unsqueeze(1)).cumsum(-1)
        return x * (1.0 + self.w) + rel.float() * self.freq


X = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def exported() -> tuple[torch.nn.Module, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    m = RelativePositions().eval()
    return m, torch.export.export(m, (X,))


def _root(e: BaseException) -> BaseException:
    while e.__cause__ is not None:
        e = e.__cause__
    return e


@pytest.mark.slow
def test_stock_vulkan_dies_and_the_adapter_lowers(exported: tuple[torch.nn.Module, torch.export.ExportedProgram]) -> None:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
        VulkanPartitioner as StockVulkanPartitioner,
    )

    import fusionkit.backends.vulkan_adapter as va

    m, ep = exported
    va.uninstall()
    with pytest.raises(Exception) as info:  # ExecuTorch 1.5.1's own failure, pinned
        to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[StockVulkanPartitioner()])
    assert "doesn't match mode" in str(_root(info.value))

    before = (ep.graph_module.code, set(ep.state_dict), set(ep.constants))
    passes = va.transform_passes()
    (fold,) = [p for p in passes if isinstance(p, FoldConstantSubgraphsPass)]
    prog = to_edge_transform_and_lower(ep, transform_passes=passes,
                                       partitioner=[va.VulkanPartitioner()]).to_executorch()
    assert (ep.graph_module.code, set(ep.state_dict), set(ep.constants)) == before
    assert fold.folded and all(f.shape == (8, 8) for f in fold.folded)
    assert va.check(prog) == []
    with torch.no_grad():
        want = m(X)
    torch.testing.assert_close(va.simulate(prog, X), want, rtol=0, atol=1e-5)


def test_parameters_and_buffers_are_not_folded(exported: tuple[torch.nn.Module, torch.export.ExportedProgram]) -> None:
    m, ep = exported
    edge = to_edge(copy.deepcopy(ep)).exported_program()
    p = FoldConstantSubgraphsPass()
    assert p(edge).modified
    sig = edge.graph_signature
    kept = set(sig.inputs_to_parameters.values()) | set(sig.inputs_to_buffers.values())
    assert {"w", "freq"} <= kept
    users = {n.name: [u.target for u in n.users] for n in edge.graph.nodes if n.op == "placeholder"}
    w_node = next(k for k, v in sig.inputs_to_parameters.items() if v == "w")
    assert users[w_node], "1 + w is still computed in the graph (the fusion rules judge it)"
    assert not any("arange" in str(n.target) or "cumsum" in str(n.target) for n in edge.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(edge.module()(X), m(X))


class Generated(torch.nn.Module):
    def __init__(self, ops: list[tuple[str, int]], n: int) -> None:
        super().__init__()
        self.ops, self.n = ops, n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = torch.arange(self.n) + 1
        for op, k in self.ops:
            if op == "add":
                v = v + k
            elif op == "mul":
                v = v * k
            elif op == "outer":
                v = (v.unsqueeze(0) - v.unsqueeze(1)).sum(0)
            elif op == "cumsum":
                v = v.cumsum(0)
            else:
                v = torch.flip(v, (0,))
        return x + v.float()


@settings(max_examples=15)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "mul", "outer", "cumsum", "flip"]),
                              st.integers(-3, 3)), min_size=1, max_size=5),
       n=st.integers(1, 6))
def test_generated_constant_chains_fold_to_their_values(ops: list[tuple[str, int]], n: int) -> None:
    """Any chain of ops on ``arange + scalar`` folds away and the program computes the same."""
    m = Generated(ops, n)
    x = torch.randn(n)
    edge = to_edge(torch.export.export(m, (x,))).exported_program()
    FoldConstantSubgraphsPass()(edge)
    computed = [n.target for n in edge.graph.nodes if n.op == "call_function"]
    assert len(computed) <= 2, computed  # x + folded (maybe a cast), nothing of the chain
    torch.testing.assert_close(edge.module()(x), m(x))
