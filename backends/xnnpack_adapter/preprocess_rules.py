"""XNNPACK's preprocess with fusionkit rules in place of its pattern-rewrite passes.

``XnnpackBackend.preprocess`` (ExecuTorch 1.5.1) runs ``XNNPACKPassManager``'s
default pass list on each partition. :data:`TAKEN_OVER_PASSES` names the stock
passes whose rewrites are fusionkit rules (:mod:`fusionkit.passes.xnnpack`, the
``"xnnpack"`` rule set); :func:`transform` is the pass manager's ``transform``
with each of those classes replaced, at its place in the list, by a
:class:`RulePass` running its rules (until nothing more matches: a rewrite can
make the next one possible, as the stock loops do when they visit nodes they
created; :func:`fusionkit.run_rules` with ``rounds=MAX_ROUNDS``). Every other pass
(layout, constant propagation, the rest) runs as
ExecuTorch wrote it, through the module's ``_transform`` (so gated by
:mod:`.pass_gates` when that is installed too).

:data:`PATCHES` is the reversible patch of ``XNNPACKPassManager.transform`` (the
name of a patch set in either adapter: the Vulkan adapter's preprocess rules' is
``preprocess_rules.PATCHES`` too). The adapter
includes it in the patch set its scoped preprocess installs, so only the partitions a
fusionkit partitioner made are rewritten by rules.
:func:`disabled` runs the stock passes instead, in this thread (the op-test
twins compare both).
"""

from __future__ import annotations

import importlib
from typing import Any

from executorch.exir.pass_base import ExportedProgramPassResult
from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit import Delegate, ExecutionTarget, FusionPass, Rule, run_rules
from fusionkit.integration.hooks import PatchSet, UnsupportedExecuTorchError
from fusionkit.integration.preprocess_takeover import Takeover
from fusionkit.integration.trace_residue import release_last_trace
from fusionkit.passes.registry import rules_taking_over, taken_over_patterns

__all__ = ["MAX_ROUNDS", "PATCHES", "RULE_PASSES", "SWEEPS_DEAD_CODE", "TAKEN_OVER_PASSES",
           "RulePass", "counts", "disabled", "is_enabled", "reset_counts", "rules_for", "transform"]

_PASSES_MODULE = "executorch.backends.xnnpack._passes"

#: the rule set whose factories registered ``takes_over=<stock pass>`` replace them
RULE_SET = "xnnpack"

#: stock pass class name (in ``executorch.backends.xnnpack._passes``) -> the factory
#: whose rules replace it. A stock pass not listed here runs as ExecuTorch wrote it.
TAKEN_OVER_PASSES: dict[str, str] = taken_over_patterns(RULE_SET)

#: taken-over stock passes that sweep dead code on every run (``ConvertToLinearPass``:
#: ``graph.eliminate_dead_code()`` in ``apply_addmm_mm_to_linear_transform``); their rule
#: pass does too, after its rules -- the shape arithmetic of a dynamic batch
#: (``operator.mul`` of SymInts, which no rule claims) goes dead with the reshapes a rule
#: replaced, and XNNPACK's serializer has no visitor for it
SWEEPS_DEAD_CODE: frozenset[str] = frozenset({"ConvertToLinearPass"})

#: rounds of one rule pass at most (each round: find every match, apply the accepted)
MAX_ROUNDS = 8

#: the taken-over passes' rules (built once), the per-thread switch and the counts
#: ({"runs", "fused"} per stock pass)
RULE_PASSES = Takeover(TAKEN_OVER_PASSES, lambda name: rules_taking_over(RULE_SET, name))
rules_for = RULE_PASSES.rules_for
is_enabled = RULE_PASSES.is_enabled
#: ``with disabled():`` the stock passes run (in this thread) while the block runs,
#: takeover installed or not
disabled = RULE_PASSES.disabled
counts = RULE_PASSES.counts
reset_counts = RULE_PASSES.reset_counts


def _visitor_refusal(node: Node) -> str | None:
    """None when XNNPACK's serializer has a node visitor for ``node``'s op."""
    import executorch.backends.xnnpack.operators  # noqa: F401  (registers the visitors)
    from executorch.backends.xnnpack.operators.node_visitor import _node_visitor_dict

    name = getattr(node.target, "__name__", None)
    if name in _node_visitor_dict:
        return None
    return f"XNNPACK's preprocess has no node visitor for {name}"


#: inside ``preprocess`` every node is XNNPACK's already: what a rule creates must be
#: an op XNNPACK's serializer writes (it never reaches the CPU runtime)
XNNPACK_TARGET = ExecutionTarget([Delegate("XNNPACK", _visitor_refusal)],
                                 assume_registered_backend_ops=False)


class RulePass(FusionPass):
    """The rules of one stock pass, applied until a round fuses nothing (at most
    :data:`MAX_ROUNDS`). Never raises for a rule: a replacement that fails is undone
    and reported (non-strict), and the stock program goes on as the stock pass
    would have left it without that rewrite."""

    def __init__(self, stock_pass: str, rules: tuple[Rule, ...]) -> None:
        super().__init__(rules, name=f"fusionkit_xnnpack:{stock_pass}", strict=False)
        self.stock_pass = stock_pass

    def call(self, exported_program: ExportedProgram) -> ExportedProgramPassResult:
        run = run_rules(exported_program, self.index, strict=False, target=XNNPACK_TARGET,
                        rounds=MAX_ROUNDS if self.rules else 0, structural_declines=False,
                        sweep_dead_code="always" if self.stock_pass in SWEEPS_DEAD_CODE
                        else "never")
        for r in run.rounds:  # a report per round (``history``), as the stock loop's visits
            self.record_run(r.outcome)
        RULE_PASSES.count(self.stock_pass, "runs")
        RULE_PASSES.count(self.stock_pass, "fused", run.fused)
        return ExportedProgramPassResult(exported_program, run.modified)


def _stock_classes() -> dict[type, str]:
    """The stock pass classes taken over, by exact class (a subclass is another pass)."""
    module = importlib.import_module(_PASSES_MODULE)
    classes: dict[type, str] = {}
    for name in TAKEN_OVER_PASSES:
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            raise UnsupportedExecuTorchError(
                f"{_PASSES_MODULE} has no pass class {name}; this ExecuTorch build does not "
                "look like the one the XNNPACK rules were written against")
        classes[cls] = name
    return classes


def _retraces(pass_obj: Any) -> bool:
    """Whether a stock pass that changed the program re-traced it (exact metadata after it)."""
    from . import pass_gates

    gate = pass_gates.PASS_GATES.get(f"{type(pass_obj).__module__}.{type(pass_obj).__qualname__}")
    return gate is not None and gate.retraces


def transform(self: Any) -> ExportedProgram:
    """``XNNPACKPassManager.transform`` with the taken-over passes run as rules.

    The stock passes taken over each end with an ExportPass re-trace, which also
    refreshes metadata that an earlier change left stale (a constant given new
    strides before partitioning, an in-place pass). A rule pass re-traces once in
    their stead where the metadata is not known to be exact yet -- before its rules,
    so that their constraints read exact values -- and not again: the nodes the rules
    create carry exact metadata of their own.
    """
    module = importlib.import_module(_PASSES_MODULE)
    classes = _stock_classes() if is_enabled() else {}
    if classes:  # the stock ConvertToSDPAPass / ConvertToUpsampleBilinear2d would trace
        release_last_trace()
    ep = self.exported_program
    exact = False  # metadata re-derived since preprocess began, no in-place change since
    for pass_ in self.passes:
        name = classes.get(pass_)
        if name is not None:
            if not exact:
                ep = module._transform(ep, module.ExportPass())
                exact = True
            ep = module._transform(ep, RulePass(name, rules_for(name)))
            continue
        if issubclass(pass_, module.XNNPACKPass):
            transform_pass: Any = pass_(ep)
        elif issubclass(pass_, module.ExportPass):
            transform_pass = pass_()
        else:
            raise RuntimeError(
                f"Expecting ExportPass or ExportPass(), but got pass: {pass_} with type: "
                f"{type(pass_)}")
        before = ep
        ep = module._transform(ep, transform_pass)
        if ep is not before:  # it changed the program: exact if it re-traced
            exact = _retraces(transform_pass)
    return ep  # type: ignore[no-any-return]


def _patches() -> list[tuple[Any, str, Any]]:
    module = importlib.import_module(_PASSES_MODULE)
    _stock_classes()  # refuse an ExecuTorch without the passes taken over
    return [(module.XNNPACKPassManager, "transform", transform)]


PATCHES = PatchSet(
    f"fusionkit.backends.xnnpack_adapter.preprocess_rules (takes over "
    f"{sorted(TAKEN_OVER_PASSES)} in {_PASSES_MODULE}.XNNPACKPassManager)", _patches)
