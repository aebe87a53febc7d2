"""fusionkit: declarative, constraint-checked fusion passes for ExecuTorch lowering.

A rule states the subgraph to find (:mod:`fusionkit.pattern`), what its operands
must be (:mod:`fusionkit.constraints`) and what replaces it
(:mod:`fusionkit.rule`). :func:`find_matches` decides every match in one phase
with the ExportedProgram at hand; :class:`FusionPass` applies the accepted ones
and drops straight into ``to_edge_transform_and_lower(transform_passes=[...])``.
"""

from fusionkit.constants import ConstantKind, ConstantRef, ProgramInputs
from fusionkit.constraints import (
    BroadcastsOverLastDim,
    CheckContext,
    Constraint,
    Custom,
    DtypeIn,
    Failure,
    GraphLeaf,
    PrepackableConstant,
    Rank,
    ReducesLastDim,
    SameDtype,
    ScalarRange,
    ShapeRelation,
    StaticShape,
    UserInput,
    named_shape_relation,
)
from fusionkit.finder import Decline, Match, MatchSet, RuleIndex, find_matches
from fusionkit.fusion_pass import FusionPass
from fusionkit.pattern import (
    CASTS,
    Pattern,
    any_float,
    any_value,
    capture,
    int_list,
    is_op,
    lit,
    one_of,
    op,
    scalar,
    through,
    where,
)
from fusionkit.report import FusionReport
from fusionkit.rewrite import FusionError
from fusionkit.rule import CallOp, PythonReplacement, Rule, RuleError, ref, replace_with

__version__ = "0.1.0"

__all__ = [
    "CASTS",
    "BroadcastsOverLastDim",
    "CallOp",
    "CheckContext",
    "ConstantKind",
    "ConstantRef",
    "Constraint",
    "Custom",
    "Decline",
    "DtypeIn",
    "Failure",
    "FusionError",
    "FusionPass",
    "FusionReport",
    "GraphLeaf",
    "Match",
    "MatchSet",
    "Pattern",
    "PrepackableConstant",
    "ProgramInputs",
    "PythonReplacement",
    "Rank",
    "ReducesLastDim",
    "Rule",
    "RuleError",
    "RuleIndex",
    "SameDtype",
    "ScalarRange",
    "ShapeRelation",
    "StaticShape",
    "UserInput",
    "any_float",
    "any_value",
    "capture",
    "find_matches",
    "int_list",
    "is_op",
    "lit",
    "named_shape_relation",
    "one_of",
    "op",
    "ref",
    "replace_with",
    "scalar",
    "through",
    "where",
]
