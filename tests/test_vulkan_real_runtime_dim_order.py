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

The same programs lowered through fusionkit's adapter (its VulkanPartitioner and
transform_passes) have their channels_last boundary tensors converted inside the delegate
(``backends/vulkan_adapter/boundary_dim_order.py``: a view to the memory's shape and a
permute at each such input, the inverse at each such output): equal to eager on the
runtime, ``check()`` clean, the simulator equal to the runtime, the program's own dim
orders unchanged. A conv -> relu (kept on the CPU) -> conv program has boundaries in the
middle of the graph: stock's is wrong there, ours is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.dialects._ops import ops as exir_ops
from held_out_models import CL, Conv, dim_order_case, same
from vulkan_runtime_oracle import run_real, session

pytestmark = pytest.mark.slow

real_vulkan = session()


class Elementwise(torch.nn.Module):
    def __init__(self, after: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.after = after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(torch.relu(x) * 2)


class Middle(torch.nn.Module):
    """conv -> relu -> conv, channels_last throughout; the relu is kept on the CPU
    (operator_blocklist), so both delegates have channels_last inputs and outputs, two of
    them in the middle of the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = torch.nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.c1(x)))


MIDDLE = "conv_relu_conv_cl"
MIDDLE_OPTIONS = {"operator_blocklist": [exir_ops.edge.aten.relu.default]}
#: (delegate, "input" | "output", index) of its channels_last boundary tensors: all four
MIDDLE_LAYOUT = {(0, "input", 0), (0, "output", 0), (1, "input", 0), (1, "output", 0)}


def _to_cl(y: torch.Tensor) -> torch.Tensor:
    return y.contiguous(memory_format=CL)


def _to_contiguous(y: torch.Tensor) -> torch.Tensor:
    return y.contiguous()


#: name -> (model factory, the input is channels_last)
PROGRAMS: dict[str, tuple[Callable[[], torch.nn.Module], bool]] = {
    "conv_cl_weight": (lambda: Conv(True, same), False),    # output CL
    "conv_cl_input": (lambda: Conv(False, same), True),     # input and output CL
    "conv_plain": (lambda: Conv(False, same), False),       # nothing CL: the control
    "relu_cl_in_out": (lambda: Elementwise(same), True),    # both CL: the two copies cancel
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
    #: fusionkit's lowering: its partitioner's boundary_dim_orders (None: stock's)
    converted: list[Any] | None = None


def _lower(model: torch.nn.Module, x: torch.Tensor, **options: Any) -> tuple[Any, Any]:
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                       partitioner=[VulkanPartitioner(**options)])
    return edge, edge.to_executorch()


def _lower_ours(model: torch.nn.Module, x: torch.Tensor,
                **options: Any) -> tuple[Any, Any, list[Any]]:
    from fusionkit.backends.vulkan_adapter import VulkanPartitioner as Ours
    from fusionkit.backends.vulkan_adapter import transform_passes

    p = Ours(**options)
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                       transform_passes=transform_passes(partitioner=p),
                                       partitioner=[p])
    return edge, edge.to_executorch(), list(p.boundary_dim_orders)


def _is_cl(t: torch.Tensor) -> bool:
    return not t.is_contiguous() and t.is_contiguous(memory_format=CL)


def _case_model(case: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    prog, dname = case.rsplit("-", 1)
    make, cl_input = PROGRAMS[prog]
    return dim_order_case(make, cl_input, DTYPES[dname])


def _middle_model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = Middle().eval()
    x = torch.randn(1, 3, 5, 6).contiguous(memory_format=CL)
    with torch.no_grad():
        eager = model(x)
    assert _is_cl(eager)
    return model, x, eager


@pytest.fixture(scope="module")
def lowered() -> dict[str, Lowered]:
    """Stock's lowerings (ExecuTorch's VulkanPartitioner), by case."""
    import executorch.backends.vulkan.patterns as vk_patterns

    torch.manual_seed(0)
    out: dict[str, Lowered] = {}
    # Speed only: the partitioner and preprocess re-export the (constant) rope pattern
    # graphs, most of a lowering this small; build them once for the module.
    graphs = vk_patterns.all_fusable_graph_patterns()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vk_patterns, "all_fusable_graph_patterns", lambda: graphs)
        for case in CASES:
            prog = case.rsplit("-", 1)[0]
            model, x, eager = _case_model(case)
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
        model, x, eager = _middle_model()
        edge, et = _lower(model, x, **MIDDLE_OPTIONS)
        out[MIDDLE] = Lowered(edge, et, x, eager, {(k, i) for _, k, i in MIDDLE_LAYOUT})
    return out


@pytest.fixture(scope="module")
def ours() -> dict[str, Lowered]:
    """The same programs lowered through fusionkit's adapter, by case."""
    torch.manual_seed(0)
    out: dict[str, Lowered] = {}
    for case in CASES:
        model, x, eager = _case_model(case)
        marks = LAYOUTS[case.rsplit("-", 1)[0]]
        edge, et, converted = _lower_ours(model, x)
        out[case] = Lowered(edge, et, x, eager, marks, converted)
    model, x, eager = _middle_model()
    edge, et, converted = _lower_ours(model, x, **MIDDLE_OPTIONS)
    out[MIDDLE] = Lowered(edge, et, x, eager, {(k, i) for _, k, i in MIDDLE_LAYOUT}, converted)
    return out


@pytest.fixture(scope="module")
def real_runs(lowered: dict[str, Lowered], ours: dict[str, Lowered],
              real_vulkan: Any) -> dict[str, torch.Tensor] | None:
    """Every program's output on the real runtime, one child for the module: stock's by
    case, fusionkit's by ``ours:<case>``."""
    if real_vulkan is None:
        return None
    out = {}
    for prefix, programs in (("", lowered), ("ours:", ours)):
        for case, low in programs.items():
            got = run_real(real_vulkan, low.et, [low.x])
            assert got is not None and len(got) == 1, case
            out[prefix + case] = got[0]
    return out


def _dim_order_problems_by_delegate(program: Any) -> set[tuple[int, str, int]]:
    from fusionkit.backends.vulkan_adapter import check

    found = set()
    for p in check(program):
        assert p.kind == "runtime_condition" and p.op == "executorch_call_delegate", str(p)
        assert p.arg_name is not None and p.arg_index is not None
        kind = p.arg_name.split()[0]
        assert "(0, 2, 3, 1)" in p.message and "contiguous order" in p.message, p.message
        found.add((p.delegate, kind, p.arg_index))
    return found


def _dim_order_problems(program: Any) -> set[tuple[str, int]]:
    return {(kind, k) for _, kind, k in _dim_order_problems_by_delegate(program)}


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
        if case in ("gelu_erf", MIDDLE):
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


# ------------------------------------------------- fusionkit's lowering: converted inside


def _payload_ops(low: Lowered) -> list[list[str]]:
    from fusionkit.backends.vulkan_adapter.inspect.payload import decode_payload
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates

    return [decode_payload(d.payload).graph.op_names() for d in vulkan_delegates(low.et)]


@pytest.mark.parametrize("case", [*CASES, MIDDLE])
def test_ours_converts_exactly_the_channels_last_boundary_tensors(ours: dict[str, Lowered],
                                                                  case: str) -> None:
    """The partitioner lists the boundary tensors eager holds channels_last (and nothing
    else); check() finds no problem in the .pte nor in the edge program; the payload has the
    conversion's permutes only where a boundary tensor is channels_last."""
    from fusionkit.backends.vulkan_adapter import check

    low = ours[case]
    assert low.converted is not None
    if case == MIDDLE:
        tags = sorted({b.tag for b in low.converted})
        got = {(tags.index(b.tag), b.kind) for b in low.converted}
        assert len(low.converted) == 4 and got == {(d, k) for d, k, _ in MIDDLE_LAYOUT}
        assert len(_payload_ops(low)) == 2  # the relu is on the CPU: two delegates
    else:
        assert {(b.kind, 0) for b in low.converted} == low.channels_last
        assert len(low.converted) == len(low.channels_last)
    assert all(b.dim_order == (0, 2, 3, 1) for b in low.converted)
    assert check(low.et) == [] and check(low.edge) == []
    permutes = sum(op == "aten.permute_copy.default" for ops in _payload_ops(low) for op in ops)
    assert permutes == len(low.converted), _payload_ops(low)


def test_stock_is_wrong_at_the_middle_boundaries(lowered: dict[str, Lowered],
                                                 real_runs: Any) -> None:
    """Stock's conv -> relu (CPU) -> conv: check() names all four channels_last boundary
    tensors of its two delegates; its output is wrong on the runtime (simulator alone
    without one), and the simulator's equals the runtime's."""
    from fusionkit.backends.vulkan_adapter import simulate

    low = lowered[MIDDLE]
    assert _dim_order_problems_by_delegate(low.et) == MIDDLE_LAYOUT
    assert _dim_order_problems_by_delegate(low.edge) == MIDDLE_LAYOUT
    sim = simulate(low.et, low.x)
    assert not torch.allclose(sim, low.eager, atol=1e-3, rtol=1e-3)
    if real_runs is not None:
        real = real_runs[MIDDLE]
        assert not torch.allclose(real, low.eager, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(sim, real, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", [*CASES, MIDDLE])
def test_ours_equals_eager_on_the_real_runtime(ours: dict[str, Lowered], real_runs: Any,
                                               case: str) -> None:
    """Fusionkit's program equals eager on the runtime (values, and the output's dim order,
    which the program keeps), and so does the simulator's, which equals the runtime's."""
    from fusionkit.backends.vulkan_adapter import simulate

    low = ours[case]
    tol = _tol(low.eager.dtype)
    sim = simulate(low.et, low.x)
    assert sim.dim_order() == low.eager.dim_order()
    torch.testing.assert_close(sim, low.eager, atol=tol, rtol=tol,
                               msg=lambda m: f"{case}: the simulator vs eager: {m}")
    if real_runs is None:
        return
    real = real_runs["ours:" + case]
    assert real.dim_order() == low.eager.dim_order(), case
    torch.testing.assert_close(real, low.eager, atol=tol, rtol=tol,
                               msg=lambda m: f"{case}: ours on the real runtime vs eager: {m}")
    torch.testing.assert_close(sim, real, atol=tol, rtol=tol)


def test_ours_keeps_the_programs_dim_orders(lowered: dict[str, Lowered],
                                            ours: dict[str, Lowered]) -> None:
    """Outside the delegates nothing changes: every tensor of ours' top-level graph has the
    dim order of the same tensor in stock's (the delegate calls' inputs and outputs too)."""
    for case in [*CASES, MIDDLE]:
        def orders(low: Lowered) -> list[tuple[str, tuple[int, ...]]]:
            gm = low.edge.exported_program().graph_module
            return [(str(n.target), tuple(n.meta["val"].dim_order())) for n in gm.graph.nodes
                    if isinstance(n.meta.get("val"), torch.Tensor)]
        assert orders(ours[case]) == orders(lowered[case]), case


class SmallCnn(torch.nn.Module):
    """conv-bn-relu, a residual conv, max pool, a 1x1 conv and a mean: two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.c3 = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.c1(x)))
        y = self.pool(y + self.c2(y))
        return self.c3(y), y.mean(dim=(2, 3))


def test_a_channels_last_model(real_vulkan: Any) -> None:
    """``model.to(memory_format=channels_last)`` with a channels_last input, both lowerings:
    ours converts its channels_last boundary tensors and equals eager on the runtime (and
    the simulator), check() clean; stock's is wrong on both, check() names the tensors."""
    from fusionkit.backends.vulkan_adapter import check, simulate

    torch.manual_seed(0)
    model = SmallCnn().eval()
    mean, var = model.bn.running_mean, model.bn.running_var
    assert mean is not None and var is not None
    with torch.no_grad():
        mean.uniform_(-1, 1)
        var.uniform_(0.5, 2)
    model = model.to(memory_format=CL)  # type: ignore[call-overload]
    x = torch.randn(2, 3, 8, 10).contiguous(memory_format=CL)
    with torch.no_grad():
        eager = model(x)
    assert _is_cl(eager[0])
    _, stock = _lower(model, x)
    _, et, converted = _lower_ours(model, x)
    assert converted and all(b.dim_order == (0, 2, 3, 1) for b in converted)
    assert check(et) == []
    assert _dim_order_problems(stock)

    def ok(outs: Any) -> bool:
        return all(torch.allclose(o, e, atol=1e-4, rtol=1e-4)
                   for o, e in zip(outs, eager, strict=True))

    with torch.no_grad():
        sim_ours, sim_stock = simulate(et, x), simulate(stock, x)
    assert ok(sim_ours) and not ok(sim_stock)
    real_ours, real_stock = run_real(real_vulkan, et, [x]), run_real(real_vulkan, stock, [x])
    if real_ours is None or real_stock is None:
        return
    assert ok(real_ours), "ours on the real runtime"
    assert [o.dim_order() for o in real_ours] == [e.dim_order() for e in eager]
    assert not ok(real_stock)
    for s, r in zip(sim_stock, real_stock, strict=True):
        torch.testing.assert_close(s, r, atol=1e-4, rtol=1e-4)
