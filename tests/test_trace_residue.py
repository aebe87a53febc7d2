"""fusionkit lets go of the last graph torch traced where a stock pass it replaces would.

torch keeps the nodes of the last ``make_fx`` trace in a module global until the next
trace. Stock XNNPACK preprocess traces pattern graphs, which drops the edge program's
graph; fusionkit's rules in their place trace nothing, and the graph (with every fake
tensor of its metadata) outlived the lowering, through serialization, the export's peak.
"""

from __future__ import annotations

import gc
import weakref

import torch
from executorch.exir import to_edge_transform_and_lower
from torch import nn
from torch.fx.experimental import proxy_tensor

from fusionkit.backends.xnnpack_adapter import XnnpackPartitioner, transform_passes
from fusionkit.integration.trace_residue import release_last_trace


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _held() -> dict[int, torch.fx.Node]:
    held = proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT
    assert isinstance(held, dict)
    return held


def _traced_graph() -> weakref.ref[torch.fx.Graph]:
    """Export the model and drop the program: a weak reference to the graph torch keeps."""
    ep = torch.export.export(_Mlp(), (torch.randn(2, 16),))
    graphs = {id(n.graph): n.graph for n in _held().values()}
    assert graphs, "torch kept no node of the trace: nothing to release"
    (graph,) = graphs.values()
    ref = weakref.ref(graph)
    del ep, graphs, graph
    gc.collect()
    return ref


def test_the_traced_graph_outlives_its_program_until_released() -> None:
    ref = _traced_graph()
    assert ref() is not None  # what the release is for: torch's global keeps it
    assert release_last_trace() > 0
    gc.collect()
    assert ref() is None and not _held()
    assert release_last_trace() == 0


def test_lowering_through_the_xnnpack_adapter_keeps_no_traced_graph() -> None:
    ep = torch.export.export(_Mlp(), (torch.randn(2, 16),))
    lowered = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                          partitioner=[XnnpackPartitioner()])
    assert lowered.exported_program().graph_module.lowered_module_0 is not None
    # the edge program's trace was the last; preprocess (rules, no pattern traces) let go
    assert not _held(), sorted({len(n.graph.nodes) for n in _held().values()})
