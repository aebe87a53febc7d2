"""Python values <-> YAML data, by the Python type a parameter declares.

One translation serves every vocabulary term: a ``torch.dtype`` is written by
name (``int8``), a set of dtypes or ints as a sorted list, a function as the
importable reference ``package.module:attr`` (imported only with consent, see
:mod:`fusionkit.specs.trust`), and a literal of any type as itself, a dtype
inside it as ``{dtype: int8}``.
"""

from __future__ import annotations

import collections.abc
import functools
import keyword
import operator
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import torch
from pydantic import AfterValidator, Field, WithJsonSchema

__all__ = [
    "DTYPES",
    "CaptureName",
    "DtypeName",
    "PyRef",
    "decode_literal",
    "encode_literal",
    "from_yaml",
    "is_python_ref",
    "to_yaml",
    "yaml_type",
]

#: every torch dtype, by the name YAML uses (``float32``, ``int8``, ...)
DTYPES: dict[str, torch.dtype] = {
    name: v for name, v in vars(torch).items() if isinstance(v, torch.dtype) and not name.startswith("_")
}
_DTYPE_NAME: dict[torch.dtype, str] = {}
for _n, _d in sorted(DTYPES.items(), key=lambda kv: (kv[0] != str(kv[1]).removeprefix("torch."), kv[0])):
    _DTYPE_NAME.setdefault(_d, _n)  # the canonical name first (float32, not float)

CaptureName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


def _dtype_name(v: str) -> str:
    if v not in DTYPES:
        raise ValueError(f"{v!r} is not a torch dtype")
    return v


DtypeName = Annotated[str, AfterValidator(_dtype_name),
                      WithJsonSchema({"type": "string", "enum": sorted(DTYPES)})]
_REF = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
PyRef = Annotated[str, Field(pattern=_REF, description="importable Python object: package.module:attr "
                                                       "(imported only with --trust / --allow-module)")]


class CodecError(ValueError):
    """A value with no YAML form, or YAML data that is no value of the declared type."""


def is_python_ref(ref: str) -> bool:
    """``package.module:attr`` made of identifiers that are not keywords (checked without importing)."""
    if not re.match(_REF, ref):
        return False
    return not any(keyword.iskeyword(p) for p in re.split(r"[.:]", ref))


def dtype_name(d: torch.dtype) -> str:
    return _DTYPE_NAME[d]


# ------------------------------------------------------------------------- literals

def encode_literal(v: Any) -> Any:
    """A literal argument as YAML data (tuples become lists, dtypes ``{dtype: name}``)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, (list, tuple)):
        return [encode_literal(x) for x in v]
    raise CodecError(f"the literal {v!r} ({type(v).__name__}) has no YAML form")


def decode_literal(v: Any) -> Any:
    """Inverse of :func:`encode_literal`."""
    if isinstance(v, dict):
        if set(v) == {"dtype"} and v["dtype"] in DTYPES:
            return DTYPES[v["dtype"]]
        raise CodecError(f"a mapping inside a literal must be {{dtype: NAME}}, got {v!r}")
    if isinstance(v, list):
        return [decode_literal(x) for x in v]
    return v


def has_mapping(v: Any) -> bool:
    if isinstance(v, dict):
        return True
    return isinstance(v, list) and any(has_mapping(x) for x in v)


# ------------------------------------------------------------------ declared types

def _parts(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    return typing.get_origin(hint), typing.get_args(hint)


def _optional(hint: Any) -> Any | None:
    origin, args = _parts(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return functools.reduce(operator.or_, rest)
    return None


_COLLECTIONS = (frozenset, set, list, tuple, collections.abc.Iterable, collections.abc.Sequence,
                collections.abc.Set)


def _element(hint: Any) -> Any | None:
    origin, args = _parts(hint)
    if origin in _COLLECTIONS:
        return args[0] if args else Any
    return None


def yaml_type(hint: Any, capture: bool = False) -> Any:
    """The YAML-side (pydantic) type of a parameter declared ``hint`` in Python."""
    inner = _optional(hint)
    if inner is not None:
        return yaml_type(inner, capture) | None
    if hint is Any:
        return Any
    if hint is torch.dtype:
        return DtypeName
    if hint is str:
        return CaptureName if capture else str
    if hint in (bool, int, float):
        return hint
    if _parts(hint)[0] is collections.abc.Callable or hint is Callable:
        return PyRef
    elem = _element(hint)
    if elem is not None:
        return list[yaml_type(elem, capture)]  # type: ignore[misc]
    raise TypeError(f"no YAML form for parameters of type {hint!r}")


def from_yaml(hint: Any, v: Any, resolve: Callable[[str], Any]) -> Any:
    """A validated YAML value as the Python argument ``hint`` declares."""
    if v is None:
        return None
    inner = _optional(hint)
    if inner is not None:
        return from_yaml(inner, v, resolve)
    if hint is Any:
        return decode_literal(v)
    if hint is torch.dtype:
        return DTYPES[v]
    if _parts(hint)[0] is collections.abc.Callable or hint is Callable:
        return resolve(v)
    elem = _element(hint)
    if elem is not None:
        items = [from_yaml(elem, x, resolve) for x in v]
        origin = _parts(hint)[0]
        return frozenset(items) if origin in (frozenset, set, collections.abc.Set) else tuple(items)
    return v


def to_yaml(hint: Any, v: Any, ref_of: Callable[[Any], str]) -> Any:
    """A Python argument as YAML data (inverse of :func:`from_yaml`)."""
    if v is None:
        return None
    inner = _optional(hint)
    if inner is not None:
        return to_yaml(inner, v, ref_of)
    if hint is Any:
        return encode_literal(v)
    if hint is torch.dtype:
        return dtype_name(v)
    if _parts(hint)[0] is collections.abc.Callable or hint is Callable:
        return ref_of(v)
    elem = _element(hint)
    if elem is not None:
        items = [to_yaml(elem, x, ref_of) for x in v]
        if isinstance(v, (set, frozenset)):
            items.sort(key=lambda x: (str(type(x)), x))
        return items
    return v
