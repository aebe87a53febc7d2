"""``fusionkit bisect``: the one applied match whose removal makes a lowered program equal eager.

Why: when a program lowered through fusionkit differs from eager on its runtime, the
question is "which fusion did this?". LLVM answers it per pass (``-opt-bisect-limit``),
PyTorch Inductor's compiler bisector per pass and subsystem; fusionkit applies every
accepted match through one point (:mod:`fusionkit.apply.gate`), so it can answer per
match: rule, root node, claimed nodes.

Each trial lowers a fresh copy of the model with the match gate in force and runs the
program on the backend's runtime beside eager, on the same random inputs: XNNPACK's
``.pte`` through ExecuTorch's ``portable_lib``; Vulkan on the real runtime (one child
process for every trial) or, without one, the payload simulator; Arm on the TOSA reference
model. A lowering or a run that fails counts as "differs". The search: the lowering with
every match (recording each match's number), then with none (it must be equal, else the
difference is not a fusion's), then a binary search for the smallest number N of leading
matches that makes the program differ -- match N is the culprit -- and a confirming
lowering with every match but that one (equal: it alone explains the difference).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fusionkit.apply.gate import MatchGate, MatchKey, gated
from fusionkit.result import MatchResult

__all__ = ["BisectReport", "Trial", "bisect_model", "bisect_text"]

Progress = Callable[[str], None]

#: outcomes -> exit status of the command
FOUND, EQUAL, NOT_A_FUSION, NOT_SINGLE = "found", "equal", "not_a_fusion", "not_single"


@dataclass
class Trial:
    """One lowering and run: which matches were let through, and the verdict."""

    what: str
    #: matches 1..limit let through (None: no limit); match ``skip`` held back (1-based)
    limit: int | None
    skip: int | None
    #: matches applied (distinct)
    applied: int
    equal: bool
    #: the largest |program - eager|, or why there is no comparison (a failed lowering or run)
    detail: str
    ran: bool = True
    seconds: float = 0.0


@dataclass
class BisectReport:
    model: str
    backend: str
    #: what ran the programs
    runtime: str
    outcome: str = EQUAL
    #: matches the full lowering applied
    matches: int = 0
    #: the culprit's number (0-based), its match as first seen and where it was applied
    culprit: int | None = None
    culprit_match: MatchResult | None = None
    stage: str = ""
    #: every match the full lowering applied, in number order: number, rule, root, stage
    applied: list[dict[str, Any]] = field(default_factory=list)
    #: preprocess matches always applied, because the lowering fails without them (and how)
    kept: int = 0
    kept_because: str = ""
    trials: list[Trial] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def lowerings(self) -> int:
        return len(self.trials)

    @property
    def runs(self) -> int:
        return sum(t.ran for t in self.trials)

    def to_dict(self) -> dict[str, Any]:
        culprit = None
        if self.culprit is not None and self.culprit_match is not None:
            culprit = {"number": self.culprit + 1, **self.culprit_match.record(),
                       "stage": self.stage}
        return {"model": self.model, "backend": self.backend, "runtime": self.runtime,
                "outcome": self.outcome, "matches": self.matches, "culprit": culprit,
                "applied": self.applied, "kept": self.kept, "kept_because": self.kept_because,
                "lowerings": self.lowerings, "runs": self.runs,
                "trials": [vars(t) for t in self.trials], "seconds": round(self.seconds, 2)}


# ---------------------------------------------------------------------- comparing


def _flat(x: Any) -> list[Any]:
    return list(pytree.tree_leaves(x))


def _compare(got: Sequence[Any], want: Sequence[Any],
             tolerance: Callable[[torch.dtype], tuple[float, float]]) -> tuple[bool, str]:
    """(every output within tolerance of eager, the largest error as text)."""
    if len(got) != len(want):
        return False, f"{len(got)} outputs, eager has {len(want)}"
    equal, worst = True, 0.0
    for g, w in zip(got, want, strict=True):
        if not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)):
            equal &= bool(g == w)
            continue
        if g.shape != w.shape:
            return False, f"an output of shape {list(g.shape)}, eager's is {list(w.shape)}"
        if not w.numel():
            continue
        diff = (g.double() - w.double()).abs()
        worst = max(worst, float(diff.max()))
        atol, rtol = tolerance(w.dtype)
        equal &= bool((diff <= atol + rtol * w.double().abs()).all())
    return equal, f"max |program - eager| {worst:.3g}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


# ---------------------------------------------------------------------- backends


class _Target:
    """Lowers the model and runs it on one backend's runtime; eager's outputs once."""

    runtime = ""

    def __init__(self, exported: Any, module: Any, inputs: tuple[Any, ...],
                 rules: Sequence[Any], tolerance: Callable[[torch.dtype], tuple[float, float]]
                 ) -> None:
        # a pristine copy: ExecuTorch's lowering drops constants from the dicts it shares
        # with the program it lowers, so every trial lowers a copy of this one
        self.exported = copy.deepcopy(exported)
        self.module = module
        self.inputs = inputs
        self.rules = list(rules)
        self.tolerance = tolerance
        eager = module if module is not None else copy.deepcopy(exported).module()
        with torch.no_grad():
            self.want = _flat(eager(*inputs))

    def lower(self) -> Any:
        raise NotImplementedError

    def run(self, lowered: Any) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Xnnpack(_Target):
    runtime = "ExecuTorch's portable_lib (XNNPACK)"

    def lower(self) -> Any:
        from fusionkit.app.lowering import lower

        return lower(copy.deepcopy(self.exported), "xnnpack", self.rules).pte

    def run(self, lowered: Any) -> list[Any]:
        from fusionkit.app.runtime import run_pte

        return run_pte(lowered, _flat(self.inputs))


class _Vulkan(_Target):
    def __init__(self, *args: Any, simulator: bool, timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session: Any = None
        if not simulator:
            from fusionkit.backends.vulkan_adapter.runtime import (
                RuntimeNotFoundError,
                RuntimeSession,
            )

            try:
                self.session = RuntimeSession(timeout=timeout)
            except RuntimeNotFoundError:
                self.session = None
        self.runtime = ("the real Vulkan runtime" if self.session is not None else
                        "the Vulkan payload simulator" + ("" if simulator else
                                                          " (no real Vulkan runtime found)"))

    def lower(self) -> Any:
        from fusionkit.app.lowering import lower

        return lower(copy.deepcopy(self.exported), "vulkan", self.rules).program

    def run(self, lowered: Any) -> list[Any]:
        if self.session is None:
            from fusionkit.backends.vulkan_adapter.inspect.simulator import simulate

            return _flat(simulate(lowered, *self.inputs))
        res = self.session.run(bytes(lowered.buffer), _flat(self.inputs))
        if not res.ok:
            what = {"error": "refused it", "abort": "aborted", "timeout": "did not finish"}
            raise RuntimeError(f"the runtime {what.get(res.status, res.status)}: {res.message}")
        if res.device and ", device " not in self.runtime:
            self.runtime += f", device {res.device}"
        return list(res.outputs or [])

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


class _Arm(_Target):
    runtime = "the TOSA reference model (tosa-tools), TOSA-1.0+FP"

    def lower(self) -> Any:
        from fusionkit.backends.arm_adapter import reference_model as rm
        from fusionkit.fusion_pass import FusionPass

        eager = (self.module if self.module is not None
                 else copy.deepcopy(self.exported).module(check_guards=False))
        passes = [FusionPass(self.rules, name="specs")] if self.rules else []
        return rm.evaluate(eager, self.inputs, fusionkit=True, spec=rm.FP,
                           transform_passes=passes)

    def run(self, lowered: Any) -> list[Any]:
        if not lowered.delegated:
            raise RuntimeError("nothing was delegated to TOSA")
        return list(lowered.outputs)


def _tolerance(backend: str, atol: float | None, rtol: float | None
               ) -> Callable[[torch.dtype], tuple[float, float]]:
    from fusionkit.app.arm_run_job import FP_TOLERANCE
    from fusionkit.app.simulate_job import TOLERANCES

    def of(dtype: torch.dtype) -> tuple[float, float]:
        a, r = FP_TOLERANCE if backend == "arm" else TOLERANCES.get(dtype, (0.0, 0.0))
        if dtype.is_floating_point:
            a, r = (a if atol is None else atol), (r if rtol is None else rtol)
        return a, r

    return of


# ---------------------------------------------------------------------- the search


def _trial(target: _Target, gate: MatchGate, what: str, say: Progress) -> Trial:
    t0 = time.perf_counter()
    ran = False
    try:
        with gated(gate):
            lowered = target.lower()
    except Exception as e:  # a lowering a held-back (or applied) match breaks: it differs
        equal, detail = False, f"the lowering failed: {_first_line(e)}"
    else:
        try:
            got = target.run(lowered)
            ran = True
        except Exception as e:
            equal, detail = False, f"the run failed: {_first_line(e)}"
        else:
            equal, detail = _compare(got, target.want, target.tolerance)
    skip = None if gate.skip is None else gate.skip + 1  # 1-based, as the report's numbers
    trial = Trial(what, gate.limit, skip, len(set(gate.applied)), equal, detail, ran,
                  round(time.perf_counter() - t0, 2))
    say(f"{what}: {'equal' if equal else 'differs'} ({detail})")
    return trial


#: what the stage of a match applied before partitioning says (spec and adapter fusion rules)
BEFORE = "before partitioning"


def _stages(backend: str, rules: Sequence[Any]) -> Callable[[str], str]:
    """Where a rule's matches are applied, by its name: the user's spec and the adapter's
    fusion rules run before partitioning, every other rule in the backend's preprocess."""
    from fusionkit.app.lowering import BACKENDS, adapter_rules

    spec = {r.name for r in rules}
    fusion = {r.name for r in adapter_rules(backend)} if backend in BACKENDS else set()

    def of(rule: str) -> str:
        if rule in spec:
            return f"your spec, {BEFORE}"
        if rule in fusion:
            return f"the {backend} adapter's fusion rules, {BEFORE}"
        return f"{backend} preprocess, in a delegate's graph"

    return of


def bisect_model(exported: Any, module: Any, example_inputs: Sequence[Any], backend: str, *,
                 name: str = "model", rules: Sequence[Any] = (), seed: int = 0,
                 atol: float | None = None, rtol: float | None = None,
                 simulator: bool = False, timeout: float = 300.0,
                 progress: Progress | None = None) -> BisectReport:
    """Find the applied match whose removal makes ``exported`` lowered for ``backend``
    (``vulkan``, ``xnnpack``, ``arm``, plus ``rules``) equal eager on its runtime."""
    from fusionkit.app.simulate_job import random_inputs

    say = progress or (lambda _msg: None)
    begun = time.perf_counter()
    inputs = tuple(random_inputs(example_inputs, seed))
    tolerance = _tolerance(backend, atol, rtol)
    target: _Target
    if backend == "vulkan":
        target = _Vulkan(exported, module, inputs, rules, tolerance, simulator=simulator,
                         timeout=timeout)
    elif backend == "xnnpack":
        target = _Xnnpack(exported, module, inputs, rules, tolerance)
    elif backend == "arm":
        target = _Arm(exported, module, inputs, rules, tolerance)
    else:
        raise ValueError(f"unknown backend {backend!r}")
    report = BisectReport(name, backend, target.runtime)
    try:
        _search(target, report, rules, say)
    finally:
        target.close()
        report.runtime = target.runtime
        report.seconds = time.perf_counter() - begun
    return report


def _search(target: _Target, report: BisectReport, rules: Sequence[Any], say: Progress) -> None:
    def trial(gate: MatchGate, what: str) -> Trial:
        t = _trial(target, gate, what, say)
        report.trials.append(t)
        return t

    say(f"lowering for {report.backend} with every match, running on {target.runtime}")
    recorded = MatchGate()
    full = trial(recorded, "every match")
    numbers: dict[MatchKey, int] = dict(recorded.numbers)
    report.matches = total = len(numbers)
    stage = _stages(report.backend, rules)
    report.applied = [{"number": n + 1, "rule": m.rule, "root": m.root.name,
                       "stage": stage(m.rule)} for n, m in sorted(recorded.seen.items())]
    if full.equal:
        report.outcome = EQUAL
        return
    if total == 0:
        report.outcome = NOT_A_FUSION
        return
    keep: frozenset[int] = frozenset()
    none = trial(MatchGate.replaying(numbers, limit=0), "no match")
    if not none.ran:
        # a backend's preprocess rewrite its partitioner counted on (XNNPACK's conv + batch
        # norm fold) cannot be left out: keep every preprocess match, bisect over the others
        keep = frozenset(n for n, m in recorded.seen.items() if BEFORE not in stage(m.rule))
        report.kept, report.kept_because = len(keep), none.detail
        if keep and len(keep) < total:
            none = trial(MatchGate.replaying(numbers, limit=0, keep=keep),
                         f"no match but the {len(keep)} in preprocess")
    if not none.equal:
        report.outcome = NOT_A_FUSION
        return
    candidates = sorted(set(range(total)) - keep)

    def first(k: int) -> MatchGate:  # the first k candidates (and what is kept)
        return MatchGate.replaying(numbers, limit=candidates[k - 1] + 1 if k else 0, keep=keep)

    lo, hi = 0, len(candidates)  # invariant: the first `lo` candidates: equal; `hi`: differs
    more = math.ceil(math.log2(hi)) if hi > 1 else 0
    say(f"bisecting over {hi} matches (at most {more} more lowering{'s' if more != 1 else ''}, "
        "then one to confirm)")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if trial(first(mid), f"matches {_numbers(candidates[:mid])} of {total}").equal:
            lo = mid
        else:
            hi = mid
    report.culprit = culprit = candidates[hi - 1]
    report.culprit_match = recorded.seen.get(culprit)
    if report.culprit_match is not None:
        report.stage = stage(report.culprit_match.rule)
    confirm = trial(MatchGate.replaying(numbers, skip=culprit), f"every match but {culprit + 1}")
    report.outcome = FOUND if confirm.equal else NOT_SINGLE


def _numbers(ns: Sequence[int]) -> str:
    """0-based numbers shown 1-based, as ranges: ``1-3, 5``."""
    runs: list[list[int]] = []
    for n in ns:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a + 1) if a == b else f"{a + 1}-{b + 1}" for a, b in runs)


# ---------------------------------------------------------------------- the report


def bisect_text(report: BisectReport, model_args: str) -> str:
    """The report as ``fusionkit bisect`` prints it: the verdict, the culprit with its
    explanation (as ``fusionkit explain --rule R --at NODE`` prints it), the work done.
    ``model_args``: MODEL and the spec options, for the ``explain`` command it suggests."""
    from fusionkit.app.present import why_not_text

    r = report
    full = r.trials[0]
    head = f"{r.model}: lowered for {r.backend} ({r.matches} match{'es' if r.matches != 1 else ''}"
    head += f" applied), run on {r.runtime}"
    lines = [head]
    if r.outcome == EQUAL:
        lines.append(f"  equal to eager ({full.detail}): nothing to bisect")
    elif r.outcome == NOT_A_FUSION:
        lines.append(f"  differs from eager ({full.detail})")
        last = r.trials[-1]
        if r.matches == 0:
            lines.append("  nothing was fused, so no match explains it: not a fusion")
        elif not last.ran:
            lines.append(f"  without its matches it cannot be lowered or run ({last.detail}): "
                         "cannot bisect")
        elif r.kept:
            lines.append(f"  it still differs with every match removed but the {r.kept} in "
                         f"preprocess, which the lowering needs ({last.detail}): no match "
                         "before partitioning explains it")
        else:
            lines.append(f"  it still differs with every match removed ({last.detail}): "
                         "no match explains it, not a fusion")
    else:
        m = r.culprit_match
        assert r.culprit is not None
        k = r.culprit
        lines.append(f"  differs from eager ({full.detail}); " + (
            "with no match: equal, with match 1: differs" if k == 0 else
            "with match 1: equal, with matches 1-2: differs" if k == 1 else
            f"with matches 1-{k}: equal, with 1-{k + 1}: differs"))
        if m is not None:
            label = "culprit" if r.outcome == FOUND else "first match that makes it differ"
            lines.append(f"{label}: match {r.culprit + 1} of {r.matches}, rule {m.rule} "
                         f"at `{m.root.name}` ({r.stage})")
            lines.extend("  " + ln for ln in why_not_text(m).splitlines())
            lines.append("    nodes:  " + ", ".join(f"`{n.name}`" for n in m.claimed))
            if BEFORE in r.stage and r.backend != "arm":
                lines.append(f"  see: fusionkit explain {model_args} --backend {r.backend} "
                             f"--rule {m.rule} --at {m.root.name}")
        if r.kept:
            them = "them" if r.kept != 1 else "it"
            lines.append(f"  kept applied: the {r.kept} match{'es' if r.kept != 1 else ''} in "
                         f"preprocess, which the lowering needs (without {them}: "
                         f"{r.kept_because})")
        confirm = r.trials[-1]
        if r.outcome == FOUND:
            lines.append(f"  confirmed: every match but this one is equal to eager "
                         f"({confirm.detail})")
        else:
            lines.append(f"  but every match but this one still differs ({confirm.detail}): "
                         "no single match explains the difference (more than one match "
                         "contributes)")
    lines.append(f"{r.lowerings} lowering{'s' if r.lowerings != 1 else ''}, {r.runs} "
                 f"run{'s' if r.runs != 1 else ''} in {r.seconds:.1f} s")
    return "\n".join(lines)
