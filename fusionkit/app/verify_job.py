"""``fusionkit verify``: which rules to verify, and the report.

A target is a YAML spec (``SPEC.yaml``), ``package.module:name`` (a :class:`~fusionkit.Rule`,
a list of them, or a no-argument callable returning either) or the name of a registered
rule set (``vulkan``, ``xnnpack``, ``vulkan_preprocess``, ``builtin``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fusionkit.authoring.verify import (
    CANNOT_CHECK,
    DIFFERENT,
    EQUAL,
    TOLERANCES,
    Verification,
    verify_rules,
)
from fusionkit.rule import Rule

__all__ = ["VerifyTargetError", "load_targets", "status_of", "verification_text", "verify_targets"]


class VerifyTargetError(ValueError):
    """A target that names no rules (no such file, module, attribute or rule set)."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _rules_of(obj: Any, what: str) -> list[Rule]:
    if callable(obj) and not isinstance(obj, Rule):
        try:
            obj = obj()
        except Exception as e:
            raise VerifyTargetError(f"{what}: calling it raised {_first_line(e)}") from None
    if isinstance(obj, Rule):
        return [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(r, Rule) for r in obj):
        return list(obj)
    raise VerifyTargetError(f"{what}: not a Rule, a list of rules or a callable returning them "
                            f"(got {type(obj).__name__})")


def load_targets(targets: Sequence[str], load_specs: Callable[[list[str]], list[Rule]]) -> list[Rule]:
    """The rules ``targets`` name, in order (``load_specs`` reads YAML files)."""
    rules: list[Rule] = []
    for t in targets:
        if t.endswith((".yaml", ".yml")):
            if not Path(t).is_file():
                raise VerifyTargetError(f"{t}: no such file")
            rules.extend(load_specs([t]))
        elif ":" in t:
            module, _, attr = t.partition(":")
            from fusionkit.specs.trust import importable_here

            with importable_here():  # a module next to the user, as the MODEL loader finds it
                try:
                    mod = importlib.import_module(module)
                except ImportError as e:
                    raise VerifyTargetError(f"{t}: cannot import {module}: {e} (looked in the "
                                            f"current directory ({os.getcwd()}) and the "
                                            "installed packages)") from None
                except Exception as e:  # the module raised while being imported
                    raise VerifyTargetError(f"{t}: importing {module} raised "
                                            f"{_first_line(e)}") from None
                if not hasattr(mod, attr):
                    raise VerifyTargetError(f"{t}: module {module} has no {attr!r}")
                rules.extend(_rules_of(getattr(mod, attr), t))
        else:
            from fusionkit.passes.registry import rule_set, rule_set_names

            try:
                rules.extend(rule_set(t))
            except KeyError:
                raise VerifyTargetError(f"{t}: not a .yaml spec, a module:name or a rule set "
                                        f"({', '.join(rule_set_names())})") from None
    return rules


def verify_targets(rules: Sequence[Rule], *, cases: int = 20, backend: str | None = None,
                   progress: Callable[[str], None] | None = None) -> list[Verification]:
    """Each rule's verification, in one worker process (restarted after a case crashes it:
    the crash is that rule's "cannot check"), so no case ends this process; with whether it
    fires on ``backend`` (else the backends registering it), as ``explain`` decides
    (:mod:`fusionkit.app.firing`). ``fusionkit verify`` and ``explain --verify`` both call
    this, so for one rule and one budget they give one verdict."""
    from fusionkit.app.firing import judges

    return verify_rules(rules, cases=cases, judges=lambda r: judges(r, backend),
                        progress=None if progress is None else lambda r: progress(f"verifying {r.name}"))


def status_of(results: Sequence[Verification]) -> int:
    """Exit status: 1 when a rule computes something else than its pattern, or never fires
    on a backend it was judged for (a problem found either way), else 0."""
    return 1 if any(v.status == DIFFERENT or v.never_fires for v in results) else 0


_MARK = {EQUAL: "equal", DIFFERENT: "DIFFERENT", CANNOT_CHECK: "cannot check"}


def verification_text(results: Sequence[Verification]) -> str:
    lines = []
    for v in results:
        never = v.never_fires
        mark = _MARK[v.status] + (f", but NEVER FIRES on {', '.join(never)}" if never else "")
        lines.append(f"{v.rule}: {mark} ({v.seconds:.1f} s): {v.reason}")
        for b, why in never.items():
            lines.append(f"  never fires on {b} (declined on all {v.firing[b]['cases']} cases "
                         f"judged, as explain decides): {why}")
        fires = [b for b, f in v.firing.items() if f.get("fires")]
        if fires:
            lines.append(f"  fires on {', '.join(fires)}")
        if v.counterexample is not None:
            lines.append(f"  smallest counterexample: {v.counterexample}")
        if v.proof is not None:
            lines.append(f"  {v.proof}")
    counts = {s: sum(v.status == s for v in results) for s in (EQUAL, DIFFERENT, CANNOT_CHECK)}
    tol = ", ".join(f"{str(d).removeprefix('torch.')} {t:g}" for d, t in TOLERANCES.items()
                    if d.is_floating_point)
    lines.append(f"{len(results)} rule(s): {counts[EQUAL]} equal, {counts[DIFFERENT]} different, "
                 f"{counts[CANNOT_CHECK]} cannot check, "
                 f"{sum(v.proof is not None and v.proof.proved for v in results)} proved, "
                 f"{sum(bool(v.never_fires) for v in results)} never fire (tolerance x (1 + |expected|): {tol}; "
                 "8-bit outputs within 1 step, other integers exact)")
    return "\n".join(lines)


def print_report(results: Sequence[Verification]) -> None:
    print(verification_text(results), file=sys.stdout)
