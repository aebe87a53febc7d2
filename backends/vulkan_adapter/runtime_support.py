"""Will the probed Vulkan runtime run this node? Asked per node, before partitioning.

The 1.5.1 partitioner delegates what its Python registry accepts; the runtime a user
deploys may still refuse the program at load. :class:`RuntimeSupport` answers, for one
graph node, whether the runtime would refuse (or miscompute) it once delegated, with the
facts ``check()`` and the simulator judge a payload by, applied to the node instead of
its serialized call (no list of its own):

* ``missing_operator`` -- :meth:`RuntimeInventory.has_operator` is False for the op
  (as ``check()``'s ``missing_operator``), unless the Vulkan preprocess removes the node
  first: ``RemoveRedundantOpsTransform``'s ops, and nodes an accepted match of the
  preprocess rules (:mod:`.preprocess_rules`, the rules ``VulkanBackend.preprocess``
  runs, judged here by the same constraints) consumes. A node such a rule *declines*
  (an int4 weight-only linear with N % 8 != 0 or one input row leaves its
  ``dequantize_per_channel``) reaches the runtime: the reason names the decline;
* ``missing_shader`` -- a binary op whose shader name, composed as ``BinaryOp.cpp`` does
  (:func:`~.inspect.shaders.missing_shader`), is not in the probed registry, for any
  storage the partitioner's own representation sets allow the node (the tagging pass
  picks among them by the node's neighbours);
* ``not_constant`` -- an argument the runtime prepacks (:data:`~.inspect.prepack_check.
  PREPACKED_ARGS`) that will not be a constant: None, or a value computed by the graph
  (a ``BatchNorm2d(affine=False)`` has no weight);
* ``runtime_condition`` -- a condition of :mod:`.inspect.runtime_conditions` broken by the
  node's arguments (``violated``, what the rules' delegation check and the simulator ask).

A node is kept off only when ExecuTorch's CPU runtime has a kernel for it (the wheel's
portable and quantized kernels, :func:`~.runtime.load_cpu_kernels`). One of an op a
preprocess fusion would remove that neither runtime has, and that the preprocess rules
leave (they decline), can run nowhere: :attr:`RuntimeSupport.unrunnable` names it
(:class:`Unrunnable`), and the adapter's partitioner refuses the lowering when it is
delegated. Any other such node stays, and ``check(program, runtime=...)`` reports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import types
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from torch.fx import Node

from fusionkit import Op, Pattern, PatternVisitor, guards_suppressed, op_key
from fusionkit.integration.partition_tags import untag

__all__ = ["DATA_MOVEMENT_OPS", "KeptOff", "RuntimeSupport", "Unrunnable", "broken_condition",
           "cpu_has_kernel", "data_movement_islands", "keep_partitions_off", "pattern_ops",
           "serialized_name", "support_check_refusing"]


@dataclasses.dataclass(frozen=True)
class KeptOff:
    """One node the partitioner left to the CPU, and the runtime fact that made it."""

    #: the graph node's name
    node: str
    #: its op as a Vulkan payload would name it
    op: str
    #: missing_operator | missing_shader | not_constant | runtime_condition |
    #: data_movement_only | int_only (its partition; the adapter's partitioner)
    fact: str
    reason: str

    def __str__(self) -> str:
        return f"`{self.node}` ({self.op}): {self.reason}"


def keep_partitions_off(graph_module: Any, partition_tags: Any, found: dict[str, list[str]],
                        fact: str, why: Callable[[str], str]) -> list[list[KeptOff]]:
    """Untag the partitions ``found`` (tag -> the names of their nodes); per partition, its
    nodes as :class:`KeptOff` facts, each with the reason ``why`` gives for the list of
    them (`name` (op), ...)."""
    if not found:
        return []
    wanted = {m for names in found.values() for m in names}
    ops = {n.name: serialized_name(n) for n in graph_module.graph.nodes if n.name in wanted}
    untag(graph_module, partition_tags, found)
    left = []
    for names in found.values():
        reason = why(", ".join(f"`{m}` ({ops[m]})" for m in names))
        left.append([KeptOff(m, ops[m], fact, reason) for m in names])
    return left


@dataclasses.dataclass(frozen=True)
class Unrunnable:
    """One node of an op neither the probed Vulkan runtime nor the CPU runtime has, that the
    Vulkan preprocess would leave in the payload: the program would be refused at load."""

    #: the graph node's name
    node: str
    #: its op as a Vulkan payload would name it
    op: str
    reason: str

    def __str__(self) -> str:
        return f"`{self.node}` ({self.op}): {self.reason}"


#: op -> what a user can do about a node of it that no runtime runs (besides the declines)
UNRUNNABLE_HINTS: dict[str, str] = {
    "torchao.dequantize_affine.default": (
        "for an 8-bit weight-only linear, quantize per output channel "
        "(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)); "
        "asymmetric needs a float32 input) with a 2-D float input, which the preprocess rule "
        "linear_weight_int8_affine makes _weight_int8pack_mm; or use 4-bit weights "
        "(et_vk.linear_q4gsw)"),
}


def serialized_name(node: Node) -> str:
    """The op name ``VkGraphBuilder`` writes for ``node`` (``node.target.__name__``)."""
    return str(getattr(node.target, "__name__", "") or op_key(node.target) or "")


@cache
def _cpu_operators() -> frozenset[str]:
    from executorch.extension.pybindings.portable_lib import _get_operator_names

    from .runtime import load_cpu_kernels

    load_cpu_kernels()
    return frozenset(n.split(".")[0] for n in _get_operator_names())  # "aten::logical_not"


def cpu_has_kernel(name: str) -> bool:
    """ExecuTorch's CPU runtime (portable + quantized kernels) runs op ``name``."""
    ns, _, rest = name.partition(".")
    return f"{ns}::{rest.split('.')[0]}" in _cpu_operators()


def broken_condition(node: Node, name: str, runtime: str) -> tuple[str, str] | None:
    """("runtime_condition", why) when ``node``'s arguments break a condition the runtime
    aborts or miscomputes on (:mod:`.inspect.runtime_conditions`), else None."""
    from .inspect.runtime_conditions import conditions_for, violated
    from .probe import schema_arguments

    key = op_key(node.target) or name
    if not conditions_for(key):
        return None
    try:
        bad = violated(key, schema_arguments(node))
    except Exception:  # arguments the conditions cannot read: the partitioner decides
        return None
    if not bad:
        return None
    c = bad[0]
    return "runtime_condition", (f"{name} breaks {runtime}'s condition {c.name!r} "
                                 f"on {', '.join(c.args)}: {c.message()}")


def _removed_by_redundant_ops() -> frozenset[str]:
    from executorch.backends.vulkan._passes.remove_redundant_ops import (
        RemoveRedundantOpsTransform,
    )

    return frozenset(getattr(o, "__name__", str(o))
                     for o in RemoveRedundantOpsTransform.redundant_ops)


#: ops that only move or reinterpret data (views, transposes, copies, slices, splits)
DATA_MOVEMENT_OPS: frozenset[str] = frozenset({
    "aten.permute_copy.default", "aten.view_copy.default", "aten.squeeze_copy.dims",
    "aten.squeeze_copy.dim", "aten.squeeze_copy.default", "aten.unsqueeze_copy.default",
    "aten.clone.default", "dim_order_ops._clone_dim_order.default", "aten.expand_copy.default",
    "aten.t_copy.default", "aten.transpose_copy.int", "aten.slice_copy.Tensor",
    "aten.select_copy.int", "aten.alias_copy.default", "aten.split_with_sizes_copy.default",
    "aten.split_copy.Tensor", "aten.unbind_copy.int",
})


def _moves_data(node: Node) -> bool:
    if node.target is operator.getitem:
        return True
    return op_key(node.target) in DATA_MOVEMENT_OPS and cpu_has_kernel(serialized_name(node))


def data_movement_islands(ep: Any, partition_tags: Any) -> dict[str, list[str]]:
    """Partitions that compute nothing: tag -> the names of their call nodes, for each
    partition whose every op only moves data (:data:`DATA_MOVEMENT_OPS`, each with a CPU
    kernel), that reads only constants and values computed on the CPU, and whose every
    result is read on the CPU. Delegating one costs a delegate call and a copy of its
    inputs to the GPU and of its results back, for a copy the CPU makes once. (The torch
    partitioner's ``non_compute_ops`` filter drops a partition with at most one compute
    op; the Vulkan partitioner keeps single-op partitions, so only these go.) A graph
    input or output next to it keeps the partition: the user may mean a program that is
    only a view."""
    from executorch.backends.vulkan.utils import is_param_node

    by_tag: dict[str, list[Node]] = {}
    for n in ep.graph_module.graph.nodes:
        tag = n.meta.get("delegation_tag")
        if tag in partition_tags:
            by_tag.setdefault(tag, []).append(n)

    def on_cpu(m: Node) -> bool:
        return m.op == "call_function" and m.meta.get("delegation_tag") not in partition_tags

    out: dict[str, list[str]] = {}
    for tag, nodes in by_tag.items():
        calls = [n for n in nodes if n.op == "call_function"]
        if not calls or not all(_moves_data(n) for n in calls):
            continue
        inside = set(nodes)
        producers = {a for n in calls for a in n.all_input_nodes if a not in inside}
        consumers = {u for n in nodes for u in n.users if u not in inside}
        if (consumers and all(on_cpu(u) for u in consumers)
                and all(on_cpu(a) or (a.op == "placeholder" and is_param_node(ep, a))
                        for a in producers)):
            out[tag] = [n.name for n in calls]
    return out


@contextlib.contextmanager
def support_check_refusing(refuse: Callable[[Node], KeptOff | None]
                           ) -> Iterator[dict[str, KeptOff]]:
    """While ExecuTorch's ``VulkanPartitioner.partition()`` runs, its per-node support
    check (``VulkanSupportedOperators``) also refuses each node ``refuse`` keeps off, and
    logs why as its own refusals are logged. Yields the nodes refused (name -> fact),
    filled as the partition runs; the stock check is back on exit."""
    import executorch.backends.vulkan.partitioner.vulkan_partitioner as stock_module

    stock_support = stock_module.VulkanSupportedOperators
    refused: dict[str, KeptOff] = {}

    class RefusingSupport(stock_support):  # type: ignore[misc,valid-type]
        def _is_node_supported(self, node: Any) -> bool:
            if not super()._is_node_supported(node):
                return False
            with guards_suppressed(node.graph):  # judging it never specializes a size
                kept = refuse(node)
            if kept is None:
                return True
            refused.setdefault(node.name, kept)
            self.log_skip(node, kept.reason)
            return False

    stock_module.VulkanSupportedOperators = RefusingSupport
    try:
        yield refused
    finally:
        stock_module.VulkanSupportedOperators = stock_support


class _PatternOps(PatternVisitor[frozenset[str]]):
    """The ops a pattern matches, every node kind through its own ``accept``."""

    def generic(self, p: Pattern) -> frozenset[str]:
        return frozenset().union(*(c.accept(self) for c in p.children()))

    def visit_op(self, p: Op) -> frozenset[str]:
        return p.targets | self.generic(p)


def pattern_ops(pattern: Pattern) -> frozenset[str]:
    """Every op a rule's pattern matches."""
    return pattern.accept(_PatternOps())


@dataclasses.dataclass
class _Preprocess:
    """What the preprocess rules would do to a program: nodes consumed, declines by node."""

    consumed: set[Node] = dataclasses.field(default_factory=set)
    #: node -> the preprocess rules declining a match that claims it, with their reasons
    declined: dict[Node, str] = dataclasses.field(default_factory=dict)


def _rule_passes() -> list[tuple[str, list[Any]]]:
    """The preprocess rule passes: the taken-over passes' rules, and the ``FusePatternsPass``
    stand-in's (the ``"vulkan"`` rules, which fuse in preprocess what the transform passes
    left to it: a fusion the partitioner would not delegate, ``linear_q4gsw`` say) before
    ``FuseQuantizedOpsTransform``, as ``VulkanBackend.preprocess`` orders them."""
    from .delegation import with_delegation_check
    from .preprocess_rules import TAKEN_OVER_PASSES, rules_for
    from .rule_ops import built_rules

    out = [(p, list(rules_for(p))) for p in TAKEN_OVER_PASSES]
    at = next((i for i, (p, _) in enumerate(out) if p == "FuseQuantizedOpsTransform"), len(out))
    out.insert(at, ("FusePatternsPass", [with_delegation_check(r, None) for r in built_rules()]))
    return out


def _find(ep: Any, rules: list[Any]) -> Any:
    from .delegation import preprocess_fusions

    # as RulePass asks inside preprocess (every node is delegated there)
    return preprocess_fusions(ep, rules=rules, strict=False)


def _note_declines(ms: Any, rules: list[Any], declined: dict[Any, tuple[list[str], list[str]]],
                   key: Any = lambda n: n, errors: set[Any] | None = None) -> None:
    """Each decline, noted at the nodes its match claimed, its root, and the root's inputs
    of an op the rule's pattern matches (a fusion declined at its user: the weight-only
    linear at the ``linear``, for its ``dequantize_per_channel``)."""
    by_name = {r.name: r for r in rules}
    errors = set() if errors is None else errors
    for d in ms.declined:
        if d.step == "error":  # the rule could not judge it: it may yet fuse (undecided)
            errors.update(key(n) for n in {*d.claimed, d.root})
        rule = by_name.get(d.rule)
        ops = pattern_ops(rule.pattern) if rule is not None else frozenset()
        inputs = {n for n in d.root.all_input_nodes if serialized_name(n) in ops}
        for n in {*d.claimed, d.root, *inputs}:
            # the fusions that would consume it from a user first, then its own rules
            declined.setdefault(key(n), ([], []))[n is d.root].append(f"{d.rule!r} ({d.reason})")


def _declines_text(said: tuple[list[str], list[str]]) -> str:
    return "the preprocess rules decline it: " + "; ".join(dict.fromkeys(said[0] + said[1]))


def _preprocess_verdicts(ep: Any) -> _Preprocess:
    """The preprocess rules' matches on ``ep`` itself, each pass's rules on their own,
    decided by their own constraints (and the runtime's conditions on what they create),
    changing nothing."""
    out = _Preprocess()
    declined: dict[Any, tuple[list[str], list[str]]] = {}
    for _, rules in _rule_passes():
        if not rules:
            continue
        try:
            ms = _find(ep, rules)
        except Exception:  # a user's lowering never dies here: nothing is known consumed
            continue
        for m in ms.accepted:
            out.consumed.update(m.claimed)
        _note_declines(ms, rules, declined)
    out.declined = {n: _declines_text(said) for n, said in declined.items()
                    if n not in out.consumed}
    return out


@contextlib.contextmanager
def _real_constants(ep: Any) -> Iterator[None]:
    """``to_edge_transform_and_lower`` partitions a fake copy of the program (ExecuTorch's
    ``get_fake_program``: the state dict made of FakeTensors); the preprocess rules judge
    the weights' values. While this is active, each fake entry holds the real tensor it
    was made from (found through its fake mode's converter), put back after."""
    from torch._subclasses.fake_tensor import FakeTensor

    fakes = {k: v for k, v in ep.state_dict.items() if isinstance(v, FakeTensor)}
    if not fakes:
        yield
        return
    real: dict[int, Any] = {}
    try:
        modes = {id(f.fake_mode): f.fake_mode for f in fakes.values()}
        for mode in modes.values():
            conv = mode.fake_tensor_converter
            for t, i in conv.meta_converter.describer.lookup_tensor.items():
                fake = conv.tensor_memo.get(i)
                if fake is not None:
                    real[id(fake)] = t
    except AttributeError:  # another torch: the rules decline on what they cannot read
        pass
    swapped = {k: real[id(v)] for k, v in fakes.items() if id(v) in real}
    ep.state_dict.update(swapped)
    try:
        yield
    finally:
        ep.state_dict.update({k: fakes[k] for k in swapped})


def _shared_tensors(ep: Any) -> dict[int, Any]:
    """A deepcopy memo sharing the program's tensors (weights, fake values) with the copy:
    the rules add constants, never write into one, and inside a lowering some of them
    are tensor subclasses that cannot be copied."""
    import torch

    memo: dict[int, Any] = {}
    found = [*ep.state_dict.values(), *ep.constants.values(),
             *ep.graph_module.state_dict(keep_vars=True).values()]
    found += [n.meta.get("val") for n in ep.graph_module.graph.nodes]
    for t in found:
        for leaf in (t if isinstance(t, (tuple, list)) else (t,)):
            if isinstance(leaf, torch.Tensor):
                memo[id(leaf)] = leaf
    return memo


@dataclasses.dataclass
class _Preprocessed:
    """A copy of the program after the preprocess rule passes, in their order, and where
    its nodes came from."""

    ep: Any
    #: copy node name -> the original nodes' names it stands for (a fusion's new node:
    #: every node its match claimed); a node left alone keeps its name
    origin: dict[str, set[str]]
    #: copy node name -> the preprocess rules' declines of matches claiming it
    declined: dict[str, tuple[list[str], list[str]]]
    #: copy node names a rule raised on (it could not judge them: left to the partitioner)
    undecided: set[str]


def _node_name(n: Any) -> str:
    return str(n.name)


def _preprocessed(ep: Any) -> _Preprocessed | None:
    """Run the preprocess rules on a copy of ``ep`` the way ``RulePass`` runs them (one
    pass after the other, each up to ``MAX_ROUNDS``): one pass's fusion may make the next
    one's (``mm`` -> ``linear``, then the weight-only linear). None if that fails."""
    import copy
    import functools

    from fusionkit import run_rules

    from .preprocess_rules import MAX_ROUNDS

    try:
        work = copy.deepcopy(ep, _shared_tensors(ep))
    except Exception:  # something in the program that cannot be copied: not judged here
        return None
    origin: dict[str, set[str]] = {}
    declined: dict[str, tuple[list[str], list[str]]] = {}
    undecided: set[str] = set()
    for _, rules in _rule_passes():
        try:  # as RulePass runs them inside preprocess (every node is delegated there)
            run = run_rules(work, rules, strict=False, rounds=MAX_ROUNDS, stop_on_failure=True,
                            structural_declines=False, allow_folding=False,
                            check_replacements=False, drop_dead_constants=False,
                            on_found=functools.partial(_note_declines, rules=rules,
                                                       declined=declined, key=_node_name,
                                                       errors=undecided))
        except Exception:  # a user's lowering never dies here
            return None
        for m, root in zip(run.applied, run.new_roots, strict=True):
            origin[root.name] = set().union(*(origin.get(n.name, {n.name}) for n in m.claimed))
    return _Preprocessed(work, origin, declined, undecided)


class RuntimeSupport:
    """Per node: what the probed runtime would refuse, with the facts ``check()`` uses.

    ``inventory``: a :class:`~.runtime_probe.RuntimeInventory`; ``texture_limits``: the
    partitioner's (for the storages a node may get). :meth:`prepare` reads the program
    once (the preprocess rules' verdicts) before :meth:`refusal` is asked per node.
    """

    def __init__(self, inventory: Any, texture_limits: Any) -> None:
        self.inventory = inventory
        self.texture_limits = texture_limits
        self._ep: Any = None
        self._pre = _Preprocess()
        self._redundant = _removed_by_redundant_ops()
        #: original node name -> what the preprocessed copy says of it (missing operators
        #: the preprocess fusions may remove, and the nodes needing them as constants)
        #: (None: decided there, delegated)
        self._after_preprocess: dict[str, KeptOff | None] | None = None
        #: original node names a fusion of the chained preprocess rules replaces
        self._fused_in_chain: frozenset[str] = frozenset()
        #: the nodes (by original name) neither runtime runs that the preprocess leaves
        self.unrunnable: dict[str, Unrunnable] = {}

    def prepare(self, ep: Any, fused_by_preprocess: frozenset[str] = frozenset()) -> None:
        """Read ``ep`` once. ``fused_by_preprocess``: ops a preprocess rule's pattern
        matches; a node of one the runtime lacks is judged on the program as the
        preprocess rules would leave it (:func:`_preprocessed`)."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily(), _real_constants(ep):  # the rules read their values
            self._prepare(ep, fused_by_preprocess)

    def _prepare(self, ep: Any, fused_by_preprocess: frozenset[str]) -> None:
        self._ep = ep
        self._pre = _preprocess_verdicts(ep)
        self._after_preprocess = None
        self._fused_in_chain = frozenset()
        self.unrunnable = {}
        candidates = [n for n in ep.graph_module.graph.nodes
                      if n.op == "call_function" and serialized_name(n) in fused_by_preprocess]
        missing = any(not self.inventory.has_operator(serialized_name(n)) for n in candidates)
        broken = any(n not in self._pre.consumed and self._condition(n, serialized_name(n))
                     for n in candidates)
        if missing or broken:
            after = _preprocessed(ep)
            if after is not None:
                # the original nodes a fusion of the chained preprocess replaces (one pass's
                # fusion may make the next one's: addmm -> linear, then linear + batch norm)
                self._fused_in_chain = frozenset().union(*after.origin.values())
                if missing:
                    self._after_preprocess = self._judge_preprocessed(ep, after,
                                                                      fused_by_preprocess)

    def _runtime(self) -> str:
        return str(self.inventory.named())

    def refusal(self, node: Node) -> KeptOff | None:
        """Why ``node`` must stay on the CPU for the runtime to load and run the program
        right, or None (delegating it is fine, or the CPU could not run it either)."""
        if node.op != "call_function":
            return None
        if self._after_preprocess is not None and node.name in self._after_preprocess:
            return self._after_preprocess[node.name]
        name = serialized_name(node)
        if not name:
            return None
        if not cpu_has_kernel(name):  # the CPU could not run it either
            return None
        if node in self._pre.consumed or node.name in self._fused_in_chain:
            # fused by a preprocess rule: what it creates is the rule's to judge, except a
            # prepacked argument the match leaves outside (conv + relu -> conv_with_clamp
            # still prepacks the conv's weight: a pt2e conv1d's dequantized weight is
            # refused at load)
            found = self._not_constant(node, name)
        else:
            found = (self._missing_operator(node, name) or self._missing_shader(node, name)
                     or self._not_constant(node, name) or self._condition(node, name))
        if found is None:
            return None
        fact, why = found
        return KeptOff(node.name, name, fact, f"{why}: it runs on the CPU")

    def _judge_preprocessed(self, ep: Any, after: _Preprocessed, fused: frozenset[str]
                            ) -> dict[str, KeptOff | None]:
        """The missing operators the preprocess rules leave in the copy, and the nodes
        that prepack what they compute, mapped back to the original nodes."""
        from .inspect.prepack_check import ABORT, PREPACKED_ARGS

        original = {n.name: n for n in ep.graph_module.graph.nodes}
        out: dict[str, KeptOff | None] = {}

        def keep(copy_node: Node, fact: str, why: str) -> None:
            for name in sorted(after.origin.get(copy_node.name, {copy_node.name})):
                n = original.get(name)
                if n is not None and n.op == "call_function" and name not in out:
                    out[name] = KeptOff(name, serialized_name(n), fact, f"{why}: it runs on the CPU")

        left: set[Node] = set()
        for n in after.ep.graph_module.graph.nodes:
            name = serialized_name(n) if n.op == "call_function" else ""
            if (name not in fused or self.inventory.has_operator(name)
                    or n.name in after.undecided):
                continue
            why = f"{self._runtime()} has no {name} (it aborts with 'Missing operator: {name}')"
            said = after.declined.get(n.name)
            if said is not None:
                why += f", and {_declines_text(said)}, so the Vulkan preprocess leaves it"
            if not cpu_has_kernel(name):
                self._note_unrunnable(n, name, why, after, original)
                continue
            left.add(n)
            keep(n, "missing_operator", why)
        for n in after.ep.graph_module.graph.nodes:
            name = serialized_name(n) if n.op == "call_function" else ""
            for arg in PREPACKED_ARGS.get(name, ()):
                v = n.args[arg.index] if arg.index < len(n.args) else None
                if v in left and cpu_has_kernel(name):
                    assert isinstance(v, Node)
                    whose = ", ".join(f"`{o}`" for o in sorted(after.origin.get(n.name, {n.name})))
                    keep(n, "not_constant", (
                        f"{self._runtime()} prepacks argument {arg.index} ({arg.name}) of "
                        f"{name} (what the Vulkan preprocess makes of {whose}), which `{v.name}` "
                        f"computes on the CPU, not a constant: {ABORT}"))
        # a missing operator the preprocess removes is delegated, where it is fused
        for n in original.values():
            name = serialized_name(n) if n.op == "call_function" else ""
            if name in fused and n.name not in out and not self.inventory.has_operator(name):
                out[n.name] = None
        return out

    def _note_unrunnable(self, copy_node: Node, name: str, why: str, after: _Preprocessed,
                         original: dict[str, Node]) -> None:
        why += (", and ExecuTorch's CPU runtime (portable and quantized kernels) has no kernel "
                "for it either, so it cannot be kept off the delegate: the program would be "
                "refused at load")
        hint = UNRUNNABLE_HINTS.get(name)
        if hint is not None:
            why += f". To run it: {hint}"
        for o in sorted(after.origin.get(copy_node.name, {copy_node.name})):
            n = original.get(o)
            if n is not None and n.op == "call_function":
                self.unrunnable.setdefault(o, Unrunnable(o, serialized_name(n), why))

    def _missing_operator(self, node: Node, name: str) -> tuple[str, str] | None:
        if self.inventory.has_operator(name) or name in self._redundant:
            return None
        why = f"{self._runtime()} has no {name} (it aborts with 'Missing operator: {name}')"
        declined = self._pre.declined.get(node)
        if declined is not None:
            why += f", and {declined}, so the Vulkan preprocess would not remove it"
        return "missing_operator", why

    def _missing_shader(self, node: Node, name: str) -> tuple[str, str] | None:
        from executorch.backends.vulkan.op_registry import get_op_features, has_impl
        from executorch.backends.vulkan.utils import get_vk_datatype

        from .inspect.shaders import missing_shader

        if not node.args or not isinstance(node.args[0], Node) or not has_impl(node.target):
            return None
        val = node.meta.get("val")
        dtype = getattr(node.args[0].meta.get("val"), "dtype", None)
        if getattr(val, "dtype", None) is None or dtype is None:
            return None
        try:
            repsets = get_op_features(node.target).make_op_repsets(node, self.texture_limits)
            out_set = repsets.get_out_repset(0)
            storages = ([1] if out_set.texture_is_valid() else []) + (
                [0] if out_set.buffer_is_valid() else [])
            in1 = types.SimpleNamespace(datatype=int(get_vk_datatype(dtype)))
        except Exception:  # not a representable tensor op: the partitioner decides
            return None
        lacking = [s for s in (missing_shader(name, types.SimpleNamespace(storage_type=st), in1,
                                              self.inventory.shaders) for st in storages) if s]
        if not lacking:
            return None
        return "missing_shader", (f"{self._runtime()} has no shader {' / '.join(lacking)} "
                                  f"(it aborts with 'Could not find ShaderInfo with name "
                                  f"{lacking[0]}')")

    def _not_constant(self, node: Node, name: str) -> tuple[str, str] | None:
        from executorch.backends.vulkan.utils import is_param_node

        from .inspect.prepack_check import ABORT, PREPACKED_ARGS

        for arg in PREPACKED_ARGS.get(name, ()):
            v = node.args[arg.index] if arg.index < len(node.args) else None
            if v is None and arg.none_ok:
                continue
            if isinstance(v, Node) and (v in self._pre.consumed or (
                    self._ep is not None and is_param_node(self._ep, v))):
                continue
            what = "None" if v is None else (f"`{v.name}`, computed by the graph"
                                             if isinstance(v, Node) else repr(v))
            return "not_constant", (f"{self._runtime()} prepacks argument {arg.index} "
                                    f"({arg.name}) of {name}, which is {what}, not a constant: "
                                    f"{ABORT}")
        return None

    def _condition(self, node: Node, name: str) -> tuple[str, str] | None:
        return broken_condition(node, name, self._runtime())
