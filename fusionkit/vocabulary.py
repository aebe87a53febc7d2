"""One vocabulary for Python and YAML: every value matcher and constraint, declared once.

A value matcher (``scalar``, ``positive``, ...) or a constraint (``DtypeIn``,
``PrepackableConstant``, ...) registers itself where it is defined, with the
decorators below. Its YAML key is its registered key, its YAML fields are its
Python parameters (same names, same defaults), and what an object dumps to is
the arguments it was built with. The JSON Schema, the spec compiler and the
dumper (:mod:`fusionkit.specs`) are all derived from :data:`VALUE_MATCHERS` and
:data:`CONSTRAINTS`, so a new term is usable from YAML the moment it exists in
Python, and no name can differ between the two.

This module imports nothing of fusionkit: the DSL modules import it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

__all__ = [
    "CONSTRAINTS",
    "VALUE_MATCHERS",
    "Term",
    "arguments_of",
    "constraint_term",
    "freeze",
    "term_of",
    "value_matcher",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: parameters of a value matcher that are fields of the :class:`~fusionkit.match.pattern.Value`
#: itself (not recorded among its arguments)
VALUE_FIELDS = ("name", "tensor_ok")


@dataclass(frozen=True)
class Term:
    """One word of the vocabulary: a YAML key and the Python builder it stands for."""

    key: str
    kind: Literal["value", "constraint"]
    #: the Python builder (a function or a dataclass); its parameters are the YAML fields
    build: Callable[..., Any]
    #: the class of the objects it builds (constraints; None for value matchers)
    cls: type | None = None
    #: parameters that name captures of the pattern (checked when a spec is compiled)
    reads: tuple[str, ...] = ()
    #: object -> builder arguments; None means "the dataclass fields" / "the recorded arguments"
    dump: Callable[[Any], dict[str, Any]] | None = None
    doc: str = ""

    @functools.cached_property
    def parameters(self) -> tuple[inspect.Parameter, ...]:
        return tuple(inspect.signature(self.build).parameters.values())

    @functools.cached_property
    def hints(self) -> dict[str, Any]:
        fn = self.build
        hints = typing.get_type_hints(fn if isinstance(fn, type) else inspect.unwrap(fn))
        hints.pop("return", None)
        return hints

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.parameters if p.default is not inspect.Parameter.empty}


#: value matchers by YAML key (== Python builder name)
VALUE_MATCHERS: dict[str, Term] = {}
#: constraints by YAML key
CONSTRAINTS: dict[str, Term] = {}
_BY_CLASS: dict[type, Term] = {}


def freeze(v: Any) -> Any:
    """A hashable, order-insensitive-where-it-should-be form of an argument."""
    if isinstance(v, (list, tuple)):
        return tuple(freeze(x) for x in v)
    if isinstance(v, (set, frozenset)):
        return frozenset(freeze(x) for x in v)
    if isinstance(v, Mapping):
        return tuple(sorted((k, freeze(x)) for k, x in v.items()))
    return v


def value_matcher(fn: F) -> F:
    """Register ``fn`` (returning a ``Value``) as a value matcher under its own name.

    The returned ``Value`` records the arguments it was built with (``spec``):
    that is what it dumps to, and what it is compared by.
    """
    key = fn.__name__
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def build(*args: Any, **kwargs: Any) -> Any:
        v = fn(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        params = tuple((k, freeze(x)) for k, x in bound.arguments.items() if k not in VALUE_FIELDS)
        return dataclasses.replace(v, spec=(key, params))

    if key in VALUE_MATCHERS:
        raise ValueError(f"value matcher {key!r} is registered twice")
    VALUE_MATCHERS[key] = Term(key, "value", build, doc=_first_line(fn))
    return build  # type: ignore[return-value]


def constraint_term(key: str, *, reads: tuple[str, ...], cls: type | None = None,
                    dump: Callable[[Any], dict[str, Any]] | None = None) -> Callable[[T], T]:
    """Register a constraint class (or a builder function of ``cls``) under ``key``.

    ``reads``: the parameters naming captures. ``dump``: how an object gives back
    the builder's arguments (default: its dataclass fields, for a class builder).
    The registration is the one place a constraint states its kind and its reads:
    the class gets ``kind = key`` and ``capture_fields = reads`` from here (its
    ``captures()`` reads those fields), and may not state either again.
    """

    def register(builder: T) -> T:
        target = cls if cls is not None else builder
        if not isinstance(target, type):
            raise TypeError(f"constraint {key!r}: pass cls= for a builder function")
        if key in CONSTRAINTS:
            raise ValueError(f"constraint {key!r} is registered twice")
        for attr in ("kind", "capture_fields"):
            if attr in vars(target):
                raise TypeError(f"constraint {key!r}: {target.__name__} states its {attr} "
                                "itself; the registration gives it (kind = key, "
                                "capture_fields = reads)")
        target.kind = key  # type: ignore[attr-defined]
        target.capture_fields = tuple(reads)  # type: ignore[attr-defined]
        term = Term(key, "constraint", builder, target, reads, dump,  # type: ignore[arg-type]
                    _first_line(builder))
        CONSTRAINTS[key] = term
        _BY_CLASS[target] = term
        return builder

    return register


def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def term_of(obj: Any) -> Term | None:
    """The term a built value matcher or constraint belongs to (None: arbitrary Python)."""
    spec = getattr(obj, "spec", None)
    if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
        return VALUE_MATCHERS.get(spec[0])
    return _BY_CLASS.get(type(obj))


def arguments_of(obj: Any) -> tuple[Term, dict[str, Any]]:
    """The term of ``obj`` and the builder arguments that rebuild it (defaults included)."""
    term = term_of(obj)
    if term is None:
        raise LookupError(f"{obj!r} is not a registered value matcher or constraint")
    if term.kind == "value":
        args = dict(obj.spec[1])
        names = {p.name for p in term.parameters}
        for f in VALUE_FIELDS:
            if f in names:
                args[f] = getattr(obj, f)
        return term, args
    if term.dump is not None:
        return term, term.dump(obj)
    return term, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
