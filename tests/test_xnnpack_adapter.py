"""XNNPACK adapter: every case lowered for real, run with ExecuTorch's runtime, compared with eager.

Each case is lowered up to three ways (module-scoped, once each):
* ``stock``   – ExecuTorch 1.5.1's XnnpackPartitioner, fusionkit hook uninstalled;
* ``serializer`` – fusionkit's XnnpackPartitioner, ``transform_passes=None`` (the
  patched serializer alone, no compaction);
* ``adapter`` – the documented drop-in (``transform_passes()`` + XnnpackPartitioner),
  for the cases in ``DROP_IN`` (the compaction pass is tested on its own in
  test_compact_constants.py; lowering is the expensive part of this suite).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
    XnnpackPartitioner as StockXnnpackPartitioner,
)
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules
from executorch.exir.passes.constant_prop_pass import constant_prop_pass
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

import fusionkit.backends.xnnpack_adapter as xa
from fusionkit.backends.xnnpack_adapter import XnnpackPartitioner, transform_passes
from fusionkit.backends.xnnpack_adapter import serializer as xser
from fusionkit.integration import hooks, versions
from fusionkit.integration.spilled_data import blob_bytes
from fusionkit.integration.tensor_bytes import tensor_bytes

pytestmark = pytest.mark.slow


@dataclass
class Lowered:
    pte: bytes
    out: torch.Tensor
    blobs: dict[str, bytes] = field(default_factory=dict)  # named key -> bytes
    delegates: int = 0

    def err(self, ref: torch.Tensor) -> float:
        return float((self.out.float() - ref.float()).abs().max())


def lower(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    mode: str,
    pre: Callable[[Any], Any] | None = None,
    **partitioner_kwargs: Any,
) -> Lowered:
    ep = torch.export.export(model, inputs)
    if pre is not None:
        ep = pre(ep)
    return lower_ep(ep, inputs, mode, **partitioner_kwargs)


def lower_ep(ep: Any, inputs: tuple[torch.Tensor, ...], mode: str, **partitioner_kwargs: Any) -> Lowered:
    if mode == "stock":
        xa.uninstall()
        part: Any = StockXnnpackPartitioner(**partitioner_kwargs)
    else:
        part = XnnpackPartitioner(**partitioner_kwargs)
    passes = transform_passes() if mode == "adapter" else None
    epm = to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[part])
    blobs: dict[str, bytes] = {}
    delegates = 0
    for _, lbm, _ in get_lowered_submodules(epm.exported_program().graph_module):
        delegates += 1
        nds = lbm.named_data_store_output
        for key, entry in nds.pte_data.items():
            blobs[key] = blob_bytes(nds.buffers[entry.buffer_index])
    et = epm.to_executorch()
    out = _load_for_executorch_from_buffer(et.buffer).forward(inputs)[0]
    return Lowered(bytes(et.buffer), out, blobs, delegates)


MODES = ("stock", "serializer", "adapter")
DROP_IN = {"offset", "several_views", "cl_conv"}


def fixed_modes(case: str) -> tuple[str, ...]:
    return ("serializer", "adapter") if case in DROP_IN else ("serializer",)


class Linear(torch.nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w)


class Conv(torch.nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.w)


class SeveralViews(torch.nn.Module):
    """Three views of one storage: a weight, a bias and another weight."""

    def __init__(self, base: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w1", base[1])
        self.register_buffer("b", base[2][3])
        self.register_buffer("w2", base[3])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.w1, self.b), self.w2)


class Duplicate(torch.nn.Module):
    """A view and an equal-valued clone: one content, one blob."""

    def __init__(self, base: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("a", base[1])
        self.register_buffer("c", base[1].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.a) + F.linear(x, self.c) * 2


class CrossAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.mha(q, kv, kv, need_weights=False)[0]


def _fold(ep: Any) -> Any:
    """Constant folding as ExecuTorch does it; on ATen it leaves the in_proj chunks as views."""
    ep = constant_prop_pass(ep)
    views = [t for t in ep.constants.values() if isinstance(t, torch.Tensor) and t._base is not None]
    assert views, "constant folding should have produced views of in_proj_weight"
    return ep


def _case(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], dict[str, Any], Any]:
    torch.manual_seed(0)
    base = torch.randn(4, 8, 8)
    x = torch.randn(2, 8)
    if name == "offset":
        return Linear(base[1]), (x,), {}, None
    if name == "offset0":
        return Linear(base[0]), (x,), {}, None
    if name == "transposed":
        return Linear(base[1].t()), (x,), {}, None
    if name == "several_views":
        return SeveralViews(base), (x,), {}, None
    if name == "duplicate":
        return Duplicate(base), (x,), {}, None
    if name == "fp16":
        return Linear(base.half()[1]), (x.half(),), {}, None
    if name == "bf16":
        return Linear(base.bfloat16()[1]), (x.bfloat16(),), {"enable_bf16": True}, None
    if name == "cl_conv":
        w = torch.randn(8, 4, 3, 3).contiguous(memory_format=torch.channels_last)[4:]
        assert w.storage_offset() and w.is_contiguous(memory_format=torch.channels_last)
        return Conv(w), (torch.randn(1, 4, 6, 6),), {}, None
    if name == "mha":
        m = CrossAttention().eval()
        return m, (torch.randn(1, 3, 8), torch.randn(1, 5, 8)), {}, _fold
    raise KeyError(name)


@pytest.fixture(scope="module")
def lowered() -> Callable[[str, str], Lowered | Exception]:
    cache: dict[tuple[str, str], Lowered | Exception] = {}

    def get(case: str, mode: str) -> Lowered | Exception:
        if (case, mode) not in cache:
            model, inputs, kw, pre = _case(case)
            try:
                cache[case, mode] = lower(model.eval(), inputs, mode, pre, **kw)
            except Exception as e:  # a stock failure is a result too
                cache[case, mode] = e
        return cache[case, mode]

    yield get
    xa.uninstall()


def _eager(case: str) -> torch.Tensor:
    model, inputs, _, _ = _case(case)
    with torch.no_grad():
        return model.eval()(*inputs)


def _ok(r: Lowered | Exception) -> Lowered:
    if isinstance(r, Exception):
        raise r
    return r


# ------------------------------------------------------------------ wrong on stock, right here


@pytest.mark.parametrize(
    "case, tol",
    [("offset", 1e-5), ("several_views", 1e-4), ("fp16", 2e-2), ("bf16", 1e-1), ("mha", 1e-5)],
)
def test_stock_is_wrong_adapter_is_right(lowered: Any, case: str, tol: float) -> None:
    eager = _eager(case)
    stock = _ok(lowered(case, "stock"))
    if case == "bf16" and not versions.features().bf16_delegation:
        # XNNPACK takes bf16 from 1.5.0 on: before, nothing is delegated, stock or fixed
        assert stock.delegates == 0
        assert [_ok(lowered(case, m)).delegates for m in fixed_modes(case)] == [0] * len(
            fixed_modes(case))
        return
    assert stock.delegates >= 1
    assert stock.err(eager) > 0.3, f"stock 1.5.1 expected to be wrong for {case}"
    for mode in fixed_modes(case):
        r = _ok(lowered(case, mode))
        assert r.delegates == stock.delegates
        assert r.err(eager) < tol, (mode, r.err(eager))


def test_offset_view_blob_is_exactly_the_view(lowered: Any) -> None:
    model, _, _, _ = _case("offset")
    w = model.w
    expected = tensor_bytes(w)
    stock = _ok(lowered("offset", "stock"))
    assert list(stock.blobs.values()) == [bytes(w.untyped_storage())]  # whole parent from byte 0
    for mode in fixed_modes("offset"):
        r = _ok(lowered("offset", mode))
        assert r.blobs == {hashlib.sha256(expected).hexdigest(): expected}


def test_offset0_view_carries_only_its_bytes(lowered: Any) -> None:
    """Values are right on stock but the file carries the whole parent; not here."""
    eager = _eager("offset0")
    stock = _ok(lowered("offset0", "stock"))
    assert stock.err(eager) < 1e-5
    assert [len(b) for b in stock.blobs.values()] == [4 * 8 * 8 * 4]  # the whole parent
    # the same program with an 8x8 weight that owns its storage (here: the transposed
    # case, whose weight stock compacts with contiguous()) is the size to match
    compact = _ok(lowered("transposed", "stock"))
    assert [len(b) for b in compact.blobs.values()] == [8 * 8 * 4]
    r = _ok(lowered("offset0", "serializer"))
    assert r.err(eager) < 1e-5
    assert [len(b) for b in r.blobs.values()] == [8 * 8 * 4]
    assert len(r.pte) == len(compact.pte)  # only the view's bytes + the same fixed overhead
    assert len(stock.pte) - len(r.pte) >= 3 * 8 * 8 * 4  # stock carries the rest of the parent


def test_transposed_view(lowered: Any) -> None:
    """Stock copies a transposed weight with contiguous() first: right there and here."""
    eager = _eager("transposed")
    model, _, _, _ = _case("transposed")
    for mode in ("stock", "serializer"):
        r = _ok(lowered("transposed", mode))
        assert r.err(eager) < 1e-5
        assert list(r.blobs.values()) == [tensor_bytes(model.w)]


def test_several_views_each_get_their_own_bytes(lowered: Any) -> None:
    model, _, _, _ = _case("several_views")
    expected = {tensor_bytes(t) for t in (model.w1, model.b, model.w2)}
    stock = _ok(lowered("several_views", "stock"))
    # stock: every view serialized as the same whole storage -> one de-duplicated blob
    assert set(stock.blobs.values()) == {bytes(model.w1.untyped_storage())}
    for mode in fixed_modes("several_views"):
        assert set(_ok(lowered("several_views", mode)).blobs.values()) == expected


def test_equal_content_is_deduplicated_by_content_hash(lowered: Any) -> None:
    eager = _eager("duplicate")
    model, _, _, _ = _case("duplicate")
    for mode in fixed_modes("duplicate"):
        r = _ok(lowered("duplicate", mode))
        assert r.err(eager) < 1e-4
        data = tensor_bytes(model.c)
        assert r.blobs == {hashlib.sha256(data).hexdigest(): data}


def test_fp16_bf16_blobs_keep_their_dtype(lowered: Any) -> None:
    if not versions.features().bf16_delegation:  # before 1.5.0: no bf16 delegate, no blob
        assert _ok(lowered("bf16", "serializer")).blobs == {}
    for case in ("fp16", "bf16") if versions.features().bf16_delegation else ("fp16",):
        model, _, _, _ = _case(case)
        r = _ok(lowered(case, "serializer"))
        assert list(r.blobs.values()) == [tensor_bytes(model.w)]
        assert len(tensor_bytes(model.w)) == 8 * 8 * 2


def test_channels_last_conv_weight_slice(lowered: Any) -> None:
    """Stock refuses a channels_last constant (ChannelsLastTaggedReshapePass); so does the
    serializer alone (the refusal is before serialization). The adapter's compaction makes it
    C-contiguous and the serializer writes exactly the slice's NHWC bytes."""
    eager = _eager("cl_conv")
    model, _, _, _ = _case("cl_conv")
    assert isinstance(lowered("cl_conv", "stock"), Exception)
    r = _ok(lowered("cl_conv", "adapter"))
    assert r.err(eager) < 1e-4
    assert list(r.blobs.values()) == [tensor_bytes(model.w, dim_order=(0, 2, 3, 1))]


# ------------------------------------------------------------------ per-channel-group int4 scales


@pytest.fixture(scope="module")
def groupwise() -> dict[str, Any]:
    """int8 dynamic activation + int4 PerGroup(32) weight (torchao, as the XNNPACK docs show);
    the scale constant is replaced by an equal-valued transposed-layout tensor."""
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.utils import unwrap_tensor_subclass

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 16, bias=False)).eval()
    x = torch.randn(3, 64)
    quantize_(m, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    unwrap_tensor_subclass(m)
    with torch.no_grad():
        eager = m(x)
    scale_key = "0.parametrizations.weight.original1"

    def export_with_transposed_scale() -> Any:
        ep = torch.export.export(m, (x,))
        s = ep.state_dict[scale_key]
        assert s.shape == (16, 2)
        ep.state_dict[scale_key] = torch.nn.Parameter(s.detach().t().contiguous().t(), requires_grad=False)
        return ep

    def run(mode: str) -> Lowered:
        ep = export_with_transposed_scale()
        return lower_ep(ep, (x,), mode)

    scale = export_with_transposed_scale().state_dict[scale_key]
    out = {"eager": eager, "scale": scale}
    for mode in MODES:
        out[mode] = run(mode)
    return out


def test_transposed_groupwise_int4_scale(groupwise: dict[str, Any]) -> None:
    eager, scale = groupwise["eager"], groupwise["scale"]
    assert not scale.is_contiguous()
    stock, alone, adapter = (groupwise[m] for m in MODES)
    assert stock.err(eager) > 0.03  # scales written column-major
    right = tensor_bytes(scale.to(torch.bfloat16))
    wrong = bytes(scale.to(torch.bfloat16).untyped_storage())
    assert stock.blobs["scale_" + hashlib.sha256(wrong).hexdigest()] == wrong
    for r in (alone, adapter):
        assert r.err(eager) < 0.01  # int4 quantization error only
        assert r.blobs["scale_" + hashlib.sha256(right).hexdigest()] == right
        assert r.delegates == stock.delegates


# ------------------------------------------------------------------ install / uninstall


def _raw_targets() -> list[tuple[Any, str, Any]]:
    return [(o, n, o.__dict__[n]) for o, n, _ in xser._patches()]


def test_install_uninstall_restores_identical_objects() -> None:
    from executorch.exir._serialize import _named_data_store as nds

    xa.uninstall()
    before = _raw_targets()
    nds_before = nds.__dict__["_tensor_to_bytes"]
    h = xa.install()
    assert xa.is_installed() and h.installed_here
    assert not xa.install().installed_here  # idempotent
    for (o, n, orig), (_, _, new) in zip(before, xser._patches(), strict=True):
        assert o.__dict__[n] is not orig
        assert o.__dict__[n] is new or getattr(o, n) is getattr(new, "__func__", new)
    assert nds.__dict__["_tensor_to_bytes"] is not nds_before
    xa.uninstall()
    xa.uninstall()  # idempotent
    assert not xa.is_installed()
    for o, n, orig in before:
        assert o.__dict__[n] is orig
    assert nds.__dict__["_tensor_to_bytes"] is nds_before


def test_context_manager_and_partitioner_installs_nothing() -> None:
    xa.uninstall()
    with xa.install():
        assert xa.is_installed()
        with xa.install():  # nested: inner does not uninstall
            pass
        assert xa.is_installed()
    assert not xa.is_installed()
    XnnpackPartitioner()  # scoped to its own partitions (tests/test_no_global_effects.py)
    assert not xa.is_installed()


def test_refuses_untested_executorch(monkeypatch: pytest.MonkeyPatch) -> None:
    xa.uninstall()
    monkeypatch.setattr(hooks, "installed_executorch_version", lambda: "1.6.0")
    with pytest.raises(xa.UnsupportedExecuTorchError, match=r"ExecuTorch 1\.6\.0.*1\.5\.1"):
        xa.install()
    assert not xa.is_installed()
    with pytest.raises(xa.UnsupportedExecuTorchError):
        XnnpackPartitioner()
