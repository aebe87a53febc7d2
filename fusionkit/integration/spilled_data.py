"""A delegate's constant bytes kept in a file until the ``.pte`` is written, not in memory.

Why: a backend's preprocess turns every constant it delegates into bytes in its
``NamedDataStore``, and those bytes live until ``to_executorch`` writes the program: a
second copy of all the weights, held through the rest of the lowering and at its peak
(an fp32 SmolLM2-135M ``export_llm`` on XNNPACK peaks while the last weight is
serialized, 515 MiB of blobs above the program itself). ExecuTorch 1.5 holds a blob either
as bytes or as ``FileBackedData``, a file it owns and streams into the ``.pte`` (its CUDA
backend keeps weights this way). :func:`constant_blob` writes a large constant from the
tensor's own memory straight to such a file, hashing it on the way.

What stays as it was: a blob under :data:`MIN_SPILL_BYTES`; every blob on an ExecuTorch
without ``FileBackedData`` (1.4); every blob when :data:`SPILL_DIR_VARIABLE` is ``off``,
or unset while the temporary directory is in memory (tmpfs); a blob whose file cannot be
written (the bytes are returned instead, nothing left behind). The files go to
:data:`SPILL_DIR_VARIABLE` or the temporary directory, and are removed when the program
holding them is freed or the process exits.

:class:`SpilledBlob` is shared, not copied, by ``copy.deepcopy`` (ExecuTorch copies
lowered modules; a copy owning the same file would delete it under the other), and
pickles as its bytes. :func:`materialized` gives bytes for readers that need them
(ExecuTorch's serde of a lowered module, for an ETRecord).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from fusionkit.integration.hooks import PatchSet
from fusionkit.integration.tensor_bytes import dense_tensor, tensor_nbytes

__all__ = [
    "MIN_SPILL_BYTES",
    "SERDE_PATCHES",
    "SPILL_DIR_VARIABLE",
    "blob_bytes",
    "constant_blob",
    "materialized",
    "spill_supported",
]

#: a directory for the files, or ``off`` to keep every blob in memory
SPILL_DIR_VARIABLE = "FUSIONKIT_SPILL_DIR"
#: blobs smaller than this stay bytes (a file per bias or scale is not worth it)
MIN_SPILL_BYTES = 1 << 20
_CHUNK = 8 << 20
_CORD = "executorch.exir._serialize._cord"
_SERDE = "executorch.exir.serde.serialize"
_NDS = "executorch.exir._serialize._named_data_store"

_blob_class: Any = None


def _file_backed_class() -> Any:
    """ExecuTorch's ``FileBackedData`` when its NamedDataStore takes it, else None."""
    try:
        cord = importlib.import_module(_CORD)
        nds = importlib.import_module(_NDS)
    except ImportError:
        return None
    cls = getattr(cord, "FileBackedData", None)
    if cls is None or getattr(nds, "FileBackedData", None) is not cls:
        return None
    return cls if callable(getattr(cls, "move_from", None)) else None


def _spilled_blob_class() -> Any:
    global _blob_class
    if _blob_class is None:
        base = _file_backed_class()
        if base is None:
            return None

        class SpilledBlob(base):  # type: ignore[misc, valid-type]
            """A constant's bytes in a file this process owns (see the module's doc)."""

            def __deepcopy__(self, memo: dict[int, Any]) -> Any:
                return self

            def __copy__(self) -> Any:
                return self

            def __reduce__(self) -> Any:
                return (bytes, (self.to_bytes(),))

        _blob_class = SpilledBlob
    return _blob_class


def spill_supported() -> bool:
    """Whether the installed ExecuTorch can hold a blob as a file."""
    return _spilled_blob_class() is not None


def _spill_dir() -> str | None:
    """Where files go: the variable's directory, else the temporary directory unless it is
    in memory (a file in tmpfs is RAM still, only no longer the process's)."""
    chosen = os.environ.get(SPILL_DIR_VARIABLE, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return chosen
    default = tempfile.gettempdir()
    return None if _in_memory_filesystem(default) else default


_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})


@functools.lru_cache(maxsize=16)
def _in_memory_filesystem(path: str) -> bool:
    """Whether ``path`` lies on a filesystem held in memory (Linux's mount table; False
    where there is none to read). Read once per path: it is asked for every large constant."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        return False
    real = os.path.realpath(path)
    best, kind = "", ""
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind in _MEMORY_FILESYSTEMS


def constant_blob(t: torch.Tensor, *, dim_order: Sequence[int] | None = None) -> tuple[Any, str]:
    """The tensor's own bytes (exactly :func:`tensor_bytes`' ``(t, dim_order)``) as a
    NamedDataStore blob, and the hex SHA-256 of those bytes.

    The blob is a :class:`SpilledBlob` file for a large constant where ExecuTorch takes
    one, else ``bytes``."""
    dense = dense_tensor(t, dim_order=dim_order)
    n = tensor_nbytes(dense)
    cls = _spilled_blob_class() if n >= MIN_SPILL_BYTES else None
    directory = _spill_dir() if cls is not None else None
    if cls is not None and directory is not None:
        blob = _write(cls, dense, n, directory)
        if blob is not None:
            return blob, blob.sha256().hex()
    data = ctypes.string_at(dense.data_ptr(), n) if n else b""
    return data, hashlib.sha256(data).hexdigest()


def _write(cls: Any, dense: torch.Tensor, n: int, directory: str) -> Any:
    """The file blob of ``dense``'s ``n`` bytes, or None (and no file) if it cannot be
    written."""
    path = None
    try:
        fd, path = tempfile.mkstemp(prefix=".fusionkit_", suffix=".blob", dir=directory)
        digest = hashlib.sha256()
        view = memoryview((ctypes.c_ubyte * n).from_address(dense.data_ptr())).cast("B")
        with os.fdopen(fd, "wb") as out:
            for start in range(0, n, _CHUNK):
                chunk = view[start:start + _CHUNK]
                digest.update(chunk)
                out.write(chunk)
        del view
        blob = cls.move_from(path, sha256=digest.digest())
        path = None
        return blob
    except (OSError, ValueError):
        return None
    finally:
        if path is not None:
            try:
                os.remove(path)
            except OSError:
                pass


def _in_memory(blob: Any) -> bool:
    """Whether a NamedDataStore blob is bytes held in memory (not a file)."""
    return isinstance(blob, (bytes, bytearray, memoryview))


def blob_bytes(blob: Any) -> bytes:
    """A NamedDataStore blob's bytes, whether it is held in memory or in a file."""
    if _in_memory(blob):
        return bytes(blob)
    to_bytes = getattr(blob, "to_bytes", None)
    if callable(to_bytes):
        return bytes(to_bytes())
    raise TypeError(f"not a NamedDataStore blob: {type(blob).__name__}")


def materialized(buffers: list[Any]) -> list[Any]:
    """``buffers`` with every file blob read into bytes (the same list when none is)."""
    if all(_in_memory(b) for b in buffers):
        return buffers
    return [b if _in_memory(b) else blob_bytes(b) for b in buffers]


# ----------------------------------------------------------------------------- serde


def _serialize_lowered_module(self: Any, lowered_module_arg: Any) -> Any:
    """ExecuTorch's ``GraphModuleSerializer.serialize_lowered_module`` (JSON, for an
    ETRecord), with the lowered module's file blobs read into bytes for the call."""
    cls = importlib.import_module(_SERDE).GraphModuleSerializer
    original = SERDE_PATCHES.original(cls, "serialize_lowered_module")
    owner = getattr(lowered_module_arg.graph, "owning_module", None)
    lowered = getattr(owner, str(lowered_module_arg.target), None)
    out: Any = getattr(lowered, "named_data_store_output", None)
    saved = getattr(out, "buffers", None)
    read = materialized(saved) if isinstance(saved, list) else saved
    if out is None or read is saved:
        return original(self, lowered_module_arg)
    out.buffers = read
    try:
        return original(self, lowered_module_arg)
    finally:
        out.buffers = saved


def _serde_patches() -> list[tuple[Any, str, Any]]:
    if not spill_supported():
        return []
    cls = importlib.import_module(_SERDE).GraphModuleSerializer
    return [(cls, "serialize_lowered_module", _serialize_lowered_module)]


#: what lets ExecuTorch's serde write a lowered module holding file blobs; a serializer
#: that makes them includes it
SERDE_PATCHES = PatchSet("fusionkit.integration.spilled_data", _serde_patches)
