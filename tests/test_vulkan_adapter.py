"""The Vulkan adapter end to end: stock ExecuTorch 1.5.1 vs fusionkit on the six
multiplier rows (fp32, fp16; bf16 is not run by Vulkan), check() on every kind of
program input, the takeover of the stock rms_norm pattern (spied: its detector
never runs under the adapter), and the payload decoder.

Lowering to Vulkan is the expensive part: every program is lowered once per
module (``lowered`` fixture) and shared by the tests that look at it.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import rmsnorm_models as R
import torch
from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
    VulkanPartitioner as StockVulkanPartitioner,
)
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import (
    Problem,
    VulkanPartitioner,
    check,
    decode_payload,
    install,
    transform_passes,
    uninstall,
)
from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates
from fusionkit.integration import hooks

pytestmark = pytest.mark.usefixtures("vulkan_ops")

RMS = "et_vk.rms_norm.default"
VK_DTYPES = (torch.float32, torch.float16)


def _registry() -> dict[str, Any]:
    from executorch.backends.vulkan.patterns import pattern_registry

    return pattern_registry.fusable_patterns


# --------------------------------------------------------------------- fixtures


@dataclass
class Spy:
    detector: int = 0
    replacement: int = 0


@dataclass
class Lowered:
    prog: EdgeProgramManager
    spy: Spy
    chains: list[list[str]] = field(default_factory=list)

    @property
    def fused(self) -> int:
        return sum(c.count(RMS) for c in self.chains)


class Lowerer:
    """Lowers each (case, mode) once; counts calls of the stock rms_norm entry meanwhile."""

    def __init__(self, spy: Spy) -> None:
        self.spy = spy
        self.cache: dict[Any, Lowered] = {}

    def get(self, key: Any, make: Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]],
            mode: str) -> Lowered:
        if (key, mode) in self.cache:
            return self.cache[(key, mode)]
        m, args = make()
        ep = torch.export.export(m, args)
        self.spy.detector = self.spy.replacement = 0
        if mode == "stock":
            uninstall()
            prog = to_edge_transform_and_lower(ep, partitioner=[StockVulkanPartitioner()])
        elif mode == "fk":
            prog = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                               partitioner=[VulkanPartitioner()])
        elif mode == "partitioner_only":
            prog = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()])
        else:
            raise ValueError(mode)
        spy = copy.copy(self.spy)
        chains = [decode_payload(d.payload).graph.op_names() for d in vulkan_delegates(prog)]
        out = self.cache[(key, mode)] = Lowered(prog, spy, chains)
        return out


@pytest.fixture(scope="module")
def lowered() -> Iterator[Lowerer]:
    was_installed = vk.is_installed()
    uninstall()
    registry = _registry()
    entry = registry["rms_norm"]
    spy = Spy()
    orig_detect, orig_replace = entry.detector_fn, entry.create_replacement_fn

    def detect(node: Any) -> Any:
        spy.detector += 1
        return orig_detect(node)

    def replace(*args: Any) -> Any:
        spy.replacement += 1
        return orig_replace(*args)

    entry.detector_fn, entry.create_replacement_fn = detect, replace
    # Speed only: the stock graph patterns (rope) re-export their pattern graphs on
    # every partition and preprocess call; SubgraphMatcher only reads them.
    cached = {name: e.get_graphs_fn for name, e in registry.items() if e.get_graphs_fn}
    for name, fn in cached.items():
        registry[name].get_graphs_fn = functools.cache(fn)
    try:
        yield Lowerer(spy)
    finally:
        uninstall()
        entry.detector_fn, entry.create_replacement_fn = orig_detect, orig_replace
        for name, fn in cached.items():
            registry[name].get_graphs_fn = fn
        if was_installed:
            install()


def _row_make(row: R.Row, dtype: torch.dtype) -> Callable[[], Any]:
    return lambda: R.row_case(row, dtype)


def _dt(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


# ----------------------------------------------------------- the six-row table

#: what stock ExecuTorch 1.5.1 does, as observed: (fuses into et_vk.rms_norm, payload aborts)
STOCK = {
    "param": (True, False),
    "buffer": (True, False),
    "cast": (True, True),
    "gemma": (True, True),
    "input": (True, True),
    "adaln": (True, True),
}


@pytest.mark.parametrize("dtype", VK_DTYPES, ids=_dt)
@pytest.mark.parametrize("row", R.ROWS, ids=lambda r: r.name)
def test_stock_1_5_1(lowered: Lowerer, row: R.Row, dtype: torch.dtype) -> None:
    lo = lowered.get((row.name, dtype), _row_make(row, dtype), "stock")
    fuses, aborts = STOCK[row.name]
    assert aborts == row.stock_aborts
    assert (lo.fused == 1) == fuses, lo.chains
    assert lo.spy.detector > 0 and lo.spy.replacement == 1  # the spy does see the stock path
    problems = check(lo.prog)
    if aborts:
        (p,) = problems
        assert (p.kind, p.op, p.arg_index, p.arg_name) == ("not_constant", RMS, 1, "weight")
        assert p.delegate == 0 and isinstance(p.value_id, int)
        assert p.message.startswith(f"{RMS} argument 1 (weight) is not a constant (TensorRef)")
        assert "(graph.val_is_tref(tensor_data)) is false!" in p.message
    else:
        assert problems == []


@pytest.mark.parametrize("dtype", VK_DTYPES, ids=_dt)
@pytest.mark.parametrize("row", R.ROWS, ids=lambda r: r.name)
def test_fusionkit(lowered: Lowerer, row: R.Row, dtype: torch.dtype) -> None:
    lo = lowered.get((row.name, dtype), _row_make(row, dtype), "fk")
    # everything is delegated, in one delegate
    assert len(lo.chains) == 1
    top = [str(n.target) for n in lo.prog.exported_program().graph_module.graph.nodes
           if n.op == "call_function" and "delegate" not in str(n.target)
           and "getitem" not in str(n.target)]
    assert not any("rms_norm" in t for t in top)
    if row.fused:
        assert lo.chains == [[RMS]]  # accepted by the partitioner, survives preprocess
    else:
        assert lo.fused == 0 and "aten.rsqrt.default" in lo.chains[0]
    assert check(lo.prog) == []
    # the stock detector and replacement never ran: not in partition, not in preprocess
    assert lo.spy == Spy(0, 0)


@pytest.mark.parametrize("dtype", R.DTYPES, ids=_dt)
@pytest.mark.parametrize("row", R.ROWS, ids=lambda r: r.name)
def test_numerics_of_transformed_edge_program(row: R.Row, dtype: torch.dtype) -> None:
    """The edge program after transform_passes() (before delegation) matches eager."""
    ep0, m, args = R.edge_program((row.name, dtype), _row_make(row, dtype))
    ep = copy.deepcopy(ep0)
    for p in transform_passes():
        p(ep)
    fused = row.fused and dtype in VK_DTYPES  # Vulkan has no bf16 kernels: not fused there
    assert sum(n.name.startswith("et_vk") for n in ep.graph_module.graph.nodes) == int(fused)
    with torch.no_grad():
        out, want = ep.module()(*args), m(*args)
    assert out.dtype == want.dtype
    torch.testing.assert_close(out.float(), want.float(), **R.tolerance(dtype))


@pytest.mark.parametrize("mode", ["stock", "fk"])
def test_bf16_is_not_delegated(lowered: Lowerer, mode: str) -> None:
    row = R.ROWS[3]  # gemma
    lo = lowered.get((row.name, torch.bfloat16), _row_make(row, torch.bfloat16), mode)
    assert lo.chains == []
    assert check(lo.prog) == []
    top = lo.prog.exported_program().graph_module.graph
    assert not any(n.name.startswith("et_vk") for n in top.nodes)  # nothing left without a kernel


# ------------------------------------------------------------- model re-creations


class _Zoo(torch.nn.Module):
    """Llama, HF Llama, Gemma, T5 and diffusers norms in sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList([R.LlamaRMSNorm(), R.HFLlamaRMSNorm(), R.GemmaRMSNorm(),
                                          R.T5LayerNorm(), R.DiffusersRMSNorm()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, n in enumerate(self.norms):
            x = n(x) + 0.5 * i
        return x


def _zoo(dtype: torch.dtype) -> Callable[[], Any]:
    def make() -> Any:
        torch.manual_seed(0)
        return _Zoo().to(dtype).eval(), (torch.randn(2, R.D, dtype=dtype),)
    return make


@pytest.mark.parametrize("dtype", [torch.float16], ids=_dt)  # fp32: see test_rms_norm.py
def test_model_recreations_through_vulkan(lowered: Lowerer, dtype: torch.dtype) -> None:
    fk = lowered.get(("zoo", dtype), _zoo(dtype), "fk")
    assert fk.fused == 5 and check(fk.prog) == [] and fk.spy == Spy(0, 0)
    stock = lowered.get(("zoo", dtype), _zoo(dtype), "stock")
    problems = check(stock.prog)
    # Gemma's ``1.0 + weight.float()`` is fused by stock with a computed weight
    assert problems and all(p.op == RMS and p.arg_name == "weight" for p in problems)


def test_qwen_qk_norms_through_vulkan(lowered: Lowerer) -> None:
    def make() -> Any:
        torch.manual_seed(0)
        return R.QwenAttention().eval(), (torch.randn(1, 3, 16),)

    fk = lowered.get("qwen", make, "fk")
    assert fk.fused == 3 and check(fk.prog) == [] and fk.spy == Spy(0, 0)


@pytest.mark.parametrize("index, fused", [(0, 1), (3, 0), (5, 0)])  # param, Gemma (needs folding), AdaLN
def test_partitioner_alone_fuses_only_through_fusionkit_rules(lowered: Lowerer, index: int,
                                                               fused: int) -> None:
    """Without our transform passes, VulkanBackend.preprocess still fuses — but with
    fusionkit's rules (and their constraints) in place of the stock detector."""
    row = R.ROWS[index]
    lo = lowered.get((row.name, torch.float32), _row_make(row, torch.float32),
                     "partitioner_only")
    assert lo.fused == fused and lo.chains
    if not fused:
        assert "aten.rsqrt.default" in lo.chains[0]
    assert lo.spy == Spy(0, 0)
    assert check(lo.prog) == []


# ------------------------------------------------------------------------ check()


def test_check_accepts_every_program_form(lowered: Lowerer, tmp_path: Path) -> None:
    row = R.ROWS[3]  # gemma: stock aborts, fusionkit does not
    for mode, n in (("stock", 1), ("fk", 0)):
        lo = lowered.get((row.name, torch.float32), _row_make(row, torch.float32), mode)
        et = copy.deepcopy(lo.prog).to_executorch()
        path = tmp_path / f"{mode}.pte"
        path.write_bytes(et.buffer)
        results = [check(lo.prog), check(et), check(et.buffer), check(path), check(str(path))]
        assert all(len(r) == n for r in results)
        assert all(r == results[0] for r in results)
        for p in results[0]:
            assert isinstance(p, Problem) and "forward" in str(p)
    with pytest.raises(TypeError):
        check(42)


class _InfScalars(torch.nn.Module):
    """An HF-style ``masked_fill(..., -inf)`` and a ``clamp(min=-inf)``: infinite scalars."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=float("-inf"), max=0.5) + torch.softmax(
            x.masked_fill(x > 1.0, float("-inf")), -1)


def test_check_handles_infinite_scalars(lowered: Lowerer) -> None:
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        extract_vk_flatbuffer,
        flatbuffer_to_vk_graph,
    )

    lo = lowered.get("inf", lambda: (_InfScalars(), (torch.randn(2, R.D),)), "fk")
    (d,) = vulkan_delegates(lo.prog)
    values = decode_payload(d.payload).graph.values
    assert any(v.kind == "Double" and v.value == -math.inf for v in values)
    with pytest.raises(ValueError):  # ExecuTorch's own flatc-JSON reader chokes on it
        flatbuffer_to_vk_graph(extract_vk_flatbuffer(d.payload))
    assert check(lo.prog) == []


def _synthetic_payload(constant_length: int, weight_constant_id: int,
                       layer_norm_bias_none: bool = True) -> bytes:
    """A payload built with ExecuTorch's own serializer, for decoder/check unit tests."""
    from executorch.backends.vulkan.serialization import vulkan_graph_schema as S
    from executorch.backends.vulkan.serialization.vulkan_graph_serialize import (
        serialize_vulkan_graph,
    )

    def t(cid: int, dims: list[int]) -> S.VkValue:
        return S.VkValue(S.VkTensor(S.VkDataType.FLOAT32, dims, cid, -1))

    values = [
        t(-1, [2, 8]),                       # 0 x
        t(weight_constant_id, [8]),          # 1 rms weight
        S.VkValue(S.Double(float("-inf"))),  # 2
        t(-1, [2, 8]),                       # 3 rms out
        S.VkValue(S.IntList([8])),           # 4 normalized shape
        t(-1, [8]),                          # 5 layer-norm weight (runtime!)
        S.VkValue(S.Null()),                 # 6 bias None
        S.VkValue(S.ValueList([3, 3])),      # 7
        S.VkValue(S.String("s")),            # 8
        S.VkValue(S.BoolList([True, False])),  # 9
        S.VkValue(S.DoubleList([1.5, float("inf")])),  # 10
        S.VkValue(S.SymInt(3)), S.VkValue(S.Bool(True)), S.VkValue(S.Int(-7)),  # 11-13
    ]
    ln_bias = 6 if layer_norm_bias_none else 5
    chain = [S.OperatorCall(0, RMS, [0, 1, 2, 3]),
             S.OperatorCall(1, "aten.native_layer_norm.default", [3, 4, 5, ln_bias, 2, 7])]
    graph = S.VkGraph("0", chain, values, [0], [3], [], [])
    return serialize_vulkan_graph(graph, [("key0", constant_length)], [])


def test_decoder_round_trips_every_value_kind() -> None:
    p = decode_payload(_synthetic_payload(32, 0))
    g = p.graph
    assert [c.name for c in g.chain] == [RMS, "aten.native_layer_norm.default"]
    assert g.chain[0].args == (0, 1, 2, 3) and g.input_ids == (0,) and g.output_ids == (3,)
    kinds = [v.kind for v in g.values]
    assert kinds == ["VkTensor", "VkTensor", "Double", "VkTensor", "IntList", "VkTensor", "Null",
                     "ValueList", "String", "BoolList", "DoubleList", "SymInt", "Bool", "Int"]
    assert g.values[1].tensor is not None and g.values[1].tensor.dims == (8,)
    assert g.values[1].tensor.is_constant and g.values[1].tensor.nbytes == 32
    assert g.values[2].value == -math.inf and g.values[10].value == (1.5, math.inf)
    assert (g.values[4].value, g.values[7].value, g.values[8].value) == ((8,), (3, 3), "s")
    assert (g.values[9].value, g.values[11].value, g.values[12].value, g.values[13].value) == (
        (True, False), 3, True, -7)
    assert g.constants[0].in_named_data and g.constants[0].named_key == "key0"


def test_check_payload_findings() -> None:
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import check_payload

    ok = check_payload(_synthetic_payload(32, 0), named_sizes={"key0": 32})
    # the layer-norm weight (a runtime tensor) and its None bias: the runtime throws on both
    assert [(p.kind, p.op, p.arg_index, p.arg_name) for p in ok] == [
        ("not_constant", "aten.native_layer_norm.default", 2, "weight"),
        ("not_constant", "aten.native_layer_norm.default", 3, "bias")]
    bias = check_payload(_synthetic_payload(32, 0, layer_norm_bias_none=False))
    assert {(p.arg_name, p.value_id) for p in bias} == {("weight", 5), ("bias", 5)}
    not_const = check_payload(_synthetic_payload(32, -1))
    assert ("not_constant", RMS, 1, "weight", 1) in [
        (p.kind, p.op, p.arg_index, p.arg_name, p.value_id) for p in not_const]
    oversized = check_payload(_synthetic_payload(64, 0), named_sizes={"key0": 64})
    assert any(p.kind == "constant_size" and "64 bytes" in p.message for p in oversized)
    missing = check_payload(_synthetic_payload(32, 0), named_sizes={})
    assert any(p.kind == "missing_constant" for p in missing)
    bad_ref = check_payload(_synthetic_payload(32, 5))
    assert any(p.kind == "bad_reference" for p in bad_ref)
    assert [p.kind for p in check_payload(b"\0" * 8 + b"VH00")] == ["bad_payload"]
    assert check(_synthetic_payload(32, -1))  # bare payload bytes are accepted too


# ------------------------------------------------------------- install/uninstall


@pytest.fixture
def restore_install_state() -> Iterator[None]:
    was = vk.is_installed()
    yield
    if was:
        install()
    else:
        uninstall()


@pytest.mark.usefixtures("restore_install_state")
def test_install_is_idempotent_and_reversible() -> None:
    from fusionkit.backends.vulkan_adapter import constant_serializer

    uninstall()
    registry = _registry()
    entry = registry["rms_norm"]
    assert install().installed_here and "rms_norm" not in registry
    assert constant_serializer.is_installed()
    assert not install().installed_here and "rms_norm" not in registry
    uninstall()
    assert registry["rms_norm"] is entry and not constant_serializer.is_installed()
    uninstall()
    assert registry["rms_norm"] is entry
    with install() as inst:
        assert inst.installed_here and "rms_norm" not in registry
    assert registry["rms_norm"] is entry and not vk.is_installed()
    install()
    with install() as inst:  # already installed: the block leaves it installed
        assert not inst.installed_here
    assert vk.is_installed() and "rms_norm" not in registry


@pytest.mark.usefixtures("restore_install_state")
def test_install_refuses_untested_executorch(monkeypatch: pytest.MonkeyPatch) -> None:
    uninstall()
    monkeypatch.setattr(hooks, "installed_executorch_version", lambda: "9.9.9")
    with pytest.raises(vk.UnsupportedExecuTorchError, match=r"ExecuTorch 9\.9\.9 is not supported.*executorch>=1\.4,<1\.6"):
        install()
    assert "rms_norm" in _registry() and not vk.is_installed()
    with pytest.raises(vk.UnsupportedExecuTorchError):
        VulkanPartitioner().partition(torch.export.export(R.ParamWeight(), (torch.randn(2, R.D),)))


def test_partitioner_accepts_what_executorch_accepts() -> None:
    assert issubclass(VulkanPartitioner, StockVulkanPartitioner)
    assert inspect.signature(VulkanPartitioner) == inspect.signature(StockVulkanPartitioner)
    p = VulkanPartitioner({"texture_limits": (2048, 2048, 2048)}, operator_blocklist=[],
                          nn_module_blocklist=["x"])
    assert p.options["texture_limits"] == (2048, 2048, 2048)
    passes = transform_passes()
    # constant folding (lifted constants, then parameter-only prepacked arguments), fusion
    assert passes is not transform_passes() and len(passes) == 3


def test_fused_op_left_out_of_vulkan_is_an_error() -> None:
    from executorch.exir.dialects._ops import ops as exir_ops

    m, args = R.row_case(R.ROWS[0], torch.float32)
    part = VulkanPartitioner(operator_blocklist=[exir_ops.edge.et_vk.rms_norm.default])
    with pytest.raises(vk.FusedOpNotDelegatedError, match=r"et_vk\.rms_norm\.default.*not delegated"):
        to_edge_transform_and_lower(torch.export.export(m, args),
                                    transform_passes=transform_passes(), partitioner=[part])
