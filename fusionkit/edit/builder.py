"""The replacement author's API: :class:`Rewriter` builds the nodes that replace a match.

A rule's replacement receives a :class:`Rewriter` positioned at the match (the
insertion point the finder chose, ``Match.insert_before``); every node it creates gets ``meta['val']`` by fake-tensor propagation and the
replaced root's provenance (stack trace, module stack, debug handle), so the
rewritten program reads like one ``torch.export`` produced. What ExecuTorch's devtools
read is kept as they read it (:func:`replaced_debug_handles`): ``debug_handle`` stays
the root's integer (the node whose value the new one computes; ExecuTorch's delegation,
serializer and ETRecord take only an int there), ``from_node`` names every replaced
node with the root last (torch's convention; ExecuTorch follows the last entry), and
``fusionkit_debug_handles`` lists the handles of all the replaced nodes, root last, for
:mod:`fusionkit.integration.devtools` to put in an ETRecord's debug-handle map. :class:`FusionError`
is what a replacement raises when it was handed something a constraint should
have declined (a rule bug, never a user's model at fault).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch._guards import TracingContext, detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, OutputSpec, TensorArgument
from torch.fx import Node

from fusionkit.edit import meta_cache, signature
from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import (
    OpTarget,
    dialect_like,
    dialect_target,
    is_edge_target,
    memo_per_target,
    resolve_op,
)

__all__ = ["DEBUG_HANDLES_KEY", "PROVENANCE_KEYS", "FusionError", "ProgramConstants",
           "Rewriter", "meta_value", "replaced_debug_handles"]

PROVENANCE_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn",
                    "debug_handle", "custom")

#: ``node.meta`` key: the debug handles of every node a fused node replaced (a tuple,
#: graph order, the root's last); ``meta['debug_handle']`` stays the root's int
DEBUG_HANDLES_KEY = "fusionkit_debug_handles"


def _handles_of(node: Node) -> tuple[int, ...]:
    """The original handles ``node`` stands for: its own, or those of what it fused."""
    fused = node.meta.get(DEBUG_HANDLES_KEY)
    if fused:
        return tuple(fused)
    h = node.meta.get("debug_handle")
    return (h,) if isinstance(h, int) and not isinstance(h, bool) and h > 0 else ()


def replaced_debug_handles(replaced: Any, root: Node) -> tuple[int, ...]:
    """The debug handles of the nodes a replacement stands for, in graph order with the
    root's last (the Inspector compares a runtime value with the AOT output of the last
    handle of its tuple); a node fused earlier contributes the handles it stood for."""
    out: dict[int, None] = {}
    for n in sorted(n for n in replaced if n is not root and n.graph is root.graph):
        out.update(dict.fromkeys(_handles_of(n)))
    last = _handles_of(root)
    for h in last:
        out.pop(h, None)
    out.update(dict.fromkeys(last))
    return tuple(out)


class FusionError(RuntimeError):
    """A rule produced something inconsistent with the node it replaces (a rule bug)."""


def meta_value(a: Any) -> Any:
    """``meta['val']`` of every node inside ``a`` (lists and tuples kept)."""
    if isinstance(a, Node):
        return a.meta["val"]
    if isinstance(a, (list, tuple)):
        return type(a)(meta_value(x) for x in a)
    return a


class ProgramConstants:
    """The program's constants during one apply: read them, add new ones.

    Built once per apply, so reading a weight or adding a repacked one costs
    O(1) instead of a scan of the graph and the signature per call (a pass that
    repacks one weight per fusion would otherwise be quadratic in the number of
    placeholders). New constants are lifted-constant placeholders placed before
    the first user input, with their signature entry at the same position.
    :meth:`reset` after a rollback: what was learnt may describe undone changes.
    """

    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        self.reset()

    def reset(self) -> None:
        """Forget the indexes (the signature or placeholders changed behind our back)."""
        self._inputs: ProgramInputs | None = None
        self._by_name: dict[str, Node] | None = None
        #: (the signature's input-spec list, the placeholders in order, index of the
        #: first user input, the fake mode of their values): learnt at the first add
        self._layout: tuple[list[InputSpec], list[Node], int, Any] | None = None

    @property
    def inputs(self) -> ProgramInputs:
        if self._inputs is None:
            self._inputs = ProgramInputs(self.ep)
        return self._inputs

    def tensor(self, node: Node) -> torch.Tensor | None:
        ref = self.inputs.constant(node)
        return None if ref is None else ref.tensor

    def _learn_layout(self, specs: list[InputSpec]) -> tuple[list[InputSpec], list[Node], int, Any]:
        placeholders = self.ep.graph_module.graph.find_nodes(op="placeholder")
        if len(specs) != len(placeholders):
            raise FusionError("the graph signature does not list every placeholder")
        at = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
        fake_mode = detect_fake_mode([p.meta.get("val") for p in placeholders])
        self._layout = (specs, placeholders, at, fake_mode)
        return self._layout

    def existing(self, name: str) -> Node | None:
        """The lifted constant an earlier :meth:`add` made for ``name``, else None."""
        if self._by_name is None:
            self._by_name = {}
            for n in self.ep.graph_module.graph.find_nodes(op="placeholder"):
                if "requested_name" in n.meta:
                    self._by_name.setdefault(n.meta["requested_name"], n)
        found = self._by_name.get(name)
        if found is None or found._erased:
            return None
        if self.inputs.constant(found) is None:
            raise FusionError(f"`{name}` already names a placeholder that is not a constant")
        return found

    def add(self, name: str, value: torch.Tensor) -> Node:
        """A lifted constant ``name`` holding ``value``; the same node for the same name."""
        existing = self.existing(name)
        if existing is not None:
            return existing
        graph = self.ep.graph_module.graph
        sig = self.ep.graph_signature
        # the list itself, as ExecuTorch's create_constant_placeholder does: a graph-module
        # pass (FusePatternsPass in VulkanBackend.preprocess) runs on a copy of the program
        # sharing this list, and ExecuTorch re-reads the signature from that copy
        specs = sig.input_specs
        layout = self._layout
        if (layout is None or layout[0] is not specs or len(specs) != len(layout[1])
                or len(specs) != _placeholder_count(graph) or not _anchored(layout)):
            layout = self._learn_layout(specs)
        _, placeholders, at, fake_mode = layout
        ctx = (graph.inserting_before(placeholders[at]) if at < len(placeholders) else
               graph.inserting_after(placeholders[-1]) if placeholders else graph.inserting_before())
        with ctx:
            node = graph.placeholder(name)
        node.target = node.name
        node.meta["requested_name"] = name
        node.meta["val"] = (meta_cache.fake_constant(value, fake_mode)
                            if fake_mode is not None else value)
        spec = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), node.name, None)
        signature.insert_input(self.ep, at, spec)
        placeholders.insert(at, node)
        self._layout = (specs, placeholders, at + 1, fake_mode)
        self.ep.constants[node.name] = value
        assert self._by_name is not None  # filled by existing()
        self._by_name[name] = node
        if self._inputs is not None:
            self._inputs.add_spec(spec)
        return node


def _anchored(layout: tuple[list[InputSpec], list[Node], int, Any]) -> bool:
    """The learnt insertion point still is the first user input, in graph and signature."""
    specs, placeholders, at, _ = layout
    if at == len(specs):
        return at == 0 or not placeholders[-1]._erased
    p = placeholders[at]
    return (not p._erased and specs[at].kind == InputKind.USER_INPUT
            and getattr(specs[at].arg, "name", None) == p.name)


def _spec_index(specs: list[InputSpec], placeholder: Node) -> int:
    """Where the signature lists ``placeholder`` (every placeholder has its input spec)."""
    for i, s in enumerate(specs):
        if getattr(s.arg, "name", None) == placeholder.name:
            return i
    raise FusionError(f"the graph signature does not list placeholder `{placeholder.name}`")


def _placeholder_count(graph: torch.fx.Graph) -> int:
    """How many placeholders ``graph`` has, from FX's own index (no list of them built)."""
    try:
        return len(graph._find_nodes_lookup_table.table[("placeholder", None)])
    except Exception:  # pragma: no cover - a torch without this index
        return len(graph.find_nodes(op="placeholder"))


def _fake_mode(vals: list[Any], root: Node) -> Any:
    """The fake mode of the arguments (the first fake tensor's; ``detect_fake_mode``
    checks every one against the others, which costs more than the memoised
    propagation it serves), else the root's."""

    tracing = TracingContext.try_get()
    if tracing is not None and tracing.fake_mode is not None:
        return tracing.fake_mode
    for v in vals:
        if isinstance(v, FakeTensor):
            return v.fake_mode
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    return mode if mode is not None else detect_fake_mode([root.meta.get("val")])


#: op -> the node name FX would derive from it (``Graph._target_to_str``); FX formats
#: an edge op's whole schema to get there, once per new node
_NODE_NAMES: dict[Any, str] = {}


def _node_name(graph: torch.fx.Graph, target: Any) -> str:
    return memo_per_target(_NODE_NAMES, target, graph._target_to_str)


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _symbolic(a: Any) -> bool:
    """Whether a raw SymInt/SymFloat/SymBool sits anywhere in an argument structure."""
    if isinstance(a, (list, tuple)):
        for x in a:
            if _symbolic(x):
                return True
        return False
    if isinstance(a, dict):
        return _symbolic(tuple(a.values()))
    return isinstance(a, _SYMBOLIC)


def _create_call(graph: torch.fx.Graph, op: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any], name: str) -> Node:
    """``graph.create_node("call_function", op, args, kwargs, name=name)``, cheaper.

    ``create_node`` walks the arguments with pytree (a third of its cost) only
    to warn about raw symbolic values; the node is created without arguments
    and given them at once by the ``Node._update_args_kwargs`` its constructor
    runs (assigning ``node.args`` would also re-index the node in the graph's
    lookup table). Arguments holding a symbolic value take the usual path
    (and its warning).
    """
    update = getattr(torch.fx.Node, "_update_args_kwargs", None)
    if update is None or _symbolic(args) or _symbolic(kwargs):
        return graph.create_node("call_function", op, args, kwargs, name=name)
    node = graph.create_node("call_function", op, name=name)
    update(node, args, kwargs)
    return node


#: op -> ``str(op)``, the provenance's target (an edge op formats its schema)
_TARGET_STRS: dict[Any, str] = {}

#: (op or name, edge program?) -> (the op as a node target, its ATen overload)
_DIALECT: dict[tuple[Any, bool], tuple[Any, Any]] = {}


def _dialect(target: OpTarget, like: Any) -> tuple[Any, Any]:
    """:func:`dialect_target` and :func:`resolve_op` of ``target``, once per op and dialect."""
    key = (target, is_edge_target(like))
    try:
        return _DIALECT[key]
    except KeyError:
        op = dialect_target(target, like=like)
        value = _DIALECT[key] = (op, resolve_op(op))
        return value
    except TypeError:  # an unhashable target
        op = dialect_target(target, like=like)
        return op, resolve_op(op)


@dataclasses.dataclass(frozen=True)
class Computed:
    """A new constant's value, computed only when a program gets it.

    The probe builds a replacement to check what it creates, not to apply it: it needs the
    constant's shape and dtype alone. A build that derives a constant from big weights
    (a repacked 4-bit weight, per-group sums) passes one of these to
    :meth:`Rewriter.constant`, so the probe does not compute it over every weight."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    compute: Callable[[], torch.Tensor]

    def value(self, rule_name: str = "") -> torch.Tensor:
        v = self.compute()
        if tuple(v.shape) != tuple(self.shape) or v.dtype != self.dtype:
            raise FusionError(f"rule {rule_name!r}: a computed constant is {tuple(v.shape)} "
                              f"{v.dtype}, announced {tuple(self.shape)} {self.dtype}")
        return v


class Rewriter:
    """Creates replacement nodes before the match's insertion point, with full metadata."""

    def __init__(self, root: Node, rule_name: str, ep: ExportedProgram | None = None, *,
                 insert_before: Node | None = None,
                 constants: ProgramConstants | None = None, journal: Any = None,
                 like: Any = None, replaced: Any = ()) -> None:
        self.root = root
        #: the nodes the replacement stands for (the match's claimed nodes; the root alone
        #: when not given): their provenance and debug handles go to every new node
        self.replaced: tuple[Node, ...] = tuple(replaced) or (root,)
        #: the op whose dialect new nodes take (:func:`~fusionkit.targets.dialect_like`)
        self._like = like if like is not None else dialect_like(root)
        self.graph = root.graph
        self.rule_name = rule_name
        self.ep = ep
        #: every node goes before this one (chosen by the finder, never while rewriting)
        self.insert_before = insert_before if insert_before is not None else root
        self._constants = constants if constants is not None or ep is None else ProgramConstants(ep)
        self.created: list[Node] = []
        #: nodes the replacement stopped reading outside the match (see :meth:`release`)
        self.released: list[Node] = []
        self._journal = journal
        self._node_sources: list[Any] | None = None
        self._debug_handles: tuple[int, ...] | None = None

    def set_meta(self, node: Node, key: str, value: Any) -> None:
        """``node.meta[key] = value`` for a node the replacement edits in place (one it
        returns), undone with the rest of the match if applying fails."""
        if self._journal is not None:
            self._journal.set_meta(node, key, value)
        else:
            node.meta[key] = value

    def set_args(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
                 ) -> None:
        """``node.args = args`` (and its kwargs) for a node the replacement edits in place
        (one it returns): an argument it did not have yet (a convolution's absent bias),
        undone with the rest of the match if applying fails."""
        kw = dict(node.kwargs) if kwargs is None else kwargs
        if self._journal is not None:
            self._journal.set_args(node, args, kw)
        else:
            node.args = args
            node.kwargs = kw

    def release(self, node: Node) -> None:
        """``node`` (outside the match) may be dead once the replacement is in place: the
        engine erases it then, and its inputs that die with it (constants included)."""
        self.released.append(node)

    # ------------------------------------------------------------ graph-editing verbs
    # A replacement changes the program beyond the nodes it creates only through these:
    # each is undone with the match if applying fails, and the probe
    # (:class:`~fusionkit.edit.probe.ProbeRewriter`) gives each its scratch-graph
    # equivalent or a no-op, so a replacement never asks which graph it builds into.

    def insert_at(self, node: Node) -> None:
        """New nodes go right before ``node`` from here on: where a stock pass leaves the op
        it rewrites (payloads list nodes in graph order), not where the finder put the match.
        ``node`` must come after every node the replacement reads (the engine checks)."""
        self.insert_before = node

    def edit(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
             ) -> Node:
        """``node`` reading ``args`` (and ``kwargs``; None: its own), edited in place and
        returned: a stock pass that edits an op in place leaves its name, place and
        metadata, and later passes name their nodes after it (the engine keeps a node of
        the match that the replacement returns)."""
        self.set_args(node, args, kwargs)
        return node

    def fresh_constant(self, name: str, value: torch.Tensor | Computed) -> Node:
        """A new lifted constant holding ``value``, named ``name``, or ``name_1``, ... when a
        placeholder has that name: never one found by name (as :meth:`constant` finds one),
        so two folds of one shared weight never share a result."""
        taken = self._names_taken()
        unique, i = name, 0
        while unique in taken:
            i += 1
            unique = f"{name}_{i}"
        return self.constant(unique, value)

    def _names_taken(self) -> set[Any]:
        taken: set[Any] = set()
        for p in self.placeholders():
            taken.add(p.name)
            taken.add(p.meta.get("requested_name"))
        return taken

    def placeholders(self) -> list[Node]:
        """The program's placeholders in order (to read: an anchor for :meth:`move_before`)."""
        graph = self.ep.graph_module.graph if self.ep is not None else self.graph
        return list(graph.find_nodes(op="placeholder"))

    def move_before(self, placeholder: Node, anchor: Node) -> None:
        """Placeholder ``placeholder`` right before placeholder ``anchor``, in the graph and
        the signature together: where a stock pass creates a folded constant (beside its
        source weight; the Vulkan serializer numbers values in placeholder order, so the
        payload stays the stock pass's)."""
        ep = self._program("moving a placeholder")
        specs = list(ep.graph_signature.input_specs)
        i, j = _spec_index(specs, placeholder), _spec_index(specs, anchor)
        if placeholder is anchor or (placeholder._next is anchor and i == j - 1):
            return
        if self._journal is not None:
            self._journal.snapshot_program()
        spec = specs.pop(i)
        specs.insert(j - 1 if i < j else j, spec)
        signature.set_specs(ep, specs)
        if self._journal is not None:
            self._journal.move_before(placeholder, anchor)
        else:
            anchor.prepend(placeholder)

    def reroute(self, old: Node, new: Node) -> None:
        """Every reader of ``old`` reads ``new``; where ``old`` is a program output, its
        output spec names ``new`` (ExecuTorch finds an output's value by that name). For
        nodes outside the match that the replacement makes redundant (the getitems of a
        tuple it replaces, a requantize); the engine reroutes the match's own outputs."""
        if self._journal is not None:
            self._journal.replace_all_uses(old, new)
        else:
            old.replace_all_uses_with(new)
        if self.ep is None:
            return
        outs = self.ep.graph_signature.output_specs
        if not any(isinstance(s.arg, TensorArgument) and s.arg.name == old.name for s in outs):
            return
        if self._journal is not None:
            self._journal.snapshot_program()
        signature.set_specs(self.ep, outputs=[
            OutputSpec(s.kind, TensorArgument(new.name), s.target)
            if isinstance(s.arg, TensorArgument) and s.arg.name == old.name else s
            for s in outs])

    def erase(self, node: Node) -> None:
        """Erase ``node``, which nothing reads now (:meth:`reroute` its readers first). A
        constant placeholder goes with its signature entry, and its tensor when no other
        entry names it: a weight the replacement repacked, which the stock pass leaves no
        trace of. For nodes outside the match; the engine erases the match's own, and
        :meth:`release` leaves one that may still be read to the engine."""
        if node.op != "placeholder":
            node.graph.erase_node(node)
            return
        ep = self._program("erasing a placeholder")
        specs = list(ep.graph_signature.input_specs)
        spec = specs.pop(_spec_index(specs, node))
        if spec.kind == InputKind.USER_INPUT:
            raise FusionError(f"rule {self.rule_name!r}: `{node.name}` is a user input: the "
                              "program's callers pass it")
        node.graph.erase_node(node)  # (the journal snapshots the program first)
        signature.set_specs(ep, specs)
        target = spec.target
        if target is not None and not any(s.target == target for s in specs):
            ep.state_dict.pop(target, None)
            ep.constants.pop(target, None)

    def _program(self, doing: str) -> ExportedProgram:
        if self.ep is None:
            raise FusionError(f"rule {self.rule_name!r}: {doing} needs the program")
        return self.ep

    def tensor(self, node: Node) -> torch.Tensor:
        """The real value of a constant placeholder (parameter, buffer, lifted constant)."""
        if self._constants is None:
            raise FusionError(f"rule {self.rule_name!r}: reading `{node.name}` needs the program")
        t = self._constants.tensor(node)
        if t is None:
            raise FusionError(f"rule {self.rule_name!r}: `{node.name}` is not a constant; "
                              "a constraint should have declined this match")
        return t.detach()

    def constant(self, name: str, value: torch.Tensor | Computed) -> Node:
        """A new lifted-constant placeholder holding ``value`` (e.g. a repacked weight).

        ``name`` identifies the content: asking twice for the same name (two
        matches sharing one source weight) returns the same placeholder, so a
        name must be derived from the source constant and the transformation.
        """
        if self._constants is None:
            raise FusionError(f"rule {self.rule_name!r}: a new constant needs the program")
        if isinstance(value, Computed):  # a fresh tensor of its own: no copy needed
            # computed only when no earlier match made it (two matches sharing one weight)
            made = self._constants.existing(name)
            if made is not None:
                return made
            return self._constants.add(name, value.value(self.rule_name).detach().contiguous())
        return self._constants.add(name, value.detach().contiguous().clone())

    def _sources(self) -> list[Any]:
        """The replaced nodes as ``from_node`` provenance (graph order, the root last), made
        once per match.

        Torch's ``GraphTransformObserver`` appends one ``NodeSource`` per replaced node
        the same way; ExecuTorch's ancestry (``DebugHandleGeneratorPass``, the Inspector's
        handle propagation) follows the last entry, the root, whose ``debug_handle`` the
        new nodes carry. ``NodeSource(node)`` deep-copies the node's whole provenance
        chain for every new node; the replaced nodes are erased, so their chains are
        shared instead.
        """
        if self._node_sources is None:
            try:
                from torch.fx.traceback import NodeSource, NodeSourceAction
            except ImportError:  # pragma: no cover - older torch
                self._node_sources = []
                return self._node_sources
            root = self.root
            others = sorted(n for n in self.replaced if n is not root and n.graph is root.graph)
            sources = []
            for n in (*others, root):
                src = NodeSource(None, f"fusionkit:{self.rule_name}", NodeSourceAction.REPLACE)
                src.node_info = NodeSource.NodeInfo(
                    n.name, memo_per_target(_TARGET_STRS, n.target, str), id(n.graph))
                src.from_node = list(n.meta.get("from_node", ()))
                sources.append(src)
            self._node_sources = sources
        return self._node_sources

    def _stamp(self, node: Node) -> None:
        for key in PROVENANCE_KEYS:
            if key in self.root.meta:
                node.meta[key] = self.root.meta[key]
        if self._debug_handles is None:
            self._debug_handles = replaced_debug_handles(self.replaced, self.root)
        if self._debug_handles:
            node.meta[DEBUG_HANDLES_KEY] = self._debug_handles
        node.meta["fusionkit_rule"] = self.rule_name
        self.created.append(node)

    def getitem(self, node: Node, index: int) -> Node:
        """``node[index]`` for an op returning a tuple (``operator.getitem``, as FX writes it)."""
        with self.graph.inserting_after(node):
            item = self.graph.call_function(operator.getitem, (node, index))
        item.meta["val"] = node.meta["val"][index]
        self._stamp(item)
        return item

    def call(self, target: OpTarget, *args: Any, **kwargs: Any) -> Node:
        """Insert ``target(*args, **kwargs)`` at the insertion point and return its node."""
        op, overload = _dialect(target, self._like)
        meta_args, meta_kwargs = meta_value(tuple(args)), meta_value(dict(kwargs))
        val = propagate_meta(overload, args, kwargs, meta_args, meta_kwargs,
                             _fake_mode([*meta_args, *meta_kwargs.values()], self.root))
        with self.graph.inserting_before(self.insert_before):
            node = _create_call(self.graph, op, tuple(args), dict(kwargs),
                                _node_name(self.graph, op))
        node.meta["val"] = val
        sources = self._sources()
        if sources:
            node.meta["from_node"] = list(sources)
        self._stamp(node)
        return node


def propagate_meta(overload: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   meta_args: tuple[Any, ...], meta_kwargs: dict[str, Any], fake_mode: Any) -> Any:
    """A new node's ``meta['val']``: fake-tensor propagation, memoised (:mod:`.meta_cache`)."""
    return meta_cache.fake_output(overload, args, kwargs, meta_args, meta_kwargs, fake_mode)
