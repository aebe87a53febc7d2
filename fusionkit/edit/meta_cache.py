"""``meta['val']`` of a new node, memoised by (op, input metadata).

A replacement node gets its ``meta['val']`` by running the op on fake tensors.
For a fused op that is the op's Python reference (``et_vk.rms_norm`` costs 3-4 ms
under FakeTensorMode), and a transformer fuses the same op on the same shapes
dozens of times. A fake tensor carries no data, so for a functional op whose
inputs all have concrete shapes the output's metadata (shape, strides, dtype,
device) is a function of the inputs' metadata and the non-tensor arguments:
computed once, every later node gets a *fresh* fake tensor with that metadata
(never a shared object: two nodes must not look like aliases). Ops that mutate
or return views, and anything symbolic, are always propagated for real.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Node

__all__ = ["clear", "fake_constant", "fake_output", "keys_remembered", "metadata_key"]

#: bound on remembered (op, input metadata) entries; cleared when full
MAX_ENTRIES = 4096

_memo: dict[tuple[Any, ...], Any] = {}
_functional: dict[Any, bool] = {}


def clear() -> None:
    """Forget every remembered output (tests; a changed op registration)."""
    _memo.clear()
    _functional.clear()
    _FRESH_STATE.clear()


def _is_functional(overload: Any) -> bool:
    ok = _functional.get(overload)
    if ok is None:
        schema = getattr(overload, "_schema", None)
        ok = (schema is not None and not schema.is_mutable
              and all(r.alias_info is None for r in schema.returns))
        _functional[overload] = ok
    return ok


class _Uncacheable(Exception):
    pass


#: inside :func:`keys_remembered`: id -> (the tensor, kept alive so its id is not reused,
#: and its key)
_remembered: dict[int, tuple[torch.Tensor, tuple[Any, ...]]] | None = None


@contextmanager
def keys_remembered() -> Iterator[None]:
    """Within: each tensor's metadata key is computed once. For a search, which decides
    many matches over the same captured values and changes no tensor's metadata: its
    memoised checks key every decision by those values' metadata."""
    global _remembered
    if _remembered is not None:  # nested: the outer scope's memo serves
        yield
        return
    _remembered = {}
    try:
        yield
    finally:
        _remembered = None


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    memo = _remembered
    if memo is not None:
        hit = memo.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
    if t._has_symbolic_sizes_strides or t.layout is not torch.strided:
        raise _Uncacheable
    offset = t.storage_offset()
    if type(offset) is not int:  # pragma: no cover - covered by the flag above
        raise _Uncacheable
    key = ("T", tuple(t.shape), t.stride(), offset, t.dtype, t.device, t.requires_grad)
    if memo is not None:
        memo[id(t)] = (t, key)
    return key


_LITERALS = frozenset({type(None), bool, int, str, torch.dtype, torch.device, torch.layout,
                       torch.memory_format})


def _key(a: Any) -> Any:
    if isinstance(a, Node):
        a = a.meta.get("val")
        if a is None:
            raise _Uncacheable
    t = type(a)
    if t in _LITERALS:
        return (t.__name__, a)
    if t is float:
        return ("float", repr(a))  # -0.0 and nan stay distinct and equal to themselves
    if isinstance(a, torch.Tensor):
        return _tensor_key(a)
    if isinstance(a, (list, tuple)):
        return (t.__name__, *[_key(x) for x in a])
    raise _Uncacheable  # SymInt, opaque objects: propagate for real


def metadata_key(a: Any) -> Any:
    """A hashable key of ``a``'s metadata (nodes by their ``meta['val']``), or None.

    Equal keys mean equal shapes, strides, dtypes and literals; None when something
    symbolic or opaque is involved (then nothing may be memoised on it).
    """
    try:
        return _key(a)
    except _Uncacheable:
        return None


def _template(v: Any) -> Any:
    """What is needed to rebuild ``v`` with fresh storage, or raise if it cannot be."""
    if isinstance(v, torch.Tensor):
        shape, stride = tuple(v.shape), tuple(v.stride())
        if (not all(type(d) is int for d in (*shape, *stride)) or v.layout is not torch.strided
                or v.storage_offset() != 0 or type(v) is not FakeTensor):
            raise _Uncacheable
        return ("T", shape, stride, v.dtype, v.device, v.requires_grad)
    if isinstance(v, (list, tuple)):
        return (type(v), [_template(x) for x in v])
    raise _Uncacheable  # SymInt, None, scalars: not worth remembering


#: device -> the instance state of a fresh FakeTensor on it, less ``fake_mode``
#: (None: this torch builds FakeTensors some other way; use the constructor)
_FRESH_STATE: dict[Any, dict[str, Any] | None] = {}


def _fresh_state(fake_mode: Any, device: torch.device) -> dict[str, Any] | None:
    """What ``FakeTensor.__new__`` stores on a new tensor on ``device``, learnt from it once.

    Only a state that is the device, the mode and ``None`` everywhere else (the
    memo slots) is reused; anything else (a debug trace, an attribute a newer
    torch adds) keeps the constructor.
    """
    try:
        return _FRESH_STATE[device]
    except KeyError:
        pass
    state: dict[str, Any] | None = None
    try:
        ref = FakeTensor(fake_mode, torch.empty(0, device="meta"), device)
        got = dict(ref.__dict__)
        if (got.pop("fake_mode", None) is fake_mode and got.pop("_fake_device", None) == device
                and all(v is None for v in got.values())):
            state = {"_fake_device": device, **got}
    except Exception:  # pragma: no cover - a torch without this constructor
        state = None
    _FRESH_STATE[device] = state
    return state


def _new_fake(fake_mode: Any, meta: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``FakeTensor(fake_mode, meta, device)`` without its argument checking (~4x faster).

    The same steps as ``FakeTensor.__new__`` for a fresh meta tensor: the
    subclass view dispatching as ``device``, the data-pointer guard, the state
    a new FakeTensor has (:func:`_fresh_state`).
    """
    state = _fresh_state(fake_mode, device) if device.type != "meta" else None
    if state is None:
        return FakeTensor(fake_mode, meta, device)
    out = torch.Tensor._make_subclass(FakeTensor, meta, False, dispatch_device=True,
                                      device_for_backend_keys=device)
    if fake_mode._allow_unsafe_data_ptr_access:
        torch._C._set_warn_deprecated_on_mutable_data_ptr(out)
    else:
        torch._C._set_throw_on_mutable_data_ptr(out)
    d = out.__dict__
    d.update(state)
    d["fake_mode"] = fake_mode
    return out


def fake_constant(value: torch.Tensor, fake_mode: Any) -> torch.Tensor:
    """The ``meta['val']`` of a new constant placeholder holding ``value``.

    ``fake_mode.from_tensor`` describes the real tensor field by field (~0.5 ms);
    a new constant (a repacked weight, a folded expression) is a plain dense
    tensor, so a fresh fake tensor with its shape, strides, dtype and device is
    the same thing. Anything else (a view, a subclass, a parameter) is converted
    by ``from_tensor``.
    """
    if (type(value) is torch.Tensor and value.layout is torch.strided
            and not value.requires_grad and value.storage_offset() == 0
            and value.is_contiguous() and value.device.type != "meta"):
        meta = torch.empty_strided(tuple(value.shape), value.stride(), dtype=value.dtype,
                                   device="meta")
        try:
            return _new_fake(fake_mode, meta, value.device)
        except Exception:  # pragma: no cover - a torch without this constructor
            pass
    out: torch.Tensor = fake_mode.from_tensor(value, static_shapes=True)
    return out


def _rebuild(t: Any, fake_mode: Any) -> Any:
    if t[0] == "T":
        _, shape, stride, dtype, device, requires_grad = t
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        try:  # what FakeTensorMode does for a factory op, without the dispatch (~6x faster)
            out: torch.Tensor = _new_fake(fake_mode, meta, device)
        except Exception:  # pragma: no cover - a torch without this constructor
            with fake_mode:
                out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        return out.requires_grad_(True) if requires_grad else out
    typ, items = t
    return typ(_rebuild(x, fake_mode) for x in items)


def _any_symbolic_shape(values: tuple[Any, ...]) -> bool:
    """Whether a tensor among ``values`` (one list level deep) has a symbolic size."""
    for v in values:
        items = v if isinstance(v, (list, tuple)) else (v,)
        for t in items:
            if isinstance(t, torch.Tensor) and not all(isinstance(d, int) for d in t.shape):
                return True
    return False


def fake_output(overload: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                meta_args: tuple[Any, ...], meta_kwargs: dict[str, Any],
                fake_mode: Any) -> Any:
    """``overload(*meta_args, **meta_kwargs)`` under ``fake_mode``, memoised when sound.

    ``args``/``kwargs`` are the node's arguments (nodes), ``meta_*`` their values.
    """
    key: tuple[Any, ...] | None = None
    if fake_mode is not None and _is_functional(overload):
        try:
            key = (overload, _key(args),
                   _key(tuple(sorted(kwargs.items()))) if kwargs else ())
        except _Uncacheable:
            key = None
        if key is not None:
            t = _memo.get(key)
            if t is not None:
                return _rebuild(t, fake_mode)
    if fake_mode is not None:
        # a symbolic size reaches C++ kernels that take concrete ints only (the
        # composite et_vk.rms_norm broadcasting a dynamic sequence length) unless the
        # Python dispatcher routes it to their SymInt forms, as ExportPass does
        with fake_mode, (enable_python_dispatcher() if _any_symbolic_shape(meta_args)
                         else contextlib.nullcontext()):
            out = overload(*meta_args, **meta_kwargs)
    else:
        out = overload(*meta_args, **meta_kwargs)
    if key is not None:
        try:
            t = _template(out)
        except _Uncacheable:
            return out
        if len(_memo) >= MAX_ENTRIES:
            _memo.clear()
        _memo[key] = t
    return out
