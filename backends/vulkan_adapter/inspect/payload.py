"""Decode an ExecuTorch Vulkan delegate payload into typed dataclasses.

A payload is a ``VulkanDelegateHeader`` ("VH00"), a ``VkGraph`` flatbuffer
("VK00", schema ``executorch/backends/vulkan/serialization/schema.fbs``) and a
raw-bytes section. This reader walks the flatbuffer directly with the generic
table API of the ``flatbuffers`` package: no ``flatc``, no JSON. ExecuTorch's
own reader (``flatbuffer_to_vk_graph``) goes through flatc's JSON output, which
prints infinite doubles as bare ``inf`` that Python's JSON parser rejects, so it
fails on payloads holding e.g. the ``-inf`` fill value of an attention mask;
this one decodes them as ``float('-inf')``.

Field slot ``i`` of a table sits at vtable offset ``4 + 2*i``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import flatbuffers
from flatbuffers import number_types as N
from flatbuffers.table import Table

__all__ = [
    "VK_DTYPE_NAMES",
    "VK_DTYPE_SIZES",
    "OperatorCall",
    "PayloadError",
    "VkBytes",
    "VkGraph",
    "VkTensor",
    "VkValue",
    "VulkanDelegateHeader",
    "VulkanPayload",
    "decode_payload",
    "decode_vkgraph",
    "read_header",
]

HEADER_MAGIC = b"VH00"
HEADER_LENGTH = 30
GRAPH_IDENTIFIER = b"VK00"
#: ``VkBytes.offset`` of a constant stored in the program's named data, not the payload
NAMED_DATA_OFFSET = 2**64 - 1

#: union ``GraphTypes`` member names by type id (0 is NONE)
UNION_TYPES: dict[int, str] = {
    0: "NONE", 1: "Null", 2: "Int", 3: "Double", 4: "Bool", 5: "VkTensor",
    6: "IntList", 7: "DoubleList", 8: "BoolList", 9: "ValueList", 10: "String", 11: "SymInt",
}
VK_DTYPE_NAMES: dict[int, str] = {
    0: "BOOL", 1: "UINT8", 2: "INT8", 3: "INT32", 4: "FLOAT16", 5: "FLOAT32",
    6: "FLOAT64", 7: "INT64", 127: "UNSET",
}
VK_DTYPE_SIZES: dict[int, int] = {0: 1, 1: 1, 2: 1, 3: 4, 4: 2, 5: 4, 6: 8, 7: 8}


class PayloadError(ValueError):
    """The bytes are not a well-formed Vulkan delegate payload."""


# ------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class VulkanDelegateHeader:
    flatbuffer_offset: int
    flatbuffer_size: int
    bytes_offset: int
    bytes_size: int


@dataclass(frozen=True)
class OperatorCall:
    """One op of the chain: ``args`` are value ids (inputs, then the output)."""

    node_id: int
    name: str
    args: tuple[int, ...]


@dataclass(frozen=True)
class VkTensor:
    datatype: int
    dims: tuple[int, ...]
    #: index into ``VkGraph.constants``; negative for a runtime tensor
    constant_id: int
    mem_obj_id: int
    storage_type: int = 255
    memory_layout: int = 255
    staging_datatype: int = 127

    @property
    def is_constant(self) -> bool:
        """A constant the runtime turns into a TensorRef (what prepacking requires)."""
        return self.constant_id >= 0

    @property
    def dtype_name(self) -> str:
        return VK_DTYPE_NAMES.get(self.datatype, f"?{self.datatype}")

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int | None:
        size = VK_DTYPE_SIZES.get(self.datatype)
        return None if size is None else size * self.numel


@dataclass(frozen=True)
class VkValue:
    """One entry of ``VkGraph.values``: ``kind`` is the union member name.

    ``value`` is None (Null/NONE), an int, float, bool, str, a :class:`VkTensor`,
    or a tuple (IntList, DoubleList, BoolList, ValueList of value ids).
    """

    kind: str
    value: Any = None

    @property
    def tensor(self) -> VkTensor | None:
        return self.value if isinstance(self.value, VkTensor) else None


@dataclass(frozen=True)
class VkBytes:
    offset: int
    length: int
    named_key: str = ""

    @property
    def in_named_data(self) -> bool:
        return self.offset == NAMED_DATA_OFFSET


@dataclass(frozen=True)
class VkGraph:
    version: str
    chain: tuple[OperatorCall, ...]
    values: tuple[VkValue, ...]
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    constants: tuple[VkBytes, ...]
    shaders: tuple[VkBytes, ...]
    storage_type_override: int = 255
    memory_layout_override: int = 255

    def value(self, value_id: int) -> VkValue | None:
        return self.values[value_id] if 0 <= value_id < len(self.values) else None

    def op_names(self) -> list[str]:
        return [c.name for c in self.chain]


@dataclass(frozen=True)
class VulkanPayload:
    header: VulkanDelegateHeader
    graph: VkGraph
    raw: bytes


# ----------------------------------------------------------------------- reader


def _slot(i: int) -> int:
    return 4 + 2 * i


def _scalar(tab: Table, i: int, flags: Any, default: Any) -> Any:
    o = tab.Offset(_slot(i))
    return tab.Get(flags, tab.Pos + o) if o else default


def _string(tab: Table, i: int, default: str = "") -> str:
    o = tab.Offset(_slot(i))
    if not o:
        return default
    raw = tab.String(tab.Pos + o)
    return bytes(raw).decode("utf-8", errors="replace")


def _scalar_vec(tab: Table, i: int, flags: Any) -> tuple[Any, ...]:
    o = tab.Offset(_slot(i))
    if not o:
        return ()
    start, n = tab.Vector(o), tab.VectorLen(o)
    if start + n * flags.bytewidth > len(tab.Bytes):
        raise PayloadError("a vector runs past the end of the flatbuffer")
    return tuple(tab.Get(flags, start + k * flags.bytewidth) for k in range(n))


def _table_vec(tab: Table, i: int) -> list[Table]:
    o = tab.Offset(_slot(i))
    if not o:
        return []
    start, n = tab.Vector(o), tab.VectorLen(o)
    if start + 4 * n > len(tab.Bytes):
        raise PayloadError("a table vector runs past the end of the flatbuffer")
    return [Table(tab.Bytes, tab.Indirect(start + 4 * k)) for k in range(n)]


def _decode_tensor(t: Table) -> VkTensor:
    return VkTensor(
        datatype=_scalar(t, 0, N.Int8Flags, 0),
        dims=_scalar_vec(t, 1, N.Uint32Flags),
        constant_id=_scalar(t, 2, N.Int32Flags, 0),
        mem_obj_id=_scalar(t, 3, N.Int32Flags, 0),
        storage_type=_scalar(t, 4, N.Uint8Flags, 255),
        memory_layout=_scalar(t, 5, N.Uint8Flags, 255),
        staging_datatype=_scalar(t, 6, N.Int8Flags, 127),
    )


def _decode_value(vt: Table) -> VkValue:
    utype = _scalar(vt, 0, N.Uint8Flags, 0)
    kind = UNION_TYPES.get(utype, f"?{utype}")
    o = vt.Offset(_slot(1))
    if not o or kind in ("NONE", "Null"):
        return VkValue(kind)
    t = Table(vt.Bytes, 0)
    vt.Union(t, o)
    if kind == "Int":
        return VkValue(kind, _scalar(t, 0, N.Int64Flags, 0))
    if kind == "Double":
        return VkValue(kind, float(_scalar(t, 0, N.Float64Flags, 0.0)))
    if kind == "Bool":
        return VkValue(kind, bool(_scalar(t, 0, N.BoolFlags, False)))
    if kind == "VkTensor":
        return VkValue(kind, _decode_tensor(t))
    if kind == "IntList":
        return VkValue(kind, _scalar_vec(t, 0, N.Int64Flags))
    if kind == "DoubleList":
        return VkValue(kind, tuple(float(v) for v in _scalar_vec(t, 0, N.Float64Flags)))
    if kind == "BoolList":
        return VkValue(kind, tuple(bool(v) for v in _scalar_vec(t, 0, N.BoolFlags)))
    if kind == "ValueList":
        return VkValue(kind, _scalar_vec(t, 0, N.Int32Flags))
    if kind == "String":
        return VkValue(kind, _string(t, 0))
    if kind == "SymInt":
        return VkValue(kind, _scalar(t, 0, N.Int32Flags, 0))
    return VkValue(kind)


def _decode_bytes(t: Table) -> VkBytes:
    return VkBytes(
        offset=_scalar(t, 0, N.Uint64Flags, 0),
        length=_scalar(t, 1, N.Uint64Flags, 0),
        named_key=_string(t, 2),
    )


def decode_vkgraph(fb: bytes) -> VkGraph:
    """Decode a ``VK00`` VkGraph flatbuffer."""
    if len(fb) < 8 or bytes(fb[4:8]) != GRAPH_IDENTIFIER:
        raise PayloadError(f"not a VkGraph flatbuffer (identifier {bytes(fb[4:8])!r}, "
                           f"expected {GRAPH_IDENTIFIER!r})")
    buf = bytearray(fb)
    try:
        root = flatbuffers.encode.Get(N.UOffsetTFlags.packer_type, buf, 0)
        g = Table(buf, root)
        return VkGraph(
            version=_string(g, 0),
            chain=tuple(
                OperatorCall(_scalar(c, 0, N.Uint32Flags, 0), _string(c, 1),
                             _scalar_vec(c, 2, N.Int32Flags))
                for c in _table_vec(g, 1)
            ),
            values=tuple(_decode_value(v) for v in _table_vec(g, 2)),
            input_ids=_scalar_vec(g, 3, N.Uint32Flags),
            output_ids=_scalar_vec(g, 4, N.Uint32Flags),
            constants=tuple(_decode_bytes(b) for b in _table_vec(g, 5)),
            shaders=tuple(_decode_bytes(b) for b in _table_vec(g, 6)),
            storage_type_override=_scalar(g, 7, N.Uint8Flags, 255),
            memory_layout_override=_scalar(g, 8, N.Uint8Flags, 255),
        )
    except PayloadError:
        raise
    except Exception as e:  # struct errors / out-of-range reads of a corrupt buffer
        raise PayloadError(f"corrupt VkGraph flatbuffer: {e}") from e


def read_header(payload: bytes) -> VulkanDelegateHeader:
    if len(payload) < HEADER_LENGTH or bytes(payload[4:8]) != HEADER_MAGIC:
        raise PayloadError(f"not a Vulkan delegate payload (magic {bytes(payload[4:8])!r}, "
                           f"expected {HEADER_MAGIC!r})")
    length = int.from_bytes(payload[8:10], "little")
    if length != HEADER_LENGTH:
        raise PayloadError(f"Vulkan delegate header is {length} bytes, expected {HEADER_LENGTH}")
    header = VulkanDelegateHeader(
        flatbuffer_offset=int.from_bytes(payload[10:14], "little"),
        flatbuffer_size=int.from_bytes(payload[14:18], "little"),
        bytes_offset=int.from_bytes(payload[18:22], "little"),
        bytes_size=int.from_bytes(payload[22:30], "little"),
    )
    if header.flatbuffer_offset + header.flatbuffer_size > len(payload):
        raise PayloadError("the VkGraph flatbuffer runs past the end of the payload")
    if header.bytes_offset + header.bytes_size > len(payload):
        raise PayloadError("the raw-bytes section runs past the end of the payload")
    return header


def decode_payload(payload: bytes) -> VulkanPayload:
    """Decode a whole delegate payload (``LoweredBackendModule.processed_bytes``)."""
    header = read_header(payload)
    fb = payload[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size]
    raw = payload[header.bytes_offset:header.bytes_offset + header.bytes_size]
    return VulkanPayload(header, decode_vkgraph(bytes(fb)), bytes(raw))
