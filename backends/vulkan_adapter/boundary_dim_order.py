"""Delegate inputs and outputs whose dim order is not contiguous, made right inside the delegate.

Why: ExecuTorch 1.5.1's ``VulkanBackend::execute`` copies each delegate input's memory into
staging, and each result into an output's memory, in contiguous order whatever the tensor's
dim order (found on the real runtime, ``tests/test_vulkan_real_runtime_dim_order.py``): a
channels_last input is read as if its memory were NCHW, a channels_last output gets the
NCHW result's bytes — wrong values, stock's programs and fusionkit's alike. Inside the
delegate the dim order does not matter: the Vulkan graph has sizes, no strides (its
``RemoveRedundantOpsTransform`` drops every ``_to_dim_order_copy``).

What: for the adapter's partitions (the takeover, :data:`PATCHES`), the program
``VulkanBackend.preprocess`` is given is rewritten before its passes run
(:func:`convert_at_boundary`). A user input ``x`` in dim order ``D`` (not contiguous) is
declared as what the delegate really receives, a contiguous tensor of ``x``'s shape holding
``x``'s memory, and its users read ``permute_copy(view_copy(x, memory shape), D⁻¹)``, which
is ``x``; a user output ``y`` in dim order ``D`` is returned as
``view_copy(permute_copy(y, D), y's shape)``, the contiguous tensor whose bytes are ``y``'s
memory in ``D``, which the runtime then copies into the output as it is. Nothing changes
outside the delegate: the program keeps its dim orders, no node is added on the CPU.
:meth:`~.partitioner.VulkanPartitioner.partition` lists the boundary tensors so handled
(:attr:`~.partitioner.VulkanPartitioner.boundary_dim_orders`, :func:`partition_boundaries`);
``check()`` recognises the two ops in a payload (:func:`converts_input`,
:func:`converts_output`) and the simulator computes them.

Why not ``_to_dim_order_copy`` nodes on the CPU at the boundary: the boundary is known only
once the partitioner has tagged, and ``to_backend`` asserts that a partitioner leaves the
graph as it found it (``is_identical_graph``); after that, the delegate is the only part of
the program the backend still writes. XNNPACK does the same for its NHWC inputs (its
delegate is told the input's dim order and reads the memory as such).

Not handled: a boundary tensor with symbolic sizes (the views would need run-time sizes; it
is left as it was, and ``check()`` takes such a tensor as contiguous), and delegate outputs
other than user outputs (buffer mutations).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fusionkit.integration.hooks import PatchSet

__all__ = ["PATCHES", "BoundaryDimOrder", "boundary_dim_orders", "convert_at_boundary",
           "converts_input", "converts_output", "memory_shape", "non_contiguous_dim_order",
           "partition_boundaries"]

_PREPROCESS_MODULE = "executorch.backends.vulkan.vulkan_preprocess"
#: the first thing ``VulkanBackend.preprocess`` does with its program (1.5.1)
_FIRST_STEP = "unsafe_remove_auto_functionalized_pass"

VIEW_OPS = ("aten.view_copy.default",)
PERMUTE_OPS = ("aten.permute_copy.default", "aten.permute.default")


@dataclass(frozen=True)
class BoundaryDimOrder:
    """One delegate input or output whose dim order is not contiguous, converted inside."""

    #: the partition's delegation tag ("" for a program given to preprocess)
    tag: str
    kind: str  # "input" | "output"
    #: the node (in the partitioned program) whose value crosses the boundary
    name: str
    shape: tuple[int, ...]
    dim_order: tuple[int, ...]


def non_contiguous_dim_order(val: Any) -> tuple[int, ...] | None:
    """``val``'s dim order when it is a tensor with concrete sizes whose bytes are not
    those of a contiguous one; else None (nothing to convert)."""
    from .inspect.runtime_conditions import contiguous_dim_order

    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    try:
        order = tuple(int(d) for d in val.dim_order())
    except Exception:  # symbolic strides
        return None
    return None if contiguous_dim_order(tuple(val.shape), order) else order


def memory_shape(shape: Sequence[int], dim_order: Sequence[int]) -> list[int]:
    """The shape whose contiguous layout is that of ``shape`` held in ``dim_order``."""
    return [int(shape[int(d)]) for d in dim_order]


def _inverse(dim_order: Sequence[int]) -> list[int]:
    return [list(dim_order).index(d) for d in range(len(dim_order))]


def partition_boundaries(ep: Any, tags: Iterable[str]) -> list[BoundaryDimOrder]:
    """Each tensor crossing a partition's boundary in a non-contiguous dim order, in the
    tagged program ``ep``: an input (a node outside read by a tagged node) or an output (a
    tagged node read outside)."""
    found: list[BoundaryDimOrder] = []
    nodes = list(ep.graph_module.graph.nodes)
    for tag in tags:
        inside = {n for n in nodes if n.meta.get("delegation_tag") == tag}
        inputs = {a: None for n in nodes if n in inside for a in n.all_input_nodes
                  if a not in inside}
        outputs = [n for n in nodes if n in inside and any(u not in inside for u in n.users)]
        for kind, group in (("input", list(inputs)), ("output", outputs)):
            for n in group:
                order = non_contiguous_dim_order(n.meta.get("val"))
                if order is not None:
                    found.append(BoundaryDimOrder(tag, kind, n.name, tuple(n.meta["val"].shape),
                                                  order))
    return found


def boundary_dim_orders(ep: Any) -> list[BoundaryDimOrder]:
    """A delegate's program (what preprocess is given): its user inputs and user outputs
    whose dim order is not contiguous."""
    from torch.export.graph_signature import InputKind, OutputKind

    sig = ep.graph_signature
    by_name = {n.name: n for n in ep.graph_module.graph.nodes}
    out_node = ep.graph_module.graph.output_node()
    found: list[BoundaryDimOrder] = []
    for spec in sig.input_specs:
        node = by_name.get(getattr(spec.arg, "name", ""))
        if spec.kind == InputKind.USER_INPUT and node is not None:
            order = non_contiguous_dim_order(node.meta.get("val"))
            if order is not None:
                found.append(BoundaryDimOrder("", "input", node.name,
                                              tuple(node.meta["val"].shape), order))
    for spec, node in zip(sig.output_specs, out_node.args[0], strict=False):
        if spec.kind == OutputKind.USER_OUTPUT and isinstance(node, torch.fx.Node):
            order = non_contiguous_dim_order(node.meta.get("val"))
            if order is not None:
                found.append(BoundaryDimOrder("", "output", node.name,
                                              tuple(node.meta["val"].shape), order))
    return found


def _call(graph: torch.fx.Graph, op: Any, args: tuple[Any, ...], fake_mode: Any) -> torch.fx.Node:
    node = graph.call_function(op, args)
    meta_args = tuple(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args)
    with fake_mode:
        node.meta["val"] = op(*meta_args)
    return node


def convert_at_boundary(ep: Any) -> Any:
    """Rewrite a delegate's program (in place; returned) so that its values are right when
    the runtime copies its inputs and outputs in contiguous order (see the module doc)."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.export.graph_signature import OutputSpec, TensorArgument

    view, permute = exir_ops.edge.aten.view_copy.default, exir_ops.edge.aten.permute_copy.default
    todo = boundary_dim_orders(ep)
    if not todo:
        return ep
    graph = ep.graph_module.graph
    by_name = {n.name: n for n in graph.nodes}
    out_node = graph.output_node()
    for b in todo:
        node = by_name[b.name]
        fake = node.meta["val"]
        mode = fake.fake_mode
        if b.kind == "input":
            with mode:
                node.meta["val"] = fake.contiguous()  # what the runtime's copy hands over
            users = list(node.users)
            with graph.inserting_after(node):
                memory = _call(graph, view, (node, memory_shape(b.shape, b.dim_order)), mode)
            with graph.inserting_after(memory):
                logical = _call(graph, permute, (memory, _inverse(b.dim_order)), mode)
            for u in users:
                u.replace_input_with(node, logical)
        else:
            with graph.inserting_before(out_node):
                memory = _call(graph, permute, (node, list(b.dim_order)), mode)
                flat = _call(graph, view, (memory, list(b.shape)), mode)
            outs = list(out_node.args[0])
            specs = ep.graph_signature.output_specs
            for i, o in enumerate(outs):
                if o is node and getattr(specs[i].arg, "name", None) == node.name:
                    outs[i] = flat
                    specs[i] = OutputSpec(specs[i].kind, TensorArgument(name=flat.name),
                                          specs[i].target)
            out_node.args = (tuple(outs),)
    graph.lint()
    ep.graph_module.recompile()
    return ep


# ------------------------------------------------------------------ the payload side


def _int_list(g: Any, vid: int) -> list[int] | None:
    v = g.value(vid)
    if v is None or not isinstance(v.value, tuple):
        return None
    return [int(e) for e in v.value]


def _readers(g: Any, vid: int) -> list[Any]:
    return [c for c in g.chain if vid in c.args[:-1]]


def converts_input(g: Any, vid: int, shape: Sequence[int], dim_order: Sequence[int]) -> bool:
    """In a decoded payload (``VkGraph``): the delegate input ``vid`` is read only through
    ``view_copy`` to its memory shape, then a permute by the inverse of ``dim_order``."""
    readers = _readers(g, vid)
    if not readers or any(c.name not in VIEW_OPS or c.args[0] != vid
                          or _int_list(g, c.args[1]) != memory_shape(shape, dim_order)
                          for c in readers):
        return False
    for c in readers:
        after = _readers(g, c.args[-1])
        if not after or any(p.name not in PERMUTE_OPS or p.args[0] != c.args[-1]
                            or _int_list(g, p.args[1]) != _inverse(dim_order) for p in after):
            return False
    return True


def converts_output(g: Any, vid: int, shape: Sequence[int], dim_order: Sequence[int]) -> bool:
    """In a decoded payload: the delegate output ``vid`` is written by ``view_copy`` to its
    shape of a permute by ``dim_order`` (and by nothing else)."""
    writers = [c for c in g.chain if c.args and c.args[-1] == vid]
    if len(writers) != 1 or writers[0].name not in VIEW_OPS:
        return False
    v = writers[0]
    if _int_list(g, v.args[1]) != [int(s) for s in shape]:
        return False
    src = [c for c in g.chain if c.args and c.args[-1] == v.args[0]]
    return (len(src) == 1 and src[0].name in PERMUTE_OPS
            and _int_list(g, src[0].args[1]) == [int(d) for d in dim_order])


# ------------------------------------------------------------------ the hook


def _first_step(program: Any, *args: Any, **kwargs: Any) -> Any:
    original = PATCHES.original(importlib.import_module(_PREPROCESS_MODULE), _FIRST_STEP)
    return convert_at_boundary(original(program, *args, **kwargs))


def _patches() -> list[tuple[Any, str, Any]]:
    return [(importlib.import_module(_PREPROCESS_MODULE), _FIRST_STEP, _first_step)]


#: ``VulkanBackend.preprocess`` begins with :func:`convert_at_boundary` (after its own first
#: step, ``unsafe_remove_auto_functionalized_pass``); part of the adapter's takeover
PATCHES = PatchSet(f"fusionkit.backends.vulkan_adapter.boundary_dim_order ({_PREPROCESS_MODULE}."
                   f"{_FIRST_STEP} then convert_at_boundary)", _patches)
