"""Rules for the pattern-shaped fusions of ExecuTorch's Arm (TOSA) backend.

ExecuTorch 1.5.1's ``ArmPassManager`` (``executorch/backends/arm/_passes/
arm_pass_manager.py``) runs its TOSA pipeline on every partition in ``preprocess``
(``TOSABackend``, and through it the Ethos-U and VGF backends). Some of its passes are
pattern fusions written by hand: a detection loop that forgets what the fused program
needs (constant operands, single users, dtypes, ranks). The modules here state them as
fusionkit rules (installed as ``fusionkit.passes.arm``), one module per stock pass; each
factory registers in the ``"arm"`` rule set with ``takes_over=<stock pass class name>``,
and the Arm adapter (:mod:`fusionkit.backends.arm_adapter.preprocess_rules`) runs them in
that pass's place in the pass list. Not in ``"vulkan_patterns"``: they rewrite TOSA-dialect ops
(``tosa.RESCALE``, ``tosa.SLICE``, ...) that only the Arm backend has.

The registry is :data:`TAKEN_OVER_PASSES` (stock pass class name -> the rule factory
replacing it) and :func:`rules_for` (the rules replacing one stock pass); a module adds
itself by registering ``@register_rules("arm", takes_over="<StockPass>")`` and being
listed in :data:`RULE_MODULES`.
"""

from __future__ import annotations

import importlib

from fusionkit import Rule
from fusionkit.passes.registry import registered, rules_taking_over, taken_over_patterns

#: the rule set the Arm adapter's takeover reads
RULE_SET = "arm"

#: the rule modules, in the order of the stock passes they take over in ArmPassManager
#: (``dyt_alpha_lut``, ``dyt_affine_conv``: where a user inserts their passes, before
#: ``InsertTableOpsPass``)
RULE_MODULES: tuple[str, ...] = (
    "quantized_activation", "safe_softmax_guard", "consecutive_clamps", "consecutive_rescales",
    "batch_norm", "dyt_alpha_lut", "dyt_affine_conv", "scalar_mul_conv", "consecutive_slices",
    "consecutive_concat_shapes",
)

for _module in RULE_MODULES:
    importlib.import_module(f"{__name__}.{_module}")


def taken_over_passes() -> dict[str, str]:
    """Stock Arm pass class name -> qualified name of the rule factory replacing it."""
    return taken_over_patterns(RULE_SET)


def rules_for(stock_pass: str) -> list[Rule]:
    """Fresh rule objects replacing the stock Arm pass ``stock_pass`` (empty: not taken over)."""
    return rules_taking_over(RULE_SET, stock_pass)


def arm_rules() -> list[Rule]:
    """Fresh rule objects of every Arm fusion."""
    return [r for f in registered(RULE_SET) for r in f.rules()]


__all__ = ["RULE_MODULES", "RULE_SET", "arm_rules", "rules_for", "taken_over_passes"]
