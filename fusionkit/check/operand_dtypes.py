"""The dtypes a backend's op takes, operand by operand, as the backend declares them.

An op's schema says ``Tensor x``, not which dtypes the kernel behind it reads: the
Vulkan runtime's ``linear_q8ta_q8csw`` quantizes a *float* activation itself
(``QuantizedLinear.cpp`` names it ``fp_input``); handed the int8 tensor, the program
lowers and serializes, then the runtime aborts at load on a shader it does not have
(``clone_buffer_to_image_int8_int32``). Only the backend knows such facts, so it declares
them (:func:`fusionkit.register_delegate`'s ``operand_dtypes``, as ExecuTorch's own
``to_edge`` verifier has a dtype table per ATen op), and the core judges every op a
replacement creates by them before the program changes
(:class:`~fusionkit.find.executable.ReplacementCheck`, step ``executable``): a rule
never has to repeat the check, and a rule that forgets it cannot make the op anyway.

The same table serves the backend's static tools (a ``check()`` of a payload, a
simulator), through :func:`violations`, so what they report and what the finder
declines are one fact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch.fx import Node

from fusionkit.targets import op_key

__all__ = ["OPERAND_DTYPES", "OperandDtypes", "dtype_names", "operand_dtype_refusal",
           "register_operand_dtypes", "violations"]


@dataclass(frozen=True)
class OperandDtypes:
    """What one operand of one op must be: one of ``dtypes`` (``backend`` says so, ``why``)."""

    op: str
    arg: str
    dtypes: frozenset[torch.dtype]
    backend: str
    why: str = ""

    def allows(self, dtype: Any) -> bool:
        return not isinstance(dtype, torch.dtype) or dtype in self.dtypes


_TABLE: dict[str, dict[str, OperandDtypes]] = {}
#: op key (``ns.op.overload``) -> schema argument name -> what it must be
OPERAND_DTYPES: Mapping[str, Mapping[str, OperandDtypes]] = MappingProxyType(_TABLE)


def register_operand_dtypes(backend: str, table: Mapping[str, Mapping[str, Any]]) -> None:
    """Declare, for each op key, the dtypes each named tensor argument may have.

    ``table``: ``{"ns.op.overload": {"arg": (dtypes, why)}}`` (or just ``dtypes``).
    A later declaration of the same op and argument replaces the earlier one.
    """
    for op, args in table.items():
        entries = _TABLE.setdefault(op, {})
        for arg, spec in args.items():
            if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], str):
                dtypes, why = spec
            else:
                dtypes, why = spec, ""
            entries[arg] = OperandDtypes(op, arg, frozenset(dtypes), backend, why)


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " / ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def violations(op: str, dtypes: Mapping[str, Any]) -> list[tuple[OperandDtypes, torch.dtype]]:
    """The declared operands of ``op`` whose dtype (schema argument name -> dtype; missing
    or None: unknown, not judged) is not one the op takes, each with the dtype found."""
    out = []
    for arg, entry in OPERAND_DTYPES.get(op, {}).items():
        got = dtypes.get(arg)
        if isinstance(got, torch.dtype) and not entry.allows(got):
            out.append((entry, got))
    return out


def _operands(node: Node) -> dict[str, Any]:
    """Schema argument name -> the argument as the node holds it (a node or a literal)."""
    schema: Any = getattr(node.target, "_schema", None) or getattr(
        getattr(node.target, "_op", None), "_schema", None)
    if schema is None:
        return {}
    out: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif i < len(node.args) and not arg.kwarg_only:
            out[arg.name] = node.args[i]
    return out


def operand_dtype_refusal(node: Node) -> str | None:
    """Why ``node``'s op cannot take one of its operands' dtype (its backend's table), or
    None. The reason names the op, the argument, the operand node and both dtypes."""
    key = op_key(node.target) if node.op == "call_function" else None
    if key is None or key not in OPERAND_DTYPES:
        return None
    operands = _operands(node)
    dtypes = {name: getattr(v.meta.get("val"), "dtype", None)
              for name, v in operands.items() if isinstance(v, Node)}
    bad = violations(key, dtypes)
    if not bad:
        return None
    entry, got = bad[0]
    operand = operands[entry.arg]
    why = f" ({entry.why})" if entry.why else ""
    return (f"{key} takes {entry.arg!r} as {dtype_names(entry.dtypes)} only{why}, but it "
            f"would be given `{operand.name}`, {str(got).removeprefix('torch.')} "
            f"({entry.backend} declares the op's operand dtypes)")
