"""An undo log for one rewrite of an ExportedProgram: apply is all-or-nothing.

Copying a program before rewriting it costs time in proportion to the whole
graph; a rewrite touches a few nodes per match. So every change the engine
makes goes through :class:`Journal`, which records how to undo it — a node
created or erased (seen through the graph module's node hooks, whoever makes
the change), a node's arguments changed (through :meth:`Journal.set_args` and
:meth:`Journal.replace_all_uses`), a ``meta`` entry of a node edited in place
(:meth:`Journal.set_meta`), a node moved (:meth:`Journal.move_before`) — and snapshots the few
program-level containers (graph signature, state dict, constants) by
reference when it opens. :meth:`Journal.rollback` undoes entries newest first,
so each undo sees the graph exactly as it was right after the change it
reverses; a savepoint lets one failed match be undone while earlier ones stay.
Rolling back leaves the same node objects, in the same order, with the same
arguments, names and ``meta`` as before.
"""

from __future__ import annotations

from typing import Any

from torch.export import ExportedProgram
from torch.fx import Graph, Node

from fusionkit.edit import signature

__all__ = ["Journal"]

_CREATE, _ARGS, _ERASE, _PROGRAM, _META, _MOVE = 0, 1, 2, 3, 4, 5


class Journal:
    """Records the changes made to ``ep`` so that they can be undone."""

    def __init__(self, ep: ExportedProgram) -> None:
        """Opens the journal: from here until :meth:`close`, every node created in or
        erased from the graph (by the engine, a replacement, a helper) is recorded."""
        self.ep = ep
        self.graph: Graph = ep.graph_module.graph
        self._log: list[tuple[Any, ...]] = []
        self._recording = True
        #: placeholders come and go with signature and state entries: snapshot those
        #: before each one (off while the engine takes one snapshot for a batch)
        self.snapshot_on_placeholders = True
        self._gm = ep.graph_module
        self._opening = self._program_state()
        ns = self.graph._graph_namespace
        self._base_count = dict(ns._base_count)
        self._gm._register_create_node_hook(self._on_create)
        self._gm._register_erase_node_hook(self._on_erase)
        self._gm._register_replace_node_hook(self._on_replace)

    def close(self) -> None:
        """Stop recording (the log is kept: :meth:`rollback` still works)."""
        self._gm._unregister_create_node_hook(self._on_create)
        self._gm._unregister_erase_node_hook(self._on_erase)
        self._gm._unregister_replace_node_hook(self._on_replace)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_create(self, node: Node) -> None:
        if self._recording:
            if node.op == "placeholder" and self.snapshot_on_placeholders:
                self.snapshot_program()
            self._log.append((_CREATE, node))

    def _on_erase(self, node: Node) -> None:
        if self._recording:
            if node.op == "placeholder" and self.snapshot_on_placeholders:
                self.snapshot_program()
            self._log.append((_ERASE, node, node._next, node.args, node.kwargs))

    def _on_replace(self, old: Node, new: str, user: Node) -> None:
        # called before ``user`` stops reading ``old`` (also when ``old`` is renamed,
        # where recording the unchanged arguments is harmless)
        if self._recording:
            self._log.append((_ARGS, user, user.args, user.kwargs))

    def _program_state(self) -> tuple[Any, ...]:
        # by reference: lists and dicts are copied, specs and tensors never are
        ep = self.ep
        sig = ep.graph_signature
        return (_PROGRAM, None, ep.graph_module, sig, list(sig.input_specs),
                list(sig.output_specs), dict(ep.state_dict), dict(ep.constants))

    def snapshot_program(self) -> None:
        """Record the graph signature, state dict and constants as they are now."""
        self._log.append(self._program_state())

    # ------------------------------------------------------------------ recording

    def savepoint(self) -> int:
        """A position to :meth:`rollback` to."""
        return len(self._log)

    def set_args(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._log.append((_ARGS, node, node.args, node.kwargs))
        node.args = args
        node.kwargs = kwargs

    def set_meta(self, node: Node, key: str, value: Any) -> None:
        """``node.meta[key] = value``, undone by a rollback (a node edited in place)."""
        self._log.append((_META, node, key, key in node.meta, node.meta.get(key)))
        node.meta[key] = value

    def move_before(self, node: Node, anchor: Node) -> None:
        """``anchor.prepend(node)``, undone by a rollback (FX has no hook for a move)."""
        self._log.append((_MOVE, node, node._next))
        anchor.prepend(node)

    def replace_all_uses(self, old: Node, new: Node) -> None:
        """``old.replace_all_uses_with(new)``; the replace hook records each user's arguments."""
        old.replace_all_uses_with(new)

    def changed(self, savepoint: int = 0) -> tuple[list[Node], list[Node]]:
        """The nodes created, and the nodes whose arguments changed, since ``savepoint``.

        Both lists hold live nodes only, each once, oldest change first: the region
        a rewrite can have made inconsistent (:func:`fusionkit.apply.rewrite.lint`).
        """
        created: dict[Node, None] = {}
        rewired: dict[Node, None] = {}
        for entry in self._log[savepoint:]:
            kind, node = entry[0], entry[1]
            if kind == _CREATE:
                created[node] = None
            elif kind == _ARGS:
                rewired[node] = None
        return ([n for n in created if not n._erased],
                [n for n in rewired if not n._erased and n not in created])

    # ------------------------------------------------------------------ undoing

    def rollback(self, savepoint: int = 0) -> None:
        """Undo every change recorded after ``savepoint`` (all of them by default).

        The graph signature, state dict and constants come back as they were at
        the savepoint (snapshots are taken around every placeholder change).
        """
        self._recording = False
        try:
            self._undo(savepoint)
        finally:
            self._recording = True
        if savepoint == 0:
            self._restore_program(self._opening)
            ns = self.graph._graph_namespace
            ns._base_count.clear()
            ns._base_count.update(self._base_count)

    def _undo(self, savepoint: int) -> None:
        log, graph = self._log, self.graph
        ns = graph._graph_namespace
        while len(log) > savepoint:
            entry = log.pop()
            kind, node = entry[0], entry[1]
            if kind == _ARGS:
                node.args = entry[2]
                node.kwargs = entry[3]
            elif kind == _CREATE:
                if not node._erased:
                    # newer entries are undone: nothing recorded uses it any more
                    graph.erase_node(node)
                name = ns._obj_to_name.pop(node, None)
                if name is not None:
                    ns._used_names.discard(name)
            elif kind == _PROGRAM:
                self._restore_program(entry)
            elif kind == _MOVE:
                entry[2].prepend(node)  # back before the node that followed it
            elif kind == _META:
                key, had, value = entry[2], entry[3], entry[4]
                if had:
                    node.meta[key] = value
                else:
                    node.meta.pop(key, None)
            elif node._erased:  # _ERASE: put the same node object back where it stood
                nxt, args, kwargs = entry[2], entry[3], entry[4]
                node._remove_from_list()  # its neighbours are adjacent again: a no-op
                nxt._prepend(node)
                node._erased = False
                graph._len += 1
                graph._find_nodes_lookup_table.insert(node)
                node.args = args
                node.kwargs = kwargs

    def _restore_program(self, state: tuple[Any, ...]) -> None:
        _, _, gm, sig, input_specs, output_specs, state_dict, constants = state
        ep = self.ep
        signature.reattach(ep, gm, sig)
        signature.set_specs(ep, input_specs, output_specs)
        for current, saved in ((ep.state_dict, state_dict), (ep.constants, constants)):
            if current.keys() != saved.keys() or any(current[k] is not v for k, v in saved.items()):
                current.clear()
                current.update(saved)
