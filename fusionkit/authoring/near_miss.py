""""Why not here?": what one rule made of one node the author points at.

:func:`find_matches` reports a structural near miss only once a pattern has
matched most of its ops, so a small rule that does not fire is usually
silent. Asked about one node, :func:`why_not` reports the deepest point the
rule reached there with no threshold: fused; part of another match; declined
by a constraint, an escaping intermediate or an overlap; or which pattern step
failed, expecting what and finding what.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.find.finder import MatchSet, find_matches
from fusionkit.program import ProgramLike, as_exported_program
from fusionkit.result import MatchResult, Status, Step
from fusionkit.rule import Rule
from fusionkit.targets import op_key

__all__ = ["why_not"]


def _node_named(ep: ExportedProgram, name: str) -> Node:
    for n in ep.graph_module.graph.nodes:
        if n.name == name:
            return n
    import difflib

    names = [n.name for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
    close += [n for n in names if (name in n or n in name) and n not in close]
    hint = f"; did you mean {', '.join(close[:5])}?" if close else ""
    raise KeyError(f"no node named {name!r} in the program{hint}")


def why_not(ep: ProgramLike, rule: Rule | str, at: str | Node, *,
            rules: Sequence[Rule] | None = None, matches: MatchSet | None = None) -> MatchResult:
    """What ``rule`` made of node ``at`` (a node or its name) in ``ep``.

    ``rules`` is the whole rule set the rule runs with (other rules' matches can
    claim nodes first); by default the rule alone. ``matches``: the result of
    ``find_matches(ep, rules, all_near_misses=True)`` when the caller has it.
    ``ep``: an ``ExportedProgram``, ``EdgeProgramManager`` or ``ExecutorchProgramManager``.
    """
    ep = as_exported_program(ep, who="why_not()")
    rule_set = list(rules) if rules is not None else ([rule] if isinstance(rule, Rule) else [])
    name = rule if isinstance(rule, str) else rule.name
    the_rule = next((r for r in rule_set if r.name == name), None)
    if the_rule is None:
        if isinstance(rule, Rule):
            rule_set.append(rule)
            the_rule = rule
        else:
            raise KeyError(f"no rule named {name!r} (rules: {', '.join(r.name for r in rule_set)})")
    node = at if isinstance(at, Node) else _node_named(ep, at)
    ms = matches if matches is not None else find_matches(ep, rule_set, all_near_misses=True)
    for m in ms.accepted:
        if m.root is node and m.rule.name == name:
            return MatchResult(name, node, Status.FUSED, Step.FUSED, None,
                               f"fused: {len(m.claimed)} nodes replaced", tuple(m.claimed), m)
    for m in ms.accepted:
        if node in m.claimed:
            what = "its root" if m.root is node else f"inside the match at `{m.root.name}`"
            return MatchResult(name, node, Status.INSIDE, Step.OVERLAP, node,
                               f"`{node.name}` is {what} of rule {m.rule.name}, which claimed it "
                               "first", tuple(m.claimed), m)
    for d in ms.declined:
        if d.root is node and d.rule == name:
            claimed = d.claimed or (node,)
            return MatchResult(name, node, d.status, d.step, d.node, d.reason, claimed, d,
                               d.error_type)
    key = op_key(node.target) if node.op == "call_function" else None
    want = " or ".join(sorted(the_rule.root_keys))
    got = key or (f"a {node.op} node" if node.op != "call_function" else str(node.target))
    return MatchResult(name, node, Status.NOT_ROOT, Step.ROOT, node,
                       f"the rule's pattern is rooted at {want}; `{node.name}` is {got}",
                       (), None)
