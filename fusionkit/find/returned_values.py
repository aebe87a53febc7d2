"""A value the program returns stays returned exactly: one output, one value of its own.

A match's outputs are replaced by what its replacement returns. When an output is a value
the program returns (a user output, or the value a buffer or input mutation writes back:
each is an argument of the graph's ``output`` node), the replacement takes its place
among the program's outputs, and that is exact only when the replacement *computes* it:

* returned in place of ``clone(y)``, a ``y`` the program already returns makes the
  output list name one value twice: ExecuTorch's Vulkan delegate then declares one output
  where the delegate call passes two ("Vulkan graph declares 1 inputs and 1 outputs, but
  the delegate call supplied 3 arguments", VulkanBackend.cpp: execute), and XNNPACK
  refuses the lowering ("Output node ... is already in the inputs ... pass through
  arguments");
* returned in place of ``clone(x)``, a graph input ``x`` (or a constant) makes the
  program return its input: a delegate must write every output it returns (XNNPACK's
  ``preserve_input_output_copies``).

So a match whose output the program returns is declined (step ``escape``: the value
escapes the match to the program's output) when the replacement would return, in its
place, an existing node that is a placeholder or that the program already returns —
counting what the matches accepted earlier in the same search rewire (:class:`Returned`).
A replacement that returns a node it creates, or an existing node the program does not
return yet, rewires the output exactly: one output, one value.

The finder calls :func:`returned_value_refusal` last for each match, after every other
check (so a match it passes is accepted, and its rewiring is recorded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.result import MatchResult, Status, Step

if TYPE_CHECKING:
    from fusionkit.check.constraints import CheckContext
    from fusionkit.program_inputs import ProgramInputs
    from fusionkit.rule import Rule

__all__ = ["Returned", "forget", "returned_value_refusal"]


class Returned:
    """The nodes a program returns, as the matches accepted so far in one search leave them,
    and those matches (each claimed node -> its match) to tell what a node they replace
    becomes."""

    def __init__(self, ep: ExportedProgram) -> None:
        out = ep.graph_module.graph.output_node()
        self.nodes: set[Node] = set(out.all_input_nodes)
        self.accepted: dict[Node, _Accepted] = {}

    def rewire(self, old: Node, new: Node) -> None:
        self.nodes.discard(old)
        self.nodes.add(new)

    def accept(self, match: _Accepted) -> None:
        for n in match.matched:
            self.accepted[n] = match

    def resolve(self, node: Node) -> Node | None:
        """What existing ``node`` stands for once the accepted matches are applied: itself,
        or what a match that replaces it returns in its place (an existing node, or the
        scratch-graph node standing for one its replacement creates); None when that
        cannot be told."""
        seen: set[Node] = set()
        while node in self.accepted and node not in seen:
            seen.add(node)
            match = self.accepted[node]
            new = match.replaced_by(node)
            if new is None:
                return None
            node = new
        return node


class _Accepted:
    """An accepted match, kept to build its replacement again when asked what one of its
    outputs becomes."""

    def __init__(self, ctx: CheckContext, rule: Rule, olds: Sequence[Node],
                 matched: tuple[Node, ...], news: list[Any] | None = None) -> None:
        self.ctx, self.rule, self.olds, self.matched = ctx, rule, tuple(olds), matched
        #: what the replacement returns per output (built once: a created node is a
        #: scratch-graph node, the same object every time it is asked about)
        self._news: list[Any] | None = news

    def replaced_by(self, node: Node) -> Node | None:
        if node not in self.olds:
            return None  # an intermediate the match erases: nothing stands for it
        if self._news is None:
            try:
                self._news = _build(self.ctx, self.rule, self.olds)[1]
            except Exception:
                return None
        return self._news[self.olds.index(node)]


def _build(ctx: CheckContext, rule: Rule, olds: Sequence[Node]) -> tuple[Any, list[Any]]:
    from fusionkit.edit.probe import build_in_scratch
    from fusionkit.find.executable import replacement_outputs

    rw, built = build_in_scratch(rule.replacement, ctx, rule.name)
    return rw, replacement_outputs(rule.name, ctx.root, list(olds), built)


#: the attribute of a search's ProgramInputs (one per find_matches call) holding its
#: :class:`Returned`: the rewirings earlier accepted matches of that search make. The search
#: holds it, so it goes with the search. A table keyed by the ProgramInputs, even weakly,
#: would keep it forever: a Returned holds the search's contexts, and each context those
#: very inputs and the program, so every program ever searched (and each constant of it:
#: +594 MiB at the end of a 2-layer Qwen3 ``export_llm`` on Vulkan) stayed alive. Held by
#: the inputs it is a cycle (inputs -> Returned -> _Accepted -> CheckContext -> inputs),
#: which :func:`forget` breaks when the search ends: the program then goes with its last
#: reference, not whenever the cyclic collector runs.
_STATE = "_fusionkit_returned"


def _returned(ctx: CheckContext) -> Returned:
    state: Returned | None = getattr(ctx.inputs, _STATE, None)
    if state is None:
        state = Returned(ctx.ep)
        setattr(ctx.inputs, _STATE, state)
    return state


def forget(inputs: ProgramInputs) -> None:
    """Drop the record of the search ``inputs`` served (call when the search is done)."""
    inputs.__dict__.pop(_STATE, None)


def _decline(rule: str, root: Node, node: Node, reason: str, matched: tuple[Node, ...]
             ) -> MatchResult:
    return MatchResult(rule, root, Status.DECLINED, Step.ESCAPE, node, reason, matched)


def returned_value_refusal(ctx: CheckContext, rule: Rule, olds: Sequence[Node],
                           matched: tuple[Node, ...] = ()) -> MatchResult | None:
    """Why the match would not rewire a value the program returns exactly (None: it would,
    or it changes none; then its rewiring is recorded for the rest of the search).

    ``olds``: the match's outputs (root first), as the finder replaces them.
    """
    state = _returned(ctx)
    returned = [i for i, old in enumerate(olds) if old in state.nodes]
    if not returned:
        state.accept(_Accepted(ctx, rule, olds, matched))
        return None
    root = ctx.root
    try:
        rw, news = _build(ctx, rule, olds)
    except Exception:
        # a replacement that raises or that the builder refuses is judged where it always
        # was: the replacement check declines it before this check runs, or (replacements
        # not checked) the all-or-nothing apply raises or reports it with the program intact
        return None
    rewired: list[tuple[Node, Node]] = []
    for i in returned:
        old, new = olds[i], news[i]
        if new is None:
            return _decline(rule.name, root, old, f"`{old.name}` is returned by the program, "
                            "and the replacement drops it", matched)
        # a node the replacement computes stands for itself; an existing one for what the
        # matches accepted before make of it
        stands = new if new.graph is rw.graph else state.resolve(new)
        if stands is None:
            return _decline(rule.name, root, old,
                            f"`{old.name}` is returned by the program; what an earlier match "
                            f"makes of `{new.name}`, which would take its place, cannot be "
                            "told", matched)
        if stands is old:  # kept, edited in place: the program returns what it returned
            continue
        if stands.op in ("placeholder", "get_attr"):
            return _decline(
                rule.name, root, old,
                f"`{old.name}` is returned by the program; the replacement would return "
                f"`{stands.name}`, a graph input or constant, in its place: the program would "
                "return its input, and a delegate must write each output it returns "
                "(a delegate refuses such a pass-through argument)", matched)
        if stands in state.nodes or any(stands is n for _, n in rewired):
            return _decline(
                rule.name, root, old,
                f"`{old.name}` is returned by the program; the replacement would return "
                f"`{stands.name}` in its place, which the program returns already: one value "
                "for two outputs (a delegate declares one output where its call passes "
                "two: runtimes abort on the argument count, or refuse the lowering)", matched)
        rewired.append((old, stands))
    for old, new in rewired:
        state.rewire(old, new)
    state.accept(_Accepted(ctx, rule, olds, matched, news))
    return None
