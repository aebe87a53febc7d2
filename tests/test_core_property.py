"""Property: on random small graphs mixing fusable and non-fusable subgraphs, the
fused program computes what the original module computes, and exactly the
embedded fusable subgraphs are fused."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import (
    RMSNorm,
    edge_config,
    export_edge,
    op_counts,
    relu_relu_rule,
    run_program,
    silu_rule,
)
from torch import nn

from fusionkit import FusionPass
from fusionkit.passes.rms_norm import rms_norm_rule

D = 8

#: op name -> is it a fusable subgraph on its own?
OPS = {
    "silu": True,  # h * sigmoid(h)
    "mul_sigmoid_other": False,  # h * sigmoid(y)
    "rms_param": True,  # rmsnorm(h) * parameter
    "rms_plus_one": True,  # rmsnorm(h) * (1.0 + parameter): folded
    "rms_input": False,  # rmsnorm(h) * w (a user input)
    "relu": False,  # fusable in pairs (relu_relu), counted separately
    "add": False,  # h + y
}


class RandomNet(nn.Module):
    def __init__(self, ops: list[str]) -> None:
        super().__init__()
        self.ops = ops
        self.norms = nn.ModuleList(
            RMSNorm(D, weight="plus_one" if o == "rms_plus_one" else "param", eps=1e-5)
            for o in ops if o in ("rms_param", "rms_plus_one"))
        self.norm_of_input = RMSNorm(D, weight="input", eps=1e-5)

    def forward(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x
        norms = iter(self.norms)
        for o in self.ops:
            if o == "silu":
                h = h * torch.sigmoid(h)
            elif o == "mul_sigmoid_other":
                h = h * torch.sigmoid(y)
            elif o in ("rms_param", "rms_plus_one"):
                h = next(norms)(h)
            elif o == "rms_input":
                h = self.norm_of_input(h, w)
            elif o == "relu":
                h = torch.relu(h)
            else:
                h = h + y
        return h


def expected_fusions(ops: list[str]) -> int:
    n = sum(OPS[o] for o in ops)
    run = 0
    for o in [*ops, None]:
        if o == "relu":
            run += 1
        else:
            n += run // 2  # a run of k relus: matches never overlap, floor(k / 2) fuse
            run = 0
    return n


def test_expected_fusions_counting():
    assert expected_fusions(["relu"] * 3) == 1
    assert expected_fusions(["relu"] * 4 + ["silu", "relu", "add", "relu"]) == 3
    assert expected_fusions(["rms_input", "mul_sigmoid_other"]) == 0


SILU_OK = edge_config(torch.ops.aten.silu.default)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(ops=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=6),
       seed=st.integers(0, 2**16), batch=st.integers(1, 3))
def test_fused_program_computes_the_same_values(vulkan_ops, ops, seed, batch):
    torch.manual_seed(seed)
    model = RandomNet(ops).eval()
    g = torch.Generator().manual_seed(seed + 1)
    example = (torch.randn(batch, D, generator=g), torch.randn(batch, D, generator=g),
               torch.rand(D, generator=g) + 0.5)
    ep = export_edge(model, example, compile_config=SILU_OK)
    before = op_counts(ep)

    p = FusionPass([silu_rule(), rms_norm_rule(), relu_relu_rule()])
    res = p(ep)
    n = expected_fusions(ops)
    assert p.report.total_fused == n, str(p.report)
    assert res.modified is (n > 0)
    after = op_counts(ep)
    assert after["aten.silu.default"] == ops.count("silu")
    assert after["et_vk.rms_norm.default"] == ops.count("rms_param") + ops.count("rms_plus_one")
    assert after["aten.relu.default"] == before["aten.relu.default"] - (
        n - ops.count("silu") - after["et_vk.rms_norm.default"])
    assert p.report.rules["rms_norm"].folded == ops.count("rms_plus_one")
    rms_declines = p.report.rules["rms_norm"].declines_by_step()
    assert rms_declines["prepackable_constant"] == ops.count("rms_input")
    ep.graph_module.graph.lint()
    ep.validate()

    for i in range(2):
        gi = torch.Generator().manual_seed(seed + 100 + i)
        inputs = (torch.randn(batch, D, generator=gi), torch.randn(batch, D, generator=gi),
                  torch.rand(D, generator=gi) + 0.5)
        with torch.no_grad():
            want = model(*inputs)
        got = run_program(ep, *inputs)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)

    # idempotent for the rules whose output cannot match again
    again = FusionPass([silu_rule(), rms_norm_rule()])
    assert again(ep).modified is False
