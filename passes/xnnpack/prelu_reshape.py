"""``PReLUReshapePass``: nothing reaches it in ExecuTorch 1.5.1.

The stock pass (``_passes/prelu_reshape_pass.py``) repeats a one-element PReLU weight
per channel, for ``_prelu_kernel`` nodes only. XNNPACK's partitioner delegates
``prelu.default`` (``PreluConfig``) and its serializer has a visitor for
``aten.prelu.default`` only, so a partition never holds a ``_prelu_kernel`` node (one
would fail serialization: no visitor). What is left of the pass in ``preprocess`` is
its re-trace, which changes no byte of the delegate (the takeover's equality check).
Had it fired, it would have written the repeated weight with ``setattr`` on the graph
module, which a lifted parameter placeholder never reads.

So the takeover runs no rule in its place (the factory below is empty and says so).
"""

from __future__ import annotations

from fusionkit import Rule
from fusionkit.passes.registry import register_rules


@register_rules("xnnpack", takes_over="PReLUReshapePass")
def prelu_reshape_rules() -> list[Rule]:
    """No rule: no partition holds the op the stock pass rewrites (see the module)."""
    return []
