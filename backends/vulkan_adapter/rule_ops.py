"""The operators fusionkit's Vulkan rules can create, read from the rules' replacements.

The runtime probe (:mod:`.runtime_probe`) must ask the real runtime about every op a
Vulkan payload can hold. The partitioner's registry lists the ops it delegates; the
Vulkan preprocess adds the ops its fusions create (``et_vk.*``,
``llama.sdpa_with_kv_cache``), which are fusionkit's rules here. What a rule can create is
read from its replacement, so a new rule is covered without anyone keeping a list:

* a :class:`~fusionkit.CallOp` names its target;
* a :class:`~fusionkit.PythonReplacement`'s function is read, not run (it needs a
  match): the strings among its constants, the module globals and closure cells it
  names, and, followed, the helper functions of ``fusionkit.passes`` it calls. A string
  that names an operator (``"aten.linear.default"``), or a bare name that is an op of the
  Vulkan delegate's namespace (``et_vk("conv_with_clamp")``), is one it can create.

This over-approximates (a string the code only compares with counts too), which costs a
probe question, never a wrong answer: the delegation check judges each fusion on the
ops its replacement actually builds. An op is named as the Vulkan payload names it
(``VkGraphBuilder``: ``node.target.__name__``), in both forms a node can take: the edge
op's ``ns.name.overload`` and a torch ``OpOverload``'s ``name.overload``. Both happen:
a replacement's ops take the dialect of the match's root, and preprocess's in-place
form holds ATen nodes (the cache updates it un-functionalizes are
``update_cache.default``; ``select_as_symint`` fused there is ``select_as_symint.default``);
stock's KV-cache fusion creates the ATen ``llama.sdpa_with_kv_cache``
(``sdpa_with_kv_cache.default``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import cache
from types import CodeType, FunctionType
from typing import Any

from fusionkit import (
    CallOp,
    DeferredRules,
    PythonReplacement,
    Replacement,
    Rule,
    RuleIndex,
    import_op_libraries,
    resolve_op,
)
from fusionkit.passes.registry import RuleFactory, registered

__all__ = ["RULE_SETS", "built_rules", "created_operators", "factory_rules", "payload_names",
           "replacement_ops", "rule_index"]

#: the rule sets whose rules run on Vulkan programs: transform passes and preprocess
#: (FusePatternsPass) run "vulkan"; the takeover of preprocess passes "vulkan_preprocess"
RULE_SETS = ("vulkan", "vulkan_preprocess")

#: a registered factory -> the rules it made. Rules are immutable and every pass list
#: wraps them in new objects (with its own delegation check), so building a factory's
#: patterns once serves every lowering of the process
_BUILT: dict[RuleFactory, tuple[Rule, ...]] = {}


def factory_rules(factory: RuleFactory) -> tuple[Rule, ...]:
    """``factory``'s rules, built once (a cache: callers wrap them, never change them)."""
    rules = _BUILT.get(factory)
    if rules is None:
        rules = _BUILT[factory] = tuple(factory.rules())
    return rules


def built_rules() -> tuple[Rule, ...]:
    """The rules of ``rule_set("vulkan")``, each factory's built once."""
    return tuple(r for f in registered("vulkan") for r in factory_rules(f))


def rule_index(wrap: Callable[[Rule], Rule]) -> RuleIndex:
    """The ``"vulkan"`` rules, each wrapped, indexed for a pass list: a factory that states
    its root ops is built the first time a program holds one of them, so a lowering
    pays only for the patterns its program can match (all are built in order when a
    factory does not state them)."""
    factories = registered("vulkan")
    if any(f.roots is None for f in factories):
        return RuleIndex([wrap(r) for r in built_rules()])

    def group(f: RuleFactory) -> DeferredRules:
        assert f.roots is not None
        return DeferredRules(f.roots, lambda: [wrap(r) for r in factory_rules(f)], f.qualname,
                             f.needs)

    return RuleIndex((), [group(f) for f in factories])



_OP_NAME = re.compile(r"[A-Za-z_]\w*\.\w+(\.\w+)?")
_BARE = re.compile(r"[a-z_][a-z0-9_]*")
#: helpers followed into: the shipped rules' own modules
_FOLLOWED = ("fusionkit.passes.",)


def _referenced(fn: Any, seen: set[CodeType]) -> Iterator[Any]:
    """The values ``fn``'s code refers to: constants, named globals, closure cells; the
    functions among them that belong to the shipped rules are read too."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, CodeType) or code in seen:
        return
    seen.add(code)
    found: list[Any] = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    namespace = getattr(fn, "__globals__", {})
    codes = [code]
    while codes:
        c = codes.pop()
        for k in c.co_consts:
            if isinstance(k, CodeType):
                codes.append(k)
            else:
                found.append(k)
        found += [namespace[n] for n in c.co_names if n in namespace]
    for value in found:
        if isinstance(value, FunctionType):
            if value.__module__.startswith(_FOLLOWED):
                yield from _referenced(value, seen)
        elif isinstance(value, (tuple, list, frozenset, set)):
            yield from value
        else:
            yield value


@cache
def _as_op(value: Any) -> Any:
    """The op ``value`` names (a string or an op object), or None."""
    from fusionkit.passes.vulkan_delegate import NAMESPACES

    if isinstance(value, str):
        names = ([value] if _OP_NAME.fullmatch(value) else
                 [f"{ns}.{value}.default" for ns in NAMESPACES] if _BARE.fullmatch(value) else [])
    else:
        names = [value] if hasattr(value, "_schema") else []
    for name in names:
        if isinstance(name, str) and not _registered(name):
            continue  # most strings a replacement holds are not ops: no failed resolve
        try:
            return resolve_op(name)
        except Exception:  # not an operator (UnknownOpError, or a library that is absent)
            continue
    return None


@cache
def _libraries_loaded(namespace: str) -> None:
    """The op libraries of ``namespace`` imported (once per namespace, not per name)."""
    import_op_libraries(namespace)


def _registered(name: str) -> bool:
    """Whether ``ns.op[.overload]`` is a registered operator: the cheap question, asked
    before ``resolve_op`` (whose error for a name that is not an op searches every
    registered op for the closest ones, ~7 ms a name)."""
    import torch

    parts = name.split(".")
    ns, op, overload = (*parts, "default") if len(parts) == 2 else parts
    _libraries_loaded(ns)
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        return overload in packet.overloads()
    except (AttributeError, RuntimeError):
        return False


def payload_names(op: Any) -> tuple[str, ...]:
    """The names a Vulkan payload can give a node of ``op`` (``VkGraphBuilder`` writes
    ``node.target.__name__``): its edge form's and its ATen ``OpOverload``'s."""
    from executorch.exir.dialects._ops import ops as exir_ops

    aten = resolve_op(op)
    ns, name = aten._schema.name.split("::", 1)
    edge = getattr(getattr(getattr(exir_ops.edge, ns), name), aten._overloadname)
    return tuple(dict.fromkeys((edge.__name__, aten.__name__)))


def replacement_ops(replacement: Replacement) -> frozenset[Any]:
    """The ATen overloads ``replacement`` can create (see the module)."""
    if isinstance(replacement, CallOp):
        values: list[Any] = [replacement.target]
    elif isinstance(replacement, PythonReplacement):
        values = list(_referenced(replacement.fn, set()))
    else:  # a replacement kind this reader does not know: nothing is claimed for it
        values = []
    ops = set()
    for v in values:
        try:
            op = _as_op(v)
        except TypeError:  # unhashable: not an op name
            continue
        if op is not None:
            ops.add(op)
    return frozenset(ops)


def created_operators(rules: list[Rule] | None = None) -> dict[str, tuple[str, ...]]:
    """Payload name -> the rules that can create it, over ``rules`` (default: every rule
    of :data:`RULE_SETS`)."""
    if rules is None:
        from fusionkit.passes import rule_set

        # the transform passes' rules are built once per process already: not again here
        rules = [r for s in RULE_SETS
                 for r in (built_rules() if s == "vulkan" else rule_set(s))]
    out: dict[str, list[str]] = {}
    for rule in rules:
        for op in replacement_ops(rule.replacement):
            for name in payload_names(op):
                out.setdefault(name, [])
                if rule.name not in out[name]:
                    out[name].append(rule.name)
    return {k: tuple(v) for k, v in sorted(out.items())}
