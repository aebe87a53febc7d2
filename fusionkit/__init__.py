"""fusionkit: declarative, constraint-checked fusion passes for ExecuTorch lowering: a :class:`Rule`, :func:`find_matches`, :class:`FusionPass`, :func:`run_rules`,
a :class:`BackendAdapter`. :data:`EXPORTS` (``fusionkit.public_names``) is the one table: ``__all__``, lazy loading and the ``TYPE_CHECKING`` imports (``python -m fusionkit._facade``) follow from it."""
# ruff: noqa: F401, I001  (the generated imports below re-export every name of EXPORTS)

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fusionkit.public_names import EXPORTS  # public name -> (module, what it is); loaded on first use (PEP 562)

__version__ = "0.2.0.dev0"

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
    from fusionkit.match.pattern import CASTS, Op, Pattern, PatternVisitor, also, any_float, any_value, capture, int_list, integer, lit, one_of, op, optional_dtype, outputs, per_row_block, positive, scalar, seq, through, where
    from fusionkit.match.shape_guards import guards_suppressed, guards_suppressed_for
    from fusionkit.program import as_exported_program
    from fusionkit.program_inputs import ConstantKind, ConstantRef, ProgramInputs
    from fusionkit.report import FusionReport
    from fusionkit.result import MatchResult, Status, Step
    from fusionkit.rule import CallOp, OpSemantics, ProgramForm, PythonReplacement, Ref, Replacement, Rule, RuleError, ref, replace_with
    from fusionkit.targets import import_op_libraries, impurity, op_key, resolve_op
# --- end of generated imports ---
