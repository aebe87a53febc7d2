"""fusionkit: declarative, constraint-checked fusion passes for ExecuTorch lowering.

This module is the one public face: a rule author imports from ``fusionkit`` only.
A rule states the subgraph to find (the pattern DSL), what its operands must be
(constraints, checked with the ExportedProgram at hand) and what replaces it;
:func:`find_matches` decides every match in one phase and :class:`FusionPass`
applies the accepted ones inside ``to_edge_transform_and_lower(transform_passes=[...])``.

Package layout (one concern per folder):

* ``fusionkit`` — the core: ``pattern``, ``constraints``, ``matcher``, ``finder``,
  ``rule``, ``builder`` (:class:`Rewriter`), ``rewrite`` (apply), ``fusion_pass``,
  ``report``, ``folding``, ``targets``, ``program_inputs``;
* ``fusionkit.specs`` — rules written as YAML;
* ``fusionkit.integration`` — ExecuTorch plumbing: reversible hooks, exact tensor bytes,
  constant compaction;
* ``fusionkit.passes`` — ready-made rules and the rule-set registry;
* ``fusionkit.backends.vulkan_adapter`` / ``xnnpack_adapter`` — thin drop-in adapters;
* ``fusionkit.app`` — the command line, the demo job and lowering helpers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> (defining module, one line saying what it is). Loaded on first
#: attribute access (PEP 562), so ``import fusionkit`` does not pull in torch by itself.
EXPORTS: dict[str, tuple[str, str]] = {
    "Pattern": ("fusionkit.pattern", "base class of every pattern node"),
    "op": ("fusionkit.pattern", "match a call of one op (or any of several) with argument patterns"),
    "is_op": ("fusionkit.pattern", "TVM-style spelling of op: ``is_op(target)(*args)``"),
    "capture": ("fusionkit.pattern", "bind a node or value to a name (the same name must bind the same thing)"),
    "through": ("fusionkit.pattern", "skip value-preserving pass-through ops (e.g. CASTS) before an inner pattern"),
    "CASTS": ("fusionkit.pattern", "the dtype-conversion ops :func:`through` skips"),
    "seq": ("fusionkit.pattern", "match a list argument element by element"),
    "outputs": ("fusionkit.pattern", "a pattern with several outputs: a primary plus :func:`also` parts"),
    "also": ("fusionkit.pattern", "a further output of a multi-output pattern, found near a capture"),
    "lit": ("fusionkit.pattern", "an exact literal argument"),
    "where": ("fusionkit.pattern", "a literal accepted by a predicate, with a description for declines"),
    "any_value": ("fusionkit.pattern", "any argument (a wildcard)"),
    "any_float": ("fusionkit.pattern", "any float literal (or 0-d float constant)"),
    "scalar": ("fusionkit.pattern", "a numeric literal within optional bounds"),
    "one_of": ("fusionkit.pattern", "a literal from a fixed set"),
    "int_list": ("fusionkit.pattern", "a list of ints, optionally of a given length"),
    "integer": ("fusionkit.pattern", "an int literal (not a bool), optionally within bounds"),
    "positive": ("fusionkit.pattern", "a number literal > 0 (a scale)"),
    "per_row_block": ("fusionkit.pattern", "a block size [1, ..., 1, G]: one quantization group per row"),
    "optional_dtype": ("fusionkit.pattern", "None or one of some dtypes (an optional dtype= argument)"),
    "Constraint": ("fusionkit.constraints", "base class of operand constraints checked with the ExportedProgram"),
    "CheckContext": ("fusionkit.constraints", "what a constraint sees: captures, program, program inputs"),
    "Failure": ("fusionkit.constraints", "a constraint's reasoned refusal (reason and node at fault)"),
    "Blame": ("fusionkit.constraints", "a custom check's reason naming its node at fault (CheckContext.blame)"),
    "PrepackableConstant": ("fusionkit.constraints", "operand must be a constant (optionally folded into one)"),
    "GraphLeaf": ("fusionkit.constraints", "operand must be a placeholder of the program"),
    "UserInput": ("fusionkit.constraints", "operand must be a user input of the program"),
    "DtypeIn": ("fusionkit.constraints", "operand dtype must be one of a set"),
    "Rank": ("fusionkit.constraints", "operand must have a given rank"),
    "StaticShape": ("fusionkit.constraints", "operand shape must be static"),
    "SameDtype": ("fusionkit.constraints", "operands must share one dtype"),
    "ShapeRelation": ("fusionkit.constraints", "two operands' shapes must satisfy a relation"),
    "named_shape_relation": ("fusionkit.constraints", "a :class:`ShapeRelation` by name (see SHAPE_RELATIONS)"),
    "broadcasts_over_last_dim": ("fusionkit.constraints", "a weight that is a vector over x's last dim"),
    "BroadcastsOverLastDim": ("fusionkit.constraints", "former name of :func:`broadcasts_over_last_dim`"),
    "ReducesLastDim": ("fusionkit.constraints", "a captured dim list names exactly the last dim"),
    "ScalarRange": ("fusionkit.constraints", "a captured scalar lies within bounds"),
    "Custom": ("fusionkit.constraints", "a constraint written as a Python function returning a reason or None"),
    "Rule": ("fusionkit.rule", "a fusion: name, pattern, constraints, replacement"),
    "RuleError": ("fusionkit.rule", "a rule that cannot be correct as written (raised when built)"),
    "Replacement": ("fusionkit.rule", "base class of replacements (build the fused node(s))"),
    "CallOp": ("fusionkit.rule", "a replacement that calls one op with referenced captures"),
    "PythonReplacement": ("fusionkit.rule", "a replacement written as a Python function over a Rewriter"),
    "Ref": ("fusionkit.rule", "a reference to a capture inside replacement arguments"),
    "ref": ("fusionkit.rule", "make a :class:`Ref`"),
    "replace_with": ("fusionkit.rule", "make a :class:`CallOp` replacement"),
    "Rewriter": ("fusionkit.builder", "creates replacement nodes with metadata (the replacement author's API)"),
    "FusionError": ("fusionkit.builder", "a rule produced something inconsistent (a rule bug)"),
    "op_key": ("fusionkit.targets", "the one string key of an op target (ATen, edge or custom)"),
    "find_matches": ("fusionkit.finder", "decide every match of a rule set in one phase (changes nothing)"),
    "Match": ("fusionkit.finder", "an accepted match: rule, root, captures, claimed nodes, folds"),
    "Decline": ("fusionkit.finder", "a refused match: rule, root, step, node at fault, reason"),
    "MatchSet": ("fusionkit.finder", "the accepted and declined matches of one search"),
    "RuleIndex": ("fusionkit.finder", "rules indexed by root op (build once, search many graphs)"),
    "FusionPass": ("fusionkit.fusion_pass", "ExportedProgram pass applying a rule set (drop-in transform pass)"),
    "FusionReport": ("fusionkit.report", "per-rule outcome of a pass run: fused, folded, declined"),
    "ProgramInputs": ("fusionkit.program_inputs", "classifies placeholders: parameters, buffers, constants, user inputs"),
    "ConstantRef": ("fusionkit.program_inputs", "a constant placeholder's kind, name and tensor"),
    "ConstantKind": ("fusionkit.program_inputs", "parameter, buffer or lifted tensor constant"),
    "CompactConstantsPass": ("fusionkit.integration.compact_constants", "gives every view constant its own compact storage"),
    "compact_tensor": ("fusionkit.integration.compact_constants", "a tensor's exact bytes in a storage of its own"),
    "tensor_bytes": ("fusionkit.integration.tensor_bytes", "the exact bytes of a tensor (views included) in C or dim order"),
    "pack_int4": ("fusionkit.integration.tensor_bytes", "pack int4 values two per byte as the backends expect"),
    "rule_from_functions": ("fusionkit.from_example", "a rule traced from the PyTorch code it fuses (and its replacement)"),
    "pattern_from_function": ("fusionkit.from_example", "the pattern traced from one example function"),
    "ExampleError": ("fusionkit.from_example", "example code that cannot become a rule as asked"),
    "to_python": ("fusionkit.python_source", "a rule or pattern printed as the DSL code that builds it"),
    "NotPrintable": ("fusionkit.python_source", "a rule part that is Python code, not data (cannot be printed)"),
    "why_not": ("fusionkit.near_miss", "what one rule made of one node: fused, declined (why) or how far it got"),
    "WhyNot": ("fusionkit.near_miss", "the verdict of :func:`why_not`: outcome, step, node at fault, reason"),
}


def __getattr__(name: str) -> Any:
    entry = EXPORTS.get(name)
    if entry is None:
        raise AttributeError(f"module 'fusionkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(entry[0]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])


if TYPE_CHECKING:
    from fusionkit.builder import FusionError as FusionError
    from fusionkit.builder import Rewriter as Rewriter
    from fusionkit.constraints import Blame as Blame
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
    from fusionkit.constraints import broadcasts_over_last_dim as broadcasts_over_last_dim
    from fusionkit.constraints import named_shape_relation as named_shape_relation
    from fusionkit.finder import Decline as Decline
    from fusionkit.finder import Match as Match
    from fusionkit.finder import MatchSet as MatchSet
    from fusionkit.finder import RuleIndex as RuleIndex
    from fusionkit.finder import find_matches as find_matches
    from fusionkit.from_example import ExampleError as ExampleError
    from fusionkit.from_example import pattern_from_function as pattern_from_function
    from fusionkit.from_example import rule_from_functions as rule_from_functions
    from fusionkit.fusion_pass import FusionPass as FusionPass
    from fusionkit.integration.compact_constants import CompactConstantsPass as CompactConstantsPass
    from fusionkit.integration.compact_constants import compact_tensor as compact_tensor
    from fusionkit.integration.tensor_bytes import pack_int4 as pack_int4
    from fusionkit.integration.tensor_bytes import tensor_bytes as tensor_bytes
    from fusionkit.near_miss import WhyNot as WhyNot
    from fusionkit.near_miss import why_not as why_not
    from fusionkit.pattern import CASTS as CASTS
    from fusionkit.pattern import Pattern as Pattern
    from fusionkit.pattern import also as also
    from fusionkit.pattern import any_float as any_float
    from fusionkit.pattern import any_value as any_value
    from fusionkit.pattern import capture as capture
    from fusionkit.pattern import int_list as int_list
    from fusionkit.pattern import integer as integer
    from fusionkit.pattern import is_op as is_op
    from fusionkit.pattern import lit as lit
    from fusionkit.pattern import one_of as one_of
    from fusionkit.pattern import op as op
    from fusionkit.pattern import optional_dtype as optional_dtype
    from fusionkit.pattern import outputs as outputs
    from fusionkit.pattern import per_row_block as per_row_block
    from fusionkit.pattern import positive as positive
    from fusionkit.pattern import scalar as scalar
    from fusionkit.pattern import seq as seq
    from fusionkit.pattern import through as through
    from fusionkit.pattern import where as where
    from fusionkit.program_inputs import ConstantKind as ConstantKind
    from fusionkit.program_inputs import ConstantRef as ConstantRef
    from fusionkit.program_inputs import ProgramInputs as ProgramInputs
    from fusionkit.python_source import NotPrintable as NotPrintable
    from fusionkit.python_source import to_python as to_python
    from fusionkit.report import FusionReport as FusionReport
    from fusionkit.rule import CallOp as CallOp
    from fusionkit.rule import PythonReplacement as PythonReplacement
    from fusionkit.rule import Ref as Ref
    from fusionkit.rule import Replacement as Replacement
    from fusionkit.rule import Rule as Rule
    from fusionkit.rule import RuleError as RuleError
    from fusionkit.rule import ref as ref
    from fusionkit.rule import replace_with as replace_with
    from fusionkit.targets import op_key as op_key

__all__ = [
    "CASTS",
    "Blame",
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
    "ExampleError",
    "Failure",
    "FusionError",
    "FusionPass",
    "FusionReport",
    "GraphLeaf",
    "Match",
    "MatchSet",
    "NotPrintable",
    "Pattern",
    "PrepackableConstant",
    "ProgramInputs",
    "PythonReplacement",
    "Rank",
    "ReducesLastDim",
    "Ref",
    "Replacement",
    "Rewriter",
    "Rule",
    "RuleError",
    "RuleIndex",
    "SameDtype",
    "ScalarRange",
    "ShapeRelation",
    "StaticShape",
    "UserInput",
    "WhyNot",
    "also",
    "any_float",
    "any_value",
    "broadcasts_over_last_dim",
    "capture",
    "compact_tensor",
    "find_matches",
    "int_list",
    "integer",
    "is_op",
    "lit",
    "named_shape_relation",
    "one_of",
    "op",
    "op_key",
    "optional_dtype",
    "outputs",
    "pack_int4",
    "pattern_from_function",
    "per_row_block",
    "positive",
    "ref",
    "replace_with",
    "rule_from_functions",
    "scalar",
    "seq",
    "tensor_bytes",
    "through",
    "to_python",
    "where",
    "why_not",
]
