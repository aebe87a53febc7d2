"""Which shader the Vulkan runtime looks up for a binary op, and whether it has it.

The runtime composes a binary op's shader name from the op, the output's storage and the
input's dtype (``BinaryOp.cpp``); ``binary_op_texture.yaml`` names some variants
differently, so some names are never found (an int32 ``eq``). Shared by the simulator
and :func:`~.prepack_check.check` (both ask a probed shader registry).
"""

from __future__ import annotations

from typing import Any

__all__ = ["missing_shader"]

#: BinaryOp.cpp: serialized op -> the op_name its shader name is composed from
_BINARY_SHADER_OPS: dict[str, str] = {
    "aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul",
    "aten.div.Tensor": "div", "aten.div.Tensor_mode": "floor_divide",
    "aten.pow.Tensor_Tensor": "pow", "aten.minimum.default": "minimum",
    "aten.eq.Tensor": "eq", "aten.lt.Tensor": "lt", "aten.le.Tensor": "le",
    "aten.gt.Tensor": "gt", "aten.ge.Tensor": "ge", "aten.bitwise_and.Tensor": "bitwise_and",
    "aten.logical_and.default": "bitwise_and", "aten.bitwise_or.Tensor": "bitwise_or",
    "aten.logical_or.default": "bitwise_or",
}
#: ShaderNameUtils.cpp add_storage_type_suffix / add_dtype_suffix, by VkGraph enum value
#: (an unset storage is the graph's default, texture3d; int64 tensors are int32 on Vulkan)
_STORAGE_SUFFIX = {0: "_buffer", 1: "_texture3d", 2: "_texture2d"}
_DTYPE_SUFFIX = {0: "_uint8", 1: "_uint8", 2: "_int8", 3: "_int32", 4: "_half", 5: "_float",
                 6: "_double", 7: "_int32"}


def missing_shader(name: str, out: Any, in1: Any, shaders: frozenset[str] | set[str],
                   storage_override: int = 255) -> str | None:
    """The shader name the runtime composes for binary op ``name`` with these tensors
    (VkTensor metadata), when ``shaders`` (a probed registry) lacks it; else None."""
    fn = _BINARY_SHADER_OPS.get(name)
    if fn is None or out is None or in1 is None:
        return None
    storage = out.storage_type if out.storage_type != 255 else storage_override
    shader = (f"binary_{fn}{_STORAGE_SUFFIX.get(storage, '_texture3d')}"
              f"{_DTYPE_SUFFIX.get(in1.datatype, '')}")
    return None if shader in shaders else shader
