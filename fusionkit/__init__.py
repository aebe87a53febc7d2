"""fusionkit: declarative, constraint-checked fusion passes for ExecuTorch lowering.

A rule states the subgraph to find (:mod:`fusionkit.pattern`), what its operands
must be (:mod:`fusionkit.constraints`) and what replaces it
(:mod:`fusionkit.rule`). :func:`find_matches` decides every match in one phase
with the ExportedProgram at hand; :class:`FusionPass` applies the accepted ones
and drops straight into ``to_edge_transform_and_lower(transform_passes=[...])``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> defining module; loaded on first attribute access (PEP 562), so
#: ``import fusionkit.cli`` does not pull in torch and ExecuTorch by itself
_EXPORTS: dict[str, str] = {
    "BroadcastsOverLastDim": "fusionkit.constraints",
    "CASTS": "fusionkit.pattern",
    "CompactConstantsPass": "fusionkit.compact_constants",
    "CallOp": "fusionkit.rule",
    "CheckContext": "fusionkit.constraints",
    "ConstantKind": "fusionkit.constants",
    "ConstantRef": "fusionkit.constants",
    "Constraint": "fusionkit.constraints",
    "Custom": "fusionkit.constraints",
    "Decline": "fusionkit.finder",
    "DtypeIn": "fusionkit.constraints",
    "Failure": "fusionkit.constraints",
    "FusionError": "fusionkit.rewrite",
    "FusionPass": "fusionkit.fusion_pass",
    "FusionReport": "fusionkit.report",
    "GraphLeaf": "fusionkit.constraints",
    "Match": "fusionkit.finder",
    "MatchSet": "fusionkit.finder",
    "Pattern": "fusionkit.pattern",
    "PrepackableConstant": "fusionkit.constraints",
    "ProgramInputs": "fusionkit.constants",
    "PythonReplacement": "fusionkit.rule",
    "Rank": "fusionkit.constraints",
    "ReducesLastDim": "fusionkit.constraints",
    "Rule": "fusionkit.rule",
    "RuleError": "fusionkit.rule",
    "RuleIndex": "fusionkit.finder",
    "SameDtype": "fusionkit.constraints",
    "ScalarRange": "fusionkit.constraints",
    "ShapeRelation": "fusionkit.constraints",
    "StaticShape": "fusionkit.constraints",
    "UserInput": "fusionkit.constraints",
    "any_float": "fusionkit.pattern",
    "any_value": "fusionkit.pattern",
    "capture": "fusionkit.pattern",
    "compact_tensor": "fusionkit.compact_constants",
    "find_matches": "fusionkit.finder",
    "int_list": "fusionkit.pattern",
    "is_op": "fusionkit.pattern",
    "lit": "fusionkit.pattern",
    "named_shape_relation": "fusionkit.constraints",
    "one_of": "fusionkit.pattern",
    "op": "fusionkit.pattern",
    "pack_int4": "fusionkit.tensor_bytes",
    "ref": "fusionkit.rule",
    "replace_with": "fusionkit.rule",
    "scalar": "fusionkit.pattern",
    "tensor_bytes": "fusionkit.tensor_bytes",
    "through": "fusionkit.pattern",
    "where": "fusionkit.pattern",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fusionkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    from fusionkit.compact_constants import CompactConstantsPass as CompactConstantsPass
    from fusionkit.compact_constants import compact_tensor as compact_tensor
    from fusionkit.constants import ConstantKind as ConstantKind
    from fusionkit.constants import ConstantRef as ConstantRef
    from fusionkit.constants import ProgramInputs as ProgramInputs
    from fusionkit.constraints import BroadcastsOverLastDim as BroadcastsOverLastDim
    from fusionkit.constraints import CheckContext as CheckContext
    from fusionkit.constraints import Constraint as Constraint
    from fusionkit.constraints import Custom as Custom
    from fusionkit.constraints import DtypeIn as DtypeIn
    from fusionkit.constraints import Failure as Failure
    from fusionkit.constraints import GraphLeaf as GraphLeaf
    from fusionkit.constraints import PrepackableConstant as PrepackableConstant
    from fusionkit.constraints import Rank as Rank
    from fusionkit.constraints import ReducesLastDim as ReducesLastDim
    from fusionkit.constraints import SameDtype as SameDtype
    from fusionkit.constraints import ScalarRange as ScalarRange
    from fusionkit.constraints import ShapeRelation as ShapeRelation
    from fusionkit.constraints import StaticShape as StaticShape
    from fusionkit.constraints import UserInput as UserInput
    from fusionkit.constraints import named_shape_relation as named_shape_relation
    from fusionkit.finder import Decline as Decline
    from fusionkit.finder import Match as Match
    from fusionkit.finder import MatchSet as MatchSet
    from fusionkit.finder import RuleIndex as RuleIndex
    from fusionkit.finder import find_matches as find_matches
    from fusionkit.fusion_pass import FusionPass as FusionPass
    from fusionkit.pattern import CASTS as CASTS
    from fusionkit.pattern import Pattern as Pattern
    from fusionkit.pattern import any_float as any_float
    from fusionkit.pattern import any_value as any_value
    from fusionkit.pattern import capture as capture
    from fusionkit.pattern import int_list as int_list
    from fusionkit.pattern import is_op as is_op
    from fusionkit.pattern import lit as lit
    from fusionkit.pattern import one_of as one_of
    from fusionkit.pattern import op as op
    from fusionkit.pattern import scalar as scalar
    from fusionkit.pattern import through as through
    from fusionkit.pattern import where as where
    from fusionkit.report import FusionReport as FusionReport
    from fusionkit.rewrite import FusionError as FusionError
    from fusionkit.rule import CallOp as CallOp
    from fusionkit.rule import PythonReplacement as PythonReplacement
    from fusionkit.rule import Rule as Rule
    from fusionkit.rule import RuleError as RuleError
    from fusionkit.rule import ref as ref
    from fusionkit.rule import replace_with as replace_with
    from fusionkit.tensor_bytes import pack_int4 as pack_int4
    from fusionkit.tensor_bytes import tensor_bytes as tensor_bytes

__all__ = [
    "CASTS",
    "BroadcastsOverLastDim",
    "CallOp",
    "CheckContext",
    "CompactConstantsPass",
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
    "compact_tensor",
    "find_matches",
    "int_list",
    "is_op",
    "lit",
    "named_shape_relation",
    "one_of",
    "op",
    "pack_int4",
    "ref",
    "replace_with",
    "scalar",
    "tensor_bytes",
    "through",
    "where",
]
