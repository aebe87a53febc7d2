"""A rebuilt node keeps the metadata of the node a stock pass would have kept in place.

Why: a stock rewrite pass that edits a node in place (a folded batch norm's conv, a
merged view chain's first view, XNNPACK's ``linear_node.meta = node.meta``) leaves that
node's metadata -- debug handle, stack trace, module stack -- where it was, and only
that; both backends' serializers write the debug handle into the payload (Vulkan's
debug-handle map, XNNPACK's node debug handles). A rule rebuilds the node, stamped by
default with the match root's metadata; this gives it the original node's instead, so
the payload is the stock pass's. Shared by the Vulkan and the XNNPACK preprocess rules.
"""

from __future__ import annotations

from torch.fx import Node

__all__ = ["keep_provenance"]

#: what the new node keeps of its own: its value, and which rule made it
_OWN = frozenset({"val", "tensor_meta", "fusionkit_rule"})


def keep_provenance(new: Node, old: Node) -> None:
    """``new`` takes ``old``'s metadata (debug handle, stack trace, ...) but its own value.

    Keys the rewriter gave ``new`` from the match's root that ``old`` lacks go too: an op
    a stock pass created bare (no debug handle) stays without one when an activation is
    fused into it. In a probe (``new`` in a scratch graph) it does the same, so the probed
    node is the one the rewrite will make.
    """
    for key in [k for k in new.meta if k not in _OWN and k not in old.meta]:
        del new.meta[key]
    for key, value in old.meta.items():
        if key not in _OWN:
            new.meta[key] = value
