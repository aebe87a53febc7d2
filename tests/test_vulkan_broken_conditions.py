"""A node whose arguments break a runtime condition runs on the CPU, under ExecuTorch's own
partitioner too (``vulkan_adapter.broken_conditions``), and ``check()`` and the simulator
know the condition (``inspect.runtime_conditions``: ``blit_needs_textures``).

``x.to(torch.int64)`` on an int32 tensor is an ``aten._to_copy`` (``export_llm`` lowers
with ``_skip_dim_order``) that keeps Vulkan's stored dtype (int64 is held as int32): the
runtime copies it with a ``BlitNode``, which takes textures only, while ExecuTorch's
registry gives every non-float copy a buffer. Stock's program aborts at its first call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fusionkit.backends.vulkan_adapter as va
from fusionkit.backends.vulkan_adapter import broken_conditions
from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, unload

BLIT = "BlitNode"
CONDITION = "storage_type_of(src_) != utils::kBuffer"


class IntCopy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).to(torch.int64) + 1


X = torch.arange(-3, 5, dtype=torch.int32)


def _lower(installed: bool) -> Any:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    ep = torch.export.export(IntCopy(), (X,))
    va.uninstall()
    if installed:
        va.install()
    try:
        return to_edge_transform_and_lower(
            ep, partitioner=[VulkanPartitioner()],
            compile_config=EdgeCompileConfig(_skip_dim_order=True)).to_executorch()
    finally:
        if installed:
            va.uninstall()


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    broken_conditions.KEPT.clear()
    return {"stock": _lower(False), "installed": _lower(True)}


def _copies_delegated(et: Any) -> int:
    """``_to_copy`` nodes left on the CPU by the partitioner (0 when all were delegated)."""
    gm = et.exported_program().graph_module
    return sum("_to_copy" in str(n.target) for n in gm.graph.nodes)


def test_check_and_the_simulator_know_stocks_program_aborts(programs: dict[str, Any]) -> None:
    stock = programs["stock"]
    assert _copies_delegated(stock) == 0
    problems = [str(p) for p in va.check(stock)]
    assert any("aten._to_copy.default" in p and CONDITION in p for p in problems), problems
    with pytest.raises(SimulationError, match=r"blit|BlitNode|storage_type_of"):
        try:
            va.simulate(stock, X)
        finally:
            unload(stock)


def test_under_install_the_copy_runs_on_the_cpu(programs: dict[str, Any]) -> None:
    ours = programs["installed"]
    assert _copies_delegated(ours) >= 1
    assert any("blit_needs_textures" in why for why in broken_conditions.KEPT.values()), \
        broken_conditions.KEPT
    assert [str(p) for p in va.check(ours)] == []
    try:
        got = va.simulate(ours, X)
    finally:
        unload(ours)
    assert torch.equal(got[0] if isinstance(got, (list, tuple)) else got, IntCopy()(X))


def test_on_the_real_runtime(programs: dict[str, Any], vulkan_runtime: Any) -> None:
    stock, ours = rt.run_many_in_child([rt.Job(bytes(programs[k].buffer), [X])
                                        for k in ("stock", "installed")])
    assert not stock.ok and BLIT in (stock.message or ""), stock
    assert ours.ok, ours
    assert torch.equal(torch.as_tensor(ours.outputs[0]).to(torch.int64), IntCopy()(X))


class PositionMask(torch.nn.Module):
    """A ring buffer's validity test (``export_llm``'s local/global attention): positions
    before the current one, ``arange(n) < input_pos.item()`` — an ``aten.lt.Scalar`` whose
    scalar the graph computes at each call."""

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        start = input_pos[0].item()
        torch._check_is_size(start)
        torch._check(start < 16)
        return (torch.arange(16) < start).to(torch.float32) + x


POSITIONS = (0, 5, 9)
MASK_X = torch.randn(16, generator=torch.Generator().manual_seed(2))

CALLS = """
import sys, torch
from fusionkit.backends.vulkan_adapter import runtime as rt
rt.load()
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
data = open(sys.argv[1], "rb").read()
module = _load_for_executorch_from_buffer(data)
x = torch.load(sys.argv[2])
outs = [module.forward((x, torch.tensor([p])))[0].clone() for p in (0, 5, 9)]
torch.save(outs, sys.argv[3])
"""


def _mask_program(installed: bool) -> Any:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(PositionMask(), (MASK_X, torch.tensor([0])), strict=False)
    va.uninstall()
    if installed:
        va.install()
    try:
        return to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()]).to_executorch()
    finally:
        if installed:
            va.uninstall()


@pytest.fixture(scope="module")
def mask_programs() -> dict[str, Any]:
    return {"stock": _mask_program(False), "installed": _mask_program(True)}


def test_check_names_a_scalar_read_once(mask_programs: dict[str, Any]) -> None:
    """Stock delegates the comparison: ``check()`` names the condition (garbage from the
    second call on); under install it runs on the CPU and ``check()`` finds nothing."""
    problems = [str(p) for p in va.check(mask_programs["stock"])]
    assert any("aten.lt.Scalar" in p and "push constants" in p for p in problems), problems
    assert [str(p) for p in va.check(mask_programs["installed"])] == []


def test_the_position_is_read_at_every_call_on_the_real_runtime(
        mask_programs: dict[str, Any], vulkan_runtime: Any, tmp_path: Any) -> None:
    """Three calls of one loaded program: stock's keeps the first call's position (the
    mask of position 0 at 5 and 9), fusionkit's computes eager's mask at each."""
    import subprocess
    import sys

    x_file = tmp_path / "x.pt"
    torch.save(MASK_X, x_file)
    want = [PositionMask()(MASK_X, torch.tensor([p])) for p in POSITIONS]
    got = {}
    for kind, et in mask_programs.items():
        pte, out = tmp_path / f"{kind}.pte", tmp_path / f"{kind}.out.pt"
        pte.write_bytes(bytes(et.buffer))
        done = subprocess.run([sys.executable, "-c", CALLS, str(pte), str(x_file), str(out)],
                              env=rt.child_environment(), capture_output=True, text=True,
                              errors="replace", timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        got[kind] = torch.load(out)
    assert all(torch.equal(g, w) for g, w in zip(got["installed"], want, strict=True))
    assert torch.equal(got["stock"][0], want[0])  # the first call reads the position it has
    assert not torch.equal(got["stock"][1], want[1])  # later ones keep it: stock's bug
