"""The exact bytes of a constant tensor, shared by every backend serializer.

ExecuTorch 1.5.1's XNNPACK and Vulkan serializers copy ``untyped_storage()``
from byte 0, which is the whole parent for a view: wrong values for a view at a
non-zero storage offset, a bloated file for a view at offset 0, and the wrong
element order for a non-contiguous tensor that is not copied first. Everything
here reads only the tensor's *own* elements, starting at its storage offset:

* :func:`tensor_bytes` – the elements in logical C-contiguous order (or in a
  given dim order, e.g. NHWC), for every dtype with a byte-sized element
  (fp32/fp16/bf16/fp64, int8..int64, uint8..uint64, bool, float8, ...);
* :func:`pack_int4` – int4 values packed two per byte, the way XNNPACK
  (low nibble first) and Vulkan (high nibble first) pack them;
* :func:`layout_bytes` – a drop-in for ExecuTorch's
  ``exir._serialize._named_data_store._tensor_to_bytes`` (bytes in the tensor's
  own dim order, which is what ``TensorLayout`` records) that never reads outside
  the tensor; :func:`acquire_named_data_fix` / :func:`release_named_data_fix`
  install it with a reference count so that several adapters can share it.

Copies: a tensor that is contiguous in the requested order is read once, from
``data_ptr()`` for ``nbytes``; any other tensor is first made dense, which
copies its elements only (never the rest of the parent storage).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "acquire_named_data_fix",
    "dense_dim_order",
    "dense_tensor",
    "layout_bytes",
    "named_data_fix_installed",
    "owns_storage_exactly",
    "pack_int4",
    "release_named_data_fix",
    "storage_nbytes",
    "tensor_bytes",
    "tensor_nbytes",
]


def _real(t: torch.Tensor) -> torch.Tensor:
    """A plain CPU tensor with real data (no autograd, conj or neg bits)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor) or t.device.type == "meta":
        raise ValueError("a fake/meta tensor has no bytes; resolve the real constant first")
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes of the tensor's own elements (``numel * element_size``)."""
    return t.numel() * t.element_size()


def storage_nbytes(t: torch.Tensor) -> int:
    """Bytes of the whole storage the tensor lives in (what ExecuTorch 1.5.1 copies)."""
    return int(t.untyped_storage().nbytes())


def dense_dim_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The dim order of a tensor contiguous in C or channels_last order, else None."""
    if t.is_contiguous():
        return tuple(range(t.dim()))
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return (0, 2, 3, 1)
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return (0, 2, 3, 4, 1)
    return None


def owns_storage_exactly(t: torch.Tensor) -> bool:
    """True if the storage holds exactly this tensor, densely, in C or channels_last order.

    Such a tensor is serialized correctly even by ExecuTorch 1.5.1 (its serializers
    either call ``contiguous()`` or keep the dense dim order).
    """
    return (
        t.storage_offset() == 0
        and storage_nbytes(t) == tensor_nbytes(t)
        and dense_dim_order(t) is not None
    )


def tensor_bytes(t: torch.Tensor, *, dim_order: Sequence[int] | None = None) -> bytes:
    """The tensor's own elements as bytes, in logical C-contiguous order.

    ``dim_order`` writes the elements in that order instead, i.e. the bytes of
    ``t.permute(dim_order)``: ``(0, 2, 3, 1)`` gives NHWC for an NCHW tensor.
    Never reads outside ``[data_ptr, data_ptr + nbytes)`` of the (dense) tensor.
    """
    t = dense_tensor(t, dim_order=dim_order)
    n = tensor_nbytes(t)
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def dense_tensor(t: torch.Tensor, *, dim_order: Sequence[int] | None = None) -> torch.Tensor:
    """A real CPU tensor whose memory, from ``data_ptr()`` for ``tensor_nbytes``, holds
    exactly what :func:`tensor_bytes` returns: ``t`` itself when it is already dense in
    that order, else a copy of its elements only."""
    t = _real(t)
    if dim_order is not None:
        order = tuple(int(d) for d in dim_order)
        if sorted(order) != list(range(t.dim())):
            raise ValueError(f"dim_order {order} is not a permutation of {t.dim()} dims")
        t = t.permute(order)
    return t if t.is_contiguous() else t.contiguous()


def layout_bytes(t: torch.Tensor) -> bytes:
    """Bytes of ``t`` in its own dense dim order (C-contiguous if it has none).

    Same contract as ExecuTorch's ``_tensor_to_bytes`` (which preserves a
    channels_last layout because ``TensorLayout`` records the dim order) but reads
    only the tensor's elements, also for a channels_last slice of a bigger tensor.
    """
    order = dense_dim_order(t)
    return tensor_bytes(t, dim_order=order if order is not None else None)


def pack_int4(t: torch.Tensor, *, low_nibble_first: bool = True) -> torch.Tensor:
    """Pack int4 values (an integer tensor in [-8, 7]) two per byte, shape ``[rows, ceil(cols/2)]``.

    Each value is stored as ``value + 8`` (uint4). An odd last dimension is padded
    with one zero. ``low_nibble_first=True`` is XNNPACK's qc4w layout
    (``NodeVisitor.convert_to_qc4w``: element 2k in the low nibble); ``False`` is
    Vulkan's (``pack_4bit_weight_tensor``: element 2k in the high nibble).
    The result is a fresh compact uint8 tensor whatever the input's layout.
    """
    t = _real(t)
    if t.numel() == 0:
        raise ValueError("pack_int4: empty tensor")
    lo, hi = int(t.min().item()), int(t.max().item())
    if lo < -8 or hi > 7:
        raise ValueError(f"pack_int4: values must be in [-8, 7], got [{lo}, {hi}]")
    if t.dim() != 2:
        t = t.squeeze()
    if t.dim() != 2:
        raise ValueError(f"pack_int4: expecting a 2-d tensor, got {t.dim()}-d")
    if t.shape[-1] % 2:
        t = torch.nn.functional.pad(t, (0, 1, 0, 0), mode="constant", value=0)
    rows, cols = t.shape
    # value + 8 in uint8 arithmetic (-8..-1 wrap to 248..255, + 8 wraps to 0..7), in one
    # compact copy changed in place: a weight's temporaries are its bytes and a half
    # (an output projection of 151936 x 1024 int8 is 148 MiB), not int16 copies of it
    u = torch.empty((rows, cols), dtype=torch.uint8)
    u.copy_(t.to(torch.int8) if t.is_floating_point() else t)
    u = u.view(-1).add_(8)
    even, odd = u[0::2], u[1::2]
    high, low = (odd, even) if low_nibble_first else (even, odd)
    packed = high << 4
    packed |= low
    return packed.view(rows, cols // 2)


# --------------------------------------------------------------------------------------
# ExecuTorch NamedDataStore fix, shared by every adapter (reference counted).

_NDS_MODULE = "executorch.exir._serialize._named_data_store"
_nds_lock = threading.Lock()
_nds_count = 0
_nds_original: Any = None


def _fixed_tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """Replacement for ``_named_data_store._tensor_to_bytes`` (see :func:`layout_bytes`)."""
    return layout_bytes(tensor)


def acquire_named_data_fix() -> None:
    """Make ``NamedDataStore.add_named_data(tensor)`` write only the tensor's own bytes.

    Reference counted: every call must be paired with :func:`release_named_data_fix`;
    the original function is restored when the last holder releases.
    """
    global _nds_count, _nds_original
    import importlib

    mod = importlib.import_module(_NDS_MODULE)
    with _nds_lock:
        if _nds_count == 0:
            _nds_original = mod.__dict__["_tensor_to_bytes"]
            mod._tensor_to_bytes = _fixed_tensor_to_bytes  # type: ignore[attr-defined]
        _nds_count += 1


def release_named_data_fix() -> None:
    """Undo one :func:`acquire_named_data_fix`; restores the original on the last release."""
    global _nds_count, _nds_original
    import importlib

    mod = importlib.import_module(_NDS_MODULE)
    with _nds_lock:
        if _nds_count == 0:
            return
        _nds_count -= 1
        if _nds_count == 0:
            mod._tensor_to_bytes = _nds_original  # type: ignore[attr-defined]
            _nds_original = None


def named_data_fix_installed() -> bool:
    """Whether the NamedDataStore fix is currently in place."""
    return _nds_count > 0
