"""``ConvertToUpsampleBilinear2d``: nothing to rewrite in ExecuTorch 1.5.1.

The stock pass (``_passes/convert_to_upsample_bilinear2d.py``) matches the graphs of
``partition/graphs/bilinear_2d.py``: ``F.interpolate(mode="bilinear")`` lowered with
XNNPACK's edge config, which keeps ``upsample_bilinear2d.vec`` whole. Each pattern
graph is that one op, and on a match whose output *is* that op the pass returns
("Op was not decomposed, do nothing"). What is left is its re-trace, which
changes no byte of the delegate (the takeover's equality check). A bilinear upsample
decomposed by another edge config is not matched by the stock pass either.

So the takeover runs no rule in its place (the factory below is empty and says so).
"""

from __future__ import annotations

from fusionkit import Rule
from fusionkit.passes.registry import register_rules


@register_rules("xnnpack", takes_over="ConvertToUpsampleBilinear2d")
def upsample_bilinear_rules() -> list[Rule]:
    """No rule: the stock pass cannot change a graph in ExecuTorch 1.5.1 (see the module)."""
    return []
