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
Vulkan runtime's conditions on those nodes (:func:`runtime_condition_broken`), and
asks the probed runtime (:mod:`.runtime_probe`) whether it has an operator under the
name the payload would give each node the replacement builds (:func:`missing_operator`):
a fusion into an op the runtime lacks is declined there, with the op and the runtime
named, before the program changes.
:func:`~.rules.transform_passes` attaches it to every rule; inside
``VulkanBackend.preprocess`` (the ``FusePatternsPass`` stand-in) it runs without
a partitioner (``support=None``): the nodes are already delegated there, so only
the runtime's conditions are checked, and a fusion declined before partitioning
is made there when the partitioner took the unfused ops, as stock ExecuTorch fuses.

Which runtime: :data:`AUTO` (the default everywhere) is the one ``scripts/vulkan-runtime``
installed, once probed (:func:`~.runtime_probe.cached_inventory`), or the inventory
:func:`use_runtime` sets for a block; none (no runtime, not probed): the 1.5.1 registry
is trusted. :func:`preprocess_fusions` answers "what would the Vulkan preprocess fuse and
decline in this program" for the partitioner.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from executorch.backends.vulkan import utils as vk_utils
from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanSupportedOperators
from torch.fx import Node

from fusionkit import CheckContext, Constraint, MatchResult, Replacement, Rule, op_key
from fusionkit.edit.meta_cache import metadata_key

from .probe import probe

if TYPE_CHECKING:
    from fusionkit import MatchSet

    from .runtime_probe import RuntimeInventory

__all__ = ["AUTO", "NO_CPU_KERNEL_NAMESPACES", "DelegatedByVulkan", "PartitionerSupport",
           "missing_operator", "payload_name", "preprocess_fusions", "runtime_condition_broken",
           "runtime_inventory", "use_runtime", "with_delegation_check"]

from .runtime_choice import (  # noqa: F401  (re-exported: the names delegation has had)
    _INSTALLED,
    _RUNTIME,
    _RUNTIME_VARIABLES,
    AUTO,
    runtime_inventory,
    use_runtime,
)

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


def payload_name(node: Node, before_edge: bool = False) -> str | None:
    """The name the Vulkan payload gives ``node`` (``VkGraphBuilder``: ``node.target.__name__``,
    ``llama.sdpa_with_kv_cache.default`` for the edge op, ``sdpa_with_kv_cache.default``
    for the ATen one). ``before_edge``: the node is judged before partitioning, where
    ``to_edge`` makes every op an edge op before the payload is written, so an ATen
    ``OpOverload`` (a program ``torch.export`` gave, as ``fusionkit.verify`` builds) is
    named as its edge op: ``et_vk.rms_norm.default``, the name ``run`` executes, not
    ``rms_norm.default``."""
    if node.op != "call_function":
        return None
    if before_edge and isinstance(node.target, torch._ops.OpOverload):
        from .rule_ops import payload_names

        try:
            return payload_names(node.target)[0]
        except Exception:  # no edge op of that name (a Python callable): as it is
            pass
    name = getattr(node.target, "__name__", None)
    return name if isinstance(name, str) else None


def missing_operator(node: Node, inventory: RuntimeInventory | None,
                     before_edge: bool = False) -> str | None:
    """Why ``inventory``'s runtime cannot run the fused ``node``: it has no operator under
    the name the Vulkan payload gives it (:func:`payload_name`). None: it has it, or
    nothing is known (no inventory)."""
    if inventory is None:
        return None
    name = payload_name(node, before_edge)
    if name is None or inventory.has_operator(name):
        return None
    return (f"{inventory.describe()} has no operator {name}, which the fused "
            f"{op_key(node.target)} is serialized as: the program would be refused at load "
            f"(`Missing operator: {name}`); left unfused")


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
    #: the runtime whose operators the fused nodes need: a RuntimeInventory, None (trust
    #: the 1.5.1 registry) or :data:`AUTO` (resolved at each check: :func:`runtime_inventory`)
    runtime: Any = AUTO
    kind: str = "delegated_by_vulkan_partitioner"
    #: captures' metadata -> the verdict's reason (None: delegated). A transformer asks
    #: the same question for every layer; building the replacement and asking the
    #: partitioner costs ~1 ms, so each distinct question is asked once per pass list.
    #: Sound because the partitioner judges node metadata, and a replacement's ops and
    #: their metadata are functions of its captures' metadata (never of weight values).
    memo: dict[Any, str | None] = field(default_factory=dict, compare=False, repr=False)
    #: the search (its ProgramInputs, one per ``find_matches``) -> the runtime resolved for
    #: it: resolving stats the probe file, once per search rather than once per match
    resolved: weakref.WeakKeyDictionary[Any, RuntimeInventory | None] = field(
        default_factory=weakref.WeakKeyDictionary, compare=False, repr=False)

    def captures(self) -> set[str]:
        return self.replacement.captures()

    def _memo_key(self, ctx: CheckContext, inventory: RuntimeInventory | None) -> Any:
        if self.support is not None and not self.support.by_metadata:
            return None
        names = sorted(self.replacement.captures() | set(ctx.folds))
        key = metadata_key(tuple(ctx.captures.get(n) for n in names))
        folds = metadata_key(tuple(ctx.folds[n] for n in sorted(ctx.folds)))
        if key is None or folds is None:
            return None
        # the same match judged against another runtime is another question
        runtime = None if inventory is None else inventory.fingerprint
        return (tuple(names), key, folds, runtime)

    def _inventory(self, ctx: CheckContext) -> RuntimeInventory | None:
        try:
            return self.resolved[ctx.inputs]
        except (KeyError, TypeError):
            inventory = runtime_inventory(self.runtime)
        try:
            self.resolved[ctx.inputs] = inventory
        except TypeError:  # not weakly referenceable: resolved at every check
            pass
        return inventory

    def check(self, ctx: CheckContext) -> MatchResult | None:
        inventory = self._inventory(ctx)
        key = self._memo_key(ctx, inventory)
        if key is None:
            why = self._verdict(ctx, inventory)
        elif key in self.memo:
            why = self.memo[key]
        else:
            why = self.memo[key] = self._verdict(ctx, inventory)
        # the fused op goes at the root: that is the node at fault
        return None if why is None else self.refuse(ctx, None, ctx.root, why)

    def _verdict(self, ctx: CheckContext, inventory: RuntimeInventory | None = None
                 ) -> str | None:
        """None when every et_vk node of the replacement would be delegated, and the
        runtime has every op the replacement builds, else why not."""
        try:
            built = probe(self.replacement, ctx, self.rule_name)
        except Exception as e:  # a user's lowering never dies inside fusionkit
            return ("the fused op could not be built to ask the Vulkan partitioner about it "
                    f"({type(e).__name__}: {e})")
        for n in built.ops():
            # before partitioning the payload names the op as to_edge makes it
            missing = missing_operator(n, inventory, before_edge=self.support is not None)
            if missing is not None:
                return missing
            broken = runtime_condition_broken(n)
            if broken is not None:
                return broken
            if self.support is None or not needs_delegation(n):
                continue
            why = _refusal_as_edge(self.support, n)
            if why is not None:
                return (f"the Vulkan partitioner would not delegate the fused {op_key(n.target)} "
                        f"({why}), and it has no CPU kernel; left unfused here, it is fused "
                        "inside VulkanBackend.preprocess if the partitioner delegates the "
                        "unfused ops")
        return None


def _refusal_as_edge(support: PartitionerSupport, node: Node) -> str | None:
    """The partitioner's answer for ``node`` as ``to_edge`` will give it to the partitioner:
    an ATen ``OpOverload`` (a scratch node of a program ``torch.export`` gave) is asked
    about as its edge op, which the partitioner's registry is keyed by."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return support.refusal(node)
    from executorch.exir.dialects._ops import ops as exir_ops

    ns, name = target._schema.name.split("::", 1)
    try:
        edge = getattr(getattr(getattr(exir_ops.edge, ns), name), target._overloadname)
    except Exception:  # no edge op of that name: asked as it is
        return support.refusal(node)
    node.target = edge
    try:
        return support.refusal(node)
    finally:
        node.target = target


def with_delegation_check(rule: Rule, support: PartitionerSupport | None,
                          runtime: Any = AUTO) -> Rule:
    """``rule`` with :class:`DelegatedByVulkan` as its last constraint (checked after the rest).

    ``support`` None: inside preprocess, where only the runtime's conditions (and its
    operators) are checked. ``runtime``: see :attr:`DelegatedByVulkan.runtime`.
    """
    check = DelegatedByVulkan(rule.replacement, support, rule.name, runtime=runtime)
    return dataclasses.replace(rule, constraints=(*rule.constraints, check))


def preprocess_fusions(program: Any, runtime: Any = AUTO, *, rules: list[Rule] | None = None,
                       strict: bool = True) -> MatchSet:
    """What the Vulkan preprocess's fusion rules would fuse and decline in ``program``,
    judged as inside ``VulkanBackend.preprocess`` (the runtime's conditions and
    operators, no partitioner): ``.accepted`` the fusions it would make, ``.declined``
    each with its reason (a fusion into an op ``runtime`` lacks names the op). Nothing is
    applied. For the partitioner: the ops of a declined fusion stay in the payload as
    they are, so an op among them that the runtime lacks would be refused at load.

    The rules are the ``FusePatternsPass`` stand-in's and the preprocess takeover's
    (:data:`~.rule_ops.RULE_SETS`); they match the program as given, so a program before
    preprocess (functional cache updates, say) shows fewer fusions than preprocess makes.
    ``rules``: judge these instead, as they are (one taken-over pass's
    :func:`~.preprocess_rules.rules_for`, which carry the check already): the one way
    the preprocess rules are matched, by :class:`~.preprocess_rules.RulePass` inside
    preprocess and by the runtime-aware partitioner on its copy of the program
    (:mod:`.runtime_support`). ``strict``: ``find_matches``'.
    """
    from fusionkit import find_matches

    if rules is None:
        from fusionkit.passes import rule_set

        from .rule_ops import RULE_SETS

        rules = [with_delegation_check(r, None, runtime) for s in RULE_SETS for r in rule_set(s)]
    # every node is delegated already (preprocess runs on a partition)
    return find_matches(program, rules, structural_declines=False, allow_folding=False,
                        check_replacements=False, strict=strict)
