"""``prepare_qat_pt2e``'s convolution + batch-norm rewrite, decided by fusionkit's rules.

torchao's ``prepare_qat_pt2e`` calls ``_fuse_conv_bn_qat(model)`` on the annotated graph
module: each convolution + batch norm becomes torchao's training subgraph, which
``convert_pt2e`` later folds (:mod:`fusionkit.passes.families.conv_batch_norm_qat` says what
the stock rewrite gets wrong). :func:`fuse_conv_bn_qat` takes that call's place:

1. the rules decide, on the graph module lifted into a program
   (:mod:`fusionkit.integration.graph_module_program`; nothing is written there), which
   pairs may be rewritten and why each other one may not;
2. torchao's own rewrite then runs with every batch norm that was not accepted out of its
   reach (its target is a stand-in while it runs, put back after), so the accepted pairs
   get exactly torchao's subgraph, its copied metadata and the quantizer's annotations
   moved onto the new nodes -- what ``convert_pt2e`` folds;
3. each accepted pair is checked as rewritten; one torchao did not rewrite is reported
   declined (``step="applied"``), and the graph stays a valid one either way.

The report (a :class:`~fusionkit.backends.quantize_step_report.FoldReport`) is in the module's
``meta[META_KEY]`` and in :func:`~fusionkit.backends.quantize_step_report.last_report`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

__all__ = ["META_KEY", "fuse_conv_bn_qat"]

#: the prepared module's meta key holding the QAT rewrite's report
META_KEY = "fusionkit_qat_conv_batch_norm"
_rules: list[Any] = []


def _the_rules() -> list[Any]:
    if not _rules:
        from fusionkit.passes.families.conv_batch_norm_qat import rules

        _rules.extend(rules())
    return _rules


def _held_batch_norm(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
    """A batch norm's stand-in target while torchao's rewrite runs: nothing matches it."""
    return torch.ops.aten.batch_norm.default(*args, **kwargs)


def _stock() -> Any:
    from torchao.quantization.pt2e import qat_utils

    return qat_utils._fuse_conv_bn_qat


def _batch_norms(m: GraphModule) -> list[Node]:
    from torchao.quantization.pt2e.utils import _is_bn_node

    return [n for n in m.graph.nodes if _is_bn_node(n)]


def fuse_conv_bn_qat(m: GraphModule) -> GraphModule:
    """torchao's ``_fuse_conv_bn_qat(m)`` on the pairs the rules accept; in place."""
    from fusionkit import find_matches
    from fusionkit.backends.quantize_step_report import Decline, FoldReport, record
    from fusionkit.integration.graph_module_program import lift

    report = FoldReport(verb="rewrote")
    record(m, META_KEY, report)
    norms = _batch_norms(m)
    if not norms:
        return m
    try:
        found = find_matches(lift(m).ep, _the_rules(), check_replacements=False)
    except Exception as e:  # a graph the rules cannot read: nothing is rewritten
        report.declined.extend(
            Decline("qat_conv_batch_norm", bn.name, "error", bn.name,
                    f"the graph could not be read ({type(e).__name__}: {e}); its "
                    "convolutions and batch norms are left as they are") for bn in norms)
        return m
    for d in found.declined:
        report.declined.append(Decline(d.rule, d.root.name, d.step,
                                       getattr(d.node, "name", str(d.node)), d.reason))
    accepted = {match.root.name: match for match in found.accepted}
    held = {bn: bn.target for bn in norms if bn.name not in accepted}
    for bn in held:
        bn.target = _held_batch_norm
    try:
        _stock()(m)
    finally:
        for bn, target in held.items():
            bn.target = target
        m.recompile()
    present = set(m.graph.nodes)
    for bn in norms:
        match = accepted.get(bn.name)
        if match is None:
            continue
        conv = match.captures.get("op")
        if bn in present:
            report.declined.append(Decline(
                "qat_conv_batch_norm", bn.name, "applied", bn.name,
                "accepted, but torchao's rewrite did not match it: the convolution and "
                "batch norm are left as they are"))
        else:
            report.folded.append((bn.name, getattr(conv, "name", "(convolution)")))
    return m
