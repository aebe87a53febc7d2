"""Layer norms without weight or bias on Vulkan (``passes/vulkan/layer_norm_affine.py``).

ExecuTorch 1.5.1 delegates ``native_layer_norm(x, shape, None, None, eps)`` and its
runtime throws building the graph; the adapter gives the node ones / zeros. Generated
over which of weight/bias is missing, rank, width and eps: stock's payload is refused
by the simulator with the runtime's condition, the adapter's equals eager.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch import nn
from vulkan_runtime_oracle import assert_real, pte_of, session

real_vulkan = session()  # the real runtime, one child for the module (simulator-only without)

logging.getLogger().setLevel(logging.WARNING)


class Norms(nn.Module):
    """Two layer norms around a linear, optionally split by an op Vulkan does not take."""

    def __init__(self, dim: int, affine: str, eps: float, split: bool) -> None:
        super().__init__()
        kw: dict[str, Any] = {"eps": eps}
        if affine == "none":
            kw["elementwise_affine"] = False
        elif affine == "weight_only":
            kw["bias"] = False
        self.a, self.b = nn.LayerNorm(dim, **kw), nn.LayerNorm(dim, **kw)
        self.lin = nn.Linear(dim, dim)
        self.split = split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(self.a(x))
        if self.split:  # a CPU op between the norms: two Vulkan partitions
            h = torch.cumsum(h, dim=-1) * 0.1
        return self.b(h) + self.a(h)  # `a` used twice: its constants reach both partitions


def _lower(ep: Any, ours: bool) -> Any:
    if ours:
        from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

        return to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                           partitioner=[VulkanPartitioner()])
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()])


def _layer_norms(prog: Any) -> list[Any]:
    """The (weight, bias) arguments of every native_layer_norm inside the delegates."""
    out = []
    for _, lm in prog.exported_program().graph_module.named_children():
        if hasattr(lm, "original_module"):
            for n in lm.original_module.graph.nodes:
                if n.op == "call_function" and "native_layer_norm" in str(n.target):
                    out.append((n.args[2], n.args[3]))
    return out


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True, phases=(Phase.generate,),
          suppress_health_check=[HealthCheck.too_slow])
@given(affine=st.sampled_from(["none", "weight_only"]),
       dim=st.sampled_from([4, 12, 32]),
       rank=st.integers(2, 4),
       eps=st.sampled_from([1e-5, 1e-6]),
       split=st.booleans())
def test_layer_norm_without_affine_lowers_and_equals_eager(real_vulkan: Any, affine: str, dim: int,
                                                           rank: int, eps: float, split: bool
                                                           ) -> None:
    from fusionkit.backends.vulkan_adapter import check, simulate
    from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError

    torch.manual_seed(dim * rank)
    m = Norms(dim, affine, eps, split).eval()
    x = torch.randn(*([2] * (rank - 1)), dim)
    ep = torch.export.export(m, (x,))
    with torch.no_grad():
        want = m(x)

    stock = _lower(ep, ours=False)
    with pytest.raises(SimulationError, match=r"native_layer_norm.*(weight|bias)"):
        simulate(stock, x)

    prog = _lower(ep, ours=True)
    norms = _layer_norms(prog)
    assert norms and all(w is not None and b is not None for w, b in norms), norms
    assert check(prog) == []
    torch.testing.assert_close(simulate(prog, x), want, atol=1e-5, rtol=1e-5)
    # the constants given to each partition serialize, and the runtime agrees
    assert_real(real_vulkan, prog.to_executorch(), (x,), want, atol=1e-4, rtol=1e-4)
    if real_vulkan is not None:  # stock's is refused for real, as the simulator said
        res = real_vulkan.run(pte_of(stock), [x])
        assert not res.ok and "native_layer_norm" in (res.message or ""), res


def test_layer_norm_with_affine_is_left_alone() -> None:
    """A norm that has weight and bias is not the rule's business: not rewritten, and no
    decline either (it would be noise in every report of every model with a LayerNorm)."""
    from fusionkit import FusionPass
    from fusionkit.passes.vulkan.layer_norm_affine import layer_norm_affine_rule

    ep = torch.export.export(nn.LayerNorm(8).eval(), (torch.randn(2, 8),))
    edge = to_edge_transform_and_lower(ep).exported_program()
    before = str(edge.graph)
    fusion = FusionPass([layer_norm_affine_rule()])
    result = fusion.call(edge)
    assert not result.modified
    assert fusion.report.total_fused == 0
    assert fusion.report.declined == []
    assert str(edge.graph) == before
