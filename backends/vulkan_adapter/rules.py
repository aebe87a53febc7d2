"""The Vulkan adapter's transform passes, built from its rule set.

The fusionkit rules that replace ExecuTorch's stock Vulkan patterns are the rule set
``"vulkan"``: ``fusionkit.passes.rule_set("vulkan")`` (the one way to get a rule set).
:func:`transform_passes` is
what a user hands to ``to_edge_transform_and_lower``: the same rules, each also
requiring that the Vulkan partitioner will delegate what it creates (:mod:`.delegation`). Inside
``VulkanBackend.preprocess`` (through the takeover in :mod:`.install`) the rules
run with the runtime's conditions only (the nodes are delegated already).
"""

from __future__ import annotations

from typing import Any

from executorch.exir.pass_base import ExportedProgramPassBase

from fusionkit import FusionPass
from fusionkit.integration.constant_subgraphs import FoldConstantSubgraphsPass
from fusionkit.integration.parameter_subgraphs import FoldParameterSubgraphsPass

from . import rule_ops
from .delegation import AUTO, PartitionerSupport, with_delegation_check

__all__ = ["PASS_NAME", "constant_args", "transform_passes"]

PASS_NAME = "fusionkit_vulkan"


def transform_passes(partitioner: Any = None) -> list[ExportedProgramPassBase]:
    """A fresh list of passes for ``to_edge_transform_and_lower(transform_passes=...)``.

    Every rule carries :class:`~.delegation.DelegatedByVulkan`: a fusion whose
    ``et_vk`` node the Vulkan partitioner would not delegate is declined here,
    with the partitioner's reason (ExecuTorch 1.5.1 refuses ``linear_q4gsw``,
    ``linear_q8ta_q8csw`` and ``linear_dq8ca_q4gsw`` for their packed integer
    operands, and has no registry entry for ``select_as_symint``); the partitioner
    then judges the unfused ops, and ``VulkanBackend.preprocess`` fuses those it
    delegated. ``partitioner``: the ``VulkanPartitioner`` the program will be
    lowered with, when it has non-default options (texture or buffer limits,
    operator or nn.Module lists), so that both answer the same question the same way;
    its probed runtime (the adapter's ``VulkanPartitioner(runtime=...)``) is then the one
    whose operators the fused ops need, else :data:`~.delegation.AUTO` (a fusion into an
    op that runtime lacks is declined, naming both: :func:`~.delegation.missing_operator`).
    """
    support = PartitionerSupport(partitioner)
    runtime = getattr(partitioner, "runtime", AUTO) if partitioner is not None else AUTO
    # each rule built the first time the program holds its root op
    rules = rule_ops.rule_index(lambda r: with_delegation_check(r, support, runtime))
    # values computed from lifted constants alone (attention masks) are folded first:
    # delegated on their own, stock Vulkan preprocess cannot re-trace them (Gemma2);
    # then every argument the runtime prepacks that the graph computes from parameters
    # alone (weight_norm's g * v / |v| into a convolution), which it would refuse at load
    return [FoldConstantSubgraphsPass(), FoldParameterSubgraphsPass(constant_args()),
            FusionPass(rules, name=PASS_NAME)]


def constant_args() -> dict[str, tuple[int, ...]]:
    """Op name -> the argument indices the Vulkan runtime prepacks (it requires a constant
    there): :data:`~.inspect.prepacked_args.PREPACKED_ARGS`, the facts ``check()`` judges
    with (the table alone is imported, not the checker)."""
    from .inspect.prepacked_args import PREPACKED_ARGS

    return {name: tuple(a.index for a in args) for name, args in PREPACKED_ARGS.items()}
