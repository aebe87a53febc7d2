"""ExecuTorch's own Vulkan partitioner, under ``install()``, keeps on the CPU a node whose
arguments break a runtime condition (``vulkan_adapter.broken_conditions``).

``llama.custom_sdpa`` with a mask (``export_llm``'s local/global attention): the runtime's
``sdpa_impl`` takes ``is_causal`` only. Stock ExecuTorch 1.5.1 fails to lower it
(``IndexError`` in Vulkan's sdpa pattern); under ``install()`` the attention runs on the
CPU (its ``llama::custom_sdpa`` kernel), the linears on Vulkan, and the program computes
what eager computes on the real runtime. The other conditions' programs are in
``test_vulkan_scalar_and_blit_conditions.py``; ExecuTorch's delegate suite under install
in ``vulkan_delegate_stock.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vulkan_real_programs import lower, run_all

from fusionkit import events
from fusionkit.backends.vulkan_adapter import broken_conditions


class MaskedAttention(torch.nn.Module):
    """A projection, ``custom_sdpa`` with an additive mask, a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(32, 32)
        self.o = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(1, 4, 4, 8)
        y = torch.ops.llama.custom_sdpa(q, q, q, 0, mask, 0.0, False, None)
        return self.o(y.reshape(1, 4, 32))


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (torch.ops.llama)

    torch.manual_seed(0)
    module = MaskedAttention().eval()
    mask = torch.zeros(4, 4)
    mask[0, 1:] = float("-inf")
    inputs = (torch.randn(1, 4, 32), mask)
    eager = module(*inputs)
    out: dict[str, Any] = {"placed": []}

    def on_placed(backend: str, what: str, why: str) -> None:
        out["placed"].append((backend, what, why))

    events.listen_placements(on_placed)
    try:
        for path in ("stock", "installed"):
            out[path] = lower("masked_sdpa", "attention", path,
                              torch.export.export(module, inputs, strict=False), inputs, eager)
    finally:
        events.unlisten_placements(on_placed)
    return out


def test_stock_cannot_lower_the_masked_attention(programs: dict[str, Any]) -> None:
    assert programs["stock"].lower_error is not None
    assert "IndexError" in programs["stock"].lower_error


def test_under_install_the_attention_runs_on_the_cpu(programs: dict[str, Any]) -> None:
    ours = programs["installed"]
    assert ours.lower_error is None, ours.lower_error
    assert ours.check_problems == [], ours.check_problems  # nothing the runtime refuses
    assert ours.simulator == "ok", ours.simulator
    kept = [why for why in broken_conditions.KEPT.values() if "custom_sdpa" in why]
    assert kept and "'causal_no_mask'" in kept[-1], broken_conditions.KEPT
    assert ("vulkan", "kept on the CPU: llama.custom_sdpa.default") in [
        p[:2] for p in programs["placed"]], programs["placed"]


def test_on_the_real_runtime(programs: dict[str, Any], vulkan_runtime: Any) -> None:
    ours = programs["installed"]
    run_all([ours])
    assert ours.real is not None and ours.real.ok, ours.real
    got = torch.as_tensor(ours.real.outputs[0])
    assert torch.allclose(got, ours.eager[0], atol=1e-5), (got - ours.eager[0]).abs().max()
