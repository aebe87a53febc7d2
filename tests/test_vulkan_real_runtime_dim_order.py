"""A delegate's inputs and outputs with a non-contiguous dim order, on the real Vulkan runtime.

Found on the real runtime (tests/test_vulkan_constants.py's conv with a channels_last
weight): ``VulkanBackend::execute`` copies each delegate input's memory into staging, and
each result into an output's memory, in contiguous order whatever the tensor's dim order.
A channels_last (0, 2, 3, 1) output so holds the NCHW result's bytes, and a channels_last
input is read as if its memory were NCHW. The simulator models it, ``check()`` reports it
(``runtime_condition`` on ``executorch_call_delegate``); here both are compared with the
runtime on one-op programs whose boundary tensors are channels_last or not, fp32 and
fp16, lowered with ExecuTorch's VulkanPartitioner. The same child runs a gelu with
``approximate='none'``: the runtime computes the tanh form, and so does the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
from executorch.exir import to_edge_transform_and_lower
from vulkan_runtime_oracle import run_real, session

pytestmark = pytest.mark.slow

real_vulkan = session()

CL = torch.channels_last


class Conv(torch.nn.Module):
    def __init__(self, weight_cl: bool, after: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(3, 4, 3, padding=1)
        if weight_cl:
            self.c.weight.data = self.c.weight.data.contiguous(memory_format=CL)
        self.after = after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.c(x))


class Elementwise(torch.nn.Module):
    def __init__(self, after: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.after = after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(torch.relu(x) * 2)


def _same(y: torch.Tensor) -> torch.Tensor:
    return y


def _to_cl(y: torch.Tensor) -> torch.Tensor:
    return y.contiguous(memory_format=CL)


def _to_contiguous(y: torch.Tensor) -> torch.Tensor:
    return y.contiguous()


#: name -> (model factory, the input is channels_last)
PROGRAMS: dict[str, tuple[Callable[[], torch.nn.Module], bool]] = {
    "conv_cl_weight": (lambda: Conv(True, _same), False),   # output CL
    "conv_cl_input": (lambda: Conv(False, _same), True),    # input and output CL
    "conv_plain": (lambda: Conv(False, _same), False),      # nothing CL: the control
    "relu_cl_in_out": (lambda: Elementwise(_same), True),   # both CL: the two copies cancel
    "relu_cl_in": (lambda: Elementwise(_to_contiguous), True),   # input CL only
    "relu_cl_out": (lambda: Elementwise(_to_cl), False),    # output CL only
}
IN, OUT = ("input", 0), ("output", 0)
#: the delegate's tensors each program makes channels_last (as eager lays them out)
LAYOUTS: dict[str, set[tuple[str, int]]] = {
    "conv_cl_weight": {OUT}, "conv_cl_input": {IN, OUT}, "conv_plain": set(),
    "relu_cl_in_out": {IN, OUT}, "relu_cl_in": {IN}, "relu_cl_out": {OUT},
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
#: every program in fp32; fp16 where a lone or a double channels_last tensor is read or
#: written (time: ~9 s a lowering)
CASES = [*(f"{p}-fp32" for p in PROGRAMS),
         *(f"{p}-fp16" for p in ("conv_cl_weight", "conv_cl_input", "relu_cl_in"))]


def _tol(dtype: torch.dtype) -> float:
    return 2e-2 if dtype == torch.float16 else 1e-4


@dataclass
class Lowered:
    edge: Any
    et: Any
    x: torch.Tensor
    eager: torch.Tensor
    #: ("input" | "output", index) of the delegate's tensors that eager holds channels_last
    channels_last: set[tuple[str, int]]


def _lower(model: torch.nn.Module, x: torch.Tensor) -> tuple[Any, Any]:
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                       partitioner=[VulkanPartitioner()])
    return edge, edge.to_executorch()


def _is_cl(t: torch.Tensor) -> bool:
    return not t.is_contiguous() and t.is_contiguous(memory_format=CL)


@pytest.fixture(scope="module")
def lowered() -> dict[str, Lowered]:
    import executorch.backends.vulkan.patterns as vk_patterns

    torch.manual_seed(0)
    out: dict[str, Lowered] = {}
    # Speed only: the partitioner and preprocess re-export the (constant) rope pattern
    # graphs, most of a lowering this small; build them once for the module.
    graphs = vk_patterns.all_fusable_graph_patterns()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vk_patterns, "all_fusable_graph_patterns", lambda: graphs)
        for case in CASES:
            prog, dname = case.rsplit("-", 1)
            make, cl_input = PROGRAMS[prog]
            dtype = DTYPES[dname]
            model = make().to(dtype).eval()
            x = torch.randn(1, 3, 5, 6, dtype=dtype)
            if cl_input:
                x = x.contiguous(memory_format=CL)
            with torch.no_grad():
                eager = model(x)
            edge, et = _lower(model, x)
            marks = {("input", 0)} if _is_cl(x) else set()
            marks |= {("output", 0)} if _is_cl(eager) else set()
            assert marks == LAYOUTS[prog], (case, marks)  # the layouts the case is about
            out[case] = Lowered(edge, et, x, eager, marks)
        gelu = torch.nn.GELU(approximate="none").eval()
        x = torch.linspace(-4, 4, 2 * 3 * 64).reshape(2, 3, 64)
        with torch.no_grad():
            eager = gelu(x)
        edge, et = _lower(gelu, x)
        out["gelu_erf"] = Lowered(edge, et, x, eager, set())
    return out


@pytest.fixture(scope="module")
def real_runs(lowered: dict[str, Lowered], real_vulkan: Any) -> dict[str, torch.Tensor] | None:
    """Every program's output on the real runtime, one child for the module."""
    if real_vulkan is None:
        return None
    out = {}
    for case, low in lowered.items():
        got = run_real(real_vulkan, low.et, [low.x])
        assert got is not None and len(got) == 1, case
        out[case] = got[0]
    return out


def _dim_order_problems(program: Any) -> set[tuple[str, int]]:
    from fusionkit.backends.vulkan_adapter import check

    found = set()
    for p in check(program):
        assert p.kind == "runtime_condition" and p.op == "executorch_call_delegate", str(p)
        assert p.arg_name is not None and p.arg_index is not None
        kind = p.arg_name.split()[0]
        assert "(0, 2, 3, 1)" in p.message and "contiguous order" in p.message, p.message
        found.add((kind, p.arg_index))
    return found


@pytest.mark.parametrize("case", CASES)
def test_check_names_every_channels_last_boundary_tensor(lowered: dict[str, Lowered],
                                                         case: str) -> None:
    """check() on the .pte and on the edge program: a problem for exactly the delegate
    inputs / outputs eager holds channels_last (the conv_plain control: none)."""
    low = lowered[case]
    assert _dim_order_problems(low.et) == low.channels_last
    assert _dim_order_problems(low.edge) == low.channels_last


@pytest.mark.parametrize("case", CASES)
def test_simulator_predicts_the_real_runtime(lowered: dict[str, Lowered],
                                             real_runs: Any, case: str) -> None:
    """The simulator's output equals the runtime's (values and dim order); whenever either
    differs from eager, check() named a channels_last boundary tensor."""
    from fusionkit.backends.vulkan_adapter import simulate

    low = lowered[case]
    tol = _tol(low.eager.dtype)
    sim = simulate(low.et, low.x)
    assert sim.shape == low.eager.shape and sim.dtype == low.eager.dtype
    sim_ok = torch.allclose(sim.float(), low.eager.float(), atol=tol, rtol=tol)
    if not sim_ok:
        assert low.channels_last, f"{case}: the simulator is wrong with nothing channels_last"
    if real_runs is None:
        return
    real = real_runs[case]
    assert real.dim_order() == low.eager.dim_order() == sim.dim_order(), case
    torch.testing.assert_close(sim, real, atol=tol, rtol=tol,
                               msg=lambda m: f"{case}: simulator vs the real runtime: {m}")
    real_ok = torch.allclose(real.float(), low.eager.float(), atol=tol, rtol=tol)
    assert real_ok == sim_ok
    if not real_ok:
        # exactly the mechanism modelled: the runtime computed on (and wrote) memory order
        assert low.channels_last


def test_the_runtime_is_wrong_where_a_lone_boundary_tensor_is_channels_last(
        lowered: dict[str, Lowered], real_runs: Any) -> None:
    """The finding itself, on the runtime (simulator alone without one): one channels_last
    boundary tensor gives wrong values; none, or an elementwise op whose input and output
    are both channels_last (the two contiguous-order copies cancel), gives eager's."""
    from fusionkit.backends.vulkan_adapter import simulate

    for case, low in lowered.items():
        if case == "gelu_erf":
            continue
        got = real_runs[case] if real_runs is not None else simulate(low.et, low.x)
        tol = _tol(low.eager.dtype)
        ok = torch.allclose(got.float(), low.eager.float(), atol=tol, rtol=tol)
        cancels = case.startswith("relu_cl_in_out")
        assert ok == (not low.channels_last or cancels), (case, low.channels_last)


def test_gelu_is_the_tanh_form_on_the_runtime_and_the_simulator(
        lowered: dict[str, Lowered], real_runs: Any) -> None:
    """gelu(approximate='none'): the runtime's shader has the tanh form only; the simulator
    computes it too, so it predicts the runtime much closer than erf's 4.7e-4."""
    from fusionkit.backends.vulkan_adapter import check, simulate

    low = lowered["gelu_erf"]
    sim = simulate(low.et, low.x)
    tanh = torch.nn.functional.gelu(low.x, approximate="tanh")
    assert check(low.et) == []  # a numerics note, not a problem
    torch.testing.assert_close(sim, tanh, atol=1e-6, rtol=0)
    assert (sim - low.eager).abs().max() > 1e-4  # erf's gelu differs measurably
    if real_runs is not None:
        real = real_runs["gelu_erf"]
        assert (real - sim).abs().max() < 2e-5, (real - sim).abs().max()
        assert (real - low.eager).abs().max() > 1e-4
