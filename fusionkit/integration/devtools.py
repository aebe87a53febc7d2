"""ExecuTorch's devtools and fusionkit's fusions: an ETRecord whose handles name what was fused.

ExecuTorch's ``Inspector`` maps a runtime value back to graph nodes through debug
handles: each instruction of the ``.pte`` has the ``debug_handle`` of the node it was
emitted from (the ETRecord's debug-handle map), each node of the reference graph (the
ATen program, its handles propagated back from the edge program) has its own, and
``calculate_numeric_gap`` compares a runtime value with the reference output of the
node whose handle is the *last* of the runtime's handles; its ``aot_ops`` are every
reference node whose handle is among them. A delegate call already carries a list of
handles this way.

A node fusionkit's rules created carries the int handle of the node whose value it
computes (the match's root) -- the only form ExecuTorch's delegation, serializer and
ETRecord accept in ``node.meta`` -- and ``meta['fusionkit_debug_handles']``, the handles of
every node it replaced, the root's last (:func:`fusionkit.edit.builder.replaced_debug_handles`).
:func:`attribute_fusions` writes those tuples into an ETRecord's debug-handle map and
delegate maps, where ExecuTorch itself puts a list for a delegate, so the Inspector
attributes the fused op's runtime value to all the nodes it replaced and compares it
with the root's reference output. Without it, the comparison is still with the right op
(the root), but names the root alone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from fusionkit.edit.builder import DEBUG_HANDLES_KEY

__all__ = ["FUSED_GRAPH_KEY", "attribute_fusions", "expand_handles", "fused_debug_handles"]

#: the graph map entry ``to_edge_transform_and_lower(..., generate_etrecord=True)`` records
#: after the transform passes (where fusionkit's rules run)
FUSED_GRAPH_KEY = "edge_after_transform/forward"


def _graph_modules(program: Any) -> Iterable[Any]:
    """The graph module of ``program`` (an ``ExportedProgram`` or a graph module) and of
    every graph module nested in it (lowered delegates' original programs included)."""
    gm = getattr(program, "graph_module", program)
    seen: set[int] = set()
    work = [gm]
    while work:
        g = work.pop()
        if id(g) in seen or not hasattr(g, "graph"):
            continue
        seen.add(id(g))
        yield g
        for child in g.children() if hasattr(g, "children") else ():
            original = getattr(child, "original_module", None)
            work.append(getattr(original, "graph_module", child))


def fused_debug_handles(*programs: Any) -> dict[int, tuple[int, ...]]:
    """handle -> the handles it stands for, for each node a fusionkit rule made in
    ``programs`` that replaced nodes of more than one handle.

    A handle still carried by a node no rule made is left out of the others' tuples
    (the Inspector would merge the two runtime values otherwise).
    """
    fused: list[tuple[int, tuple[int, ...]]] = []
    surviving: set[int] = set()
    for program in programs:
        for gm in _graph_modules(program):
            for n in gm.graph.nodes:
                if n.op != "call_function":
                    continue
                h = n.meta.get("debug_handle")
                if not isinstance(h, int) or isinstance(h, bool):
                    continue
                handles = n.meta.get(DEBUG_HANDLES_KEY)
                if handles and h in handles:
                    fused.append((h, tuple(handles)))
                else:
                    surviving.add(h)
    out: dict[int, tuple[int, ...]] = {}
    for h, handles in fused:
        kept = [x for x in handles if x == h or x not in surviving]
        merged = dict.fromkeys([*out.get(h, ()), *kept])
        merged.pop(h, None)
        merged[h] = None  # the node's own (the root's) handle last
        if len(merged) > 1:
            out[h] = tuple(merged)
    return out


def expand_handles(value: Any, expansions: Mapping[int, tuple[int, ...]]) -> Any:
    """A debug-handle map value with each fused handle replaced by the handles it stands
    for: an int becomes a list (as ExecuTorch writes a delegate's), a list or tuple keeps
    its type; the order is kept and the last handle stays the last one's."""
    if isinstance(value, int) and not isinstance(value, bool):
        return list(expansions[value]) if value in expansions else value
    if isinstance(value, (list, tuple)):
        out: dict[Any, None] = {}
        for h in value:
            for x in expansions.get(h, (h,)) if isinstance(h, int) else (h,):
                out.pop(x, None)
                out[x] = None
        return type(value)(out)
    return value


def attribute_fusions(etrecord: Any, *programs: Any,
                      positional_delegates: Collection[str] = ()) -> dict[int, tuple[int, ...]]:
    """Make ``etrecord``'s debug-handle map and delegate maps name, for each instruction a
    fused node became, the handles of all the nodes it replaced; returns the expansions.

    ``programs``: where fusionkit's fused nodes are (default: the ETRecord's graph after
    the transform passes, :data:`FUSED_GRAPH_KEY`, which ``generate_etrecord=True``
    records). A delegate's per-op map is expanded too, but not that of a backend
    named in ``positional_delegates`` (one whose map holds something other than the
    nodes' handles: an adapter's ``POSITIONAL_DELEGATE_MAPS``). Call it on the ETRecord object before ``save`` (a parsed one has lost the
    nodes' fusionkit metadata). The maps are replaced, not edited (the program manager
    may share them).
    """
    if not programs:
        graph_map = getattr(etrecord, "graph_map", None) or {}
        after = graph_map.get(FUSED_GRAPH_KEY)
        programs = (after,) if after is not None else ()
    expansions = fused_debug_handles(*programs)
    if not expansions:
        return expansions
    handle_map = etrecord._debug_handle_map
    if handle_map:
        etrecord._debug_handle_map = {
            method: {i: expand_handles(v, expansions) for i, v in per.items()}
            for method, per in handle_map.items()}
    delegate_map = etrecord._delegate_map
    if delegate_map:
        etrecord._delegate_map = {
            method: {i: meta if meta.get("name") in positional_delegates else {
                **meta, "delegate_map": {k: expand_handles(v, expansions)
                                         for k, v in (meta.get("delegate_map") or {}).items()}}
                for i, meta in per.items()}
            for method, per in delegate_map.items()}
    return expansions
