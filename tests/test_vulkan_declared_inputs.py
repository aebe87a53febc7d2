"""Every input a Vulkan delegate call passes is declared by its serialized graph
(``vulkan_adapter.declared_inputs``).

``aten.copy.default(z, src)`` is ``src`` to Vulkan's preprocess
(``RemoveRedundantOpsTransform``): ``z`` is left without users, ExecuTorch's serializer
skips it, and the graph declares one input fewer than the call passes — the runtime aborts
at the first call, stock's program included. Under the adapter ``z`` is declared.
"""

from __future__ import annotations

from typing import Any

import torch
from vulkan_real_programs import lower, run_all


class CopyInto(torch.nn.Module):
    """``export_llm``'s local/global attention writes its cache positions this way."""

    def forward(self, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.copy.default(z, w * 2.0) + 1.0


INPUTS = (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),
          torch.randn(4, 8, generator=torch.Generator().manual_seed(1)))


def _export() -> Any:
    return torch.export.export(CopyInto().eval(), INPUTS)


def test_stock_declares_an_input_fewer_and_the_adapter_declares_them_all() -> None:
    eager = CopyInto()(*INPUTS)
    stock = lower("copy_into", "declared inputs", "stock", _export(), INPUTS, eager)
    assert stock.lower_error is None, stock.lower_error
    assert any("declares 1 inputs and 1 outputs, but the delegate call supplied 3 arguments"
               in p for p in stock.check_problems), stock.check_problems
    assert stock.simulator.startswith("stopped"), stock.simulator
    for path in ("installed", "adapter"):
        ours = lower("copy_into", "declared inputs", path, _export(), INPUTS, eager)
        assert ours.lower_error is None, (path, ours.lower_error)
        assert ours.check_problems == [], (path, ours.check_problems)
        assert ours.simulator == "ok", (path, ours.simulator)


def test_the_declared_program_runs_on_the_real_runtime(vulkan_runtime: Any) -> None:
    eager = CopyInto()(*INPUTS)
    stock = lower("copy_into", "declared inputs", "stock", _export(), INPUTS, eager)
    ours = lower("copy_into", "declared inputs", "installed", _export(), INPUTS, eager)
    run_all([stock, ours])
    assert stock.outcome == "refused", stock.describe()
    assert ours.outcome == "ok", ours.describe()
