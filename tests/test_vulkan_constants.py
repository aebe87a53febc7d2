"""Vulkan constant serialization: decode the delegate payload and the .pte's named data.

One tiny program holding every case of a view constant (a weight that is a view into a
bigger tensor) as a separate constant is lowered with ExecuTorch's VulkanPartitioner
twice (stock 1.5.1, and with ``constant_serializer.install()``). The proof is by bytes:
for every VkTensor with a constant in the VkGraph, its ``VkBytes`` (named key, length)
is followed to the named data of the serialized .pte, and each source constant must be
found there byte for byte. Then both programs run: on the simulator and on ExecuTorch's
real Vulkan runtime (one child for the module, ``vulkan_runtime_oracle``; the simulator
alone without one). The fixed program's view constants are right; stock's outputs that
read a view constant are wrong. The conv's output is channels_last, and the runtime writes
a delegate's result into it in contiguous order (wrong on both, the simulator predicts
it, ``check()`` names it: tests/test_vulkan_real_runtime_dim_order.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
from executorch.backends.vulkan.serialization.vulkan_graph_serialize import extract_vk_flatbuffer
from executorch.exir import to_edge_transform_and_lower
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.lowered_backend_module import get_lowered_submodules
from executorch.exir.passes.constant_prop_pass import constant_prop_pass
from vulkan_runtime_oracle import run_real, session

from fusionkit.backends.vulkan_adapter import constant_serializer as vcs
from fusionkit.integration import hooks
from fusionkit.integration.spilled_data import blob_bytes
from fusionkit.integration.tensor_bytes import tensor_bytes

pytestmark = pytest.mark.slow

real_vulkan = session()  # the real runtime, one child for the module (simulator-only without)

#: the MHA's softmax (torch's safe softmax) emits aten.logical_not, which the public
#: runtime lacks (docs/vulkan-runtime.md, the probe): with it delegated, both programs
#: are refused at load. On the CPU it changes nothing this file is about.
KEPT_OFF = [exir_ops.edge.aten.logical_not.default]


class AllCases(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        base = torch.randn(4, 8, 8)  # one storage, several views used by different ops
        self.register_buffer("offset", base[1])  # view at a non-zero offset
        self.register_buffer("offset0", base[0])  # view at offset 0
        self.register_buffer("transposed", base[2].t())  # transposed view at an offset
        self.register_buffer("bias_view", base[3][5])  # 1-d view, different op (bias)
        cl = torch.randn(8, 4, 3, 3).contiguous(memory_format=torch.channels_last)
        self.register_buffer("cl_conv", cl[4:])  # channels_last slice of a bigger tensor
        self.register_buffer("fp16", torch.randn(4, 8).half()[1:3])  # fp16 view at an offset
        self.mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)  # cross-attention
        with torch.no_grad():
            self.mha.in_proj_bias.normal_()  # non-zero, so each bias chunk is distinguishable

    def forward(self, x: torch.Tensor, img: torch.Tensor, kv: torch.Tensor) -> Any:
        y = F.linear(x, self.offset) + F.linear(x, self.offset0, self.bias_view)
        y = y + F.linear(x, self.transposed)
        z = F.conv2d(img, self.cl_conv)
        h = F.linear(x.half(), self.fp16)
        a = self.mha(x.unsqueeze(0), kv, kv, need_weights=False)[0]
        return y, z, h, a


#: forward's outputs, and whether stock's program computes each with the wrong bytes
OUTPUTS = {"y": True, "z": False, "h": True, "a": True}  # z: cl_conv, which stock copies
CASES = ("offset", "offset0", "transposed", "bias_view", "cl_conv", "fp16")


def _constant_tensors(fb: bytes) -> list[tuple[list[int], int, str]]:
    """(dims, length, named_key) of every VkTensor that has a constant, read straight from
    the VkGraph flatbuffer (schema.fbs); executorch's flatc-JSON route chokes on the
    -inf of an attention mask."""
    import flatbuffers
    from flatbuffers import number_types as N
    from flatbuffers.table import Table

    buf = bytearray(fb)
    assert bytes(buf[4:8]) == b"VK00"
    root = Table(buf, flatbuffers.encode.Get(N.UOffsetTFlags.packer_type, buf, 0))

    def field(tab: Table, i: int) -> int:
        return int(tab.Offset(4 + 2 * i))

    def tables(tab: Table, i: int) -> list[Table]:
        o = field(tab, i)
        if not o:
            return []
        start, n = tab.Vector(o), tab.VectorLen(o)
        return [Table(tab.Bytes, tab.Indirect(start + 4 * k)) for k in range(n)]

    def scalar(tab: Table, i: int, flags: Any, default: int) -> int:
        o = field(tab, i)
        return int(tab.Get(flags, tab.Pos + o)) if o else default

    constants = []
    for b in tables(root, 5):  # VkGraph.constants: [VkBytes]
        o = field(b, 2)
        constants.append((scalar(b, 1, N.Uint64Flags, 0), b.String(b.Pos + o).decode() if o else ""))
    out = []
    for v in tables(root, 2):  # VkGraph.values: [VkValue]
        if scalar(v, 0, N.Uint8Flags, 0) != 5:  # union type VkTensor
            continue
        t = Table(v.Bytes, 0)
        v.Union(t, field(v, 1))
        cid = scalar(t, 2, N.Int32Flags, -1)
        if cid < 0:
            continue
        o = field(t, 1)
        start, n = t.Vector(o), t.VectorLen(o)
        dims = [int(t.Get(N.Uint32Flags, start + 4 * k)) for k in range(n)]
        length, key = constants[cid]
        out.append((dims, length, key))
    return out


@dataclass
class VkConstants:
    blobs: list[bytes]  # one per VkGraph constant referenced by a VkTensor, from the .pte
    dims: list[list[int]]
    pte_size: int
    folded: dict[str, torch.Tensor]
    program: Any  # the ExecutorchProgramManager: the simulator's and the runtime's input


def _lower(model: AllCases, inputs: tuple[torch.Tensor, ...]) -> VkConstants:
    ep = constant_prop_pass(torch.export.export(model, inputs))  # folds the in_proj chunks
    folded = {k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor) and v._base is not None}
    epm = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner(
        operator_blocklist=list(KEPT_OFF))])
    et = epm.to_executorch()
    named = deserialize_pte_binary(bytes(et.buffer)).named_data
    assert named is not None
    blobs, dims = [], []
    for _, lbm, _ in get_lowered_submodules(epm.exported_program().graph_module):
        assert lbm.backend_id == "VulkanBackend"
        for tdims, length, key in _constant_tensors(extract_vk_flatbuffer(lbm.processed_bytes)):
            blob = blob_bytes(named.buffers[named.pte_data[key].buffer_index])
            assert hashlib.sha256(blob).hexdigest() == key
            assert len(blob) == length
            blobs.append(blob)
            dims.append(tdims)
    return VkConstants(blobs, dims, len(et.buffer), folded, et)


@pytest.fixture(scope="module")
def lowered() -> Any:
    import executorch.backends.vulkan.patterns as vk_patterns

    model = AllCases().eval()
    inputs = (torch.randn(2, 8), torch.randn(1, 4, 6, 6), torch.randn(1, 5, 8))
    with torch.no_grad():
        eager = model(*inputs)
    # Speed only: the Vulkan partitioner and preprocess each re-export the (constant) rope
    # pattern graphs, ~80% of a lowering here; build them once for the module.
    graphs = vk_patterns.all_fusable_graph_patterns()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vk_patterns, "all_fusable_graph_patterns", lambda: graphs)
        vcs.uninstall()
        stock = _lower(model, inputs)
        with vcs.install():
            fixed = _lower(model, inputs)
    yield {"model": model, "inputs": inputs, "eager": eager, "stock": stock, "fixed": fixed}


@pytest.mark.parametrize("name", CASES)
def test_each_constant_is_exactly_its_source(lowered: dict[str, Any], name: str) -> None:
    src = getattr(lowered["model"], name)
    expected = tensor_bytes(src)
    fixed: VkConstants = lowered["fixed"]
    assert expected in fixed.blobs, f"{name}: exact bytes not in the Vulkan named data"
    stock: VkConstants = lowered["stock"]
    # stock 1.5.1 writes the parent storage from byte 0 for a contiguous view; it is right
    # only where it copied first (transposed: contiguous(), channels_last: contiguous())
    stock_right = expected in stock.blobs
    assert stock_right == (name in ("transposed", "cl_conv")), name
    if not stock_right:
        assert bytes(src.untyped_storage()) in stock.blobs  # the whole parent instead


def test_mha_in_proj_chunks_after_folding(lowered: dict[str, Any]) -> None:
    fixed: VkConstants = lowered["fixed"]
    stock: VkConstants = lowered["stock"]
    chunks = [t for t in fixed.folded.values() if t.storage_offset() != 0]
    assert chunks, "constant folding should leave in_proj chunks as views at an offset"
    used = [t for t in fixed.folded.values() if tensor_bytes(t) in fixed.blobs]
    assert any(t.storage_offset() != 0 for t in used), "no offset chunk reached the delegate"
    for t in used:
        if t.storage_offset() != 0:  # stock writes the parent in_proj from byte 0 instead
            assert tensor_bytes(t) not in stock.blobs
            assert bytes(t.untyped_storage()) in stock.blobs


def _wrong_outputs(got: Any, eager: Any) -> set[str]:
    """The names of the outputs that differ from eager (fp16's tolerance for ``h``)."""
    wrong = set()
    for name, g, w in zip(OUTPUTS, got, eager, strict=True):
        tol = 2e-2 if w.dtype == torch.float16 else 1e-4
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, g.dtype)
        if not torch.allclose(g.float(), w.float(), atol=tol, rtol=tol):
            wrong.add(name)
    return wrong


@pytest.fixture(scope="module")
def real_runs(lowered: dict[str, Any], real_vulkan: Any) -> dict[str, list[Any]] | None:
    """Both programs' outputs on the real runtime (None without one); a refusal fails."""
    if real_vulkan is None:
        return None
    return {path: run_real(real_vulkan, lowered[path].program, lowered["inputs"]) or []
            for path in ("fixed", "stock")}


def _dim_order_problems(program: Any) -> list[Any]:
    from fusionkit.backends.vulkan_adapter import check

    return [p for p in check(program) if p.kind == "runtime_condition"]


def test_fixed_equals_eager_and_stock_reads_the_wrong_bytes(lowered: dict[str, Any],
                                                            real_runs: Any) -> None:
    """What the bytes mean when the program runs: on the simulator, and on the real runtime.
    ``z`` (the channels_last conv output) is wrong on both for both programs: it is
    test_channels_last_conv_output_is_predicted's."""
    from fusionkit.backends.vulkan_adapter import check, simulate

    inputs, eager = lowered["inputs"], lowered["eager"]
    fixed: VkConstants = lowered["fixed"]
    stock: VkConstants = lowered["stock"]
    stock_wrong = {name for name, wrong in OUTPUTS.items() if wrong}
    assert {p.kind for p in check(fixed.program)} == {"runtime_condition"}  # z's dim order
    assert {p.kind for p in check(stock.program)} == {"constant_size", "runtime_condition"}
    sims = {"fixed": simulate(fixed.program, *inputs), "stock": simulate(stock.program, *inputs)}
    assert _wrong_outputs(sims["fixed"], eager) == {"z"}
    assert _wrong_outputs(sims["stock"], eager) == stock_wrong | {"z"}
    if real_runs is not None:
        for path in ("fixed", "stock"):  # the simulator predicts every output
            assert _wrong_outputs(real_runs[path], eager) == _wrong_outputs(sims[path], eager)
            for name, g, w in zip(OUTPUTS, real_runs[path], sims[path], strict=True):
                tol = 2e-2 if w.dtype == torch.float16 else 1e-4
                torch.testing.assert_close(g, w, atol=tol, rtol=tol,
                                           msg=lambda m, n=f"{path} {name}": f"{n}: {m}")


def test_channels_last_conv_output_is_predicted(lowered: dict[str, Any],
                                                real_runs: Any) -> None:
    """``z`` (conv with a channels_last weight) is channels_last, as in eager, so the
    program's output has dim order (0, 2, 3, 1). Found here: the real runtime writes the
    delegate's result into it in contiguous order, stock's and the fixed program's alike
    (the weight's bytes are right in both). The simulator computes the same, and check()
    names that delegate output and its dim order."""
    from fusionkit.backends.vulkan_adapter import simulate

    z = lowered["eager"][1]
    assert z.is_contiguous(memory_format=torch.channels_last) and not z.is_contiguous()
    for path in ("fixed", "stock"):
        program = lowered[path].program
        problems = _dim_order_problems(program)
        assert len(problems) == 1, [str(p) for p in problems]
        p = problems[0]
        assert p.op == "executorch_call_delegate" and p.arg_name is not None
        assert p.arg_name.startswith("output ")
        assert f"({list(z.shape)}) has dim order (0, 2, 3, 1)" in p.message, p.message
        got = [simulate(program, *lowered["inputs"])[1]]
        if real_runs is not None:
            got.append(real_runs[path][1])
        for g in got:  # exactly this: the output's memory holds eager's NCHW data
            assert not torch.allclose(g, z, atol=1e-4, rtol=1e-4), path
            memory = g.permute(0, 2, 3, 1).flatten()
            assert torch.allclose(memory, z.contiguous().flatten(), atol=1e-4, rtol=1e-4), path


def test_no_constant_carries_extra_bytes(lowered: dict[str, Any]) -> None:
    fixed: VkConstants = lowered["fixed"]
    stock: VkConstants = lowered["stock"]
    def too_long(c: VkConstants) -> int:
        n = 0
        for blob, dims in zip(c.blobs, c.dims, strict=True):
            numel = 1
            for d in dims:
                numel *= d
            n += len(blob) not in (numel * 2, numel * 4)  # fp16 / fp32 constants only here
        return n

    assert too_long(fixed) == 0
    assert too_long(stock) >= 5  # offset, offset0, bias_view, fp16, in_proj chunks


def test_install_uninstall_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    from executorch.backends.vulkan.serialization import vulkan_graph_builder as vgb
    from executorch.backends.vulkan.serialization import vulkan_graph_serialize as vgs
    from executorch.exir._serialize import _named_data_store as nds

    vcs.uninstall()
    before = (
        vgb.VkGraphBuilder.__dict__["maybe_add_constant_tensor"],
        vgs.__dict__["serialize_constant_tensors"],
        nds.__dict__["_tensor_to_bytes"],
    )
    assert vcs.install().installed_here
    assert not vcs.install().installed_here
    assert vgb.VkGraphBuilder.__dict__["maybe_add_constant_tensor"] is vcs.maybe_add_constant_tensor
    assert vgs.__dict__["serialize_constant_tensors"] is vcs.serialize_constant_tensors
    vcs.uninstall()
    vcs.uninstall()
    after = (
        vgb.VkGraphBuilder.__dict__["maybe_add_constant_tensor"],
        vgs.__dict__["serialize_constant_tensors"],
        nds.__dict__["_tensor_to_bytes"],
    )
    assert all(a is b for a, b in zip(before, after, strict=True))
    monkeypatch.setattr(hooks, "installed_executorch_version", lambda: "1.3.1")
    with pytest.raises(vcs.UnsupportedExecuTorchError, match=r"1\.3\.1.*1\.5\.1"):
        vcs.install()
    assert not vcs.is_installed()


def test_legacy_raw_tensor_constants_are_exact() -> None:
    from executorch.backends.vulkan.serialization.vulkan_graph_schema import VkGraph

    base = torch.randn(3, 4)
    g = VkGraph(version="0", chain=[], values=[], input_ids=[], output_ids=[], constants=[], shaders=[])
    raw = bytearray()
    vcs.serialize_constant_tensors(g, [base[1], None], raw)
    assert bytes(raw[: g.constants[0].length]) == tensor_bytes(base[1])
    assert g.constants[0].length == 16
