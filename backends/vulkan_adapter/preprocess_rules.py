"""``VulkanBackend.preprocess`` with fusionkit rules in place of stock rewrite passes.

ExecuTorch 1.5.1's ``VulkanBackend.preprocess`` hands ``vulkan_preprocess.apply_passes``
a list of pass objects. :data:`TAKEN_OVER_PASSES` names the stock passes whose rewrites
are fusionkit rules (the ``"vulkan_preprocess"`` rule set: a factory registered with
``takes_over=<stock pass class name>``); the patched ``apply_passes`` puts a
:class:`RulePass` running those rules in each one's place in the list. Every other pass
runs as ExecuTorch wrote it (through the module's ``_transform``, so gated by
:mod:`.pass_gates`).

A :class:`RulePass` is a plain callable, which ``apply_passes`` calls with the program
(``program = p(program)``): every match is decided first (constraints, and the Vulkan
runtime's conditions on any ``et_vk`` node it would create), then the accepted ones are
applied in place, all or nothing, and constants left unused are removed (as the stock
passes delete theirs): :func:`fusionkit.run_rules`, until a round fuses nothing or a
replacement fails (:data:`MAX_ROUNDS` at most), each stock pass's dead-code sweep as a
parameter (:class:`StockPass`). No retrace: each new node's metadata comes from fake-tensor
propagation.

:data:`PATCHES` is the reversible patch of ``apply_passes``; the takeover includes it,
so only partitions a fusionkit partitioner made are rewritten by rules. :func:`disabled`
runs the stock passes instead (in this thread), for comparisons.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from fusionkit import Rule, op_key, run_rules
from fusionkit.integration.hooks import PatchSet
from fusionkit.integration.preprocess_takeover import Takeover
from fusionkit.passes.registry import rules_taking_over, taken_over_patterns
from fusionkit.passes.vulkan.addmm_to_linear import FALLBACK_OPS as ADDMM_FALLBACK_OPS

from .delegation import with_delegation_check

__all__ = ["MAX_ROUNDS", "PATCHES", "RULE_PASSES", "STOCK_PASSES", "TAKEN_OVER_PASSES", "RulePass",
           "StockPass", "counts", "disabled", "is_enabled", "reset_counts", "rules_for"]

_PREPROCESS_MODULE = "executorch.backends.vulkan.vulkan_preprocess"

#: the rule set whose factories registered ``takes_over=<stock pass>`` replace them
RULE_SET = "vulkan_preprocess"

#: stock pass class name -> the factory whose rules replace it
TAKEN_OVER_PASSES: dict[str, str] = taken_over_patterns(RULE_SET)

@dataclass(frozen=True)
class StockPass:
    """What the adapter must know of one replaced stock pass to leave what it leaves."""

    #: its exact ``module.QualName`` in ExecuTorch 1.5.1 (a subclass, or a same-named
    #: class elsewhere, is a different pass and keeps running)
    qualname: str
    #: the stock pass deletes the constants its rewrite left unused
    drop_dead_constants: bool = True
    #: the stock pass ends with FX dead-code elimination, found something or not
    dead_code_elimination: bool = False
    #: ... only when it rewrote something
    dead_code_elimination_if_changed: bool = False
    #: op keys on which the stock pass runs instead (a rewrite not written as a rule)
    fallback_ops: frozenset[str] = frozenset()


#: stock pass class name -> what it does besides its rewrites
STOCK_PASSES: dict[str, StockPass] = {
    "FuseBatchNormPass": StockPass(
        "executorch.backends.xnnpack._passes.fuse_batch_norm.FuseBatchNormPass",
        drop_dead_constants=False),
    "FuseClampPass": StockPass(
        "executorch.backends.transforms.fuse_conv_with_clamp.FuseClampPass"),
    "AddmmToLinearTransform": StockPass(
        "executorch.backends.transforms.addmm_mm_to_linear.AddmmToLinearTransform",
        drop_dead_constants=False, dead_code_elimination=True,
        fallback_ops=ADDMM_FALLBACK_OPS),
    "RemoveRedundantOpsTransform": StockPass(
        "executorch.backends.vulkan._passes.remove_redundant_ops.RemoveRedundantOpsTransform",
        drop_dead_constants=False, dead_code_elimination=True),
    "ViewCopyToSqueezeUnsqueezePass": StockPass(
        "executorch.backends.transforms.view_copy_to_squeeze_unsqueeze."
        "ViewCopyToSqueezeUnsqueezePass", drop_dead_constants=False),
    "InsertDtypePromotionPass": StockPass(
        "executorch.backends.vulkan._passes.insert_dtype_promotion.InsertDtypePromotionPass",
        drop_dead_constants=False, dead_code_elimination_if_changed=True),
    "FuseQuantizedOpsTransform": StockPass(
        "executorch.backends.vulkan._passes.fuse_quantized_ops.FuseQuantizedOpsTransform",
        drop_dead_constants=False, dead_code_elimination=True),
    "FoldQDQPass": StockPass(
        "executorch.backends.vulkan._passes.fold_qdq.FoldQDQPass",
        drop_dead_constants=False, dead_code_elimination=True),
    "SqueezeUnsqueezeInputs": StockPass(
        "executorch.backends.vulkan._passes.squeeze_unsqueeze_inputs.SqueezeUnsqueezeInputs",
        drop_dead_constants=False),
    "FuseViewCopyTransform": StockPass(
        "executorch.backends.transforms.fuse_view_copy.FuseViewCopyTransform",
        drop_dead_constants=False, dead_code_elimination_if_changed=True),
}

#: rounds of one rule pass at most (a rewrite can make the next one possible: the linear
#: an mm became may be followed by an identity view)
MAX_ROUNDS = 8


def _rules(stock_pass: str) -> list[Rule]:
    """With the runtime's conditions on what they create (the nodes are delegated already)."""
    return [with_delegation_check(r, None) for r in rules_taking_over(RULE_SET, stock_pass)]


#: the taken-over passes' rules (built once), the per-thread switch and the counts
#: ({"runs", "fused", "declined", "stock_runs"} per stock pass)
RULE_PASSES = Takeover(TAKEN_OVER_PASSES, _rules,
                       count_keys=("runs", "fused", "declined", "stock_runs"))
rules_for = RULE_PASSES.rules_for
is_enabled = RULE_PASSES.is_enabled
#: ``with disabled():`` the stock passes run (in this thread) while the block runs
disabled = RULE_PASSES.disabled
counts = RULE_PASSES.counts
reset_counts = RULE_PASSES.reset_counts


class RulePass:
    """Runs the rules replacing one stock pass on a whole ``ExportedProgram``, in place.

    ``stock``: the stock pass object, run instead (through ``_transform``, as
    ``apply_passes`` would) on a graph holding one of its :attr:`StockPass.fallback_ops`.
    """

    def __init__(self, stock_pass: str, stock: Any = None) -> None:
        self.stock_pass = stock_pass
        self.stock = stock
        self.spec = STOCK_PASSES[stock_pass]

    def __repr__(self) -> str:
        return f"RulePass({self.stock_pass!r})"

    def _falls_back(self, program: Any) -> bool:
        if self.stock is None or not self.spec.fallback_ops:
            return False
        return any(op_key(n.target) in self.spec.fallback_ops
                   for n in program.graph_module.graph.nodes if n.op == "call_function")

    def __call__(self, program: Any) -> Any:
        if self._falls_back(program):
            module = importlib.import_module(_PREPROCESS_MODULE)
            self._count("stock_runs", 1)
            return module._transform(program, self.stock, override_verifiers=[module._any_op])
        spec = self.spec
        # every node is delegated already (preprocess runs on a partition): no folding, no
        # CPU check; the rules carry the runtime's conditions (:func:`_rules`)
        run = run_rules(program, rules_for(self.stock_pass), rounds=MAX_ROUNDS,
                        stop_on_failure=True, structural_declines=False, allow_folding=False,
                        check_replacements=False, drop_dead_constants=spec.drop_dead_constants,
                        sweep_dead_code="always" if spec.dead_code_elimination else
                        "if_fused" if spec.dead_code_elimination_if_changed else "never")
        self._count("runs", 1)
        self._count("fused", run.fused)
        self._count("declined", sum(len(r.found.declined) for r in run.rounds))
        return program

    def _count(self, key: str, n: int) -> None:
        RULE_PASSES.count(self.stock_pass, key, n)


def _stock_name(pass_obj: Any) -> str | None:
    cls = type(pass_obj)
    name = cls.__name__
    spec = STOCK_PASSES.get(name)
    if name in TAKEN_OVER_PASSES and spec is not None and \
            spec.qualname == f"{cls.__module__}.{cls.__qualname__}":
        return name
    return None


def _replaced(passes: list[Any]) -> list[Any]:
    out = []
    for p in passes:
        name = _stock_name(p) if is_enabled() else None
        out.append(RulePass(name, p) if name is not None else p)
    return out


def _release_programs(passes: list[Any]) -> None:
    """Each pass drops the program it holds (``_exported_program``: ``FuseBatchNormPass``'s
    from its constructor, the one ``apply_passes`` sets on the others). An ``ExportPass``
    and its tracer refer to each other (``tracer.callback``), so a pass outlives the list
    ``VulkanBackend.preprocess`` builds for this one call until the cyclic collector runs,
    and with it the program: the copy preprocess works on, each delegated weight copied
    (Qwen3's 594 MiB output projection among them)."""
    for p in passes:
        held: tuple[Any, ...] = (p, getattr(p, "stock", None))  # a RulePass: the stock pass
        for q in held:
            if getattr(q, "_exported_program", None) is not None:
                q._exported_program = None


def _patches() -> list[tuple[Any, str, Any]]:
    module = importlib.import_module(_PREPROCESS_MODULE)
    stock = module.apply_passes

    def apply_passes(program: Any, passes: Any) -> Any:
        passes = _replaced(list(passes))
        try:
            return stock(program, passes)
        finally:
            _release_programs(passes)

    apply_passes.__wrapped__ = stock  # type: ignore[attr-defined]
    return [(module, "apply_passes", apply_passes)]


#: rules in place of :data:`TAKEN_OVER_PASSES` inside ``vulkan_preprocess.apply_passes``
PATCHES = PatchSet("fusionkit.backends.vulkan_adapter.preprocess_rules (Vulkan preprocess "
                   f"passes {sorted(TAKEN_OVER_PASSES)} as rules)", _patches)
