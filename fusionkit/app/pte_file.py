"""A ``.pte`` the user names on the command line: read once, or one line saying why not.

``fusionkit check`` and ``fusionkit run`` take a serialized ExecuTorch program. A file
that is not one (a ``.pt2``, a text file, a truncated download) must be a user's
mistake of one line naming the file, not a ``struct.error`` from deep in the flatbuffer
reader; and what the program delegates to (which backends' payloads it holds) is what
``check`` says it read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BACKEND_NAMES", "PteError", "PteFile", "read_pte"]


class PteError(ValueError):
    """The file is not a serialized ExecuTorch program (one line, naming the file)."""


#: delegate ids (``Backend::id`` in the runtime) -> the name the user knows
BACKEND_NAMES: dict[str, str] = {
    "VulkanBackend": "Vulkan",
    "XnnpackBackend": "XNNPACK",
    "TOSABackend": "Arm TOSA",
    "EthosUBackend": "Arm Ethos-U",
    "VgfBackend": "Arm VGF",
    "CoreMLBackend": "Core ML",
    "MPSBackend": "MPS",
    "QnnBackend": "Qualcomm QNN",
}


@dataclass
class PteFile:
    path: str
    data: bytes
    methods: list[str] = field(default_factory=list)
    #: delegate id -> how many delegates of the program have it, in program order
    delegates: Counter[str] = field(default_factory=Counter)

    def backends_text(self) -> str:
        """``2 Vulkan (VulkanBackend), 1 XNNPACK (XnnpackBackend)``, or ``no delegate``."""
        if not self.delegates:
            return "no delegate (every op runs on the portable CPU kernels)"
        return ", ".join(f"{n} {BACKEND_NAMES.get(b, b)}" + (f" ({b})" if b in BACKEND_NAMES else "")
                         for b, n in self.delegates.items())


def _what_it_is(head: bytes) -> str:
    if head.startswith(b"PK"):
        return "a zip archive (a .pt2 saved by torch.export.save? `fusionkit lower` makes a .pte of it)"
    if head[4:8] == b"VH00":
        return "a bare Vulkan delegate payload, not a whole program"
    if not head:
        return "an empty file"
    return "not an ExecuTorch program"


def read_pte(path: str) -> PteFile:
    """The program at ``path`` (a path as the user gave it), or :class:`PteError`."""
    p = Path(path)
    if p.is_dir():
        raise PteError(f"{path}: a directory, not a .pte file")
    if not p.is_file():
        raise PteError(f"{path}: no such file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PteError(f"{path}: cannot read ({e.strerror or e})") from None
    if data[4:6] != b"ET":  # a .pte's flatbuffer file identifier ("ET12", ...)
        raise PteError(f"{path}: {_what_it_is(data[:8])}; expected a .pte")
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        program = deserialize_pte_binary(data).program
    except Exception as e:  # a damaged flatbuffer raises struct.error, IndexError, ...
        raise PteError(f"{path}: a damaged .pte, cannot be read ({type(e).__name__})") from None
    pte = PteFile(path, data, [plan.name for plan in program.execution_plan])
    for plan in program.execution_plan:
        for d in plan.delegates:
            pte.delegates[d.id] += 1
    return pte
