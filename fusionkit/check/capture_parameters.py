"""Captures as parameters: a check or replacement says what it reads by its signature.

``def check(ctx, x, weight, bias=None)`` reads the captures ``x``, ``weight``
and ``bias``: the parameters after the first (the context, or the rewriter)
are capture names, and the signature is the only place they are written.
A parameter with a default is *optional*: it receives the default when the
match did not bind that capture (an alternative of the pattern without it).

A rule validates the parameters against its pattern when it is built
(:class:`~fusionkit.rule.Rule`), so a check can never ask for a capture that
does not exist; :class:`DeclaredCaptures` makes sure it reads no other.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CaptureParameters", "DeclaredCaptures", "UnboundCapture", "UndeclaredCapture"]

_REQUIRED = object()


class UndeclaredCapture(LookupError):
    """A check read a capture that is not among its parameters (the signature is the list)."""


class UnboundCapture(LookupError):
    """A parameter without a default named a capture this match did not bind."""


def _label(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


@dataclass(frozen=True)
class CaptureParameters:
    """The capture parameters of one function: names in order, and which are optional."""

    #: ``module.qualname`` of the function, for messages
    owner: str
    names: tuple[str, ...]
    #: parameter name -> its default (the optional ones)
    defaults: Mapping[str, Any]

    @classmethod
    def of(cls, fn: Callable[..., Any], first: str) -> CaptureParameters:
        """The parameters of ``fn`` after its first, which takes ``first`` (e.g. "the CheckContext").

        Raises TypeError for a signature that hides what it reads (``*args``,
        ``**kwargs``, positional-only captures) or has no first parameter.
        """
        owner = _label(fn)
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError) as e:
            raise TypeError(f"{owner}: cannot read its signature ({e})") from None
        if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"{owner}: its first parameter must take {first}")
        names: list[str] = []
        defaults: dict[str, Any] = {}
        for p in params[1:]:
            if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise TypeError(f"{owner}: parameter {p.name!r} is variadic; list each capture "
                                "it reads as a parameter of its own")
            if p.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise TypeError(f"{owner}: capture parameter {p.name!r} is positional-only; "
                                "captures are passed by name")
            names.append(p.name)
            if p.default is not inspect.Parameter.empty:
                defaults[p.name] = p.default
        return cls(owner, tuple(names), defaults)

    @property
    def required(self) -> tuple[str, ...]:
        """The parameters without a default: captures every match must bind."""
        return tuple(n for n in self.names if n not in self.defaults)

    def arguments(self, captures: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments for one match's ``captures``."""
        out: dict[str, Any] = {}
        for n in self.names:
            v = captures.get(n, _REQUIRED)
            if v is _REQUIRED:
                v = self.defaults.get(n, _REQUIRED)
                if v is _REQUIRED:
                    raise UnboundCapture(f"{self.owner}: capture {n!r} is not bound in this "
                                         "match; give the parameter a default")
            out[n] = v
        return out


class DeclaredCaptures(Mapping[str, Any]):
    """A match's captures as a check sees them: only those its parameters name.

    Reading any other capture (``ctx.captures["w"]``, ``ctx.val("w")``) raises
    :class:`UndeclaredCapture` instead of quietly working, so the signature
    cannot drift from the code.
    """

    __slots__ = ("_captures", "_names", "_owner")

    def __init__(self, captures: Mapping[str, Any], names: tuple[str, ...], owner: str) -> None:
        self._captures, self._names, self._owner = captures, frozenset(names), owner

    def _declared(self, key: str) -> None:
        if key not in self._names:
            raise UndeclaredCapture(f"{self._owner} reads capture {key!r}, which is not one of "
                                    f"its parameters {sorted(self._names)}; add it to the "
                                    "signature")

    def __getitem__(self, key: str) -> Any:
        self._declared(key)
        return self._captures[key]

    def get(self, key: str, default: Any = None) -> Any:
        self._declared(key)
        return self._captures.get(key, default)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        self._declared(key)
        return key in self._captures

    def __iter__(self) -> Iterator[str]:
        return (n for n in self._captures if n in self._names)

    def __len__(self) -> int:
        return sum(1 for n in self._captures if n in self._names)
