"""Rules for the graph rewrites ExecuTorch's XNNPACK backend makes in ``preprocess``.

ExecuTorch 1.5.1 runs ``XNNPACKPassManager``'s default list
(``executorch/backends/xnnpack/_passes/``) on every partition before serializing
it; most of those passes are pattern rewrites written by hand, each with its own
detection loop and a re-trace at the end. The modules here state the same
rewrites as fusionkit rules (installed as ``fusionkit.passes.xnnpack``), one
module per stock pass; each factory registers in the ``"xnnpack"`` set with the
stock pass class it takes over, and the XNNPACK adapter
(:mod:`fusionkit.backends.xnnpack_adapter.preprocess_rules`) runs them in
``preprocess`` in that pass's place. Not in ``"vulkan_patterns"``: these rewrites target
XNNPACK's serializer (fused-activation metadata, its 5-input concatenate) and
belong in no other lowering.
"""

from __future__ import annotations

import importlib

from fusionkit import Rule
from fusionkit.passes.registry import registered

#: the rule modules, in the order of the stock passes they take over
RULE_MODULES: tuple[str, ...] = (
    "remove_clone", "upsample_bilinear", "convert_to_linear", "convert_to_sdpa", "fuse_batch_norm",
    "decompose_batch_norm", "fuse_activation", "decompose_cat", "remove_getitem",
    "insert_pad_qdq", "conv1d_unsqueeze", "prelu_reshape",
)
for _module in RULE_MODULES:
    importlib.import_module(f"{__name__}.{_module}")


def xnnpack_rules() -> list[Rule]:
    """Fresh rule objects of every XNNPACK preprocess rewrite."""
    return [r for f in registered("xnnpack") for r in f.rules()]


__all__ = ["RULE_MODULES", "xnnpack_rules"]
