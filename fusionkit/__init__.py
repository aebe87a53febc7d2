"""fusionkit: declarative, constraint-checked fusion passes for ExecuTorch lowering.

This module is the one public face: a rule author imports from ``fusionkit`` only.
A rule states the subgraph to find (the pattern DSL), what its operands must be
(constraints, checked with the ExportedProgram at hand) and what replaces it;
:func:`find_matches` decides every match in one phase and :class:`FusionPass`
applies the accepted ones inside ``to_edge_transform_and_lower(transform_passes=[...])``.

Package layout (by phase, then by concern):

* ``fusionkit.match`` — find: the pattern DSL, op keys, the matcher, gates, the finder;
* ``fusionkit.check`` — decide: operand constraints, what a placeholder is, constant folding;
* ``fusionkit.apply`` — rewrite: the replacement author's :class:`Rewriter`, all-or-nothing apply;
* ``fusionkit.authoring`` — rules from eager code, rules printed as code, ``why_not``,
  the shared Python/YAML vocabulary;
* ``fusionkit.rule``, ``fusionkit.fusion_pass``, ``fusionkit.report`` — a rule, the drop-in
  pass and what it did;
* ``fusionkit.specs`` — rules written as YAML;
* ``fusionkit.integration`` — ExecuTorch plumbing: reversible hooks, exact tensor bytes,
  constant compaction, pass gating (not part of the rule-authoring API);
* ``fusionkit.passes`` — ready-made rules and the rule-set registry;
* ``fusionkit.backends.vulkan_adapter`` / ``xnnpack_adapter`` — the drop-in adapters;
* ``fusionkit.app`` — the command line, the demo job and lowering helpers.

:data:`EXPORTS` is the one table of the facade: ``__all__``, lazy loading and the
``TYPE_CHECKING`` imports below (generated from it by ``python -m fusionkit._facade``,
checked by ``tests/test_architecture.py``) all follow from it.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from fusionkit._compat import install_module_aliases

__version__ = "0.1.0"

#: public name -> (defining module, one line saying what it is). Loaded on first
#: attribute access (PEP 562), so ``import fusionkit`` does not pull in torch by itself.
EXPORTS: dict[str, tuple[str, str]] = {
    "Pattern": ("fusionkit.match.pattern", "base class of every pattern node"),
    "op": ("fusionkit.match.pattern", "match a call of one op (or any of several) with argument patterns"),
    "capture": ("fusionkit.match.pattern", "bind a node or value to a name (the same name must bind the same thing)"),
    "through": ("fusionkit.match.pattern", "skip value-preserving pass-through ops (e.g. CASTS) before an inner pattern"),
    "CASTS": ("fusionkit.match.pattern", "the dtype-conversion ops :func:`through` skips"),
    "seq": ("fusionkit.match.pattern", "match a list argument element by element"),
    "outputs": ("fusionkit.match.pattern", "a pattern with several outputs: a primary plus :func:`also` parts"),
    "also": ("fusionkit.match.pattern", "a further output of a multi-output pattern, found near a capture"),
    "lit": ("fusionkit.match.pattern", "an exact literal argument"),
    "where": ("fusionkit.match.pattern", "a literal accepted by a predicate, with a description for declines"),
    "any_value": ("fusionkit.match.pattern", "any argument (a wildcard)"),
    "any_float": ("fusionkit.match.pattern", "any float literal (or 0-d float constant)"),
    "scalar": ("fusionkit.match.pattern", "a numeric literal within optional bounds"),
    "one_of": ("fusionkit.match.pattern", "a literal from a fixed set"),
    "int_list": ("fusionkit.match.pattern", "a list of ints, optionally of a given length"),
    "integer": ("fusionkit.match.pattern", "an int literal (not a bool), optionally within bounds"),
    "positive": ("fusionkit.match.pattern", "a number literal > 0 (a scale)"),
    "per_row_block": ("fusionkit.match.pattern", "a block size [1, ..., 1, G]: one quantization group per row"),
    "optional_dtype": ("fusionkit.match.pattern", "None or one of some dtypes (an optional dtype= argument)"),
    "Constraint": ("fusionkit.check.constraints", "base class of operand constraints checked with the ExportedProgram"),
    "CheckContext": ("fusionkit.check.constraints", "what a constraint sees: captures, program, program inputs"),
    "PrepackableConstant": ("fusionkit.check.constraints", "operand must be a constant (optionally folded into one)"),
    "GraphLeaf": ("fusionkit.check.constraints", "operand must be a placeholder of the program"),
    "UserInput": ("fusionkit.check.constraints", "operand must be a user input of the program"),
    "DtypeIn": ("fusionkit.check.constraints", "operand dtype must be one of a set"),
    "Rank": ("fusionkit.check.constraints", "operand must have a given rank"),
    "StaticShape": ("fusionkit.check.constraints", "operand shape must be static"),
    "SameDtype": ("fusionkit.check.constraints", "operands must share one dtype"),
    "ShapeRelation": ("fusionkit.check.constraints", "two operands' shapes must satisfy a relation"),
    "named_shape_relation": ("fusionkit.check.constraints", "a :class:`ShapeRelation` by name (see SHAPE_RELATIONS)"),
    "broadcasts_over_last_dim": ("fusionkit.check.constraints", "a weight that is a vector over x's last dim"),
    "ReducesLastDim": ("fusionkit.check.constraints", "a captured dim list names exactly the last dim"),
    "ScalarRange": ("fusionkit.check.constraints", "a captured scalar lies within bounds"),
    "Custom": ("fusionkit.check.constraints", "a constraint written as a Python function returning a reason or None"),
    "Rule": ("fusionkit.rule", "a fusion: name, pattern, constraints, replacement"),
    "RuleError": ("fusionkit.rule", "a rule that cannot be correct as written (raised when built)"),
    "Replacement": ("fusionkit.rule", "base class of replacements (build the fused node(s))"),
    "CallOp": ("fusionkit.rule", "a replacement that calls one op with referenced captures"),
    "PythonReplacement": ("fusionkit.rule", "a replacement written as a Python function over a Rewriter"),
    "Ref": ("fusionkit.rule", "a reference to a capture inside replacement arguments"),
    "ref": ("fusionkit.rule", "make a :class:`Ref`"),
    "replace_with": ("fusionkit.rule", "make a :class:`CallOp` replacement"),
    "Rewriter": ("fusionkit.apply.builder", "creates replacement nodes with metadata (the replacement author's API)"),
    "FusionError": ("fusionkit.apply.builder", "a rule produced something inconsistent (a rule bug)"),
    "op_key": ("fusionkit.match.targets", "the one string key of an op target (ATen, edge or custom)"),
    "register_delegate": ("fusionkit.check.executable", "tell fusionkit which ops a backend's delegate takes (its own namespaces, its registry)"),
    "find_matches": ("fusionkit.match.finder", "decide every match of a rule set in one phase (changes nothing)"),
    "Match": ("fusionkit.match.finder", "an accepted match: rule, root, captures, claimed nodes, folds"),
    "Decline": ("fusionkit.match.finder", "a refused match: rule, root, step, node at fault, reason"),
    "MatchSet": ("fusionkit.match.finder", "the accepted and declined matches of one search"),
    "RuleIndex": ("fusionkit.match.finder", "rules indexed by root op (build once, search many graphs)"),
    "FusionPass": ("fusionkit.fusion_pass", "ExportedProgram pass applying a rule set (drop-in transform pass)"),
    "FusionReport": ("fusionkit.report", "per-rule outcome of a pass run: fused, folded, declined"),
    "ProgramInputs": ("fusionkit.check.program_inputs", "classifies placeholders: parameters, buffers, constants, user inputs"),
    "ConstantRef": ("fusionkit.check.program_inputs", "a constant placeholder's kind, name and tensor"),
    "ConstantKind": ("fusionkit.check.program_inputs", "parameter, buffer or lifted tensor constant"),
    "rule_from_functions": ("fusionkit.authoring.from_example", "a rule traced from the PyTorch code it fuses (and its replacement)"),
    "pattern_from_function": ("fusionkit.authoring.from_example", "the pattern traced from one example function"),
    "TraceOptions": ("fusionkit.authoring.from_example", "how an example is traced (wildcards, dialect, casts, ...), as one value"),
    "ExampleError": ("fusionkit.authoring.from_example", "example code that cannot become a rule as asked"),
    "to_python": ("fusionkit.authoring.python_source", "a rule or pattern printed as the DSL code that builds it"),
    "NotPrintable": ("fusionkit.authoring.python_source", "a rule part that is Python code, not data (cannot be printed)"),
    "MatchResult": ("fusionkit.result", "the one reasoned result: rule, node, status, step, node at fault, reason"),
    "Status": ("fusionkit.result", "a result's verdict: fused, inside, declined, error, not_root"),
    "Step": ("fusionkit.result", "the step that decided a result (or a constraint's kind)"),
    "why_not": ("fusionkit.authoring.near_miss", "what one rule made of one node: fused, declined (why) or how far it got"),
}

#: former public names, kept for one release: name -> (module, attribute there, advice)
DEPRECATED: dict[str, tuple[str, str, str]] = {
    "is_op": ("fusionkit.match.pattern", "is_op", "use op(target, *args)"),
    "BroadcastsOverLastDim": ("fusionkit.check.constraints", "broadcasts_over_last_dim",
                              "use broadcasts_over_last_dim"),
    "CompactConstantsPass": ("fusionkit.integration.compact_constants", "CompactConstantsPass",
                             "import it from fusionkit.integration"),
    "compact_tensor": ("fusionkit.integration.compact_constants", "compact_tensor",
                       "import it from fusionkit.integration"),
    "tensor_bytes": ("fusionkit.integration.tensor_bytes", "tensor_bytes",
                     "import it from fusionkit.integration"),
    "pack_int4": ("fusionkit.integration.tensor_bytes", "pack_int4",
                  "import it from fusionkit.integration"),
}

__all__ = sorted(EXPORTS)

install_module_aliases()


def __getattr__(name: str) -> Any:
    entry = EXPORTS.get(name)
    if entry is not None:
        value = getattr(importlib.import_module(entry[0]), name)
        globals()[name] = value
        return value
    old = DEPRECATED.get(name)
    if old is not None:
        warnings.warn(f"fusionkit.{name} is deprecated and will be removed in 0.2: {old[2]}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(old[0]), old[1])
    raise AttributeError(f"module 'fusionkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])


# --- generated from EXPORTS by `python -m fusionkit._facade`; do not edit by hand ---
if TYPE_CHECKING:
    from fusionkit.apply.builder import FusionError as FusionError
    from fusionkit.apply.builder import Rewriter as Rewriter
    from fusionkit.authoring.from_example import ExampleError as ExampleError
    from fusionkit.authoring.from_example import TraceOptions as TraceOptions
    from fusionkit.authoring.from_example import pattern_from_function as pattern_from_function
    from fusionkit.authoring.from_example import rule_from_functions as rule_from_functions
    from fusionkit.authoring.near_miss import why_not as why_not
    from fusionkit.authoring.python_source import NotPrintable as NotPrintable
    from fusionkit.authoring.python_source import to_python as to_python
    from fusionkit.check.constraints import CheckContext as CheckContext
    from fusionkit.check.constraints import Constraint as Constraint
    from fusionkit.check.constraints import Custom as Custom
    from fusionkit.check.constraints import DtypeIn as DtypeIn
    from fusionkit.check.constraints import GraphLeaf as GraphLeaf
    from fusionkit.check.constraints import PrepackableConstant as PrepackableConstant
    from fusionkit.check.constraints import Rank as Rank
    from fusionkit.check.constraints import ReducesLastDim as ReducesLastDim
    from fusionkit.check.constraints import SameDtype as SameDtype
    from fusionkit.check.constraints import ScalarRange as ScalarRange
    from fusionkit.check.constraints import ShapeRelation as ShapeRelation
    from fusionkit.check.constraints import StaticShape as StaticShape
    from fusionkit.check.constraints import UserInput as UserInput
    from fusionkit.check.constraints import broadcasts_over_last_dim as broadcasts_over_last_dim
    from fusionkit.check.constraints import named_shape_relation as named_shape_relation
    from fusionkit.check.executable import register_delegate as register_delegate
    from fusionkit.check.program_inputs import ConstantKind as ConstantKind
    from fusionkit.check.program_inputs import ConstantRef as ConstantRef
    from fusionkit.check.program_inputs import ProgramInputs as ProgramInputs
    from fusionkit.fusion_pass import FusionPass as FusionPass
    from fusionkit.match.finder import Decline as Decline
    from fusionkit.match.finder import Match as Match
    from fusionkit.match.finder import MatchSet as MatchSet
    from fusionkit.match.finder import RuleIndex as RuleIndex
    from fusionkit.match.finder import find_matches as find_matches
    from fusionkit.match.pattern import CASTS as CASTS
    from fusionkit.match.pattern import Pattern as Pattern
    from fusionkit.match.pattern import also as also
    from fusionkit.match.pattern import any_float as any_float
    from fusionkit.match.pattern import any_value as any_value
    from fusionkit.match.pattern import capture as capture
    from fusionkit.match.pattern import int_list as int_list
    from fusionkit.match.pattern import integer as integer
    from fusionkit.match.pattern import lit as lit
    from fusionkit.match.pattern import one_of as one_of
    from fusionkit.match.pattern import op as op
    from fusionkit.match.pattern import optional_dtype as optional_dtype
    from fusionkit.match.pattern import outputs as outputs
    from fusionkit.match.pattern import per_row_block as per_row_block
    from fusionkit.match.pattern import positive as positive
    from fusionkit.match.pattern import scalar as scalar
    from fusionkit.match.pattern import seq as seq
    from fusionkit.match.pattern import through as through
    from fusionkit.match.pattern import where as where
    from fusionkit.match.targets import op_key as op_key
    from fusionkit.report import FusionReport as FusionReport
    from fusionkit.result import MatchResult as MatchResult
    from fusionkit.result import Status as Status
    from fusionkit.result import Step as Step
    from fusionkit.rule import CallOp as CallOp
    from fusionkit.rule import PythonReplacement as PythonReplacement
    from fusionkit.rule import Ref as Ref
    from fusionkit.rule import Replacement as Replacement
    from fusionkit.rule import Rule as Rule
    from fusionkit.rule import RuleError as RuleError
    from fusionkit.rule import ref as ref
    from fusionkit.rule import replace_with as replace_with
# --- end of generated imports ---
