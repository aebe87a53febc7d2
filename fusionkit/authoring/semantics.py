"""What the verifier must be told of a backend: the node metadata its replacements use to
say what a node computes, and the ops whose CPU reference is not what the kernel computes.

Backends register these (their own code, so the core names no backend); the registries are
plain dicts, light to import, read by :mod:`fusionkit.authoring.verify`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "METADATA_SEMANTICS",
    "REFERENCE_IS_NOT_THE_KERNEL",
    "register_metadata_semantics",
    "register_reference_caveat",
]

#: node metadata whose meaning the verifier applies when it runs the rewritten program: the
#: key, and what it does to the node's result (``apply(recorded value, result)``)
METADATA_SEMANTICS: dict[str, Callable[[Any, Any], Any]] = {}

#: backend ops (``namespace.name.overload``) whose registered CPU reference does not
#: compute what the kernel computes from what the rules feed it, and why: a rule is never
#: judged through it
REFERENCE_IS_NOT_THE_KERNEL: dict[str, str] = {}


def register_metadata_semantics(key: str, apply: Callable[[Any, Any], Any]) -> None:
    """Tell the verifier what a node's ``meta[key]`` does to its result."""
    METADATA_SEMANTICS[key] = apply


def register_reference_caveat(op: str, why: str) -> None:
    """Tell the verifier that ``op``'s CPU reference is not its kernel (``why``)."""
    REFERENCE_IS_NOT_THE_KERNEL[op] = why
