"""The YAML spec format, as pydantic v2 models (its JSON Schema is generated).

A spec file::

    version: 1
    rules:
      - name: silu
        pattern: {op: aten.mul.Tensor, args: [{capture: x}, {op: aten.sigmoid.default, args: [{capture: x}]}]}
        constraints: [{dtype: {capture: x, dtypes: [float32]}}]
        replace: {op: aten.silu.default, args: [{ref: x}]}

Pattern nodes and constraints are single-purpose mappings told apart by their
key (``op``, ``capture``, ``any_of``, ``through``, ``use``, ``lit``, ``scalar``,
...); any other YAML value inside ``args`` is an exact literal.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

__all__ = ["SPEC_VERSION", "SpecFile"]

SPEC_VERSION = 1

Name = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ------------------------------------------------------------------------------- patterns

class OpNode(_Strict):
    """A call of one op (or any of several), e.g. ``aten.mul.Tensor``."""

    op: str | list[str] = Field(description="qualified op name(s): namespace.op.overload")
    args: list[PatternOrLiteral] = Field(default_factory=list)
    kwargs: dict[str, PatternOrLiteral] = Field(default_factory=dict)
    commutative: bool | None = Field(None, description="default: true for known commutative ops")
    strict_defaults: bool = True
    bind: Name | None = Field(None, description="also capture the matched node under this name")


class CaptureNode(_Strict):
    capture: Name


class AnyOfNode(_Strict):
    any_of: list[PatternNode] = Field(min_length=1, description="alternatives, tried in order")
    bind: Name | None = None


class ThroughNode(_Strict):
    through: Literal["casts"] | list[str] = Field(
        description="pass-through ops skipped in front of the pattern ('casts' = dtype casts)")
    pattern: PatternOrLiteral
    max_depth: int = Field(8, ge=0)


class UseNode(_Strict):
    use: Name = Field(description="a sub-pattern defined under the rule's `let`")


class LitNode(_Strict):
    lit: Any
    bind: Name | None = None
    tensor_ok: bool = False


class Range(_Strict):
    min: float | None = None
    max: float | None = None


class ScalarNode(_Strict):
    scalar: Range = Field(description="a number in [min, max]")
    bind: Name | None = None
    tensor_ok: bool = Field(True, description="a 0-d constant tensor counts as a scalar")


class AnyFloatNode(_Strict):
    any_float: Literal[True]
    bind: Name | None = None
    tensor_ok: bool = True


class AnyValueNode(_Strict):
    any_value: Literal[True]
    bind: Name | None = None


class OneOfNode(_Strict):
    one_of: list[Any] = Field(min_length=1)
    bind: Name | None = None
    tensor_ok: bool = False


class IntListSpec(_Strict):
    len: int | None = Field(None, ge=0)


class IntListNode(_Strict):
    int_list: IntListSpec
    bind: Name | None = None


PATTERN_KEYS: dict[str, type[_Strict]] = {
    "op": OpNode, "capture": CaptureNode, "any_of": AnyOfNode, "through": ThroughNode,
    "use": UseNode, "lit": LitNode, "scalar": ScalarNode, "any_float": AnyFloatNode,
    "any_value": AnyValueNode, "one_of": OneOfNode, "int_list": IntListNode,
}
_CLASS_TAG: dict[type[BaseModel], str] = {cls: key for key, cls in PATTERN_KEYS.items()}


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


PatternNode = Annotated[
    Annotated[OpNode, Tag("op")] | Annotated[CaptureNode, Tag("capture")]
    | Annotated[AnyOfNode, Tag("any_of")] | Annotated[ThroughNode, Tag("through")]
    | Annotated[UseNode, Tag("use")] | Annotated[LitNode, Tag("lit")]
    | Annotated[ScalarNode, Tag("scalar")] | Annotated[AnyFloatNode, Tag("any_float")]
    | Annotated[AnyValueNode, Tag("any_value")] | Annotated[OneOfNode, Tag("one_of")]
    | Annotated[IntListNode, Tag("int_list")],
    Discriminator(pattern_tag, custom_error_type="unknown_pattern_node",
                  custom_error_message=_PATTERN_ERROR),
]

#: where a plain YAML value (number, bool, list, null, string) is an exact literal
PatternOrLiteral = Annotated[
    Annotated[OpNode, Tag("op")] | Annotated[CaptureNode, Tag("capture")]
    | Annotated[AnyOfNode, Tag("any_of")] | Annotated[ThroughNode, Tag("through")]
    | Annotated[UseNode, Tag("use")] | Annotated[LitNode, Tag("lit")]
    | Annotated[ScalarNode, Tag("scalar")] | Annotated[AnyFloatNode, Tag("any_float")]
    | Annotated[AnyValueNode, Tag("any_value")] | Annotated[OneOfNode, Tag("one_of")]
    | Annotated[IntListNode, Tag("int_list")]
    | Annotated[int | float | bool | str | list[Any] | None, Tag("literal")],
    Discriminator(pattern_tag, custom_error_type="unknown_pattern_node",
                  custom_error_message=_PATTERN_ERROR),
]


# ---------------------------------------------------------------------------- constraints

class PrepackableArgs(_Strict):
    capture: Name
    fold: bool = Field(False, description="fold a value computed only from constants")
    role: str | None = Field(None, description="why it must be constant, for messages")


class CaptureArgs(_Strict):
    capture: Name


class DtypeArgs(_Strict):
    capture: Name
    dtypes: list[str] = Field(min_length=1, description="torch dtype names, e.g. float32")


class RankArgs(_Strict):
    capture: Name
    ranks: list[int] = Field(min_length=1)


class PairArgs(_Strict):
    a: Name
    b: Name


class ShapeRelationArgs(_Strict):
    a: Name
    b: Name
    relation: Literal["broadcasts_over_last_dim", "same_shape", "same_last_dim"]


class ReducesLastDimArgs(_Strict):
    dim: Name
    x: Name


class ScalarRangeArgs(_Strict):
    capture: Name
    min: float | None = None
    max: float | None = None


class CustomArgs(_Strict):
    python: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                        description="package.module:function taking a CheckContext")
    name: Name
    reads: list[Name] = Field(default_factory=list)


class PrepackableC(_Strict):
    prepackable_constant: PrepackableArgs


class GraphLeafC(_Strict):
    graph_leaf: CaptureArgs


class UserInputC(_Strict):
    user_input: CaptureArgs


class StaticShapeC(_Strict):
    static_shape: CaptureArgs


class DtypeC(_Strict):
    dtype: DtypeArgs


class RankC(_Strict):
    rank: RankArgs


class SameDtypeC(_Strict):
    same_dtype: PairArgs


class ShapeRelationC(_Strict):
    shape_relation: ShapeRelationArgs


class ReducesLastDimC(_Strict):
    reduces_last_dim: ReducesLastDimArgs


class ScalarRangeC(_Strict):
    scalar_range: ScalarRangeArgs


class CustomC(_Strict):
    custom: CustomArgs


CONSTRAINT_KEYS: dict[str, type[_Strict]] = {
    "prepackable_constant": PrepackableC, "graph_leaf": GraphLeafC, "user_input": UserInputC,
    "static_shape": StaticShapeC, "dtype": DtypeC, "rank": RankC, "same_dtype": SameDtypeC,
    "shape_relation": ShapeRelationC, "reduces_last_dim": ReducesLastDimC,
    "scalar_range": ScalarRangeC, "custom": CustomC,
}
_CONSTRAINT_TAG: dict[type[BaseModel], str] = {cls: key for key, cls in CONSTRAINT_KEYS.items()}


def constraint_tag(v: Any) -> str | None:
    if isinstance(v, dict):
        keys = [k for k in v if k in CONSTRAINT_KEYS]
        return keys[0] if len(keys) == 1 and len(v) == 1 else None
    if isinstance(v, BaseModel):
        return _CONSTRAINT_TAG.get(type(v))
    return None


ConstraintEntry = Annotated[
    Annotated[PrepackableC, Tag("prepackable_constant")] | Annotated[GraphLeafC, Tag("graph_leaf")]
    | Annotated[UserInputC, Tag("user_input")] | Annotated[StaticShapeC, Tag("static_shape")]
    | Annotated[DtypeC, Tag("dtype")] | Annotated[RankC, Tag("rank")]
    | Annotated[SameDtypeC, Tag("same_dtype")] | Annotated[ShapeRelationC, Tag("shape_relation")]
    | Annotated[ReducesLastDimC, Tag("reduces_last_dim")]
    | Annotated[ScalarRangeC, Tag("scalar_range")] | Annotated[CustomC, Tag("custom")],
    Discriminator(constraint_tag, custom_error_type="unknown_constraint",
                  custom_error_message="unknown constraint: expected a mapping with exactly one "
                  "key among " + ", ".join(CONSTRAINT_KEYS)),
]


# ---------------------------------------------------------------------------- replacement

class RefArg(_Strict):
    ref: Name


ReplacementArg = RefArg | int | float | bool | str | None | list[Any]


class ReplaceOp(_Strict):
    op: str = Field(description="qualified name of the op that replaces the match")
    args: list[ReplacementArg] = Field(default_factory=list)
    kwargs: dict[str, ReplacementArg] = Field(default_factory=dict)


class ReplacePython(_Strict):
    python: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                        description="package.module:function(rewriter, captures) -> Node")
    reads: list[Name] = Field(default_factory=list)


class RuleSpec(_Strict):
    name: Name
    description: str = ""
    priority: int = 0
    allow_escape: bool = False
    let: dict[Name, PatternNode] = Field(default_factory=dict,
                                         description="named sub-patterns, used with {use: name}")
    pattern: PatternNode
    constraints: list[ConstraintEntry] = Field(default_factory=list)
    replace: ReplaceOp | ReplacePython


class SpecFile(_Strict):
    """A fusionkit spec file."""

    version: Literal[1] = Field(description="spec format version")
    rules: list[RuleSpec] = Field(min_length=1)


OpNode.model_rebuild()
AnyOfNode.model_rebuild()
ThroughNode.model_rebuild()
RuleSpec.model_rebuild()
SpecFile.model_rebuild()
