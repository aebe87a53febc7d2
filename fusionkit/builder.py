"""The replacement author's API: :class:`Rewriter` builds the nodes that replace a match.

A rule's replacement receives a :class:`Rewriter` positioned at the match; every
node it creates gets ``meta['val']`` by fake-tensor propagation and the
replaced root's provenance (stack trace, module stack, debug handle), so the
rewritten program reads like one ``torch.export`` produced. :class:`FusionError`
is what a replacement raises when it was handed something a constraint should
have declined (a rule bug, never a user's model at fault).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import OpTarget, dialect_target, resolve_op

__all__ = ["PROVENANCE_KEYS", "FusionError", "Rewriter", "meta_value"]

PROVENANCE_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn",
                    "debug_handle", "custom")


class FusionError(RuntimeError):
    """A rule produced something inconsistent with the node it replaces (a rule bug)."""


def meta_value(a: Any) -> Any:
    """``meta['val']`` of every node inside ``a`` (lists and tuples kept)."""
    if isinstance(a, Node):
        return a.meta["val"]
    if isinstance(a, (list, tuple)):
        return type(a)(meta_value(x) for x in a)
    return a


class Rewriter:
    """Creates replacement nodes at the root's position, with full metadata."""

    def __init__(self, root: Node, rule_name: str, ep: ExportedProgram | None = None) -> None:
        self.root = root
        self.graph = root.graph
        self.rule_name = rule_name
        self.ep = ep
        self.created: list[Node] = []

    def tensor(self, node: Node) -> torch.Tensor:
        """The real value of a constant placeholder (parameter, buffer, lifted constant)."""
        if self.ep is None:
            raise FusionError(f"rule {self.rule_name!r}: reading `{node.name}` needs the program")
        ref = ProgramInputs(self.ep).constant(node)
        if ref is None:
            raise FusionError(f"rule {self.rule_name!r}: `{node.name}` is not a constant; "
                              "a constraint should have declined this match")
        return ref.tensor.detach()

    def constant(self, name: str, value: torch.Tensor) -> Node:
        """A new lifted-constant placeholder holding ``value`` (e.g. a repacked weight).

        ``name`` identifies the content: asking twice for the same name (two
        matches sharing one source weight) returns the same placeholder, so a
        name must be derived from the source constant and the transformation.
        """
        if self.ep is None:
            raise FusionError(f"rule {self.rule_name!r}: a new constant needs the program")
        from fusionkit.folding import new_constant_placeholder

        return new_constant_placeholder(self.ep, name, value.detach().contiguous().clone())

    def getitem(self, node: Node, index: int) -> Node:
        """``node[index]`` for an op returning a tuple (``operator.getitem``, as FX writes it)."""
        with self.graph.inserting_after(node):
            item = self.graph.call_function(operator.getitem, (node, index))
        item.meta["val"] = node.meta["val"][index]
        for key in PROVENANCE_KEYS:
            if key in self.root.meta:
                item.meta[key] = self.root.meta[key]
        item.meta["fusionkit_rule"] = self.rule_name
        self.created.append(item)
        return item

    def call(self, target: OpTarget, *args: Any, **kwargs: Any) -> Node:
        """Insert ``target(*args, **kwargs)`` before the root and return its node."""
        op = dialect_target(target, like=self.root.target)
        overload = resolve_op(op)
        vals = [meta_value(a) for a in (*args, *kwargs.values())]
        fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
        if fake_mode is None:
            fake_mode = detect_fake_mode([self.root.meta.get("val")])
        with self.graph.inserting_before(self.root):
            node = self.graph.call_function(op, tuple(args), dict(kwargs))
        if fake_mode is not None:
            with fake_mode:
                node.meta["val"] = overload(*meta_value(tuple(args)), **meta_value(dict(kwargs)))
        else:
            node.meta["val"] = overload(*meta_value(tuple(args)), **meta_value(dict(kwargs)))
        for key in PROVENANCE_KEYS:
            if key in self.root.meta:
                node.meta[key] = self.root.meta[key]
        try:
            from torch.fx.traceback import NodeSource, NodeSourceAction

            node.meta["from_node"] = [
                NodeSource(self.root, f"fusionkit:{self.rule_name}", NodeSourceAction.REPLACE)
            ]
        except ImportError:  # pragma: no cover - older torch
            pass
        node.meta["fusionkit_rule"] = self.rule_name
        self.created.append(node)
        return node
