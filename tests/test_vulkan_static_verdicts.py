"""One verdict with or without a Vulkan runtime installed (issue 45, item 3).

What fusionkit knows without a probe -- the runtime conditions, the arguments the runtime
prepacks, the shader variants the wheel's templates generate and the ops whose shaders the
wheel lacks (:mod:`fusionkit.backends.vulkan_adapter.wheel_inventory`) -- steers the
partitioner alike with and without a runtime; the probe only adds facts. Each known-refused
case below is partitioned the same both ways:

* a batch norm on a rank-3 input (``BatchNorm only support 4d tensor``);
* weight-only linears whose preprocess fusion is declined (int8 with non-zero zero points,
  int4 with N % 8 != 0), leaving a ``dequantize_per_channel`` the runtime lacks;
* an int32 ``eq`` (no ``binary_eq_texture3d_int32`` shader);
* two vision models that stock and fusionkit both lowered to programs the runtime refuses
  or miscomputes, from two runtime conditions found here: a SigLIP-style patch embedding
  (``padding='valid'`` exports a 2-D conv with one padding entry: ``make_ivec2: (ints.size()
  == 2) is false``) and ConvNeXt V2's depthwise 7x7 conv (the generic ``conv2d_dw`` shader
  is wrong with a padding along the width).

With a runtime present, every program of fusionkit's runs on it equal to eager, stock's
vision programs fail as ``check()`` and the simulator say; ``check()`` and ``simulate()``
name the missing shader of a stock int32 ``eq`` program from the wheel alone.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, unload
from fusionkit.backends.vulkan_adapter.wheel_inventory import (
    OP_SHADER_STEMS,
    InferredInventory,
    wheel_inventory,
)

pytest.importorskip("torchao")
pytestmark = pytest.mark.usefixtures("vulkan_ops")


# ------------------------------------------------------------------------------ models


class BatchNorm3d(nn.Module):
    """A BatchNorm1d over (N, C, L): a rank-3 batch norm no conv absorbs."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(x * 1.5)) - 0.25


class Compare(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (torch.eq(a, b).to(torch.float32) + 1.0) * (a.to(torch.float32) - 0.5)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(a.transpose(1, 2).reshape(b, n, d))  # type: ignore[no-any-return]


class SigLIPTower(nn.Module):
    """SigLIP's vision tower in small: a 'valid' patch-embedding conv, learned positions,
    one pre-norm encoder layer (attention, tanh-GELU MLP), a post layer norm."""

    def __init__(self, d: int = 32, patch: int = 4, image: int = 16, heads: int = 4) -> None:
        super().__init__()
        n = (image // patch) ** 2
        self.patch = nn.Conv2d(3, d, patch, stride=patch, padding="valid")
        self.pos = nn.Embedding(n, d)
        self.register_buffer("ids", torch.arange(n)[None], persistent=False)
        self.ln1, self.ln2, self.post = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos(self.ids)
        x = x + self.attn(self.ln1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return self.post(x)  # type: ignore[no-any-return]


class GRN(nn.Module):
    """ConvNeXt V2's global response normalization (channels last)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.randn(1, 1, 1, d) * 0.5)
        self.beta = nn.Parameter(torch.randn(1, 1, 1, d) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * nx) + self.beta + x


class ConvNeXtV2(nn.Module):
    """A patchify stem and one ConvNeXt V2 block: depthwise 7x7, channels-last layer norm,
    pointwise linears around GELU and GRN, a residual; a mean-pooled linear head."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, d, 4, stride=4)
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.ln = nn.LayerNorm(d, eps=1e-6)
        self.pw1, self.grn, self.pw2 = nn.Linear(d, 4 * d), GRN(4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = self.ln(self.dw(x).permute(0, 2, 3, 1))
        y = self.pw2(self.grn(F.gelu(self.pw1(y))))
        x = x + y.permute(0, 3, 1, 2)
        return self.head(x.mean((-2, -1)))  # type: ignore[no-any-return]


@dataclass
class Case:
    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    #: the fact the partitioner keeps a node off for, and a substring of that node's name
    fact: str
    node: str
    #: way -> (pte, partitioner, ExecutorchProgramManager)
    low: dict[str, tuple[bytes, Any, Any]] = field(default_factory=dict)
    real: dict[str, rt.RunResult] = field(default_factory=dict)


def _cases() -> list[Case]:
    from test_vulkan_preprocess_quantized_rules import HandQuantizedLinear
    from test_vulkan_real_runtime_partitioner import Int4Linear, _int4

    g = torch.Generator().manual_seed(45)
    torch.manual_seed(45)
    bn = BatchNorm3d().eval()
    with torch.no_grad():
        bn.bn.running_mean.uniform_(-1, 1, generator=g)
        bn.bn.running_var.uniform_(0.5, 2, generator=g)
    x4 = (torch.randn(6, 16, generator=g),)
    a = torch.randint(0, 3, (3, 5, 4), generator=g, dtype=torch.int32)
    b = torch.randint(0, 3, (3, 5, 4), generator=g, dtype=torch.int32)
    return [
        Case("batch norm rank 3", bn, (torch.randn(2, 6, 5, generator=g),),
             "runtime_condition", "batch_norm"),
        Case("int8 weight-only linear, zero points 3", HandQuantizedLinear(zeros=3).eval(),
             (torch.randn(4, 8, generator=g),), "missing_operator", "dequantize_per_channel"),
        Case("int4 weight-only linear N=12", _int4(Int4Linear(16, 12), x4), x4,
             "missing_operator", "dequantize_per_channel"),
        Case("int32 eq", Compare(), (a, b), "missing_shader", "eq"),
        Case("SigLIP-style tower", SigLIPTower().eval(), (torch.randn(1, 3, 16, 16, generator=g),),
             "runtime_condition", "convolution"),
        Case("ConvNeXt V2-style net", ConvNeXtV2().eval(),
             (torch.randn(1, 3, 16, 16, generator=g),), "runtime_condition", "convolution"),
    ]


def _lower(case: Case, stock: bool = False) -> tuple[bytes, Any, Any]:
    from executorch.exir import to_edge_transform_and_lower
    from vulkan_real_programs import pattern_graphs_once, stock_partitioner

    ep = torch.export.export(case.model, case.inputs)
    with pattern_graphs_once():
        if stock:
            vk.uninstall()
            part = stock_partitioner()
            edge = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[part])
        else:
            part = vk.VulkanPartitioner()  # runtime="auto": the installed one, if any
            edge = to_edge_transform_and_lower(
                copy.deepcopy(ep), transform_passes=vk.transform_passes(partitioner=part),
                partitioner=[part])
    et = edge.to_executorch()
    return bytes(et.buffer), part, et


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Case]]:
    from vulkan_runtime_oracle import adapter_state_restored, required

    out = _cases()
    installed = rt.find_runtime() is not None
    if required() and not installed:
        pytest.fail("no real Vulkan runtime (FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1 / CI)")
    with adapter_state_restored():
        for case in out:
            case.low["installed"] = _lower(case)
        with pytest.MonkeyPatch.context() as mp:  # a machine with no runtime installed
            mp.setenv("FUSIONKIT_CACHE", str(tmp_path_factory.mktemp("no-runtime")))
            mp.delenv(rt.RUNTIME_ENV, raising=False)
            assert rt.find_runtime() is None
            for case in out:
                case.low["none"] = _lower(case)
        for case in out[3:]:  # the int32 eq and the vision models, as stock lowers them
            case.low["stock"] = _lower(case, stock=True)
    if installed:
        todo = [(c, way) for c in out for way in c.low]
        results = rt.run_many_in_child(
            [rt.Job(c.low[way][0], list(c.inputs)) for c, way in todo], timeout=300)
        for (c, way), res in zip(todo, results, strict=True):
            c.real[way] = res
    yield out


def _kept(part: Any) -> set[tuple[str, str]]:
    return {(k.node, k.fact) for k in part.kept_off_nodes}


def _probe_only(part: Any) -> set[tuple[str, str]]:
    """What only a probe can tell (:mod:`.wheel_inventory`: not inferable from the wheel)."""
    inferred = wheel_inventory()
    return {(k.node, k.fact) for k in part.kept_off_nodes
            if k.fact == "missing_operator" and inferred.has_operator(k.op)}


def _eager(case: Case) -> list[torch.Tensor]:
    with torch.no_grad():
        return pytree.tree_leaves(case.model(*case.inputs))  # type: ignore[no-any-return]


def _err(got: list[torch.Tensor], case: Case) -> float:
    return max(float((g.double() - w.double()).abs().max())
               for g, w in zip(got, _eager(case), strict=True))


def test_each_known_refused_case_is_partitioned_alike_with_and_without_a_runtime(
        cases: list[Case]) -> None:
    for case in cases:
        with_rt, without = case.low["installed"][1], case.low["none"][1]
        assert isinstance(without.runtime, InferredInventory)
        facts = [k for k in without.kept_off_nodes
                 if k.fact == case.fact and case.node in k.node]
        assert facts, (case.name, [str(k) for k in without.kept_off_nodes])
        assert "wheel implies" in facts[0].reason, facts[0]
        # the same nodes kept off for the same facts: the probe adds nothing here (the
        # SDPA mask's aten.logical_not is missing by the registered-operator list too)
        assert _probe_only(with_rt) == set(), (case.name, sorted(_probe_only(with_rt)))
        assert _kept(with_rt) == _kept(without), (
            case.name, sorted(_kept(with_rt)), sorted(_kept(without)))
        assert case.low["installed"][0] == case.low["none"][0], case.name


def test_every_program_of_fusionkit_runs_equal_to_eager_on_the_runtime(
        cases: list[Case]) -> None:
    if not cases[0].real:
        pytest.skip("no real Vulkan runtime")
    bad = []
    for case in cases:
        for way in ("installed", "none"):
            res = case.real[way]
            if not res.ok or _err(res.outputs or [], case) > 1e-4:
                bad.append(f"{case.name} [{way}]: {res.status} {res.message or ''} "
                           f"{_err(res.outputs, case) if res.ok and res.outputs else ''}")
    assert not bad, bad


def test_stock_fails_on_the_vision_models_as_check_and_the_simulator_say(
        cases: list[Case]) -> None:
    by = {c.name.split("-")[0]: c for c in cases}
    siglip, convnext = by["SigLIP"], by["ConvNeXt V2"]
    for case, condition in ((siglip, "conv2d_padding_2"), (convnext, "depthwise_width_padding_0")):
        pte, _, et = case.low["stock"]
        problems = [p for p in vk.check(pte, runtime=None) if p.op == "aten.convolution.default"]
        assert [p.kind for p in problems] == ["runtime_condition"], [str(p) for p in problems]
        try:
            vk.simulate(et, *case.inputs, runtime=None)
            raised: Any = None
        except SimulationError as e:
            raised = e
        finally:
            unload(et)
        assert raised is not None and raised.condition.name == condition, raised
        # fusionkit keeps that conv on the CPU, with the condition in its reason
        kept = [k for k in case.low["none"][1].kept_off_nodes if condition in k.reason]
        assert kept and kept[0].op == "aten.convolution.default", kept
    if not siglip.real:
        return
    msg = siglip.real["stock"].message or ""
    assert not siglip.real["stock"].ok and "(ints.size() == 2) is false" in msg, msg
    res = convnext.real["stock"]
    assert res.ok and _err(res.outputs or [], convnext) > 0.01, res.message


def test_check_and_the_simulator_name_the_missing_shader_without_a_runtime(
        cases: list[Case]) -> None:
    case = next(c for c in cases if c.name == "int32 eq")
    pte, _, et = case.low["stock"]
    # stock's partitioner gives this eq buffer storage: the name BinaryOp.cpp composes then
    # is binary_eq_buffer_int32 (binary_eq_texture3d_int32 on texture): neither exists
    name = r"binary_eq_(texture3d|buffer)_int32"
    for runtime in (None, "auto"):
        problems = [p for p in vk.check(pte, runtime=runtime) if p.kind == "missing_shader"]
        assert problems and re.search(name, problems[0].message), problems
        with pytest.raises(SimulationError, match=name):
            try:
                vk.simulate(et, *case.inputs, runtime=runtime)
            finally:
                unload(et)
    if case.real:
        res = case.real["stock"]
        assert not res.ok and re.search(name, res.message or ""), res.message


def test_what_the_wheel_implies_agrees_with_the_probe(probed: Any) -> None:
    """The inferred operators -- every operator the probe asks about -- and the binary
    shader names equal the probed runtime's."""
    inferred = wheel_inventory()
    asked = sorted(set(probed.operators) | set(OP_SHADER_STEMS))
    assert len(asked) > 150
    assert {op: inferred.has_operator(op) for op in asked} == {
        op: probed.has_operator(op) for op in asked}
    binary = {s for s in probed.shaders if s.startswith("binary_")}
    assert binary and binary == {s for s in inferred.shaders if s.startswith("binary_")}


def test_the_wheel_inventory_is_cheap_and_needs_no_runtime(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from fusionkit.backends.vulkan_adapter.wheel_inventory import effective_inventory

    monkeypatch.setenv("FUSIONKIT_CACHE", str(tmp_path))
    monkeypatch.delenv(rt.RUNTIME_ENV, raising=False)
    inv = effective_inventory("auto")
    assert inv is wheel_inventory() and effective_inventory(None) is inv
    assert not inv.has_operator("quantized_decomposed.dequantize_per_channel.default")
    assert inv.has_operator("aten.add.Tensor")
    # the Python registry takes them; the runtime's C++ registers no such name
    for op in ("aten.logical_not.default", "aten.t_copy.default",
               "dim_order_ops._clone_dim_order.default"):
        assert not inv.has_operator(op), op
    assert "binary_eq_int32_texture3d" in inv.shaders
    assert "binary_eq_texture3d_int32" not in inv.shaders


def test_the_registered_operators_are_read_from_the_runtime_sources(tmp_path: Path) -> None:
    """The reader takes every ``VK_REGISTER_OP`` name, over line breaks, and nothing else;
    the list kept for the installed wheel names the runtime's source commit."""
    from importlib.metadata import version

    from fusionkit.backends.vulkan_adapter import registered_operators as ro

    impl = tmp_path / "backends/vulkan/runtime/graph/ops/impl"
    impl.mkdir(parents=True)
    (impl / "A.cpp").write_text("REGISTER_OPERATORS {\n  VK_REGISTER_OP(aten.add.Tensor, add);\n"
                                "  VK_REGISTER_OP(\n      et_vk.rms_norm.default,\n      rms);\n"
                                "  // aten.logical_not.default is not registered\n}\n")
    (impl / "B.h").write_text("VK_REGISTER_OP(aten.t_copy.default, t);\n")  # not a .cpp
    assert ro.operators_registered_in(tmp_path) == {"aten.add.Tensor", "et_vk.rms_norm.default"}
    kept = ro.registered_operators(version("executorch"))
    if kept is None:
        pytest.skip(f"no list kept for executorch {version('executorch')}")
    assert {"aten.convolution.default", "et_vk.rms_norm.default"} <= kept
    assert "aten.logical_not.default" not in kept
    assert re.fullmatch(r"[0-9a-f]{40}", ro.source_commit(version("executorch")) or "")


def test_each_executorch_series_reads_its_own_registered_operators() -> None:
    """The lists kept for 1.4.1 and 1.5.1 (read from the v1.4.1 tag and the 1.5.1 runtime's
    source commit): every name well formed, 1.5.1's a superset of 1.4.1's by the seven
    operators 1.5 registered; a 1.4.x wheel takes the 1.4 list, not 1.5.1's and not "every
    operator present"; a series with no list kept infers nothing."""
    from fusionkit.backends.vulkan_adapter import registered_operators as ro

    old, new = ro.registered_operators("1.4.1"), ro.registered_operators("1.5.1")
    assert old is not None and new is not None
    for name in old | new:
        # namespace.op.overload, op.overload (et_vk's own) or a bare symbolic op (add, mul)
        assert re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*){0,2}", name), name
    assert new - old == {"aten.ge.Scalar", "aten.gt.Scalar", "aten.le.Scalar",
                         "aten.lt.Scalar", "aten.ne.Scalar", "aten.log10.default",
                         "aten.unfold_copy.default"}
    assert not old - new
    assert ro.source_commit("1.4.1") == "e4d02f41f7909e8ed5bf4a14ffc520d733453d9f"
    for v in ("1.4.0", "1.4.1", "1.4.2+cpu"):
        assert ro.kept_version(v) == "1.4.1" and ro.registered_operators(v) == old
    assert ro.kept_version("1.5.1+cpu") == "1.5.1"
    assert ro.registered_operators("1.3.0") is None
    assert ro.registered_operators("not a version") is None
