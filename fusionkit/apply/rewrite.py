"""The engine's apply step: accepted matches become replacements, all or nothing.

Every match reaching this module already passed all its constraints, and the
finder chose where its replacement goes (``Match.insert_before``). Per match:
fold the constants it planned to fold, build the replacement at that point
(new nodes get ``meta['val']`` from memoised fake-tensor propagation and the
root's provenance), check it in place (each new node after its inputs and
before its users, outputs of the same dtype and shape), reroute the outputs'
users and erase the claimed nodes (but one the replacement edited in place and
returned as an output, while it is read: it stays, with its name). Then, once for the whole pass: drop what
became dead (graph nodes and the constants nothing uses, in one batch), rename
program outputs, lint what changed, and mark the code for regeneration (:mod:`.lazy_code`).

Every change goes through a :class:`~fusionkit.edit.journal.Journal`. A match whose
replacement raises is undone alone and reported as failed; if a pass-wide step
raises, the whole program is restored — graph, signature, state dict,
constants, node ``meta`` — exactly as it was. In strict mode (the default for
direct calls) the exception is re-raised after the rollback.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputSpec, OutputSpec, TensorArgument
from torch.fx import Node

from fusionkit import events
from fusionkit.apply import gate
from fusionkit.check.folding import evaluate_constant
from fusionkit.edit import lazy_code, signature
from fusionkit.edit.builder import (
    DEBUG_HANDLES_KEY,
    FusionError,
    ProgramConstants,
    Rewriter,
    replaced_debug_handles,
)
from fusionkit.edit.journal import Journal
from fusionkit.find.executable import replacement_outputs
from fusionkit.find.finder import Match
from fusionkit.match.pattern import output_names
from fusionkit.match.shape_guards import guards_suppressed
from fusionkit.program_inputs import ConstantKind
from fusionkit.result import MatchResult
from fusionkit.strict import strict_mode
from fusionkit.targets import is_assertion, schema_of

__all__ = ["ApplyFailure", "ApplyResult", "apply_matches"]


@dataclass(frozen=True)
class ApplyFailure:
    """A match that could not be applied: ``during`` names the step, ``error`` the exception.

    ``during`` is ``"replacement"`` when the match's own replacement failed (it
    alone was undone), else the pass-wide step that failed (nothing was applied).
    """

    match: Match
    during: str
    error: BaseException

    def result(self) -> MatchResult:
        """This failure as the one result type: a decline with status ``error``."""
        m = self.match
        during = ("the replacement" if self.during == "replacement"
                  else f"applying the pass ({self.during})")
        return MatchResult.from_exception(m.rule.name, m.root, during, self.error)


@dataclass
class ApplyResult:
    """What :func:`apply_matches` did. ``applied`` and ``new_roots`` are parallel lists;
    ``held``: matches the match gate held back (:mod:`fusionkit.apply.gate`), not applied."""

    applied: list[Match] = field(default_factory=list)
    new_roots: list[Node] = field(default_factory=list)
    failed: list[ApplyFailure] = field(default_factory=list)
    held: list[Match] = field(default_factory=list)

    @property
    def modified(self) -> bool:
        return bool(self.applied)


def _erase_assertions_on(n: Node) -> None:
    """Drop run-time checks whose only subject is ``n`` once nothing else uses ``n``."""
    users = n.users  # stops at the first real user: a shared weight may have thousands
    if users and all(is_assertion(u) for u in users):
        for u in list(users):
            n.graph.erase_node(u)


class _Apply:
    """One call of :func:`apply_matches`: shared state and the steps, in order."""

    def __init__(self, ep: ExportedProgram, journal: Journal) -> None:
        self.ep = ep
        self.graph = ep.graph_module.graph
        self.journal = journal
        self.constants = ProgramConstants(ep)
        self.replaced: dict[Node, Node] = {}
        self.folded: dict[Node, Node] = {}
        self.dead_candidates: list[Node] = []
        self._order: dict[Node, int] | None = None

    def order(self) -> dict[Node, int]:
        if self._order is None:  # only folding needs positions of the original nodes
            self._order = {n: i for i, n in enumerate(self.graph.nodes)}
        return self._order

    # ------------------------------------------------------------- one match

    def fold(self, source: Node) -> Node:
        node = self.folded.get(source)
        if node is None:
            value = evaluate_constant(source, self.constants.inputs, self.order())
            node = self.constants.add(f"fk_folded_{source.name}", value)
            node.meta["fusionkit_folded_from"] = source.name
        return node

    def build(self, m: Match) -> Node:
        """Apply ``m``; returns its new root. Raises (the caller rolls the match back)."""
        captures = {k: self.replaced.get(v, v) if isinstance(v, Node) else v
                    for k, v in m.captures.items()}
        folded: dict[Node, Node] = {}
        for name, source in m.folds.items():
            folded[source] = captures[name] = self.fold(source)
        insert_before = getattr(m, "insert_before", None) or m.root
        rw = Rewriter(m.root, m.rule.name, self.ep, insert_before=insert_before,
                      constants=self.constants, journal=self.journal, replaced=m.claimed)
        built = m.rule.replacement.build(rw, captures)
        olds = [m.root, *(m.captures[name] for name in output_names(m.rule.pattern))]
        news = replacement_outputs(m.rule.name, m.root, olds, built)
        check_placement(m, rw.created)
        pairs: list[tuple[Node, Node]] = []
        for old, new in zip(olds, news, strict=True):
            if new is None:
                # an output the fused op subsumes (e.g. an in-place cache update whose
                # return value nothing reads): allowed only when nothing uses it
                if old.users:
                    raise FusionError(f"rule {m.rule.name!r} dropped output `{old.name}`, which "
                                      "is still used: add a constraint so such matches are "
                                      "declined")
                continue
            self.journal.replace_all_uses(old, new)
            pairs.append((old, new))
        check_users_follow(m, pairs)
        # a node of the match the replacement edited in place and returned (its inputs
        # changed through ``Node.replace_input_with``, which the journal records) stays
        # while anything reads it: a stock pass that edits an op in place keeps its name,
        # and later passes name their nodes after it
        kept = {new for _, new in pairs if new.users and new in m.claimed}
        if kept:
            # it now computes what the match did: it stands for all the nodes it replaced
            # (its ``debug_handle`` stays, as a stock pass editing in place leaves it)
            handles = replaced_debug_handles(m.claimed, m.root)
            for n in kept:
                if handles and n.meta.get(DEBUG_HANDLES_KEY) != handles:
                    self.journal.set_meta(n, DEBUG_HANDLES_KEY, handles)
        self.erase_claimed(m, kept)
        # success: publish what later matches and the pass-wide steps need
        self.folded.update(folded)
        self.dead_candidates.extend(folded)
        self.replaced.update(pairs)
        self.dead_candidates.extend(v for v in m.captures.values() if isinstance(v, Node))
        self.dead_candidates.extend(rw.released)
        return pairs[0][1]  # the new root (a node: replacement_outputs checked it)

    def erase_claimed(self, m: Match, kept: set[Node] | frozenset[Node] = frozenset()) -> None:
        """Erase the match's nodes but ``kept``, consumers before producers (one sweep,
        latest first)."""
        pending = sorted((n for n in m.claimed if n not in kept), reverse=True)
        while pending:
            left: list[Node] = []
            for n in pending:
                if n.users:
                    _erase_assertions_on(n)
                if n.users:
                    left.append(n)
                    continue
                self.dead_candidates.extend(n._input_nodes)
                self.graph.erase_node(n)
            if len(left) == len(pending):
                raise FusionError(
                    f"rule {m.rule.name!r} at `{m.root.name}`: claimed nodes "
                    f"{[n.name for n in pending]} are still used after the replacement")
            pending = left

    # ------------------------------------------------------------- pass-wide

    def erase_dead(self, drop_constants: bool) -> None:
        """Erase candidates (and, transitively, their inputs) that nothing uses, in one batch.

        Only pure call_function nodes and constant placeholders are removed; a
        constant's state-dict entry and signature spec go with its placeholder.
        """
        dead_constants: list[Node] = []
        seen: set[Node] = set()
        work = self.dead_candidates
        while work:
            n = work.pop()
            if n._erased or n in seen:
                continue
            if n.users:
                _erase_assertions_on(n)
                if n.users:
                    continue
            if n.op == "call_function":
                schema = schema_of(n.target)
                if schema is None or schema.is_mutable:  # it may write; kept
                    continue
                ins = n.all_input_nodes
                erase_node(self.graph, n)
                work.extend(ins)
            elif n.op == "placeholder" and drop_constants:
                seen.add(n)
                if self.constants.inputs.constant(n) is not None:
                    dead_constants.append(n)
        if dead_constants:
            drop_constant_placeholders(self.ep, self.journal, dead_constants,
                                       self.constants.inputs)

    def rename_outputs(self) -> None:
        """A replaced node that was a program output: its output spec names the new node."""
        renamed = {old.name: _last(self.replaced, new).name for old, new in self.replaced.items()}
        sig = self.ep.graph_signature
        if not any(isinstance(s.arg, TensorArgument) and s.arg.name in renamed
                   for s in sig.output_specs):
            return
        self.journal.snapshot_program()
        outs = [OutputSpec(s.kind, TensorArgument(renamed[s.arg.name]), s.target)
                if isinstance(s.arg, TensorArgument) and s.arg.name in renamed else s
                for s in sig.output_specs]
        update_signature(self.ep, outputs=outs)


def _last(replaced: dict[Node, Node], node: Node) -> Node:
    """What ``node`` finally stands for: a later match may replace the node an earlier one
    put in an output's place (its spec must name the last one)."""
    seen = {node}
    while node in replaced and replaced[node] not in seen:
        node = replaced[node]
        seen.add(node)
    return node


# The pass-wide steps below are module-level functions so that the fault-injection
# tests can make each one raise and check that the program comes back unchanged.

def erase_node(graph: Any, node: Node) -> None:
    """Erase one dead node (journaled through the graph module's erase hook)."""
    graph.erase_node(node)


def update_signature(ep: ExportedProgram, inputs: list[InputSpec] | None = None,
                     outputs: list[OutputSpec] | None = None) -> None:
    """The program's input and output specs become these (None: unchanged), in place
    (:func:`fusionkit.edit.signature.set_specs`: the signature may be shared)."""
    signature.set_specs(ep, inputs, outputs)


def lint(ep: ExportedProgram, journal: Journal) -> None:
    """The all-or-nothing safety net: ``Graph.lint``'s checks, on what this apply changed.

    ``Graph.lint`` walks the whole graph (tens of µs per fusion in a large one);
    a rewrite can only make the nodes it created or rerouted inconsistent, and
    the journal knows exactly those (:meth:`~fusionkit.edit.journal.Journal.changed`).
    The checks a rewrite can violate are made there: every such node is in the
    graph with a legal op and target and its own name; each argument node is in
    this graph, not erased, and comes before it; each user of a new node comes
    after it. (Nodes no rewrite touched were as good as the caller handed them in.)
    """
    created, rewired = journal.changed()
    check_region(ep.graph_module, created, rewired)


_LEGAL_OPS = frozenset({"placeholder", "call_method", "call_module", "call_function",
                        "get_attr", "output", "root"})


def check_region(gm: torch.fx.GraphModule, created: list[Node], rewired: list[Node]) -> None:
    """Raise :class:`FusionError` if a created or rerouted node breaks the graph's invariants."""
    graph = gm.graph
    table = graph._find_nodes_lookup_table
    obj_to_name = graph._graph_namespace._obj_to_name

    def fail(why: str) -> None:
        raise FusionError(f"the rewritten graph is inconsistent: {why}")

    for is_new, nodes in ((True, created), (False, rewired)):
        for n in nodes:
            if n.graph is not graph or n not in table:
                fail(f"`{n.name}` does not belong to the graph")
            if n.op not in _LEGAL_OPS:
                fail(f"`{n.name}` has the unknown opcode {n.op!r}")
            for a in n._input_nodes:
                if a.graph is not graph or a._erased:
                    fail(f"`{n.name}` reads `{a.name}`, which is not in the graph"
                         + (" (erased)" if a._erased else ""))
                if not a < n:
                    fail(f"`{n.name}` reads `{a.name}`, which comes after it")
            if not is_new:
                continue
            if obj_to_name.get(n) != n.name:
                fail(f"`{n.name}` was renamed to a name the graph did not give it")
            for u in n.users:
                if u.graph is not graph or u._erased or not n < u:
                    fail(f"`{u.name}` reads `{n.name}` before it is computed")
            _check_target(gm, n, fail)


def _check_target(gm: torch.fx.GraphModule, n: Node, fail: Any) -> None:
    if n.op == "call_function":
        if not callable(n.target):
            fail(f"`{n.name}` calls {n.target!r}, which is not callable")
    elif not isinstance(n.target, str):
        fail(f"`{n.name}` ({n.op}) has target {n.target!r}, not a string")
    elif n.op in ("get_attr", "call_module"):
        obj: Any = gm
        for atom in n.target.split("."):
            obj = getattr(obj, atom, None)
            if obj is None:
                fail(f"`{n.name}` refers to `{n.target}`, which the graph module lacks")
        if n.op == "call_module" and not isinstance(obj, torch.nn.Module):
            fail(f"`{n.name}` calls `{n.target}`, which is not a module")


def recompile(ep: ExportedProgram) -> None:
    """Regenerate the graph module's code, lazily (:func:`fusionkit.edit.lazy_code.mark_stale`)."""
    lazy_code.mark_stale(ep.graph_module)


def drop_constant_placeholders(ep: ExportedProgram, journal: Journal, nodes: list[Node],
                               inputs: Any) -> None:
    """Remove unused constant placeholders with their signature and state entries, at once."""
    journal.snapshot_program()
    journal.snapshot_on_placeholders = False
    try:
        names = {n.name for n in nodes}
        sig = ep.graph_signature
        specs = [s for s in sig.input_specs if getattr(s.arg, "name", None) not in names]
        still_used = {s.target for s in specs if s.target is not None}
        for n in nodes:
            ref = inputs.constant(n)
            if ref is None or ref.target in still_used:
                continue
            if ref.kind is not ConstantKind.LIFTED_CONSTANT and ref.target in ep.state_dict:
                del ep.state_dict[ref.target]
            else:
                ep.constants.pop(ref.target, None)
        update_signature(ep, inputs=specs)
        for n in nodes:
            erase_node(ep.graph_module.graph, n)
    finally:
        journal.snapshot_on_placeholders = True


def check_placement(m: Match, created: list[Node]) -> None:
    """Each node the replacement created comes after every node it reads."""
    for n in created:
        for a in n.all_input_nodes:
            if not a < n:
                raise FusionError(
                    f"rule {m.rule.name!r} at `{m.root.name}`: `{n.name}` reads `{a.name}`, "
                    "which comes after it: no valid insertion point")


def check_users_follow(m: Match, pairs: list[tuple[Node, Node]]) -> None:
    """Each rerouted user of an output comes after the node now producing it."""
    for _, new in pairs:
        for u in new.users:
            if u.op != "output" and not new < u:
                raise FusionError(
                    f"rule {m.rule.name!r} at `{m.root.name}`: `{u.name}` uses output "
                    f"`{new.name}` before it is computed: no valid insertion point")


def apply_matches(ep: ExportedProgram, matches: Sequence[Match], *,
                  drop_dead_constants: bool = True, strict: bool | None = None) -> ApplyResult:
    """Apply every match in order; all or nothing. Mutates ``ep`` only on success.

    A match whose replacement raises is undone alone: with ``strict`` (``None``:
    the ``FUSIONKIT_STRICT`` setting) the whole program is then
    restored and the exception re-raised, otherwise it is listed in
    :attr:`ApplyResult.failed` and the others are applied. A failure in a
    pass-wide step (dead-code removal, signature update, lint, code
    generation) restores the whole program, then raises (strict) or reports
    every match as failed. ``drop_dead_constants=False`` leaves constants that
    became unused in place, for callers (graph-module passes) whose pass
    manager owns the signature. A match the match gate in force holds back
    (:mod:`fusionkit.apply.gate`, ``fusionkit bisect``) is not applied and is listed in
    :attr:`ApplyResult.held`.
    """
    begun = time.perf_counter()
    strict = strict_mode(strict)
    matches, held = gate.select(matches)
    result = ApplyResult(held=held)
    if not matches:
        return result
    with Journal(ep) as journal, guards_suppressed(ep.graph_module.graph):
        state = _Apply(ep, journal)
        for m in matches:
            savepoint = journal.savepoint()
            try:
                new_root = state.build(m)
            except Exception as e:
                if strict:
                    journal.rollback()
                    raise
                journal.rollback(savepoint)
                state.constants.reset()  # its indexes may describe undone placeholders
                result.failed.append(ApplyFailure(m, "replacement", e))
                continue
            result.applied.append(m)
            result.new_roots.append(new_root)
        if not result.applied:
            journal.rollback()
            return result
        step = "dead-code removal"
        try:
            state.erase_dead(drop_dead_constants)
            step = "output renaming"
            state.rename_outputs()
            step = "lint"
            lint(ep, journal)
            step = "code generation"
            recompile(ep)
        except Exception as e:
            journal.rollback()
            if strict:
                raise
            failed = [ApplyFailure(m, step, e) for m in result.applied]
            return ApplyResult([], [], [*result.failed, *failed], held)
    events.applied(result.applied, time.perf_counter() - begun)
    return result
