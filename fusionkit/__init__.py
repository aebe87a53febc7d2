"""fusionkit: declarative, constraint-checked fusion passes for ExecuTorch lowering: a :class:`Rule`, :func:`find_matches`, :class:`FusionPass`, :func:`run_rules`,
a :class:`BackendAdapter`. :data:`EXPORTS` is the one table: ``__all__``, lazy loading and the ``TYPE_CHECKING`` imports (``python -m fusionkit._facade``) follow from it."""
# ruff: noqa: F401, I001  (the generated imports below re-export every name of EXPORTS)

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

#: public name -> (module, what it is); loaded on first use (PEP 562): no torch import here
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
    "Custom": ("fusionkit.check.constraints", "a constraint written as a Python function returning a reason or None"), "OperandHint": ("fusionkit.check.constraints", "how fusionkit.verify makes an operand a check asks for (a check's hints)"),
    "Rule": ("fusionkit.rule", "a fusion: name, pattern, constraints, replacement"),
    "RuleError": ("fusionkit.rule", "a rule that cannot be correct as written (raised when built)"),
    "Replacement": ("fusionkit.rule", "base class of replacements (build the fused node(s))"),
    "CallOp": ("fusionkit.rule", "a replacement that calls one op with referenced captures"),
    "PythonReplacement": ("fusionkit.rule", "a replacement written as a Python function over a Rewriter"),
    "Ref": ("fusionkit.rule", "a reference to a capture inside replacement arguments"),
    "ref": ("fusionkit.rule", "make a :class:`Ref`"),
    "replace_with": ("fusionkit.rule", "make a :class:`CallOp` replacement"), "OpSemantics": ("fusionkit.rule", "what a backend states its ops compute, carried by its rules (for verify)"), "ProgramForm": ("fusionkit.rule", "where a backend's pipeline runs a rule: the program's form there (for verify)"),
    "Rewriter": ("fusionkit.edit.builder", "creates replacement nodes with metadata (the replacement author's API)"),
    "FusionError": ("fusionkit.edit.builder", "a rule produced something inconsistent (a rule bug)"),
    "op_key": ("fusionkit.targets", "the one string key of an op target (ATen, edge or custom)"),
    "register_delegate": ("fusionkit.find.executable", "tell fusionkit which ops a backend's delegate takes (its own namespaces, its registry)"),
    "find_matches": ("fusionkit.find.finder", "decide every match of a rule set in one phase (changes nothing)"),
    "Match": ("fusionkit.find.finder", "an accepted match: rule, root, captures, claimed nodes, folds"),
    "MatchSet": ("fusionkit.find.finder", "the accepted matches and the declined ones (MatchResults) of one search"),
    "RuleIndex": ("fusionkit.find.finder", "rules indexed by root op (build once, search many graphs)"), "DeferredRules": ("fusionkit.find.finder", "a group of rules built the first time a program holds one of their root ops"),
    "FusionPass": ("fusionkit.fusion_pass", "ExportedProgram pass applying a rule set (drop-in transform pass)"),
    "run_rules": ("fusionkit.engine", "the one engine: find, decide, apply a rule set on a program (rounds, target, sweep)"), "RuleRun": ("fusionkit.engine", "what run_rules did: its rounds, the matches applied and declined, modified"),
    "ExecutionTarget": ("fusionkit.find.executable", "where a program runs: what a replacement may create (the CPU runtime, delegates)"), "Delegate": ("fusionkit.find.executable", "a backend taking ops off the CPU runtime: its refusal(node) says why not"),
    "BackendAdapter": ("fusionkit.integration.adapter", "what a backend provides: rule sets, target, oracle, takeover points, install trio"), "PatchSet": ("fusionkit.integration.adapter", "named, reversible replacements of stock functions: an adapter's install trio"),
    "FusionReport": ("fusionkit.report", "per-rule outcome of a pass run: fused, folded, declined"),
    "ProgramInputs": ("fusionkit.program_inputs", "classifies placeholders: parameters, buffers, constants, user inputs"),
    "ConstantRef": ("fusionkit.program_inputs", "a constant placeholder's kind, name and tensor"),
    "ConstantKind": ("fusionkit.program_inputs", "parameter, buffer or lifted tensor constant"),
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
    "verify": ("fusionkit.authoring.verify", "whether a rule's replacement computes what its pattern computes: equal, different (smallest counterexample) or cannot check"),
}

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    entry = EXPORTS.get(name)
    if entry is None:
        raise AttributeError(f"module 'fusionkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(entry[0]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])


# --- generated from EXPORTS by `python -m fusionkit._facade`; do not edit by hand ---
if TYPE_CHECKING:
    from fusionkit.authoring.from_example import ExampleError, TraceOptions, pattern_from_function, rule_from_functions
    from fusionkit.authoring.near_miss import why_not
    from fusionkit.authoring.python_source import NotPrintable, to_python
    from fusionkit.authoring.verify import verify
    from fusionkit.check.constraints import CheckContext, Constraint, Custom, DtypeIn, GraphLeaf, OperandHint, PrepackableConstant, Rank, ReducesLastDim, SameDtype, ScalarRange, ShapeRelation, StaticShape, UserInput, broadcasts_over_last_dim, named_shape_relation
    from fusionkit.edit.builder import FusionError, Rewriter
    from fusionkit.engine import RuleRun, run_rules
    from fusionkit.find.executable import Delegate, ExecutionTarget, register_delegate
    from fusionkit.find.finder import DeferredRules, Match, MatchSet, RuleIndex, find_matches
    from fusionkit.fusion_pass import FusionPass
    from fusionkit.integration.adapter import BackendAdapter, PatchSet
    from fusionkit.match.pattern import CASTS, Pattern, also, any_float, any_value, capture, int_list, integer, lit, one_of, op, optional_dtype, outputs, per_row_block, positive, scalar, seq, through, where
    from fusionkit.program_inputs import ConstantKind, ConstantRef, ProgramInputs
    from fusionkit.report import FusionReport
    from fusionkit.result import MatchResult, Status, Step
    from fusionkit.rule import CallOp, OpSemantics, ProgramForm, PythonReplacement, Ref, Replacement, Rule, RuleError, ref, replace_with
    from fusionkit.targets import op_key
# --- end of generated imports ---
