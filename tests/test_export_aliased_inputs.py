"""One tensor passed for two arguments at export: the program reads only one of them.

``torch.export`` traces the example inputs as tensors, and a tensor object seen
twice becomes *one* graph input: the first argument's placeholder is left
unused and every use reads the last one (strict and non-strict alike;
pytorch/pytorch#144683, called expected behavior there). A KV-cache decoder
exported with ``cache, cache`` as its key and value caches therefore computes
its key update from the value cache on every later call — the cause of the
Vulkan KV-cache end-to-end failure (``test_vulkan_quantized_e2e``), which was
neither the simulator nor a fusion rule: the simulated program agrees with the
exported program exactly, and with eager once the caches are distinct.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn


class TwoInputs(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + 1, b * 2


@pytest.mark.parametrize("strict", [False, True])
def test_export_merges_one_tensor_passed_twice(strict: bool) -> None:
    """Pins torch's behaviour: if this starts failing, torch keeps aliased inputs apart."""
    z = torch.zeros(3)
    ep = torch.export.export(TwoInputs(), (z, z), strict=strict)
    users = {n.name: len(n.users) for n in ep.graph.nodes if n.op == "placeholder"}
    assert users == {"a": 0, "b": 2}
    a, b = torch.ones(3), torch.full((3,), 5.0)
    got, want = ep.module()(a, b), TwoInputs()(a, b)
    assert torch.equal(got[1], want[1]) and not torch.equal(got[0], want[0])
    assert torch.equal(got[0], b + 1)
    distinct = torch.export.export(TwoInputs(), (z, z.clone()), strict=strict)
    assert all(torch.equal(g, w) for g, w in zip(distinct.module()(a, b), want, strict=True))


HEADS, CAP, HD = 2, 4, 8


class KVStep(nn.Module):
    """One decode step writing k and v at ``pos`` and attending to positions <= pos."""

    def __init__(self) -> None:
        super().__init__()
        self.wk, self.wv = nn.Linear(HEADS * HD, HEADS * HD), nn.Linear(HEADS * HD, HEADS * HD)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(1, 1, HEADS, HD).transpose(1, 2)

        k = k.index_copy(2, pos, heads(self.wk(x)))
        v = v.index_copy(2, pos, heads(self.wv(x)))
        mask = (torch.arange(CAP) <= pos).view(1, CAP)
        return F.scaled_dot_product_attention(heads(x), k, v, attn_mask=mask), k, v


Trace = list[tuple[torch.Tensor, ...]]


def _decode(step: Any, steps: int = 3) -> Trace:
    """``(y, k_cache, v_cache)`` of ``steps`` decode steps, the caches carried between calls."""
    torch.manual_seed(1)
    kc = vc = torch.zeros(1, HEADS, CAP, HD)
    trace = []
    with torch.no_grad():
        for s in range(steps):
            y, kc, vc = step(torch.randn(1, 1, HEADS * HD), kc, vc, torch.tensor([s]))
            trace.append((y, kc, vc))
    return trace


def _errors(got: Trace, want: Trace) -> list[float]:
    """Largest absolute difference per step."""
    return [max(float((a - b).abs().max()) for a, b in zip(g, w, strict=True))
            for g, w in zip(got, want, strict=True)]


@pytest.mark.slow
def test_vulkan_kv_step_follows_the_exported_program() -> None:
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, simulate, transform_passes

    torch.manual_seed(0)
    m = KVStep().eval()
    eager = _decode(m)
    cache = torch.zeros(1, HEADS, CAP, HD)
    for aliased in (True, False):
        ep = torch.export.export(m, (torch.randn(1, 1, HEADS * HD), cache,
                                     cache if aliased else cache.clone(), torch.tensor([0])))
        prog = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                           partitioner=[VulkanPartitioner()])
        simulated = _decode(lambda *a, prog=prog: simulate(prog, *a))
        # the simulator runs what was exported, aliased or not
        assert max(_errors(simulated, _decode(ep.module()))) < 1e-5
        errors = _errors(simulated, eager)
        if aliased:
            # step 0 starts from equal (zero) caches; from step 1 the key cache is the value one
            assert errors[0] < 1e-5 and min(errors[1:]) > 1e-2, errors
        else:
            assert max(errors) < 1e-5, errors
