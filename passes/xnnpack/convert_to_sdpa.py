"""``ConvertToSDPAPass``: nothing it could rewrite reaches XNNPACK's preprocess in 1.5.1.

The stock pass (``_passes/convert_to_sdpa.py``) matches the graphs of
``partition/graphs/sdpa.py`` -- ``F.scaled_dot_product_attention`` with a 2-D mask, fp32
and fp16, as ``to_edge`` decomposes it -- with ``SubgraphMatcher(ignore_literals=True)``
and puts ``scaled_dot_product_attention`` in their place. Every one of those graphs holds
ops XNNPACK's partitioner has no config for (``any.dim``, ``eq.Scalar``, ``expand_copy``,
``full_like``, ``logical_not``, ``mul.Scalar``, ``where.self``), so no partition ever holds
a whole pattern graph and the pass cannot match inside preprocess; and had it matched,
XNNPACK's serializer has no node visitor for ``scaled_dot_product_attention`` (the
lowering would fail). ``tests/test_xnnpack_rules.py`` checks both facts against the
installed ExecuTorch, so a release that changes them fails that test.

So the takeover runs no rule in its place (the factory below is empty and says so): what
is left of the stock pass is its re-trace, which changes no byte of the delegate.
"""

from __future__ import annotations

from fusionkit import Rule
from fusionkit.passes.registry import register_rules

#: ops of every 1.5.1 SDPA pattern graph that XNNPACK's partitioner has no config for
UNPARTITIONED_PATTERN_OPS: tuple[str, ...] = (
    "any.dim", "eq.Scalar", "expand_copy.default", "full_like.default",
    "logical_not.default", "mul.Scalar", "where.self",
)


@register_rules("xnnpack", takes_over="ConvertToSDPAPass")
def convert_to_sdpa_rules() -> list[Rule]:
    """No rule: the stock pass cannot match in an XNNPACK partition (see the module)."""
    return []


__all__ = ["UNPARTITIONED_PATTERN_OPS", "convert_to_sdpa_rules"]
