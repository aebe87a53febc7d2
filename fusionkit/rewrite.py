"""The engine's apply step: accepted matches become replacements in an ExportedProgram.

Every match reaching this module already passed all its constraints, so each
one is applied: fold the constants it planned to fold, build the replacement
before the root (new nodes get ``meta['val']`` from fake-tensor propagation and
the root's provenance metadata), reroute the root's users, erase the claimed
nodes, and finally drop whatever became dead — graph nodes and the constants
(with their signature entries and state-dict tensors) nothing uses any more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import TensorArgument
from torch.fx import Node

from fusionkit.builder import FusionError, Rewriter
from fusionkit.finder import Match
from fusionkit.folding import fold_to_constant
from fusionkit.pattern import output_names
from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import is_assertion, resolve_op

__all__ = ["apply_matches"]

def _same_signature(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
    return type(a) is type(b)


def _erase_dead(ep: ExportedProgram, candidates: list[Node], drop_constants: bool = True) -> None:
    """Erase candidates (and, transitively, their inputs) that nothing uses.

    Only pure call_function nodes and constant placeholders are removed; a
    constant's state-dict entry and signature spec go with its placeholder.
    """
    from executorch.backends.transforms.utils import delete_constant_placeholder

    inputs = ProgramInputs(ep)
    graph = ep.graph_module.graph
    work = list(candidates)
    while work:
        n = work.pop()
        if getattr(n, "_erased", False):
            continue
        _erase_assertions_on(n)
        if n.users or n.op == "output":
            continue
        if n.op == "call_function":
            schema = getattr(resolve_op(n.target), "_schema", None) if _is_op(n.target) else None
            if schema is None or schema.is_mutable:
                continue
            ins = list(n.all_input_nodes)
            graph.erase_node(n)
            work.extend(ins)
        elif drop_constants and n.op == "placeholder" and inputs.constant(n) is not None:
            delete_constant_placeholder(ep, n)
            inputs = ProgramInputs(ep)


def _rename_outputs(ep: ExportedProgram, renamed: dict[str, str]) -> None:
    """A replaced root that was a program output: its output spec names the new node."""
    for spec in ep.graph_signature.output_specs:
        if isinstance(spec.arg, TensorArgument) and spec.arg.name in renamed:
            spec.arg = TensorArgument(name=renamed[spec.arg.name])


def _erase_assertions_on(n: Node) -> None:
    """Drop run-time checks whose only subject is ``n`` once nothing else uses ``n``."""
    users = list(n.users)
    if users and all(is_assertion(u) for u in users):
        for u in users:
            n.graph.erase_node(u)


def _is_op(target: Any) -> bool:
    try:
        resolve_op(target)
        return True
    except Exception:
        return False


def apply_matches(ep: ExportedProgram, matches: Sequence[Match], *,
                  drop_dead_constants: bool = True) -> list[Node]:
    """Apply every match in order; returns the new root nodes. Mutates ``ep``.

    ``drop_dead_constants=False`` leaves constants that became unused in place,
    for callers (graph-module passes) whose pass manager owns the signature.
    """
    graph = ep.graph_module.graph
    inputs = ProgramInputs(ep)
    order = {n: i for i, n in enumerate(graph.nodes)}
    replaced: dict[Node, Node] = {}
    folded: dict[Node, Node] = {}
    dead_candidates: list[Node] = []
    new_roots: list[Node] = []

    for m in matches:
        captures = {k: replaced.get(v, v) if isinstance(v, Node) else v
                    for k, v in m.captures.items()}
        for name, source in m.folds.items():
            if source not in folded:
                folded[source] = fold_to_constant(ep, source, inputs, order)
            captures[name] = folded[source]
            dead_candidates.append(source)
        rw = Rewriter(m.root, m.rule.name, ep)
        built = m.rule.replacement.build(rw, captures)
        olds = [m.root, *(m.captures[name] for name in output_names(m.rule.pattern))]
        news = list(built) if isinstance(built, (tuple, list)) else [built]
        if len(news) != len(olds) or news[0] is None:
            raise FusionError(f"rule {m.rule.name!r} at `{m.root.name}` returned {len(news)} "
                              f"node(s) for a match with {len(olds)} output(s)")
        for old, new in zip(olds, news, strict=True):
            if new is None:
                # an output the fused op subsumes (e.g. an in-place cache update whose
                # return value nothing reads): allowed only when nothing uses it
                if old.users:
                    raise FusionError(f"rule {m.rule.name!r} dropped output `{old.name}`, which "
                                      "is still used: add a constraint so such matches are "
                                      "declined")
                continue
            old_val = old.meta.get("val")
            if old_val is not None and not _same_signature(new.meta.get("val"), old_val):
                nv = new.meta.get("val")
                raise FusionError(
                    f"rule {m.rule.name!r} at `{old.name}` built `{new.name}` with "
                    f"{getattr(nv, 'dtype', type(nv))}{tuple(getattr(nv, 'shape', ()))}, but the "
                    f"output is {getattr(old_val, 'dtype', '')}"
                    f"{tuple(getattr(old_val, 'shape', ()))}: "
                    "add a constraint so such matches are declined"
                )
            old.replace_all_uses_with(new)
            replaced[old] = new
        new_roots.append(news[0])
        for v in m.captures.values():
            if isinstance(v, Node):
                dead_candidates.append(v)
        # claimed nodes: erase consumers before producers
        pending = list(m.claimed)
        while pending:
            progress = False
            for n in list(pending):
                _erase_assertions_on(n)
                if not n.users:
                    ins = list(n.all_input_nodes)
                    graph.erase_node(n)
                    pending.remove(n)
                    dead_candidates.extend(ins)
                    progress = True
            if not progress:
                raise FusionError(
                    f"rule {m.rule.name!r} at `{m.root.name}`: claimed nodes "
                    f"{[n.name for n in pending]} are still used after the replacement"
                )
    _erase_dead(ep, dead_candidates, drop_dead_constants)
    _rename_outputs(ep, {old.name: new.name for old, new in replaced.items()})
    graph.lint()
    ep.graph_module.recompile()
    return new_roots
