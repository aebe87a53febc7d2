"""Arm's TOSA pipeline with fusionkit rules in place of its pattern-shaped fusions.

``TOSABackend._preprocess`` (ExecuTorch 1.5.1; the Ethos-U and VGF backends call it
too) builds an ``ArmPassManager`` and runs its TOSA pipeline on each partition
(``transform_to_backend_pipeline``). :func:`taken_over_passes` names the stock passes
whose fusions are fusionkit rules (:mod:`fusionkit.passes.arm`, the ``"arm"`` rule set;
each factory registered with ``takes_over=<stock pass class>``); the patched
``ArmPassManager._transform`` runs the pipeline with each instance of those classes
replaced, at its place in the list, by an :class:`ArmRulePass` running its rules (until
a round fuses nothing). Every other pass runs as ExecuTorch wrote it; the pass list
itself (skips from the pipeline config, registered insertions, the check of which pass
must run after which) is built by ExecuTorch and validated before the swap, so a pass
the config skips is never replaced and an insertion before a taken-over pass still
lands there.

A rule pass works on the program the pass manager is transforming (it needs the
``ExportedProgram``: constants are read from it); a control-flow submodule, which Arm
transforms as a bare ``GraphModule``, runs the stock passes.

:data:`PATCHES` is the reversible patch of ``ArmPassManager._transform``; the adapter
includes it in the patch set its scoped preprocess installs, so only the partitions a
fusionkit partitioner made are rewritten by rules. :func:`disabled` runs the stock
passes instead, in this thread (the comparisons with stock use it).
"""

from __future__ import annotations

import importlib
from typing import Any

from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassResult

from fusionkit import Delegate, ExecutionTarget, FusionReport, Rule, op_key, run_rules
from fusionkit.integration.hooks import PatchSet, UnsupportedExecuTorchError
from fusionkit.integration.preprocess_takeover import Takeover
from fusionkit.passes.arm import RULE_SET, rules_for, taken_over_passes

__all__ = ["ARM_TARGET", "MAX_ROUNDS", "PATCHES", "RETRACES", "RULE_PASSES", "RULE_SET",
           "TAKEN_OVER_PASSES", "ArmRulePass",
           "counts", "disabled", "is_enabled", "reset_counts"]

_PASSES_MODULE = "executorch.backends.arm._passes"
_MANAGER_MODULE = "executorch.backends.arm._passes.arm_pass_manager"

#: rounds of one rule pass at most (each round: find every match, apply the accepted)
MAX_ROUNDS = 8

#: taken-over stock passes that re-trace the program after a change (``super().call``:
#: ``FuseQuantizedActivationPass``); their rule pass does too, so the nodes after it
#: carry the names and metadata of a fresh trace, as after the stock pass
RETRACES: frozenset[str] = frozenset({"FuseQuantizedActivationPass"})

#: stock pass class name (in ``executorch.backends.arm._passes``) -> the factory whose
#: rules replace it; a stock pass not listed here runs as ExecuTorch wrote it
TAKEN_OVER_PASSES: dict[str, str] = taken_over_passes()

#: the taken-over passes' rules (built once), the per-thread switch and the counts
RULE_PASSES = Takeover(TAKEN_OVER_PASSES, lambda name: rules_for(name))
is_enabled = RULE_PASSES.is_enabled
#: ``with disabled():`` the stock passes run (in this thread) while the block runs
disabled = RULE_PASSES.disabled
counts = RULE_PASSES.counts
reset_counts = RULE_PASSES.reset_counts

#: the ops a rule may create inside Arm's pipeline: those the stock passes taken over
#: create at the same place (later passes of the pipeline lower each to TOSA)
CREATED_OPS: frozenset[str] = frozenset({
    "aten.clamp.default", "aten.convolution.default",
    "quantized_decomposed.quantize_per_tensor.default",
    "tosa.SLICE.default", "tosa.CONST_SHAPE.default", "tosa.CONCAT_SHAPE.default",
    "tosa.RESCALE.default", "tosa.TABLE.default"})


def _arm_refusal(node: Node) -> str | None:
    key = op_key(node.target)
    if key in CREATED_OPS:
        return None
    return (f"{key} is not an op the stock Arm passes taken over create, so no later pass "
            "of the TOSA pipeline is known to lower it")


#: inside preprocess every node is the TOSA backend's already
ARM_TARGET = ExecutionTarget([Delegate("TOSA", _arm_refusal)],
                             assume_registered_backend_ops=False)


class ArmRulePass:
    """The rules of one stock Arm pass, as the graph-module pass ``ArmPassManager`` runs.

    ``ArmPassManager._transform`` wraps each pass so that one with an
    ``exported_program`` attribute gets the program being transformed; the rules are
    found and applied on it (:func:`fusionkit.run_rules`, :data:`MAX_ROUNDS` rounds at most,
dead code swept when a rule applied). Never raises for a rule (unless
    ``FUSIONKIT_STRICT=1``, as the tests run): a replacement that fails is undone and
    reported, and the program goes on as the stock pass would have left it without that
    rewrite.
    """

    def __init__(self, stock: Any, rules: tuple[Rule, ...]) -> None:
        self.stock = stock
        self.stock_pass = type(stock).__name__
        self.rules = rules
        self.exported_program: Any = None
        self.report: FusionReport | None = None
        self.history: list[FusionReport] = []
        # what ArmPassManager asks any pass (its name, which passes must follow)
        self._passes_required_after: set[type] = set(getattr(stock, "_passes_required_after", ()))
        self.__name__ = f"fusionkit_arm:{self.stock_pass}"

    def __call__(self, graph_module: GraphModule) -> PassResult:
        ep = self.exported_program
        if ep is None or ep.graph_module is not graph_module:
            raise RuntimeError(f"{self.__name__} runs only on the program ArmPassManager "
                               "transforms")
        run = run_rules(ep, self.rules, strict=None, target=ARM_TARGET, rounds=MAX_ROUNDS,
                        structural_declines=False, sweep_dead_code="if_fused")
        names = [r.name for r in self.rules]
        for r in run.rounds:  # a report per round, the last one :attr:`report`
            self.report = FusionReport.from_matches(names, r.outcome)
            self.history.append(self.report)
        gm = ep.graph_module
        if run.fused and self.stock_pass in RETRACES:  # the stock pass's own re-trace
            retrace: Any = super(type(self.stock), self.stock)  # (ArmPass.call)
            gm = retrace.call(gm).graph_module
        RULE_PASSES.count(self.stock_pass, "runs")
        RULE_PASSES.count(self.stock_pass, "fused", run.fused)
        return PassResult(gm, run.fused > 0)


def _stock_classes() -> dict[type, str]:
    """The stock pass classes taken over, by exact class (a subclass is another pass)."""
    module = importlib.import_module(_PASSES_MODULE)
    classes: dict[type, str] = {}
    for name in RULE_PASSES:
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            raise UnsupportedExecuTorchError(
                f"{_PASSES_MODULE} has no pass class {name}; this ExecuTorch build does not "
                "look like the one the Arm rules were written against")
        classes[cls] = name
    return classes


def _with_rules(passes: list[Any]) -> list[Any]:
    classes = _stock_classes()
    out = []
    for p in passes:
        name = classes.get(type(p))
        out.append(ArmRulePass(p, RULE_PASSES.rules_for(name)) if name else p)
    return out


def _patches() -> list[tuple[Any, str, Any]]:
    manager = importlib.import_module(_MANAGER_MODULE).ArmPassManager
    _stock_classes()  # refuse an ExecuTorch without the passes taken over
    stock_transform = manager.__dict__["_transform"]

    def _transform(self: Any, exported_program: Any, graph_module: Any) -> Any:
        if not is_enabled() or graph_module is not exported_program.graph_module:
            return stock_transform(self, exported_program, graph_module)
        stock_passes = self.passes
        self.passes = _with_rules(stock_passes)
        try:
            return stock_transform(self, exported_program, graph_module)
        finally:
            self.passes = stock_passes

    _transform.__wrapped__ = stock_transform  # type: ignore[attr-defined]
    return [(manager, "_transform", _transform)]


PATCHES = PatchSet(
    f"fusionkit.backends.arm_adapter.preprocess_rules (takes over {sorted(RULE_PASSES)} in "
    f"{_MANAGER_MODULE}.ArmPassManager, rule set {RULE_SET!r})", _patches)
