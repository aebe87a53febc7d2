"""An ExportedProgram pass that gives every constant a storage of its own.

``CompactConstantsPass`` replaces each constant (parameter, buffer, lifted tensor
constant) that does not own its storage exactly – a view at a storage offset, a
view that leaves part of a bigger storage unused, a transposed or otherwise
non-dense tensor – by a compact copy with the same values. A dense
channels_last tensor stays channels_last; anything else becomes C-contiguous.
The placeholder's ``meta["val"]`` is given the new strides.

It works on ATen or edge programs and drops into any backend's
``to_edge_transform_and_lower(transform_passes=[...])``; afterwards even a
serializer that copies ``untyped_storage()`` from byte 0 writes the right bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export import ExportedProgram

from fusionkit.integration.tensor_bytes import (
    dense_dim_order,
    owns_storage_exactly,
    storage_nbytes,
    tensor_nbytes,
)

__all__ = ["CompactConstantsPass", "CompactedConstant", "compact_tensor", "is_compact"]


@dataclass(frozen=True)
class CompactedConstant:
    """One constant the pass replaced."""

    target: str  # key in state_dict / constants
    where: str  # "state_dict" or "constants"
    shape: tuple[int, ...]
    dtype: torch.dtype
    storage_offset: int  # in elements, before
    storage_nbytes_before: int
    nbytes_after: int


def is_compact(t: torch.Tensor, *, keep_channels_last: bool = False) -> bool:
    """Owns its storage exactly, C-contiguous (or channels_last if ``keep_channels_last``)."""
    if not owns_storage_exactly(t):
        return False
    return keep_channels_last or t.is_contiguous()


def compact_tensor(t: torch.Tensor, *, keep_channels_last: bool = False) -> torch.Tensor:
    """A copy of ``t`` that owns its storage exactly: C-contiguous, or channels_last kept."""
    order = dense_dim_order(t)
    if keep_channels_last and order is not None and order != tuple(range(t.dim())):
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        out = t.detach().clone(memory_format=fmt)
    else:
        out = t.detach().clone(memory_format=torch.contiguous_format)
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=t.requires_grad)
    return out


def _placeholders_by_target(ep: ExportedProgram) -> dict[str, list[torch.fx.Node]]:
    names: dict[str, list[str]] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.target is not None and hasattr(spec.arg, "name"):
            names.setdefault(spec.target, []).append(spec.arg.name)
    by_name = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    return {t: [by_name[n] for n in ns if n in by_name] for t, ns in names.items()}


def _restride_meta(node: torch.fx.Node, new: torch.Tensor) -> None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or tuple(val.stride()) == tuple(new.stride()):
        return
    fake_mode = getattr(val, "fake_mode", None)
    if fake_mode is None:
        return
    try:
        with fake_mode:
            node.meta["val"] = torch.empty_strided(
                tuple(val.shape), tuple(new.stride()), dtype=val.dtype, device=val.device
            )
    except Exception:  # meta is advisory; leave it if the fake mode refuses
        pass


class CompactConstantsPass(ExportedProgramPassBase):
    """Compacts every constant of the program that does not own its storage exactly."""

    def __init__(self, keep_channels_last: bool = False) -> None:
        self.keep_channels_last = keep_channels_last
        #: constants replaced by the most recent run
        self.compacted: list[CompactedConstant] = []

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        ep = exported_program
        self.compacted = []
        placeholders = _placeholders_by_target(ep)
        for where, table in (("state_dict", ep.state_dict), ("constants", ep.constants)):
            for target, t in list(table.items()):
                if not isinstance(t, torch.Tensor) or is_compact(
                    t, keep_channels_last=self.keep_channels_last
                ):
                    continue
                new = compact_tensor(t, keep_channels_last=self.keep_channels_last)
                table[target] = new  # type: ignore[index]
                for node in placeholders.get(target, []):
                    _restride_meta(node, new)
                self.compacted.append(
                    CompactedConstant(
                        target=target,
                        where=where,
                        shape=tuple(t.shape),
                        dtype=t.dtype,
                        storage_offset=int(t.storage_offset()),
                        storage_nbytes_before=storage_nbytes(t),
                        nbytes_after=tensor_nbytes(new),
                    )
                )
        return ExportedProgramPassResult(ep, bool(self.compacted))

    def __repr__(self) -> str:
        return f"CompactConstantsPass(keep_channels_last={self.keep_channels_last})"
