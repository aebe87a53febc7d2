"""Will the Vulkan partitioner delegate the node a fusion creates? Decided before fusing.

ExecuTorch 1.5.1's ``VulkanPartitioner`` takes a node when
``VulkanSupportedOperators._is_node_supported`` says so: the op registry's dtype
sets (``linear_q4gsw``, ``linear_q8ta_q8csw`` and ``linear_dq8ca_q4gsw`` declare
*every* input floating point, so their packed uint8 / int8 operands are always
refused), the op's ``are_node_inputs_supported_fn``, high-dim and dynamic-shape
support, operator and nn.Module allow/block lists, and the storage / texture /
buffer limits of each operand. An ``et_vk`` node it refuses stays on the CPU,
which has no kernel for it: the program cannot be loaded.

:class:`DelegatedByVulkan` is the one place that decides "this fused node will
be delegated": it builds the rule's replacement in a scratch graph
(:mod:`.probe`) and asks that very partitioner function, configured from the
partitioner's own options (:class:`PartitionerSupport`), about every ``et_vk``
node the replacement would create. A fusion the partitioner would refuse is
declined with the partitioner's own reason. The same check evaluates the
Vulkan runtime's conditions on those nodes (:func:`runtime_condition_broken`).
:func:`~.rules.transform_passes` attaches it to every rule; inside
``VulkanBackend.preprocess`` (the ``FusePatternsPass`` stand-in) it runs without
a partitioner (``support=None``): the nodes are already delegated there, so only
the runtime's conditions are checked, and a fusion declined before partitioning
is made there when the partitioner took the unfused ops, as stock ExecuTorch fuses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from executorch.backends.vulkan import utils as vk_utils
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanSupportedOperators
from torch.fx import Node

from fusionkit import CheckContext, Constraint, Failure, Replacement, Rule, op_key
from fusionkit.apply.meta_cache import metadata_key

from .probe import probe

__all__ = ["NO_CPU_KERNEL_NAMESPACES", "DelegatedByVulkan", "PartitionerSupport",
           "runtime_condition_broken", "with_delegation_check"]

#: op namespaces without a kernel in ExecuTorch's portable CPU runtime: a node of
#: these outside every Vulkan partition makes the program unloadable
NO_CPU_KERNEL_NAMESPACES: frozenset[str] = frozenset({"et_vk"})


class _RecordingSupport(VulkanSupportedOperators):
    """ExecuTorch's per-node support check, keeping the reason it logs for a refusal."""

    last_reason: str = ""

    def log_skip(self, node: Node, reason: str) -> None:
        self.last_reason = reason


class PartitionerSupport:
    """``VulkanSupportedOperators`` configured as ``VulkanPartitioner.partition`` configures it.

    ``partitioner``: the ``VulkanPartitioner`` (stock or the adapter's) whose options
    decide: texture limits, buffer limit, dynamic shapes, bool tensors, operator
    and nn.Module allow/block lists; None: the defaults.
    """

    def __init__(self, partitioner: Any = None) -> None:
        options: dict[str, Any] = dict(getattr(partitioner, "options", None) or {})
        # the same precedence as VulkanPartitioner.partition (ExecuTorch 1.5.1)
        if "texture_limits" in options:
            limits = options["texture_limits"]
        elif options.get("small_texture_limits", False):
            limits = vk_utils.SMALL_TEXTURE_LIMITS
        else:
            limits = vk_utils.DEFAULT_TEXTURE_LIMITS
        self._ops = _RecordingSupport(
            limits,
            options.get("buffer_limit", vk_utils.DEFAULT_BUFFER_LIMIT),
            require_dynamic_shape=options.get("require_dynamic_shapes", False),
            skip_bool_tensors=options.get("skip_bool_tensors", False),
            operator_blocklist=set(getattr(partitioner, "operator_blocklist", None) or ()),
            operator_allowlist=getattr(partitioner, "operator_allowlist", None),
            fusable_subgraphs=[],
            nn_module_blocklist=getattr(partitioner, "nn_module_blocklist", None),
            nn_module_allowlist=getattr(partitioner, "nn_module_allowlist", None),
        )

        #: answers depend on node metadata only unless nn.Module lists look at the stack
        self.by_metadata = (getattr(partitioner, "nn_module_blocklist", None) is None
                            and getattr(partitioner, "nn_module_allowlist", None) is None)

    def refusal(self, node: Node) -> str | None:
        """None when the partitioner would put ``node`` in a partition, else its reason."""
        self._ops.last_reason = ""
        if self._ops._is_node_supported(node):
            return None
        return self._ops.last_reason or "not supported"


def runtime_condition_broken(node: Node) -> str | None:
    """Why the Vulkan runtime would abort on (or miscompute) the fused ``node``, or None.

    The conditions are the simulator's own (:mod:`.inspect.runtime_conditions`, read
    from the runtime's C++ and shaders); they judge shapes and literals, so they hold
    on the fake tensors of ``node``'s arguments as on real ones. One list serves both:
    a fusion that would break one is never made, and the simulator raises on it.
    """
    from .inspect.runtime_conditions import conditions_for, violated
    from .probe import schema_arguments

    key = op_key(node.target) or ""
    if not conditions_for(key):
        return None
    bad = violated(key, schema_arguments(node))
    if not bad:
        return None
    c = bad[0]
    return (f"the fused {key} would break the Vulkan runtime's condition {c.name!r} on "
            f"{', '.join(c.args)}: {c.message()}")


def needs_delegation(node: Node) -> bool:
    """``node`` calls an op that exists only inside a Vulkan delegate."""
    key = op_key(node.target) if node.op == "call_function" else None
    return key is not None and key.split(".")[0] in NO_CPU_KERNEL_NAMESPACES


@dataclass(frozen=True, eq=False)
class DelegatedByVulkan(Constraint):
    """Every ``et_vk`` node the replacement creates will be delegated by the Vulkan partitioner,
    and meets every condition the Vulkan runtime places on its arguments."""

    replacement: Replacement
    #: the partitioner's view; None inside ``VulkanBackend.preprocess``, where the nodes
    #: are already delegated and only the runtime's conditions are checked
    support: PartitionerSupport | None = field(default_factory=PartitionerSupport)
    rule_name: str = ""
    kind: str = "delegated_by_vulkan_partitioner"
    #: captures' metadata -> the verdict's reason (None: delegated). A transformer asks
    #: the same question for every layer; building the replacement and asking the
    #: partitioner costs ~1 ms, so each distinct question is asked once per pass list.
    #: Sound because the partitioner judges node metadata, and a replacement's ops and
    #: their metadata are functions of its captures' metadata (never of weight values).
    memo: dict[Any, str | None] = field(default_factory=dict, compare=False, repr=False)

    def captures(self) -> set[str]:
        return self.replacement.captures()

    def _memo_key(self, ctx: CheckContext) -> Any:
        if self.support is not None and not self.support.by_metadata:
            return None
        names = sorted(self.replacement.captures() | set(ctx.folds))
        key = metadata_key(tuple(ctx.captures.get(n) for n in names))
        folds = metadata_key(tuple(ctx.folds[n] for n in sorted(ctx.folds)))
        if key is None or folds is None:
            return None
        return (tuple(names), key, folds)

    def check(self, ctx: CheckContext) -> Failure | None:
        key = self._memo_key(ctx)
        if key is None:
            why = self._verdict(ctx)
        elif key in self.memo:
            why = self.memo[key]
        else:
            why = self.memo[key] = self._verdict(ctx)
        # the fused op goes at the root: that is the node at fault
        return None if why is None else self.refuse(ctx, None, ctx.root, why)

    def _verdict(self, ctx: CheckContext) -> str | None:
        """None when every et_vk node of the replacement would be delegated, else why not."""
        try:
            built = probe(self.replacement, ctx, self.rule_name)
        except Exception as e:  # a user's lowering never dies inside fusionkit
            return ("the fused op could not be built to ask the Vulkan partitioner about it "
                    f"({type(e).__name__}: {e})")
        for n in built.ops():
            broken = runtime_condition_broken(n)
            if broken is not None:
                return broken
            if self.support is None or not needs_delegation(n):
                continue
            why = self.support.refusal(n)
            if why is not None:
                return (f"the Vulkan partitioner would not delegate the fused {op_key(n.target)} "
                        f"({why}), and it has no CPU kernel; left unfused here, it is fused "
                        "inside VulkanBackend.preprocess if the partitioner delegates the "
                        "unfused ops")
        return None


def with_delegation_check(rule: Rule, support: PartitionerSupport | None) -> Rule:
    """``rule`` with :class:`DelegatedByVulkan` as its last constraint (checked after the rest).

    ``support`` None: inside preprocess, where only the runtime's conditions are checked.
    """
    check = DelegatedByVulkan(rule.replacement, support, rule.name)
    return dataclasses.replace(rule, constraints=(*rule.constraints, check))
