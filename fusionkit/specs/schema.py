"""The YAML spec format, as pydantic v2 models (its JSON Schema is generated).

A spec file::

    version: 1
    rules:
      - name: silu
        pattern: {op: aten.mul.Tensor, args: [{capture: x}, {op: aten.sigmoid.default, args: [{capture: x}]}]}
        constraints: [{dtype: {capture: x, dtypes: [float32]}}]
        replacement: {op: aten.silu.default, args: [{ref: x}]}

The structure of a pattern (``op``, ``capture``, ``any_of``, ``through``,
``seq``, ``outputs``/``also``, ``use``, ``dtype``) is written here, one model
per DSL construct with the builder's parameter names. Value matchers
(``{scalar: {name: eps, lo: 0.0}}``) and constraints (``{dtype: {capture: x,
dtypes: [float32]}}``) are *generated* from the vocabulary registry
(:mod:`fusionkit.vocabulary`): each term's fields are its Python parameters.
Any other YAML value inside ``args`` is an exact literal (a dtype inside it is
``{dtype: int8}``); a list of patterns is ``{seq: [...]}``.
"""

from __future__ import annotations

import functools
import inspect
import operator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, create_model, model_validator

# the DSL modules register their terms on import
import fusionkit.check.constraints
import fusionkit.match.pattern  # noqa: F401
from fusionkit.specs.codec import CaptureName, DtypeName, PyRef, yaml_type
from fusionkit.vocabulary import CONSTRAINTS, VALUE_FIELDS, VALUE_MATCHERS, Term

__all__ = ["SPEC_VERSION", "SpecFile", "constraint_tag", "pattern_tag"]

SPEC_VERSION = 1

Name = CaptureName


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_BIND = Field(None, description="also capture the value this node matched under this name")


# ------------------------------------------------------------------ structural nodes

class OpNode(_Strict):
    """``op(targets, *args, **kwargs)``: a call of one op (or any of several)."""

    op: str | list[str] = Field(description="qualified op name(s): namespace.op.overload")
    args: list[PatternOrLiteral] = Field(default_factory=list)
    kwargs: dict[str, PatternOrLiteral] = Field(default_factory=dict)
    commutative: bool | None = Field(None, description="default: true for known commutative ops")
    strict_defaults: bool = True
    bind: Name | None = _BIND


class CaptureNode(_Strict):
    """``capture(name)``: a named hole."""

    capture: Name
    bind: Name | None = _BIND


class AnyOfNode(_Strict):
    """``a | b | ...``: alternatives, tried in order."""

    any_of: list[PatternNode] = Field(min_length=1)
    bind: Name | None = _BIND


class ThroughNode(_Strict):
    """``through(ops, inner, max_depth)``: pass-through ops skipped in front of ``inner``."""

    through: Literal["casts"] | list[str] = Field(
        description="pass-through ops ('casts' = the dtype casts of fusionkit.CASTS)")
    inner: PatternOrLiteral
    max_depth: int = Field(8, ge=0)
    narrowing: bool = Field(
        False, description="also pass through casts that can change values (fp32 -> fp16)")
    bind: Name | None = _BIND


class SeqNode(_Strict):
    """``seq(*items)``: a list argument matched element by element."""

    seq: list[PatternOrLiteral]
    bind: Name | None = _BIND


class AlsoSpec(_Strict):
    """``also(name, pattern, near, max_depth)``: a further output found downstream of ``near``."""

    name: Name
    pattern: PatternOrLiteral
    near: Name
    max_depth: int = Field(12, ge=0)


class OutputsNode(_Strict):
    """``outputs(primary, *also)``: a multi-output pattern."""

    outputs: PatternNode = Field(description="the primary pattern, at the match's root")
    also: list[AlsoSpec] = Field(min_length=1)
    bind: Name | None = _BIND


class UseNode(_Strict):
    """A sub-pattern defined under the rule's ``let``."""

    use: Name
    bind: Name | None = _BIND


class DtypeNode(_Strict):
    """The literal ``torch.<dtype>``."""

    dtype: DtypeName
    bind: Name | None = _BIND


STRUCTURE: dict[str, type[_Strict]] = {
    "op": OpNode, "capture": CaptureNode, "any_of": AnyOfNode, "through": ThroughNode,
    "seq": SeqNode, "outputs": OutputsNode, "use": UseNode, "dtype": DtypeNode,
}


# --------------------------------------------------- generated from the vocabulary

def _field(term: Term, p_name: str, default: Any) -> tuple[Any, Any]:
    hint = term.hints[p_name]
    t = yaml_type(hint, capture=p_name in term.reads or (p_name == "name" and term.kind == "value"))
    if default is inspect.Parameter.empty:
        return (t, ...)
    return (t, default if not isinstance(default, (frozenset, set, tuple)) else list(default))


def arguments_model(term: Term) -> type[BaseModel]:
    """The model of a term's arguments: its Python parameters, names and defaults."""
    fields = {p.name: _field(term, p.name, p.default) for p in term.parameters}
    return create_model(f"{_camel(term.key)}Args", __config__=ConfigDict(extra="forbid", frozen=True),
                        __doc__=term.doc, **fields)  # type: ignore[call-overload]


def _camel(key: str) -> str:
    return "".join(w.capitalize() for w in key.split("_"))


def shorthand(term: Term) -> str | None:
    """The parameter a bare (non-mapping) value stands for: the one required parameter."""
    required = [p.name for p in term.parameters if p.default is p.empty]
    return required[0] if len(required) == 1 else None


def normalize_value_node(term: Term, data: Any) -> Any:
    """``{lit: 3}`` -> ``{lit: {value: 3}}``, ``{any_value: true}`` -> ``{any_value: {}}``."""
    if not isinstance(data, dict) or term.key not in data:
        return data
    v = data[term.key]
    names = {p.name for p in term.parameters}
    short = shorthand(term)
    if isinstance(v, dict) and set(v) <= names and (short is None or short in v):
        return data
    if v is True or (v == {} and short is None):
        return {**data, term.key: {}}
    if short is not None:
        return {**data, term.key: {short: v}}
    return data


def _value_node_model(term: Term) -> type[BaseModel]:
    args = arguments_model(term)
    short = shorthand(term)
    how = (f"arguments of {term.key}(...): " + ", ".join(p.name for p in term.parameters)
           + (f"; or just the {short}" if short else "; or `true` for all defaults"))

    def _normalize(cls: type[BaseModel], data: Any) -> Any:
        return normalize_value_node(term, data)

    return create_model(
        f"{_camel(term.key)}Node", __config__=ConfigDict(extra="forbid", frozen=True),
        __doc__=term.doc,
        __validators__={"_normalize": model_validator(mode="before")(_normalize)},  # type: ignore[dict-item]
        **{term.key: (args, Field(description=how))},  # type: ignore[call-overload]
    )


def _constraint_model(term: Term) -> type[BaseModel]:
    return create_model(f"{_camel(term.key)}Constraint",
                        __config__=ConfigDict(extra="forbid", frozen=True), __doc__=term.doc,
                        **{term.key: (arguments_model(term), ...)})  # type: ignore[call-overload]


VALUE_NODES: dict[str, type[BaseModel]] = {k: _value_node_model(t) for k, t in VALUE_MATCHERS.items()}
CONSTRAINT_MODELS: dict[str, type[BaseModel]] = {k: _constraint_model(t) for k, t in CONSTRAINTS.items()}
PATTERN_KEYS: dict[str, type[BaseModel]] = {**STRUCTURE, **VALUE_NODES}
_CLASS_TAG: dict[type[BaseModel], str] = {cls: key for key, cls in PATTERN_KEYS.items()}
_CONSTRAINT_TAG: dict[type[BaseModel], str] = {cls: key for key, cls in CONSTRAINT_MODELS.items()}

assert not set(STRUCTURE) & set(VALUE_NODES), "a value matcher's key collides with a DSL construct"
assert not set(VALUE_FIELDS) & set(PATTERN_KEYS)

_PATTERN_ERROR = ("not a pattern node: expected a mapping with one of the keys "
                  + ", ".join(PATTERN_KEYS))


def pattern_tag(v: Any) -> str | None:
    if isinstance(v, dict):
        for key in PATTERN_KEYS:
            if key in v:
                return key
        return None  # a mapping that is no pattern node: pydantic reports it
    if isinstance(v, BaseModel):
        return _CLASS_TAG.get(type(v))
    return "literal"


def _union(tagged: dict[str, Any]) -> Any:
    return functools.reduce(operator.or_, (Annotated[t, Tag(k)] for k, t in tagged.items()))


if TYPE_CHECKING:  # built from the registry at run time
    PatternNode = Any
else:
    PatternNode = Annotated[
        _union(PATTERN_KEYS),
        Discriminator(pattern_tag, custom_error_type="unknown_pattern_node",
                      custom_error_message=_PATTERN_ERROR),
    ]


#: where a plain YAML value (number, bool, list, null, string) is an exact literal
#: (a list of patterns is written ``{seq: [...]}``)
if TYPE_CHECKING:  # built from the registry at run time
    PatternOrLiteral = Any
else:
    PatternOrLiteral = Annotated[
        _union({**PATTERN_KEYS, "literal": int | float | bool | str | list[Any] | None}),
        Discriminator(pattern_tag, custom_error_type="unknown_pattern_node",
                      custom_error_message=_PATTERN_ERROR),
    ]


def constraint_tag(v: Any) -> str | None:
    if isinstance(v, dict):
        keys = [k for k in v if k in CONSTRAINT_MODELS]
        return keys[0] if len(keys) == 1 and len(v) == 1 else None
    if isinstance(v, BaseModel):
        return _CONSTRAINT_TAG.get(type(v))
    return None


if TYPE_CHECKING:  # built from the registry at run time
    ConstraintEntry = Any
else:
    ConstraintEntry = Annotated[
        _union(CONSTRAINT_MODELS),
        Discriminator(constraint_tag, custom_error_type="unknown_constraint",
                      custom_error_message="unknown constraint: expected a mapping with exactly one "
                      "key among " + ", ".join(CONSTRAINT_MODELS)),
    ]


# ---------------------------------------------------------------------------- replacement

class RefArg(_Strict):
    """``ref(name)``: the value a capture bound."""

    ref: Name


ReplacementArg = RefArg | int | float | bool | str | None | list[Any] | dict[str, Any]


class ReplaceOp(_Strict):
    """``replace_with(op, *args, **kwargs)``: one call of an op."""

    op: str = Field(description="qualified name of the op that replaces the match")
    args: list[ReplacementArg] = Field(default_factory=list)
    kwargs: dict[str, ReplacementArg] = Field(default_factory=dict)


class ReplacePython(_Strict):
    """``PythonReplacement(fn)``: ``fn(rewriter, x, weight, ...)`` builds the replacement.

    Its captures are its parameters; ``reads`` is for the older ``fn(rewriter, captures)``.
    """

    fn: PyRef
    reads: list[Name] | None = None


def replacement_tag(v: Any) -> str:
    if isinstance(v, BaseModel):
        return "op" if isinstance(v, ReplaceOp) else "fn"
    return "op" if isinstance(v, dict) and "op" in v else "fn"


Replacement = Annotated[Annotated[ReplaceOp, Tag("op")] | Annotated[ReplacePython, Tag("fn")],
                        Discriminator(replacement_tag)]


class RuleSpec(_Strict):
    """``Rule(name, pattern, replacement, constraints, priority, allow_escape, description)``."""

    name: Name
    description: str = ""
    priority: int = 0
    allow_escape: bool = False
    let: dict[Name, PatternNode] = Field(default_factory=dict,
                                         description="named sub-patterns, used with {use: name}")
    pattern: PatternNode
    constraints: list[ConstraintEntry] = Field(default_factory=list)
    replacement: Replacement


class SpecFile(_Strict):
    """A fusionkit spec file."""

    version: Literal[1] = Field(description="spec format version")
    rules: list[RuleSpec] = Field(min_length=1)


for _m in (OpNode, AnyOfNode, ThroughNode, SeqNode, AlsoSpec, OutputsNode, RuleSpec, SpecFile):
    _m.model_rebuild()

#: old spellings, named in errors: YAML uses the Python names
RENAMED: dict[str, str] = {"replace": "replacement", "min": "lo", "max": "hi", "len": "length",
                           "python": "fn"}
