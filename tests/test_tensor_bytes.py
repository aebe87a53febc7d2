"""fusionkit.integration.tensor_bytes: the exact bytes of a tensor itself, for every serialized dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusionkit.integration.tensor_bytes import (
    acquire_named_data_fix,
    layout_bytes,
    named_data_fix_installed,
    owns_storage_exactly,
    pack_int4,
    release_named_data_fix,
    tensor_bytes,
)

DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32,
]


def _reference(t: torch.Tensor) -> bytes:
    """Bytes of a fresh compact copy (owns its storage): the ground truth."""
    c = t.detach().clone(memory_format=torch.contiguous_format)
    assert owns_storage_exactly(c)
    return bytes(c.untyped_storage())


def _parent(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 8, 8, generator=g) * 5).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_views_give_their_own_bytes(dtype: torch.dtype) -> None:
    p = _parent(dtype)
    for view in (p[1], p[0], p[2].t(), p[:, 3, 1:5], p[1, ::2], p[2, 5]):
        got = tensor_bytes(view)
        assert len(got) == view.numel() * view.element_size()
        assert got == _reference(view)
    if dtype != torch.bool:  # the first 8x8 block of the parent is a different tensor
        assert tensor_bytes(p[1]) != bytes(p.untyped_storage())[: 8 * 8 * p.element_size()]


def test_dim_order_gives_nhwc() -> None:
    w = torch.randn(8, 4, 3, 3)[4:]
    assert tensor_bytes(w, dim_order=(0, 2, 3, 1)) == _reference(w.permute(0, 2, 3, 1))
    with pytest.raises(ValueError):
        tensor_bytes(w, dim_order=(0, 1, 1, 2))


def test_empty_fake_and_special_tensors() -> None:
    assert tensor_bytes(torch.empty(0, 4)) == b""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(2))
    with pytest.raises(ValueError, match="fake"):
        tensor_bytes(fake)
    p = torch.nn.Parameter(torch.randn(4, 4))[1]
    assert tensor_bytes(p) == _reference(p)
    c = torch.randn(2, 3, dtype=torch.complex64).conj()
    assert tensor_bytes(c) == _reference(c.resolve_conj())


def test_layout_bytes_channels_last_slice() -> None:
    cl = torch.randn(2, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    view = cl[1:]
    assert view.storage_offset() == 12
    got = layout_bytes(view)
    assert len(got) == 48
    assert got == _reference(view.permute(0, 2, 3, 1))  # its own dim order, only its elements
    assert layout_bytes(cl) == bytes(cl.untyped_storage())  # dense CL owning storage: unchanged


def _stock_qc4w(t: torch.Tensor) -> torch.Tensor:
    from executorch.backends.xnnpack.operators.node_visitor import NodeVisitor

    from fusionkit.backends.xnnpack_adapter import serializer

    if serializer.SERIALIZER_PATCHES.is_installed():
        pytest.skip("stock convert_to_qc4w is patched right now")
    return NodeVisitor.convert_to_qc4w(t)


@pytest.mark.parametrize("cols", [8, 7])
def test_pack_int4_matches_backends(cols: int) -> None:
    from executorch.backends.vulkan._passes.fuse_quantized_ops import (
        pack_4bit_weight_tensor as vk_pass_pack,  # high nibble first
    )
    from executorch.backends.vulkan.patterns.weight_packing_utils import (
        pack_4bit_weight_tensor as vk_pattern_pack,  # low nibble first, even columns
    )

    g = torch.Generator().manual_seed(1)
    parent = torch.randint(-8, 8, (3, 4, cols), generator=g, dtype=torch.int8)
    q = parent[1]  # a view at an offset
    assert torch.equal(pack_int4(q), _stock_qc4w(q.clone()))
    assert torch.equal(pack_int4(q, low_nibble_first=False), vk_pass_pack(q.clone()))
    if cols % 2 == 0:
        assert torch.equal(pack_int4(q), vk_pattern_pack(q.clone()))
    assert pack_int4(q).shape == (4, (cols + 1) // 2)
    # transposed input: packed in logical order
    qt = parent[2].t().contiguous().t()
    assert torch.equal(pack_int4(qt), _stock_qc4w(parent[2].clone()))
    with pytest.raises(ValueError):
        pack_int4(torch.full((2, 2), 9, dtype=torch.int8))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 12),
       dtype=st.sampled_from([torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                              torch.float32]),
       seed=st.integers(0, 2**16))
def test_pack_int4_equals_stock_and_leaves_its_input(rows: int, cols: int, dtype: torch.dtype,
                                                     seed: int) -> None:
    """Any integer dtype (or float holding ints) of [-8, 7]: the stock packing's bytes, the
    input unchanged (the packing works in place on its own copy)."""
    g = torch.Generator().manual_seed(seed)
    lo = 0 if dtype == torch.uint8 else -8
    t = torch.randint(lo, 8, (rows, cols), generator=g).to(dtype)
    before = t.clone()
    got = pack_int4(t)
    assert torch.equal(t, before)
    assert got.dtype == torch.uint8 and got.is_contiguous()
    assert torch.equal(got, _stock_qc4w(t.to(torch.int8).clone()))


def test_pack_int4_temporaries_are_its_input_and_a_half() -> None:
    """Packing a weight needs its bytes and a half at most: its uint8 copy (changed in place)
    and the packed half. (int16 intermediates took 4x: +296 MiB at a Qwen3-0.6B output
    projection, above stock's 2x.) Blocks above glibc's largest dynamic mmap threshold
    (32 MiB) are mapped and unmapped, so the peak RSS is what is live."""
    import re

    def status(key: str) -> float:
        with open("/proc/self/status") as f:
            return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1)) / 1024  # type: ignore[union-attr]

    t = torch.randint(-8, 8, (3 * 2**15, 2**10), dtype=torch.int8)  # 96 MiB
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak to the current RSS
    except OSError:
        pytest.skip("no /proc/self/clear_refs: the peak RSS cannot be reset")
    base = status("VmRSS")
    packed = pack_int4(t)
    above = status("VmHWM") - base
    assert packed.numel() == t.numel() // 2
    assert above <= 1.6 * 96, f"{above:.0f} MiB of temporaries for a 96 MiB weight"


def test_named_data_store_fix_is_refcounted_and_exact() -> None:
    from executorch.exir._serialize import _named_data_store as nds

    original = nds.__dict__["_tensor_to_bytes"]
    cl = torch.randn(2, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    stock_store = nds.NamedDataStore()
    stock_store.add_named_data("k", cl[1:])
    out = stock_store.get_named_data_store_output()
    assert len(out.buffers[out.pte_data["k"].buffer_index]) == 96  # 1.5.1: whole storage
    was = named_data_fix_installed()
    acquire_named_data_fix()
    acquire_named_data_fix()
    try:
        store = nds.NamedDataStore()
        store.add_named_data("k", cl[1:])
        out = store.get_named_data_store_output()
        assert bytes(out.buffers[out.pte_data["k"].buffer_index]) == layout_bytes(cl[1:])
        release_named_data_fix()
        assert named_data_fix_installed()  # still held once
    finally:
        release_named_data_fix()
    if not was:
        assert nds.__dict__["_tensor_to_bytes"] is original
