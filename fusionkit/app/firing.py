"""Does a rule fire where it is registered? ``explain``'s judgement, on ``verify``'s cases.

``fusionkit verify`` judges whether a rule's replacement computes what its pattern does; it
rewrites the pattern's program in torch, where every op runs. Whether the rule can fire in a
lowering is another question, which ``explain`` answers: on the edge program, the rule as the
backend's adapter applies it (Vulkan's with its delegation check: the partitioner's refusal,
the probed runtime's operators), and every replacement judged by the executability check
(step ``executable``: an op outside the core ATen opset, with no out variant or no kernel).
A rule ``equal`` in torch that is declined there on every case never fires.

:func:`judges` makes, for one rule, a judge per backend (label): ``judge(ep)`` takes the
exported program of a case the rule accepted in torch and returns None when the rule fires
in it as the backend applies it, else why not: its decline at ``executable`` or at a check
the adapter adds (the partitioner's refusal); a case whose edge program does not reach that
question (``to_edge`` changed the structure the generator built; another constraint declined
it) raises :class:`NotJudged` and is not counted. It decides by the functions ``explain`` calls:
:func:`~fusionkit.app.lowering.edge_program`, :func:`~fusionkit.app.lowering.adapter_rules`
and :func:`~fusionkit.find.finder.find_matches` (whose replacement check is the
``executable`` step); for the Vulkan rules that also run inside ``VulkanBackend.preprocess``,
:func:`~fusionkit.backends.vulkan_adapter.delegation.preprocess_fusions` as the adapter's
preprocess judges them. :func:`fusionkit.verify` calls the judges on the cases it compares
(:attr:`~fusionkit.authoring.verify.Verification.firing`).

Which backends: the one given (``--backend``), else those whose rule sets hold the rule
(a shipped rule), else "any backend": a rule of a spec or module is applied by ``lower
--spec`` and ``explain --spec`` before partitioning, judged alike for every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fusionkit.rule import Rule
from fusionkit.targets import op_key

__all__ = ["ANY_BACKEND", "Judge", "NotJudged", "judges", "plain_rule", "registered_backends"]

#: the label of a rule no backend registers, judged as ``lower --spec`` applies it
ANY_BACKEND = "any backend"

#: ``judge(ep)``: None when the rule fires in the case's program, else why not
Judge = Callable[[Any], "str | None"]

#: backend -> the rule sets it runs in preprocess (after partitioning), beside its adapter's
#: transform passes (:func:`~fusionkit.app.lowering.adapter_rules`)
_PREPROCESS_SETS: dict[str, tuple[str, ...]] = {"vulkan": ("vulkan", "vulkan_preprocess")}
#: backend -> the rule sets whose rules are judged there: its adapter's transform passes
#: (``vulkan``) and its preprocess rules judged as its preprocess judges them. XNNPACK's
#: adapter has no transform-pass rules (its ``xnnpack`` set runs inside its preprocess, with
#: its own target), and ``explain`` applies none of them: not judged
_JUDGED_SETS: dict[str, tuple[str, ...]] = {"vulkan": ("vulkan", "vulkan_preprocess")}


def _same(a: Rule, b: Rule) -> bool:
    if a.name != b.name:
        return False
    try:
        return bool(a.pattern == b.pattern)
    except Exception:  # a pattern that cannot be compared: the name decides
        return True


def _in_sets(rule: Rule, sets: tuple[str, ...]) -> bool:
    from fusionkit.passes.registry import rule_set

    return any(_same(r, rule) for s in sets for r in rule_set(s))


def _applied(rule: Rule, backend: str) -> Rule | None:
    """``rule`` as ``explain --backend backend`` applies it: its adapter's (with the
    adapter's checks) when the adapter's transform passes hold it, else the rule itself
    (as a ``--spec`` rule is applied); None for a shipped rule its transform passes do not
    hold (one that runs only in the backend's preprocess, or another backend's)."""
    from fusionkit.app.lowering import adapter_rules

    if rule.shipped:  # (only where a set of the backend holds it: else no judge at all)
        return next((r for r in adapter_rules(backend) if _same(r, rule)), None)
    return rule


def registered_backends(rule: Rule) -> list[str]:
    """The backends whose rule sets hold ``rule`` (a shipped rule; none for a spec's)."""
    if not rule.shipped:
        return []
    # (read from the registry: no other backend's adapter is imported for a rule)
    return [b for b, sets in _JUDGED_SETS.items() if _in_sets(rule, sets)]


def plain_rule(rule: Rule, backend: str) -> Rule:
    """The registered rule that ``rule`` (an adapter's, carrying the adapter's checks, as
    ``explain`` lists it) is made from: what ``fusionkit verify BACKEND`` verifies, so that
    ``explain --verify`` and ``verify`` judge one rule alike. A rule no set of ``backend``
    holds is itself."""
    if not rule.shipped:
        return rule
    from fusionkit.passes.registry import rule_set

    for s in (backend, *_PREPROCESS_SETS.get(backend, ())):
        try:
            found = next((r for r in rule_set(s) if r.name == rule.name), None)
        except KeyError:  # no rule set of that name
            continue
        if found is not None:
            return found
    return rule


class NotJudged(Exception):
    """The case's edge program does not ask the question: the rule does not reach its
    replacement there (``to_edge`` changed the structure the generator built, another
    constraint declined it). The case is not counted (:attr:`Verification.firing`'s
    ``not_judged``): only the replacement's executability and the partitioner decide
    "never fires"."""


def _added_steps(applied: Rule, rule: Rule) -> frozenset[str]:
    """The steps of the checks the adapter adds to ``rule`` (Vulkan's delegation check:
    the partitioner, the probed runtime's operators, the runtime's conditions)."""
    return frozenset(c.kind for c in applied.constraints) - {c.kind for c in rule.constraints}


def _deciding(ms: Any, edge: Any, where: str, steps: frozenset[str]) -> str | None:
    """None when a match was accepted; the decline at ``executable`` or at an adapter's
    check; else :class:`NotJudged`."""
    if ms.accepted:
        return None
    declined = list(ms.declined)
    for d in declined:
        if d.step == "executable" or d.step in steps:
            return f"declined {where} at {d.step}: {d.reason}"
    if declined:
        d = declined[0]
        raise NotJudged(f"{where}: declined at {d.step}, not by the replacement's "
                        f"executability or the partitioner: {d.reason}")
    ops = ", ".join(dict.fromkeys(op_key(n.target) or str(n.target) for n in edge.graph.nodes
                                  if n.op == "call_function"))
    raise NotJudged(f"{where}: the pattern is not in the edge program to_edge makes of the "
                    f"case ({ops})")


def _before_partitioning(applied: Rule, rule: Rule) -> Judge:
    steps = _added_steps(applied, rule)

    def judge(ep: Any) -> str | None:
        from fusionkit.app.lowering import edge_program
        from fusionkit.find.finder import find_matches

        edge = edge_program(ep)
        return _deciding(find_matches(edge, [applied], strict=False), edge,
                         "before partitioning", steps)
    return judge


def _in_preprocess(rule: Rule, backend: str) -> Judge | None:
    if backend != "vulkan" or not rule.shipped or not _in_sets(rule, _PREPROCESS_SETS[backend]):
        return None

    def judge(ep: Any) -> str | None:
        from fusionkit.app.lowering import edge_program
        from fusionkit.backends.vulkan_adapter.delegation import (
            preprocess_fusions,
            with_delegation_check,
        )

        edge = edge_program(ep)
        checked = with_delegation_check(rule, None)
        return _deciding(preprocess_fusions(edge, rules=[checked], strict=False), edge,
                         "in VulkanBackend.preprocess", _added_steps(checked, rule))
    return judge


def _both(first: Judge, second: Judge) -> Judge:
    """Fires when either stage fires; never fires when both decline it (at ``executable``
    or an adapter's check); otherwise the case is not judged."""
    def judge(ep: Any) -> str | None:
        said: list[str] = []
        unknown: list[str] = []
        for stage in (first, second):
            try:
                why = stage(ep)
            except NotJudged as e:
                unknown.append(str(e))
                continue
            if why is None:
                return None
            said.append(why)
        if unknown:
            raise NotJudged("; ".join(unknown))
        return "; ".join(said)
    return judge


def judges(rule: Rule, backend: str | None = None) -> Mapping[str, Judge]:
    """Backend label -> the judge of whether ``rule`` fires there (see the module): the
    ``backend`` given, else the backends registering it, else :data:`ANY_BACKEND`. A
    shipped rule is judged only where a set of the backend holds it (the preprocess rules of
    XNNPACK and Arm, which ``explain`` does not apply, are not judged)."""
    labels = ([backend] if backend else registered_backends(rule) if rule.shipped
              else [ANY_BACKEND])
    out: dict[str, Judge] = {}
    for label in labels:
        if label == ANY_BACKEND:
            out[label] = _before_partitioning(rule, rule)
            continue
        applied = _applied(rule, label)
        stages = [j for j in (None if applied is None else _before_partitioning(applied, rule),
                              _in_preprocess(rule, label)) if j is not None]
        if len(stages) == 2:
            out[label] = _both(stages[0], stages[1])
        elif stages:
            out[label] = stages[0]
    return out
