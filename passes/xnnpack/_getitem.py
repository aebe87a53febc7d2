"""Rerouting the ``getitem(., 0)`` readers of a tuple-returning op the rules replace.

Patterns name operator overloads, not ``getitem``: a rule rewriting an op that returns a
tuple (batch norm, ``max.dim``, a max pool with indices) is rooted at the op itself, and
its replacement makes the getitems read the new value and go. Where one was a program
output, the output signature then names the new node.
"""

from __future__ import annotations

from torch.export.graph_signature import ExportGraphSignature, OutputSpec, TensorArgument
from torch.fx import Node

from fusionkit import Rewriter


def read_through_getitems(rw: Rewriter, new: Node) -> Node:
    """The root's getitem users read ``new`` and are erased; returns the root, which nothing
    reads now (it is erased with the match). In a probe the root is a stand-in nothing reads."""
    renamed = {}
    for item in list(rw.root.users):
        item.replace_all_uses_with(new)
        renamed[item.name] = new.name
        rw.graph.erase_node(item)
    ep = rw.ep
    if renamed and ep is not None and rw.graph is ep.graph_module.graph:
        sig = ep.graph_signature
        if any(getattr(s.arg, "name", None) in renamed for s in sig.output_specs):
            outs = [OutputSpec(s.kind, TensorArgument(renamed[s.arg.name]), s.target)
                    if getattr(s.arg, "name", None) in renamed else s
                    for s in sig.output_specs]
            ep._graph_signature = ExportGraphSignature(sig.input_specs, outs)
    return rw.root


__all__ = ["read_through_getitems"]
