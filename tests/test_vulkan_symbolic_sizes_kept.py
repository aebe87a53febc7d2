"""Judging a node for the Vulkan runtime never specializes the user's dynamic sizes.

The runtime conditions read a node's arguments; a symbolic size among them
(``arange(x.shape[0], ...)``: ``start`` is the SymInt ``s0``) evaluated the Python way
(``float(start).is_integer()``) adds a guard, and the program's ShapeEnv then replaces
``s0`` with the example size: the partitioner under ``install()`` gave back a program whose
inputs were static (``size=(8,)``), which the runtime refused at any other size
(``Attempted to resize a static tensor``). ``runtime_conditions.violated`` now judges such
values by their example values with guards suppressed. The programs here come from
ExecuTorch's own delegate suite (``test_vulkan_delegate.py``'s dynamic arange and clamp
tests), lowered by ExecuTorch's ``VulkanPartitioner`` under install and run at sizes across
their range; the simulator now refuses an input the ``.pte`` does not plan for, as the
runtime does.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.export import Dim

import fusionkit.backends.vulkan_adapter as va
from fusionkit.backends.vulkan_adapter.inspect.runtime_conditions import violated
from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, simulate
from fusionkit.backends.vulkan_adapter.probe import schema_arguments

pytestmark = pytest.mark.usefixtures("vulkan_ops")


class ArangeStart(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.arange(x.shape[0], 32, 2)


class ArangeFloatStep(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.arange(0, x.shape[0], 0.5)


class ClampBySize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, max=x.shape[0])


MODELS = {"arange_start": (ArangeStart, (8,)), "arange_float_step": (ArangeFloatStep, (8,)),
          "clamp_by_size": (ClampBySize, (8, 4))}
LENGTH = Dim("length", min=2, max=16)


def _export(name: str) -> Any:
    cls, shape = MODELS[name]
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    return torch.export.export(cls(), (x,), dynamic_shapes={"x": {0: LENGTH}})


def _input_sizes(ep: Any) -> list[Any]:
    return [list(n.meta["val"].shape) for n in ep.graph.nodes if n.op == "placeholder"]


@pytest.fixture(scope="module")
def lowered() -> dict[str, Any]:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    out = {}
    va.install()
    try:
        for name in MODELS:
            edge = to_edge_transform_and_lower(copy.deepcopy(_export(name)),
                                               partitioner=[VulkanPartitioner()])
            out[name] = (edge.exported_program(), edge.to_executorch())
    finally:
        va.uninstall()
    return out


def test_judging_a_symbolic_argument_adds_no_guard() -> None:
    from executorch.exir import to_edge

    ep = to_edge(_export("arange_start")).exported_program()
    node = next(n for n in ep.graph.nodes if "arange" in str(n.target))
    start = node.args[0].meta["val"]
    env = start.node.shape_env
    guards = len(env.guards)
    names = [c.name for c in violated("aten.arange.start_step", schema_arguments(node))]
    assert names == ["start_known_when_built"]  # read once when built: it stays on the CPU
    assert len(env.guards) == guards
    assert _input_sizes(ep)[0][0].node.maybe_as_int() is None


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_installed_lowering_keeps_the_inputs_symbolic(lowered: dict[str, Any],
                                                          name: str) -> None:
    ep, _ = lowered[name]
    [[dim, *_]] = _input_sizes(ep)
    # a specialized size is still a SymInt, whose expression the ShapeEnv resolves to 8
    assert isinstance(dim, torch.SymInt) and dim.node.maybe_as_int() is None, (name, dim)


@settings(max_examples=8, deadline=None)
@given(length=st.integers(2, 16))
def test_every_length_in_range_runs_equal_to_eager(lowered: dict[str, Any], length: int) -> None:
    """On ExecuTorch's runtime (these programs keep every node on the CPU: their
    conditions' values are computed as the graph runs), and in the simulator."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    for name, (cls, shape) in MODELS.items():
        x = torch.arange(float(length * torch.Size(shape[1:]).numel())).reshape(
            length, *shape[1:])
        eager = cls()(x)
        _, et = lowered[name]
        [got] = _load_for_executorch_from_buffer(et.buffer).run_method("forward", (x,))
        torch.testing.assert_close(got, eager, msg=name)
        [sim] = torch.utils._pytree.tree_leaves(simulate(et, x))
        torch.testing.assert_close(sim, eager, msg=name)


def test_the_simulator_refuses_sizes_the_program_does_not_plan(lowered: dict[str, Any]
                                                               ) -> None:
    from executorch.exir import to_edge

    _, et = lowered["arange_start"]
    with pytest.raises(SimulationError, match="maximum capacity of 16 elements"):
        simulate(et, torch.randn(17))
    static = to_edge(torch.export.export(ArangeStart(), (torch.randn(8),))).to_executorch()
    with pytest.raises(SimulationError, match=r"static tensor of sizes \[8\], given \[3\]"):
        simulate(static, torch.randn(3))
    assert torch.utils._pytree.tree_leaves(simulate(static, torch.randn(8)))[0].shape == (12,)
