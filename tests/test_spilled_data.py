"""Constant blobs kept in files (``fusionkit.integration.spilled_data``): the same bytes as
in memory, the same ``.pte``, a program that runs, copies that share, ETRecords that save."""

from __future__ import annotations

import copy
import gc
import hashlib
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fusionkit.integration import spilled_data
from fusionkit.integration.spilled_data import (
    SPILL_DIR_VARIABLE,
    blob_bytes,
    constant_blob,
    materialized,
    spill_supported,
)
from fusionkit.integration.tensor_bytes import tensor_bytes

needs_spill = pytest.mark.skipif(not spill_supported(),
                                 reason="this ExecuTorch holds named data as bytes only")


@pytest.fixture
def spill_all(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every blob spilled, into a directory of the test's own."""
    monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", 0)
    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path))
    return tmp_path


def _cases() -> list[tuple[str, torch.Tensor, tuple[int, ...] | None]]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, 8, generator=g)
    cl = torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last)
    return [
        ("contiguous", torch.randn(5, 7, generator=g), None),
        ("view at an offset", base[2], None),
        ("transposed", base[1].t(), None),
        ("nhwc of nchw", torch.randn(2, 3, 4, 5, generator=g), (0, 2, 3, 1)),
        ("channels_last slice", cl[1:], (0, 2, 3, 1)),
        ("bf16", torch.randn(9, 3, generator=g).to(torch.bfloat16), None),
        ("int8", torch.randint(-128, 127, (33,), dtype=torch.int8, generator=g), None),
    ]


@needs_spill
@pytest.mark.parametrize(("name", "t", "order"), _cases(), ids=[c[0] for c in _cases()])
def test_a_spilled_blob_holds_exactly_the_tensor_bytes(
    spill_all: Path, name: str, t: torch.Tensor, order: tuple[int, ...] | None
) -> None:
    blob, key = constant_blob(t, dim_order=order)
    expected = tensor_bytes(t, dim_order=order)
    assert not isinstance(blob, bytes), name
    assert len(blob) == len(expected)
    assert blob_bytes(blob) == expected
    assert key == hashlib.sha256(expected).hexdigest()
    assert [p.parent for p in spill_all.iterdir()] == [spill_all]


@needs_spill
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), start=st.integers(0, 3),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.int32, torch.uint8]))
def test_spilled_and_in_memory_blobs_agree(rows: int, cols: int, start: int,
                                           dtype: torch.dtype) -> None:
    base = (torch.arange((rows + 4) * cols) % 251).to(dtype).reshape(rows + 4, cols)
    t = base[start:start + rows]
    in_memory, key_in_memory = constant_blob(t)  # small: stays bytes
    assert isinstance(in_memory, bytes)
    old = spilled_data.MIN_SPILL_BYTES
    spilled_data.MIN_SPILL_BYTES = 0
    try:
        spilled, key = constant_blob(t)
    finally:
        spilled_data.MIN_SPILL_BYTES = old
    assert key == key_in_memory and blob_bytes(spilled) == in_memory


@needs_spill
def test_copies_share_the_file_and_pickles_carry_the_bytes(spill_all: Path) -> None:
    t = torch.randn(64, 16)
    blob, _ = constant_blob(t)
    assert copy.deepcopy(blob) is blob and copy.copy(blob) is blob
    assert copy.deepcopy({"b": [blob]})["b"][0] is blob
    assert pickle.loads(pickle.dumps(blob)) == tensor_bytes(t)
    assert materialized([b"x", blob]) == [b"x", tensor_bytes(t)]
    kept = [b"x", b"y"]
    assert materialized(kept) is kept


@needs_spill
def test_the_file_goes_with_the_blob(spill_all: Path) -> None:
    blob, _ = constant_blob(torch.randn(32, 32))
    assert len(list(spill_all.iterdir())) == 1
    del blob
    gc.collect()
    assert list(spill_all.iterdir()) == []


def test_off_small_or_unwritable_keeps_bytes(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    t = torch.randn(128, 64)
    monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", 0)
    monkeypatch.setenv(SPILL_DIR_VARIABLE, "off")
    assert constant_blob(t)[0] == tensor_bytes(t)
    missing = tmp_path / "missing"
    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(missing))
    blob, key = constant_blob(t)
    assert blob == tensor_bytes(t) and key == hashlib.sha256(blob).hexdigest()
    assert not missing.exists()
    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", t.numel() * 4 + 1)
    assert isinstance(constant_blob(t)[0], bytes)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- lowered


class _Net(torch.nn.Module):
    """A linear whose weight is a view at an offset, and an NHWC conv weight."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        base = torch.randn(3, 16, 16, generator=g)
        self.register_buffer("w", base[1])
        self.register_buffer("k", torch.randn(4, 3, 3, 3, generator=g))

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.relu(F.linear(x, self.w)), F.conv2d(img, self.k)


def _lower(generate_etrecord: bool = False):  # type: ignore[no-untyped-def]
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.xnnpack_adapter import XnnpackPartitioner

    inputs = (torch.randn(2, 16), torch.randn(1, 3, 8, 8))
    ep = torch.export.export(_Net().eval(), inputs)
    return inputs, to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                               generate_etrecord=generate_etrecord)


@pytest.fixture(scope="module")
def _adapter():  # type: ignore[no-untyped-def]
    import fusionkit.backends.xnnpack_adapter as xa

    with xa.install():
        yield


def _blobs(epm):  # type: ignore[no-untyped-def]
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    return [b for _, lm, _ in get_lowered_submodules(epm.exported_program().graph_module)
            for b in lm.named_data_store_output.buffers]


@needs_spill
def test_a_program_with_spilled_weights_is_the_same_pte_and_runs(
    _adapter: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    monkeypatch.setenv(SPILL_DIR_VARIABLE, "off")
    inputs, kept = _lower()
    assert all(isinstance(b, bytes) for b in _blobs(kept))
    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", 0)
    _, spilled = _lower()
    blobs = _blobs(spilled)
    assert blobs and not any(isinstance(b, bytes) for b in blobs)
    assert sorted(blob_bytes(b) for b in blobs) == sorted(_blobs(kept))
    copied = copy.deepcopy(spilled)  # ExecuTorch copies programs; the files stay shared
    del spilled
    gc.collect()
    pte = copied.to_executorch().buffer
    assert pte == kept.to_executorch().buffer
    out = _load_for_executorch_from_buffer(pte).forward(inputs)
    ref = _Net().eval()(*inputs)
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    path = tmp_path / "net.pte"
    with open(path, "wb") as f:
        copied.to_executorch().write_to_file(f)
    assert path.read_bytes() == pte


@needs_spill
def test_a_lowered_program_with_spilled_weights_serializes_with_its_bytes(
    _adapter: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ExecuTorch's serde (``exir.save``, an ETRecord of a lowered program) writes a
    lowered module's named data as JSON; the file blobs are read for that call only."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules
    from executorch.exir.serde.serialize import deserialize, serialize

    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", 0)
    _, epm = _lower()
    want = sorted(blob_bytes(b) for b in _blobs(epm))
    back = deserialize(serialize(epm.exported_program()))
    assert not any(isinstance(b, bytes) for b in _blobs(epm))
    got = sorted(bytes(b) for _, lm, _ in get_lowered_submodules(back.graph_module)
                 for b in lm.named_data_store_output.buffers)
    assert got == want


@needs_spill
def test_an_etrecord_of_a_program_with_spilled_weights_saves(
    _adapter: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from executorch.devtools.etrecord import parse_etrecord

    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", 0)
    _, epm = _lower(generate_etrecord=True)
    program = epm.to_executorch()
    record = program.get_etrecord()
    record.save(str(tmp_path / "etrecord.bin"))
    assert not any(isinstance(b, bytes) for b in _blobs(epm))  # read for the call only
    parsed = parse_etrecord(str(tmp_path / "etrecord.bin"))
    assert parsed.edge_dialect_program is not None


@needs_spill
def test_a_vulkan_program_with_spilled_weights_is_the_same_pte_and_simulates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Vulkan adapter's constants: the same ``.pte`` as in memory; ``check`` and
    ``simulate`` read the spilled edge program's weights from their files."""
    from executorch.exir import to_edge_transform_and_lower

    import fusionkit.backends.vulkan_adapter as va

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(2)
            self.register_buffer("w", torch.randn(3, 24, 16, generator=g)[1])
            self.register_buffer("b", torch.randn(24, generator=g))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(F.linear(x, self.w, self.b))

    x = (torch.randn(4, 16),)

    def lower():  # type: ignore[no-untyped-def]
        ep = torch.export.export(Mlp().eval(), x)
        return to_edge_transform_and_lower(ep, partitioner=[va.VulkanPartitioner()])

    with va.install():
        monkeypatch.setenv(SPILL_DIR_VARIABLE, "off")
        kept = lower()
        monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path))
        monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", 0)
        spilled = lower()
    blobs = _blobs(spilled)
    assert blobs and not any(isinstance(b, bytes) for b in blobs)
    assert va.check(spilled, runtime=None) == va.check(kept, runtime=None)
    torch.testing.assert_close(va.simulate(spilled, *x), Mlp().eval()(*x), rtol=1e-4, atol=1e-4)
    assert spilled.to_executorch().buffer == kept.to_executorch().buffer


def _mount_type(path: str) -> str | None:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            rows = [line.split()[1:3] for line in f]
    except OSError:
        return None
    hits = [(p, t) for p, t in rows if path == p]
    return hits[-1][1] if hits else None


@pytest.mark.skipif(_mount_type("/dev/shm") != "tmpfs", reason="no tmpfs at /dev/shm")
def test_a_temporary_directory_in_memory_is_not_spilled_to(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SPILL_DIR_VARIABLE, raising=False)
    monkeypatch.setattr(spilled_data, "MIN_SPILL_BYTES", 0)
    monkeypatch.setattr(spilled_data.tempfile, "gettempdir", lambda: "/dev/shm")
    t = torch.randn(64, 64)
    before = set(os.listdir("/dev/shm"))
    assert constant_blob(t)[0] == tensor_bytes(t)
    assert set(os.listdir("/dev/shm")) == before
    monkeypatch.setattr(spilled_data.tempfile, "gettempdir", lambda: "/dev/shm/sub/dir")
    assert spilled_data._in_memory_filesystem("/dev/shm/sub/dir")
