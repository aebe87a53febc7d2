"""Rerouting the ``getitem(., 0)`` readers of a tuple-returning op the rules replace.

Patterns name operator overloads, not ``getitem``: a rule rewriting an op that returns a
tuple (batch norm, ``max.dim``, a max pool with indices) is rooted at the op itself, and
its replacement makes the getitems read the new value and go. Where one was a program
output, the output signature then names the new node.
"""

from __future__ import annotations

from torch.fx import Node

from fusionkit import Rewriter


def read_through_getitems(rw: Rewriter, new: Node) -> Node:
    """The root's getitem users read ``new`` (a program output's spec names it) and are
    erased; returns the root, which nothing reads now (it is erased with the match)."""
    for item in list(rw.root.users):
        rw.reroute(item, new)
        rw.erase(item)
    return rw.root


__all__ = ["read_through_getitems"]
