"""Build a match's replacement in a scratch graph, to examine the fused nodes before they exist.

A check that must judge the *fused* ops (will the runtime have a kernel for
them? will the partitioner take them? does the replacement even build?) needs
those ops with their exact arguments. Restating them beside the replacement
would be a second source of truth that can drift; :func:`build_in_scratch` runs
the rule's own replacement instead, through a :class:`ProbeRewriter`: the same
code, the same values and fake-tensor results, written into a throwaway graph.
The program, its graph and its state dict are never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx import Graph, Node

from fusionkit.check.folding import evaluate_constant
from fusionkit.edit.builder import Computed, Rewriter
from fusionkit.targets import dialect_like, op_key

if TYPE_CHECKING:
    from fusionkit.check.constraints import CheckContext

__all__ = ["ProbeRewriter", "build_in_scratch", "schema_arguments"]


def _fake_mode(node: Node) -> FakeTensorMode:
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    found = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    return found if found is not None else FakeTensorMode(allow_non_fake_inputs=True)


class ProbeRewriter(Rewriter):
    """A :class:`~fusionkit.Rewriter` whose nodes go into a scratch graph.

    A program node handed to an op is stood in for by a placeholder carrying a
    copy of that node's metadata (``val``, module stack, ...); a new constant is
    a placeholder whose ``val`` is the fake tensor of the computed value (which
    :meth:`tensor` returns); a fold the match planned reads the value the fold
    will produce.
    """

    def __init__(self, ctx: CheckContext, rule_name: str) -> None:
        scratch = Graph()
        target: Any = ctx.root.target
        anchor = scratch.call_function(target, ())  # where new nodes are inserted
        anchor.meta = dict(ctx.root.meta)
        super().__init__(anchor, rule_name, ctx.ep, like=dialect_like(ctx.root))
        self._ctx = ctx
        self._fake = _fake_mode(ctx.root)
        self._probe_standins: dict[Node, Node] = {}
        self._probe_values: dict[Node, torch.Tensor | Computed] = {}
        self._probe_constants: dict[str, Node] = {}

    def captures(self) -> dict[str, Any]:
        """The captures as the replacement will see them (planned folds as constants)."""
        out = dict(self._ctx.captures)
        order: dict[Node, int] | None = None
        for name, source in self._ctx.folds.items():
            if order is None:
                order = {n: i for i, n in enumerate(source.graph.nodes)}
            out[name] = self.constant(f"fk_folded_{source.name}",
                                      evaluate_constant(source, self._ctx.inputs, order))
        return out

    def _standin(self, a: Any) -> Any:
        if isinstance(a, Node):
            if a.graph is self.graph:
                return a
            if a not in self._probe_standins:
                p = self.graph.placeholder(a.name)
                p.meta = dict(a.meta)
                self._probe_standins[a] = p
            return self._probe_standins[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._standin(x) for x in a)
        return a

    def tensor(self, node: Node) -> torch.Tensor:
        if node in self._probe_values:
            value = self._probe_values[node]
            if isinstance(value, Computed):  # read back by the build: computed now, once
                value = self._probe_values[node] = value.value(self.rule_name).detach()
            return value
        return super().tensor(node)

    def constant(self, name: str, value: torch.Tensor | Computed) -> Node:
        if name not in self._probe_constants:
            p = self.graph.placeholder(name)
            if isinstance(value, Computed):  # its shape and dtype: not computed here
                with self._fake:
                    p.meta["val"] = torch.empty(value.shape, dtype=value.dtype)
            else:
                value = value.detach()
                p.meta["val"] = self._fake.from_tensor(value, static_shapes=True)
            self._probe_values[p] = value
            self._probe_constants[name] = p
        return self._probe_constants[name]

    def call(self, target: Any, *args: Any, **kwargs: Any) -> Node:
        return super().call(target, *self._standin(args),
                            **{k: self._standin(v) for k, v in kwargs.items()})

    # The graph-editing verbs: on scratch nodes, what the rewriter does; on the program's
    # nodes nothing (the probe never changes the program). An edited node stays what it
    # was, op and value: :meth:`edit` returns it (the checks judge what a rewrite
    # creates; the edited op was in the program already).

    def _scratch(self, *nodes: Node) -> bool:
        return all(n.graph is self.graph for n in nodes)

    def insert_at(self, node: Node) -> None:
        if self._scratch(node):
            super().insert_at(node)

    def edit(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
             ) -> Node:
        if self._scratch(node):
            return super().edit(node, args, kwargs)
        return node  # the program's node stands for itself, as the edit leaves it

    def set_args(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
                 ) -> None:
        if self._scratch(node):
            super().set_args(node, args, kwargs)

    def set_meta(self, node: Node, key: str, value: Any) -> None:
        if self._scratch(node):
            node.meta[key] = value

    def _names_taken(self) -> set[Any]:
        return super()._names_taken() | set(self._probe_constants)

    def move_before(self, placeholder: Node, anchor: Node) -> None:
        if self._scratch(placeholder, anchor) and placeholder is not anchor:
            anchor.prepend(placeholder)

    def reroute(self, old: Node, new: Node) -> None:
        if self._scratch(old, new):
            old.replace_all_uses_with(new)

    def erase(self, node: Node) -> None:
        if self._scratch(node):
            self.graph.erase_node(node)

    def ops(self) -> Iterator[Node]:
        """The op calls the replacement created (not the getitems)."""
        return (n for n in self.created if n.op == "call_function" and op_key(n.target))


class Buildable(Protocol):
    """What the probe runs: a rule's replacement (``fusionkit.rule.Replacement``), named
    structurally so graph editing does not import the rule layer above it."""

    def build(self, rw: Any, captures: Any) -> Any: ...


def build_in_scratch(replacement: Buildable, ctx: CheckContext, rule_name: str = ""
                     ) -> tuple[ProbeRewriter, Any]:
    """Run ``replacement`` for the match in ``ctx`` into a scratch graph.

    Returns the rewriter (its nodes are in ``.created``) and what the
    replacement returned. Raises whatever the replacement raises.
    """
    rw = ProbeRewriter(ctx, rule_name)
    built = replacement.build(rw, rw.captures())
    return rw, built


def schema_arguments(node: Node) -> dict[str, Any]:
    """The node's arguments by schema name, each node replaced by its ``meta['val']``."""
    # an EdgeOpOverload and a torch OpOverload carry their schema (the latter's ``_op`` is
    # the bare C++ callable, which has none); other edge targets wrap an op in ``_op``
    target: Any = node.target
    schema = getattr(target, "_schema", None) or getattr(getattr(target, "_op", None),
                                                         "_schema", None)
    if schema is None:
        return {}

    def val(a: Any) -> Any:
        if isinstance(a, Node):
            return a.meta.get("val")
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        return a

    out: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = val(node.args[i])
        elif arg.name in node.kwargs:
            out[arg.name] = val(node.kwargs[arg.name])
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out
