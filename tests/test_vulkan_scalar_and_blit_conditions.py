"""Two runtime conditions shown on the real runtime (``inspect.runtime_conditions``:
``blit_needs_textures``, ``scalar_known_when_built``): ``check()`` and the simulator name
them in stock's programs; the adapter's partitioner, and ExecuTorch's own under
``install()`` (``vulkan_adapter.broken_conditions``), keep such nodes on the CPU.

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
from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, unload

BLIT = "BlitNode"
CONDITION = "storage_type_of(src_) != utils::kBuffer"


class IntCopy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).to(torch.int64) + 1


X = torch.arange(-3, 5, dtype=torch.int32)


PATHS = ("stock", "installed", "ours")


def _lower(module: torch.nn.Module, inputs: tuple[Any, ...], path: str,
           **config: Any) -> Any:
    """Stock ExecuTorch's lowering, ExecuTorch's own calls under ``install()`` (as
    ``fusionkit exec`` runs them), or the adapter's (its partitioner and rules)."""
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    ep = torch.export.export(module, inputs, strict=False)
    va.uninstall()
    compile_config = EdgeCompileConfig(**config)
    if path == "stock":
        return to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()],
                                           compile_config=compile_config).to_executorch()
    if path == "installed":
        va.install()
        try:
            return to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()],
                                               compile_config=compile_config).to_executorch()
        finally:
            va.uninstall()
    part = va.VulkanPartitioner()
    return to_edge_transform_and_lower(ep, transform_passes=va.transform_passes(partitioner=part),
                                       partitioner=[part],
                                       compile_config=compile_config).to_executorch()


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    return {k: _lower(IntCopy(), (X,), k, _skip_dim_order=True) for k in PATHS}


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


@pytest.mark.parametrize("path", ["installed", "ours"])
def test_the_adapter_keeps_the_copy_on_the_cpu(programs: dict[str, Any], path: str) -> None:
    ours = programs[path]
    assert _copies_delegated(ours) >= 1
    assert [str(p) for p in va.check(ours)] == []
    try:
        got = va.simulate(ours, X)
    finally:
        unload(ours)
    assert torch.equal(got[0] if isinstance(got, (list, tuple)) else got, IntCopy()(X))


def test_on_the_real_runtime(programs: dict[str, Any], vulkan_runtime: Any) -> None:
    stock, *ours = rt.run_many_in_child([rt.Job(bytes(programs[k].buffer), [X])
                                         for k in PATHS])
    assert not stock.ok and BLIT in (stock.message or ""), stock
    for run in ours:
        assert run.ok, run
        assert torch.equal(torch.as_tensor(run.outputs[0]).to(torch.int64), IntCopy()(X))


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


@pytest.fixture(scope="module")
def mask_programs() -> dict[str, Any]:
    return {k: _lower(PositionMask(), (MASK_X, torch.tensor([0])), k) for k in PATHS}


def test_check_names_a_scalar_read_once(mask_programs: dict[str, Any]) -> None:
    """Stock delegates the comparison: ``check()`` names the condition (garbage from the
    second call on)."""
    problems = [str(p) for p in va.check(mask_programs["stock"])]
    assert any("aten.lt.Scalar" in p and "push constants" in p for p in problems), problems


def test_the_runtime_reads_the_position_at_the_first_call_only(
        mask_programs: dict[str, Any], vulkan_runtime: Any, tmp_path: Any) -> None:
    """Three calls of one loaded program: stock's keeps the first call's position (the
    mask of position 0 at 5 and 9): the condition is the runtime's. Under ``install()`` and
    the adapter the comparison runs on the CPU, and every call computes its own mask (the
    ``.item()``'s partition, left giving the CPU an int only, goes with it: ExecuTorch's
    memory planning cannot lower a delegate with no tensor result)."""
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
    assert torch.equal(got["stock"][0], want[0])  # the first call reads the position it has
    assert not torch.equal(got["stock"][1], want[1])  # later ones keep it: stock's bug
    for path in ("installed", "ours"):
        for k, (g, w) in enumerate(zip(got[path], want, strict=True)):
            assert torch.equal(g, w), (path, POSITIONS[k], g, w)
