"""A delegated in-place update whose new value the CPU program reads runs on the CPU
(``vulkan_adapter.mutated_buffers.keep_cpu_read_updates_on_cpu``).

``llama.update_cache`` is in Vulkan's registry; an op reading the cache afterwards may not
be (``export_llm``'s ``model.quantize_kv_cache=True``: the quantized sdpa reads the cache
scales). ExecuTorch then takes the update's result as the delegate's own and erases it from
the program while the CPU op still reads it: stock's lowering fails (``Tried to erase Node
... but it still had 1 users``). Under the adapter the update runs on the CPU, with its
``llama::`` kernel, and the program computes eager's values, call after call.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fusionkit.backends.vulkan_adapter as va
from fusionkit.backends.vulkan_adapter import mutated_buffers
from fusionkit.backends.vulkan_adapter import runtime as rt

pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")


class UpdateThenRead(torch.nn.Module):
    """A KV-cache write (on Vulkan) whose cache an op without Vulkan support reads."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 8, 2, 4))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        p = pos[0].item()
        torch._check_is_size(p)
        torch._check(p < 7)
        torch.ops.llama.update_cache(x * 2.0, self.cache, p)
        return torch.remainder(self.cache, 3.0) + 1.0


STEPS = [(torch.randn(1, 1, 2, 4, generator=torch.Generator().manual_seed(i)), torch.tensor([p]))
         for i, p in enumerate((2, 5))]

CALLS = """
import sys, torch
import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
from fusionkit.backends.vulkan_adapter import runtime as rt
rt.load()
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
data = open(sys.argv[1], "rb").read()
module = _load_for_executorch_from_buffer(data)
steps = torch.load(sys.argv[2])
torch.save([module.forward(list(s))[0].clone() for s in steps], sys.argv[3])
"""


def _lower(installed: bool) -> Any:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(UpdateThenRead(), STEPS[0], strict=False)
    va.uninstall()
    if installed:
        va.install()
    try:
        return to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()]).to_executorch()
    finally:
        if installed:
            va.uninstall()


def test_stock_fails_and_the_adapter_keeps_the_update_on_the_cpu() -> None:
    with pytest.raises(RuntimeError, match="Tried to erase Node"):
        _lower(False)
    mutated_buffers.KEPT.clear()
    ours = _lower(True)
    assert any("updated in place" in k.reason and k.buffer == "cache"
               for k in mutated_buffers.KEPT), mutated_buffers.KEPT
    code = ours.exported_program().graph_module.code
    assert "update_cache" in code  # on the CPU
    assert [str(p) for p in va.check(ours)] == []


def test_the_program_computes_eager_call_after_call(vulkan_runtime: Any, tmp_path: Path) -> None:
    ours = _lower(True)
    pte, steps, out = tmp_path / "ours.pte", tmp_path / "steps.pt", tmp_path / "out.pt"
    pte.write_bytes(bytes(ours.buffer))
    torch.save(STEPS, steps)
    done = subprocess.run([sys.executable, "-c", CALLS, str(pte), str(steps), str(out)],
                          env=rt.child_environment(), capture_output=True, text=True,
                          errors="replace", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    model = UpdateThenRead()
    want = [model(*s) for s in STEPS]
    got = torch.load(out)
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want, strict=True))


def test_the_simulator_computes_eager_call_after_call() -> None:
    """The serialized program's output node leaves out the cache the CPU's
    ``update_cache.out`` writes in place, while the signature still lists its mutation: the
    simulator takes the user outputs from the end, and carries the cache between calls."""
    from fusionkit.backends.vulkan_adapter.inspect.simulator import unload

    ours = _lower(True)
    node = next(n for n in ours.exported_program().graph_module.graph.nodes if n.op == "output")
    assert len(node.args[0]) < len(ours.exported_program().graph_signature.output_specs)
    model = UpdateThenRead()
    try:
        for s in STEPS:
            got = va.simulate(ours, *s)
            got = got[0] if isinstance(got, (list, tuple)) else got
            assert torch.allclose(got, model(*s), atol=1e-6)
    finally:
        unload(ours)
