"""A buffer a model writes with ``copy_`` (LFM2's short-conv state) through the Vulkan
partitioner: stock ExecuTorch 1.5.1 moves it into the delegate and serializes its new value
as a graph output the delegate call does not supply (the runtime aborts at the first call);
under fusionkit's adapter the buffer stays with the CPU program, which writes it back.

The proof: each Vulkan delegate call supplies what its serialized graph declares (stock's
does not), the buffer is reported kept, and the program runs on the real Vulkan runtime
(the simulator without one) equal to the eager module.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import llm_pipeline as llm
import pytest
import torch
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
from vulkan_runtime_oracle import adapter_state_restored, assert_real, pte_of, session

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import mutated_buffers

real_vulkan = session()


class ConvState(torch.nn.Module):
    """A causal depthwise conv over [state, x] whose last two steps become the new state."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(1, 8, 2))
        self.conv = torch.nn.Conv1d(8, 8, 3, groups=8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.state, x], -1)
        self.state.copy_(y[..., -2:])
        return self.conv(y) * 2.0


def _lower(model: torch.nn.Module, x: torch.Tensor) -> bytes:
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                       partitioner=[VulkanPartitioner()])
    # the state starts as the module's zeros (ExecuTorch leaves a mutated buffer
    # uninitialized unless asked, as export_llm asks for its cache positions)
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["state"])])
    return pte_of(edge.to_executorch(config))


@pytest.fixture(scope="module")
def programs() -> Iterator[dict[str, Any]]:
    torch.manual_seed(0)
    x, model = torch.randn(1, 8, 3), ConvState().eval()
    with adapter_state_restored():
        vk.uninstall()
        stock = _lower(copy.deepcopy(model), x)
        vk.install()
        mutated_buffers.KEPT.clear()
        ours = _lower(copy.deepcopy(model), x)
        kept = list(mutated_buffers.KEPT)
    yield {"x": x, "stock": stock, "ours": ours, "kept": kept, "eager": model(x)}


def test_stock_declares_an_output_its_call_does_not_supply(programs: dict[str, Any]) -> None:
    assert any(supplied != declared for supplied, declared in llm.delegate_arity(programs["stock"]))


def test_the_buffer_stays_on_the_cpu_and_every_call_matches(programs: dict[str, Any]) -> None:
    arity = llm.delegate_arity(programs["ours"])
    assert arity and all(supplied == declared for supplied, declared in arity), arity
    assert [k.buffer for k in programs["kept"]] == ["state"]
    assert "written back from" in programs["kept"][0].reason


def test_runs_as_eager(programs: dict[str, Any], real_vulkan: Any) -> None:
    want = programs["eager"]
    got = assert_real(real_vulkan, programs["ours"], [programs["x"]], want, atol=1e-5, rtol=1e-5)
    if got is None:  # no runtime: the simulator
        out = vk.simulate(programs["ours"], programs["x"])
        torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, want,
                                   atol=1e-5, rtol=1e-5)
