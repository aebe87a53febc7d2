"""A rebuilt node keeps the metadata of the node a stock pass would have kept in place.

Why: a stock rewrite pass that edits a node in place (a folded batch norm's conv, a
merged view chain's first view) leaves that node's metadata -- debug handle, stack
trace, module stack -- where it was, and the Vulkan serializer's debug-handle map reads
it. A rule rebuilds the node, stamped by default with the match root's metadata; this
gives it the original node's instead, so the map is the stock pass's.
"""

from __future__ import annotations

from torch.fx import Node

__all__ = ["keep_provenance"]

#: what the new node keeps of its own: its value, and which rule made it
_OWN = frozenset({"val", "tensor_meta", "fusionkit_rule"})


def keep_provenance(new: Node, old: Node) -> None:
    """``new`` takes ``old``'s metadata, except its own value and rule stamp."""
    if new.graph is not old.graph:
        return  # a probe builds into a scratch graph
    for key, value in old.meta.items():
        if key not in _OWN:
            new.meta[key] = value
