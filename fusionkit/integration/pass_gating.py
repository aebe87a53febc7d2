"""Skip a backend preprocess pass when the graph holds nothing it could act on.

Why: inside a backend's ``preprocess`` every pass goes through
``executorch.exir.program._program._transform`` -- the pass manager's checks before and
after (recompile, lint, ``validate``), usually an ExportPass retrace, the signature
rebuild -- 10-40 ms a call even when the pass finds nothing.

This module is the backend-neutral mechanism; what each pass class needs in the graph
lives with the backend whose preprocess runs it (``backends/*_adapter/pass_gates.py``),
as a :data:`GateTable`. A :class:`PassGate` names the pass's *trigger* (what must be in
the graph for the pass to possibly change it). When the trigger is absent, the pass's
own rewrite does nothing and all that is left is what the gate's flags describe:

* ``retraces`` -- the pass ends with an ExportPass retrace: the same nodes with their
  ``val`` re-derived. Skipped only when the graph is *settled*: nothing has changed it in
  place since it was given or last retraced (tracked per graph module; an in-place pass
  that reported a change unsettles it, unless its ``keeps_meta`` shows beforehand that
  every value it leaves is exact), so re-deriving gives back the same metadata.
* ``always_modified`` -- the pass reports a change even when it made none, so the pass
  manager would also de-duplicate equal ``getitem`` nodes and rebuild the signature and
  range constraints: skipped only without duplicate getitems and without range
  constraints (static shapes).
* ``dce`` -- the pass eliminates dead code even when it rewrote nothing: skipped only
  when no node (placeholders and the output aside) is unused.

A graph with sub-graphs (control flow) is never gated. A pass class not in the table, or
one whose gate's trigger is ``None``, always runs; so does any pass whose gate raises.

:func:`gated_transform` wraps ``_transform``: a skipped pass returns the program itself,
which is what ExecuTorch's ``_transform`` returns when a pass reports no change.
:func:`transform_patches` makes the :class:`~fusionkit.integration.hooks.PatchSet` that
puts it in place of a module's ``_transform`` name; an adapter includes it in the patch
set its scoped preprocess installs, so only the partitions a fusionkit partitioner made
are gated. :func:`disabled` turns gating off; :func:`checking` also runs every skipped
pass on a deep copy and raises :class:`GateViolation` if it changed anything (nodes,
targets, arguments, output metadata, selected node metadata, signature, constants).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import operator
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from fusionkit.integration.hooks import PatchSet
from fusionkit.integration.preprocess_state import Tally, ThreadSwitch
from fusionkit.integration.tensor_bytes import tensor_bytes

__all__ = [
    "NO_NAME",
    "GateTable",
    "GateViolation",
    "PassGate",
    "Trigger",
    "arg",
    "calls",
    "checking",
    "counts",
    "disabled",
    "edge_ops",
    "gate_for",
    "gated_transform",
    "has_duplicate_getitems",
    "is_enabled",
    "nodes",
    "present",
    "reset_counts",
    "retracing",
    "structure",
    "target_names",
    "transform_patches",
    "val_key",
]

Trigger = Callable[[Any, Any], bool]  # (ExportedProgram, pass instance) -> may act


@dataclass(frozen=True)
class PassGate:
    """What one pass class needs in the graph to possibly change it, and what it does
    when it finds nothing (see the module docstring)."""

    trigger: Trigger | None  # None: never skipped (the entry only records ``retraces``)
    retraces: bool = False
    always_modified: bool = False
    dce: bool = False
    #: for a pass that changes the graph in place: True when, run on this (settled)
    #: graph, every ``val`` it leaves is what a retrace would derive (asked before it runs)
    keeps_meta: Trigger | None = None


#: ``module.QualName`` of a pass class (exactly; a subclass is a different pass) -> gate
GateTable = Mapping[str, PassGate]


def retracing(trigger: Trigger, dce: bool = False) -> PassGate:
    """An ExportPass that rewrites, then retraces and reports a change even with nothing found."""
    return PassGate(trigger, retraces=True, always_modified=True, dce=dce)


class GateViolation(AssertionError):
    """A skipped pass, run on a copy under :func:`checking`, changed the program."""


# ----------------------------------------------------------------------------- trigger helpers


def edge_ops() -> Any:
    """``executorch.exir.dialects._ops.ops.edge`` (imported when first needed)."""
    from executorch.exir.dialects._ops import ops as exir_ops

    return exir_ops.edge


def _graph(ep: Any) -> torch.fx.Graph:
    return ep.graph_module.graph  # type: ignore[no-any-return]


def nodes(ep: Any, *targets: Any) -> Iterator[Node]:
    """call_function nodes with one of ``targets`` (FX's own (op, target) index)."""
    g = _graph(ep)
    for t in targets:
        yield from g.find_nodes(op="call_function", target=t)


def arg(n: Node, i: int) -> Any:
    """An argument, untyped: the passes read them as nodes or lists without checks."""
    return n.args[i]


def present(ep: Any, *targets: Any) -> bool:
    return any(True for _ in nodes(ep, *targets))


def calls(ep: Any) -> Iterator[Node]:
    return (n for n in _graph(ep).nodes if n.op == "call_function")


NO_NAME = object()


def target_names(ep: Any) -> set[Any]:
    """``target.__name__`` of every call (:data:`NO_NAME` when one has none: passes that
    read every call's ``__name__`` would raise on it, so they must run)."""
    return {getattr(n.target, "__name__", NO_NAME) for n in calls(ep)}


def gate_for(pass_obj: Any, table: GateTable) -> PassGate | None:
    """The gate of a pass instance's exact class, or None (always runs)."""
    cls = type(pass_obj)
    return table.get(f"{cls.__module__}.{cls.__qualname__}")


# ----------------------------------------------------------------------------- state

_enabled = ThreadSwitch(default=True)
_checking = ThreadSwitch(default=False)
_tally = Tally(("skipped", "ran"))
#: graph modules changed in place (not retraced) by a pass that ran
_unsettled: weakref.WeakSet[GraphModule] = weakref.WeakSet()


def is_enabled() -> bool:
    return _enabled.is_on()


def _is_checking() -> bool:
    return _checking.is_on()


def disabled() -> AbstractContextManager[None]:
    """Every pass runs (in this thread) while the block runs."""
    return _enabled.turned(False)


def checking() -> AbstractContextManager[None]:
    """Every skip is verified: the pass runs on a deep copy and must change nothing."""
    return _checking.turned(True)


def counts() -> dict[str, dict[str, int]]:
    """Pass class name -> {"skipped": n, "ran": n} since the last :func:`reset_counts`."""
    return _tally.snapshot()


def reset_counts() -> None:
    _tally.reset()


def _count(pass_obj: Any, outcome: str) -> None:
    _tally.add(type(pass_obj).__name__, outcome)


# ----------------------------------------------------------------------------- deciding


def _has_subgraphs(gm: GraphModule) -> bool:
    return any(m is not gm and isinstance(m, GraphModule) for m in gm.modules())


def _has_dead_code(gm: GraphModule) -> bool:
    """Any unused node but placeholders and the output (what DCE might erase; impure
    unused nodes count too: conservative)."""
    return any(not n.users and n.op not in ("placeholder", "output") for n in gm.graph.nodes)


def has_duplicate_getitems(gm: GraphModule) -> bool:
    """What ``_common_getitem_elimination_pass`` would merge (or cannot index)."""
    seen: set[tuple[Node, Any]] = set()
    for n in gm.graph.find_nodes(op="call_function", target=operator.getitem):
        source, idx = n.args
        if not isinstance(source, Node) or (source, idx) in seen:
            return True
        seen.add((source, idx))
    return False


def _skippable(gate: PassGate, program: Any, pass_obj: Any) -> bool:
    if gate.trigger is None:
        return False
    gm = program.graph_module
    if _has_subgraphs(gm):
        return False
    if gate.retraces and gm in _unsettled:
        return False
    if gate.always_modified and (program.range_constraints or has_duplicate_getitems(gm)):
        return False
    if gate.dce and _has_dead_code(gm):
        return False
    return not gate.trigger(program, pass_obj)


def _keeps_meta(gate: PassGate | None, program: Any, pass_obj: Any) -> bool:
    """Asked before an in-place pass runs: will the graph still be settled after it?"""
    if gate is None or gate.keeps_meta is None or program.graph_module in _unsettled:
        return False
    try:
        return bool(gate.keeps_meta(program, pass_obj))
    except Exception:
        return False


def _after_run(gate: PassGate | None, program: Any, result: Any, keeps_meta: bool) -> None:
    if result is program:
        return  # reported no change: the program is as it was
    gm = result.graph_module
    if (gate is not None and gate.retraces) or (keeps_meta and gm is program.graph_module):
        _unsettled.discard(gm)
    else:
        _unsettled.add(gm)


def gated_transform(orig: Callable[..., Any], table: GateTable) -> Callable[..., Any]:
    """``_transform`` that returns the program unchanged for a pass of ``table`` with
    nothing to do."""

    def _transform(program: Any, *passes: Any, **kwargs: Any) -> Any:
        if not is_enabled() or len(passes) != 1:
            return orig(program, *passes, **kwargs)
        pass_obj = passes[0]
        gate = gate_for(pass_obj, table)
        try:
            skip = gate is not None and _skippable(gate, program, pass_obj)
        except Exception:
            skip = False  # a gate that cannot decide lets the pass run
        if skip:
            _count(pass_obj, "skipped")
            if _is_checking():
                _check_unchanged(orig, program, pass_obj, kwargs)
            return program
        keeps_meta = _keeps_meta(gate, program, pass_obj)
        result = orig(program, pass_obj, **kwargs)
        _count(pass_obj, "ran")
        with contextlib.suppress(Exception):
            _after_run(gate, program, result, keeps_meta)
        return result

    _transform.__wrapped__ = orig  # type: ignore[attr-defined]
    return _transform


def transform_patches(component: str, module_name: str, table: GateTable) -> PatchSet:
    """The patch set gating every pass ``module_name`` runs through its ``_transform`` name."""

    def patches() -> list[tuple[Any, str, Any]]:
        module = importlib.import_module(module_name)
        return [(module, "_transform", gated_transform(module._transform, table))]

    return PatchSet(component, patches)


# ----------------------------------------------------------------------------- checking

#: node metadata the check ignores: provenance and debugging aids that a retrace
#: rewrites or that never reach a backend ("val" is compared on its own)
VOLATILE_META = frozenset({
    "val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack", "from_node",
    "seq_nr", "torch_fn", "debug_handle", "original_aten", "unbacked_bindings",
    "partitioner_tag", "delegation_tag", "custom_op_name", "is_wrapped_scalar",
})


def val_key(v: Any) -> Any:
    """A comparable summary of a ``val``: shape, dtype and strides of every tensor."""
    if isinstance(v, torch.Tensor):
        stride = tuple(v.stride()) if v.layout == torch.strided else None
        return ("T", tuple(v.shape), v.dtype, stride)
    if isinstance(v, (list, tuple)):
        return tuple(val_key(x) for x in v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return (type(v).__name__, str(v))


def _meta_value_key(v: Any, index: dict[Node, int]) -> Any:
    if isinstance(v, Node):
        return ("N", index.get(v))
    if isinstance(v, torch.Tensor):
        return val_key(v)
    if isinstance(v, (list, tuple)):
        return tuple(_meta_value_key(x, index) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _meta_value_key(x, index)) for k, x in v.items()))
    return repr(v)


def structure(program: Any, values: bool = True) -> list[Any]:
    """A name-free description of a program: every node (op, target, arguments with
    nodes as positions, output metadata, non-volatile metadata), the signature and the
    constants (name, shape, dtype, a hash of the exact bytes; with ``values=False`` the
    tensor object's identity instead). Node names are left out: a retrace renames nodes
    from their ops, and the serializers do not read names."""
    gm = program.graph_module
    all_nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(all_nodes)}

    def ref(a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: f"%{index[n]}")  # type: ignore[arg-type,return-value]

    rows: list[Any] = []
    for n in all_nodes:
        meta = tuple(sorted((k, _meta_value_key(v, index)) for k, v in n.meta.items()
                            if k not in VOLATILE_META))
        target = n.target if n.op in ("placeholder", "get_attr", "output") else str(n.target)
        # the output node's val only repeats its arguments' (a retrace adds it)
        val = None if n.op == "output" else val_key(n.meta.get("val"))
        rows.append((n.op, target, repr(ref(n.args)), repr(ref(n.kwargs)), val, meta))
    sig = program.graph_signature
    rows.append(("inputs", [(str(s.kind), s.target, getattr(s, "persistent", None))
                            for s in sig.input_specs]))
    rows.append(("outputs", [(str(s.kind), s.target) for s in sig.output_specs]))
    for label, tensors in (("state_dict", program.state_dict), ("constants", program.constants)):
        for name in sorted(tensors):
            t = tensors[name]
            if isinstance(t, torch.Tensor):
                data = (hashlib.sha256(tensor_bytes(t.detach())).hexdigest() if values
                        else id(t))
                rows.append((label, name, val_key(t), data))
            else:
                rows.append((label, name, type(t).__name__))
    return rows


def _check_unchanged(orig: Callable[..., Any], program: Any, pass_obj: Any,
                     kwargs: dict[str, Any]) -> None:
    twin = copy.deepcopy(program)
    twin_pass = copy.copy(pass_obj)
    if hasattr(twin_pass, "_exported_program"):
        twin_pass._exported_program = twin
    before = structure(program)
    after = structure(orig(twin, twin_pass, **kwargs))
    if before != after:
        diff = next((i, b, a) for i, (b, a) in enumerate(zip(before, after, strict=False))
                    if b != a) if len(before) == len(after) else ("length", len(before), len(after))
        raise GateViolation(
            f"{type(pass_obj).__name__} was skipped but changes the program: {diff}")
