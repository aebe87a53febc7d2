"""Build a match's replacement in a scratch graph (the core's :mod:`fusionkit.edit.probe`).

The Vulkan delegation check (:mod:`.delegation`) asks the partitioner about the
fused nodes before they exist; the scratch build is the core's, which the
finder also uses to judge every replacement (:mod:`fusionkit.find.executable`).
"""

from __future__ import annotations

from fusionkit import CheckContext, Replacement
from fusionkit.edit.probe import ProbeRewriter, build_in_scratch, schema_arguments

__all__ = ["ProbeRewriter", "probe", "schema_arguments"]


def probe(replacement: Replacement, ctx: CheckContext, rule_name: str = "") -> ProbeRewriter:
    """Run ``replacement`` for the match in ``ctx`` into a scratch graph; its nodes are in
    ``.created``. Raises whatever the replacement raises."""
    rw, _ = build_in_scratch(replacement, ctx, rule_name)
    return rw
