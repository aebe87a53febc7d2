"""Vulkan constant serialization on fusionkit's core constant access.

ExecuTorch 1.5.1's ``VkGraphBuilder.maybe_add_constant_tensor``
(``backends/vulkan/serialization/vulkan_graph_builder.py``) writes each constant
as ``untyped_storage()`` from byte 0 – the whole parent of a view, starting at
the parent's first element. The same bug sits in the legacy raw-tensor branch of
``vulkan_graph_serialize.serialize_constant_tensors``. Both are re-implemented
here on :mod:`fusionkit.program_inputs` and :mod:`fusionkit.integration.tensor_bytes`: the
constant's own bytes in logical C order (after the builder's dtype conversion),
keyed by the sha256 of exactly those bytes, 16-byte aligned as before. A constant of a
MiB or more goes to the NamedDataStore as a file
(:mod:`fusionkit.integration.spilled_data`) where ExecuTorch takes one.

Scalar constants too: ``VkGraphBuilder.get_or_create_scalar_value`` shares one value
among equal scalars keyed by the Python scalar, and ``1 == 1.0`` (``0.0 == -0.0``), so
an int argument serialized after an equal float gets the float's ``Double`` value. The
runtime reads some int arguments with the strict ``graph.get_int`` (``Value::toInt``):
a conv's ``groups`` of 1 after a ``clamp(x, -1.0, 1.0)`` or an ``x > 1.0`` in the same
delegate aborts the load with ``(isInt()) is false! Expected value to have type Int,
got DOUBLE instead`` (issue 24: the OpMix program), and ``avg_pool2d`` ignores a
``divisor_override`` that is not an Int. :func:`get_or_create_scalar_value` keys the
shared values by the scalar's type and ``repr``, so each is serialized as its own type.

:func:`install` / :func:`uninstall` (idempotent, reversible to the identical
objects; ``with install():`` scopes it) also hold the shared NamedDataStore
``_tensor_to_bytes`` fix. Only ExecuTorch 1.5.1 is accepted.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from fusionkit import ProgramInputs
from fusionkit.integration.hooks import (
    PatchSet,
    UnsupportedExecuTorchError,
)
from fusionkit.integration.spilled_data import SERDE_PATCHES, constant_blob
from fusionkit.integration.tensor_bytes import (
    acquire_named_data_fix,
    release_named_data_fix,
    tensor_bytes,
)

__all__ = [
    "PATCHES",
    "UnsupportedExecuTorchError",
    "get_or_create_scalar_value",
    "install",
    "is_installed",
    "maybe_add_constant_tensor",
    "serialize_constant_tensors",
    "uninstall",
]

_BUILDER = "executorch.backends.vulkan.serialization.vulkan_graph_builder"
_SERIALIZE = "executorch.backends.vulkan.serialization.vulkan_graph_serialize"
_UINT64_MAX = 18446744073709551615
_ALIGNMENT = 16


def _constant_of(builder: Any, node: torch.fx.Node) -> torch.Tensor:
    ref = ProgramInputs(builder.program).constant(node)
    if ref is not None:
        return ref.tensor
    # mutable buffer (initial value) or get_attr: the builder's own lookup
    return builder.get_param_tensor(node)  # type: ignore[no-any-return]


def maybe_add_constant_tensor(self: Any, node: torch.fx.Node) -> int:
    """``VkGraphBuilder.maybe_add_constant_tensor`` writing the constant's exact bytes."""
    builder_mod = importlib.import_module(_BUILDER)
    constant_id = -1
    if builder_mod.is_param_node(self.program, node):
        tensor = _constant_of(self, node).detach()
        effective_dtype = self.get_effective_dtype(tensor.dtype)
        if tensor.dtype != effective_dtype:
            if effective_dtype.is_floating_point:
                info = torch.finfo(effective_dtype)
                tensor = tensor.clamp(min=info.min, max=info.max)
            tensor = tensor.to(effective_dtype)
        data, named_key = constant_blob(tensor)
        constant_id = len(self.const_tensors)
        if len(data):
            self.named_data_store.add_named_data(named_key, data, alignment=_ALIGNMENT)
            self.const_tensors.append((named_key, len(data)))
        else:
            self.const_tensors.append(None)
    return constant_id


def get_or_create_scalar_value(self: Any, scalar: bool | int | float) -> int:
    """``VkGraphBuilder.get_or_create_scalar_value`` sharing a value only among scalars of
    one type and one ``repr`` (stock's key is the scalar itself: ``1``, ``1.0`` and ``True``
    fall together but for its bool special case, and so do ``0.0`` and ``-0.0``)."""
    from executorch.backends.vulkan.serialization import vulkan_graph_schema as vk_schema

    key = ("fusionkit", type(scalar).__name__, repr(scalar))
    if key in self.const_scalar_to_value_ids:
        return int(self.const_scalar_to_value_ids[key])
    new_id = len(self.values)
    if isinstance(scalar, bool):
        self.values.append(vk_schema.VkValue(vk_schema.Bool(scalar)))
    elif isinstance(scalar, int):
        self.values.append(vk_schema.VkValue(vk_schema.Int(scalar)))
    elif isinstance(scalar, float):
        self.values.append(vk_schema.VkValue(vk_schema.Double(scalar)))
    else:
        raise TypeError(f"not a scalar the Vulkan graph can hold: {type(scalar).__name__}")
    self.const_scalar_to_value_ids[key] = new_id
    return new_id


def serialize_constant_tensors(vk_graph: Any, const_tensors: list[Any], raw_bytes: bytearray) -> None:
    """``vulkan_graph_serialize.serialize_constant_tensors`` with exact bytes for raw tensors."""
    from executorch.backends.vulkan.serialization.vulkan_graph_schema import VkBytes

    ser = importlib.import_module(_SERIALIZE)
    assert len(vk_graph.constants) == 0
    current_offset = len(raw_bytes)
    for tensor in const_tensors:
        if isinstance(tensor, tuple):
            named_key, size = tensor
            vk_graph.constants.append(VkBytes(offset=_UINT64_MAX, length=size, named_key=named_key))
        elif tensor is None or (isinstance(tensor, torch.Tensor) and tensor.numel() == 0):
            vk_graph.constants.append(VkBytes(current_offset, 0))
        elif isinstance(tensor, torch.Tensor):
            data = tensor_bytes(tensor)
            raw_bytes += data
            raw_bytes += b"\x00" * ser.padding_required(len(data))
            vk_graph.constants.append(VkBytes(current_offset, len(data)))
            current_offset += ser.aligned_size(len(data))
        else:
            raise ValueError(f"Unsupported constant tensor type: {type(tensor)}")


def _patches() -> list[tuple[Any, str, Any]]:
    builder_mod = importlib.import_module(_BUILDER)
    ser = importlib.import_module(_SERIALIZE)
    return [
        (builder_mod.VkGraphBuilder, "maybe_add_constant_tensor", maybe_add_constant_tensor),
        (builder_mod.VkGraphBuilder, "get_or_create_scalar_value", get_or_create_scalar_value),
        (ser, "serialize_constant_tensors", serialize_constant_tensors),
    ]


PATCHES = PatchSet("fusionkit.backends.vulkan_adapter.constant_serializer", _patches,
                    before_install=acquire_named_data_fix,
                    after_uninstall=release_named_data_fix,
                    includes=(SERDE_PATCHES,))


#: the component's trio is the patch set's own methods, as every adapter's (:mod:`.install`)
install = PATCHES.install
uninstall = PATCHES.uninstall
is_installed = PATCHES.is_installed
