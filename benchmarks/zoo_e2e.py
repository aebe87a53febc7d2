"""Section 6: end-to-end lowering of every model-zoo architecture, stock vs adapter, by stage.

Issue 13 states its end-to-end targets on a set of small transformers/diffusers
models, not on one synthetic stack: the Vulkan adapter's lowering <= 0.4x stock's
time and XNNPACK's <= 1.0x. This section lowers each model of the project's zoo
(``tests/zoo_models.py``: real ``transformers``/``diffusers`` architectures built
from their configurations) both ways in one process, in interleaved pairs, and
judges the target on the aggregate ``sum(adapter) / sum(stock)`` over the models
both paths lower (a model's time weighs as much as it costs a user); the median and
geometric mean of the per-model ratios are printed beside it. A model a path
cannot lower is reported with its one-line error and left out of the aggregate.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.harness import STAGES
from benchmarks.output import Targets, fmt_ms, fmt_ratio, fmt_spread, fmt_table

# The zoo lives with the tests, which import it as the top-level module ``zoo_models``
# (tests/conftest.py puts tests/ on sys.path); do the same, so it is one module either way.
_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

#: adapter/stock limits per backend (issue 13)
LIMITS = {"vulkan": 0.4, "xnnpack": 1.0}
BACKENDS = ("vulkan", "xnnpack")
#: the optional third path: the adapter with its preprocess takeover off, so the stock
#: preprocess passes run (gated) as they did before they became rules -- "before" beside
#: the adapter's "after" (issue 25: lowering time no worse than before the takeover)
TAKEOVER_OFF = "takeover_off"


def zoo_names() -> list[str]:
    """Every model of the zoo, in its order."""
    import zoo_models

    return [m.name for m in zoo_models.ZOO]


def _one_line(e: BaseException) -> str:
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    def first(x: BaseException) -> str:  # first line, without object addresses
        text = re.sub(r" object at 0x[0-9a-f]+", "", f"{type(x).__name__}: {x}").strip()
        return text.splitlines()[0][:200] if text else type(x).__name__

    return first(e) if root is e else f"{first(e)} <- {first(root)}"


def _uninstall(adapters: dict[str, Any]) -> None:
    """Both adapters' global hooks off: a stock lowering is stock whatever ran before."""
    for a in adapters.values():
        if a is not None:
            a.uninstall()


def lower_once(module: Any, inputs: tuple[Any, ...], backend: str, label: str,
               adapters: dict[str, Any]) -> dict[str, float]:
    """One export -> ``to_edge_transform_and_lower`` -> ``.pte``, CPU time per stage.

    Raises what the lowering raises (the caller records it). The stages are those of
    section 3 (``harness.stage_timer``): ``edge`` is the rest of the lowering.
    """
    import torch

    from benchmarks.harness import CPU_CLOCK, stock_partitioner, timed_lowering

    if label == "stock":
        _uninstall(adapters)
    try:
        if label == TAKEOVER_OFF:
            with takeover_disabled(backend):
                return lower_once(module, inputs, backend, "adapter", adapters)
        c0 = CPU_CLOCK()
        with torch.no_grad():
            ep = torch.export.export(module, inputs)
        export_s = CPU_CLOCK() - c0
        if label == "stock":
            passes: list[Any] = []
            part = stock_partitioner(backend)
        else:
            passes, part = adapters[backend].passes(), adapters[backend].partitioner()
        return timed_lowering(ep, passes, part, export_s)
    finally:
        if label == "stock":
            _uninstall(adapters)


def takeover_disabled(backend: str) -> Any:
    """The adapter's preprocess rules switched off for this thread (stock passes run)."""
    import importlib

    mod = importlib.import_module(f"fusionkit.backends.{backend}_adapter.preprocess_rules")
    return mod.disabled()


def _gmean(vals: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def aggregate(per_model: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Sum ratio, median and geometric mean of the models both paths lowered."""
    both = {n: r for n, r in per_model.items() if r["ratio"] is not None}
    if not both:
        return {"models": [], "sum_ratio": None, "median_ratio": None, "gmean_ratio": None,
                "ratio_min": None, "ratio_max": None, "stock_sum_s": None,
                "adapter_sum_s": None, "stages": {}}
    ratios = [r["ratio"] for r in both.values()]
    st = sum(r["stock_cpu_s"] for r in both.values())
    ad = sum(r["adapter_cpu_s"] for r in both.values())
    labels = [lb for lb in ("stock", "adapter", TAKEOVER_OFF)
              if all(lb in r["stages"] for r in both.values())]
    stages = {label: {k: sum(r["stages"][label][k] for r in both.values())
                      for k in (*STAGES, "total")} for label in labels}
    e2e_st, e2e_ad = stages["stock"]["total"], stages["adapter"]["total"]
    return {"models": list(both), "sum_ratio": ad / st, "median_ratio": statistics.median(ratios),
            "gmean_ratio": _gmean(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "stock_sum_s": st, "adapter_sum_s": ad,
            "end_to_end_sum_ratio": e2e_ad / e2e_st if e2e_st else None, "stages": stages}


def bench_zoo(models: Sequence[str], pairs: int, warmup: bool = True,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              checkpoint: Callable[[dict[str, Any]], None] | None = None,
              takeover_off: bool = False) -> dict[str, Any]:
    """Lower every model in ``models`` stock and with the adapter, ``pairs`` times each.

    One warm-up lowering per path and backend on the first model (first-use costs),
    then for each model and backend ``pairs`` interleaved stock/adapter pairs; pair ``i`` of the
    ``m``-th model runs stock first when ``i + m`` is even, so with an even ``pairs``
    each path runs first equally often per model, with an odd one across the zoo.
    A path that fails is recorded once (one-line error) and not retried. ``checkpoint``
    is called with the figures so far after each model. With ``takeover_off`` each pair
    also lowers with the adapter's preprocess takeover off (:data:`TAKEOVER_OFF`).
    """
    import torch
    import zoo_models

    from benchmarks.harness import load_adapter

    adapters: dict[str, Any] = {}
    why: dict[str, str] = {}
    for backend in BACKENDS:
        adapters[backend], why[backend] = load_adapter(backend)
    built: dict[str, tuple[Any, tuple[Any, ...]]] = {}
    for name in models:
        torch.manual_seed(0)
        module, inputs = zoo_models.BY_NAME[name].factory()
        built[name] = (module.eval(), inputs)

    out: dict[str, Any] = {"models": list(models), "pairs": pairs, "warmup": warmup,
                           "limits": LIMITS, "backends": {}}
    labels = {b: ["stock"] + (["adapter"] + ([TAKEOVER_OFF] if takeover_off else [])
                              if adapters[b] is not None else []) for b in BACKENDS}
    per_model: dict[str, dict[str, dict[str, Any]]] = {b: {} for b in BACKENDS}
    if warmup and models:
        module, inputs = built[models[0]]
        for backend in BACKENDS:
            for label in labels[backend]:
                try:
                    lower_once(module, inputs, backend, label, adapters)
                except Exception:  # recorded when the model is measured
                    pass
    # model by model, both backends each: a drift in the machine's state falls on
    # both backends alike, and a run cut short has complete models (``checkpoint``)
    for m, name in enumerate(models):
        module, inputs = built[name]
        for backend in BACKENDS:
            per_model[backend][name] = _measure(module, inputs, backend, labels[backend],
                                                adapters, why[backend], pairs, m)
            r = per_model[backend][name]
            r["stock_program_unusable"] = zoo_models.STOCK_FAILS.get((name, backend))
            log(f"  ... zoo {name} {backend}: stock {fmt_ms(r['stock_cpu_s'])} ms, adapter "
                f"{fmt_ms(r['adapter_cpu_s'])} ms"
                + "".join(f"; {k} fails: {v}" for k, v in r["errors"].items() if v))
        for backend in BACKENDS:
            out["backends"][backend] = {"adapter": why[backend], "models": per_model[backend],
                                        "aggregate": aggregate(per_model[backend])}
        if checkpoint is not None:
            checkpoint(out)
    _uninstall(adapters)
    return out


def _measure(module: Any, inputs: tuple[Any, ...], backend: str, labels: list[str],
             adapters: dict[str, Any], why: str, pairs: int, m: int) -> dict[str, Any]:
    """``pairs`` stock/adapter pairs of one model on one backend (the ``m``-th model)."""
    samples: dict[str, list[dict[str, float]]] = {label: [] for label in ("stock", "adapter",
                                                                          *labels)}
    errors: dict[str, str | None] = {label: None for label in samples}
    if adapters[backend] is None:
        errors["adapter"] = why
    takeover: list[float] = []
    pair_ratios: list[float] = []
    for i in range(pairs):
        order = labels if (i + m) % 2 == 0 else labels[::-1]
        pair: dict[str, dict[str, float]] = {}
        for label in order:
            if errors[label] is not None:
                continue
            try:
                t = lower_once(module, inputs, backend, label, adapters)
            except Exception as e:
                errors[label] = _one_line(e)
                continue
            t["order"] = float(len(pair))
            t["pair"] = float(i)
            pair[label] = t
            samples[label].append(t)
        if "stock" in pair and "adapter" in pair:
            pair_ratios.append(pair["adapter"]["lower"] / pair["stock"]["lower"])
        if TAKEOVER_OFF in pair and "adapter" in pair and pair[TAKEOVER_OFF]["preprocess"]:
            takeover.append(pair["adapter"]["preprocess"] / pair[TAKEOVER_OFF]["preprocess"])

    def med(label: str, key: str) -> float | None:
        vals = [x[key] for x in samples[label]]
        return statistics.median(vals) if vals else None

    st, ad = med("stock", "lower"), med("adapter", "lower")
    e_st, e_ad = med("stock", "total"), med("adapter", "total")
    return {
        "stock_cpu_s": st, "adapter_cpu_s": ad,
        "ratio": ad / st if st and ad else None,
        "pair_ratios": pair_ratios,
        "preprocess_after_before": takeover,
        "end_to_end_ratio": e_ad / e_st if e_st and e_ad else None,
        "stages": {label: {k: med(label, k) for k in (*STAGES, "total")}
                   for label in samples if samples[label]},
        "errors": errors,
        "samples": samples,
    }


def _model_rows(per_model: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for name, r in per_model.items():
        fails = [f"{k} fails: {v if len(v) <= 160 else v[:159] + '…'}"
                 for k, v in r["errors"].items() if v]
        note = "; ".join(fails)
        if r["stock_program_unusable"] and not r["errors"]["stock"]:
            note = (note + "; " if note else "") + "stock's program is wrong at run time"
        rows.append([name, str(len(r["pair_ratios"])), fmt_ms(r["stock_cpu_s"]),
                     fmt_ms(r["adapter_cpu_s"]), fmt_ratio(r["ratio"]),
                     fmt_spread(r["pair_ratios"]) if r["pair_ratios"] else "-",
                     fmt_ratio(r["end_to_end_ratio"]), note])
    return rows


def report(out: dict[str, Any]) -> None:
    """The per-model tables, the stage split and the aggregate, on stdout."""
    n_zoo = len(zoo_names())
    for backend, b in out["backends"].items():
        agg = b["aggregate"]
        print(f"\n  {backend} ({b['adapter']}):")
        print(fmt_table(_model_rows(b["models"]),
                     ["model", "pairs", "stock ms", "adapter ms", "adapter/stock",
                      "per pair min-max", "export..pte ratio", "note"]))
        stage_rows = []
        for name, r in b["models"].items():
            for label, st in r["stages"].items():
                lows = [x["lower"] for x in r["samples"][label]]
                stage_rows.append([f"{name} {label}", *(fmt_ms(st[k]) for k in STAGES),
                                   fmt_ms(st["total"]), f"{fmt_ms(min(lows))}-{fmt_ms(max(lows))}"])
        for label, st in agg["stages"].items():
            stage_rows.append([f"sum of {len(agg['models'])} models {label}",
                               *(fmt_ms(st[k]) for k in STAGES), fmt_ms(st["total"]), "-"])
        print(f"\n  {backend}: where a lowering's time goes (CPU ms, medians per model):")
        print(fmt_table(stage_rows, ["model path", *STAGES, "total", "lowering min-max"]))
        if TAKEOVER_OFF in agg["stages"]:
            before, after = agg["stages"][TAKEOVER_OFF], agg["stages"]["adapter"]
            per_pair = [x for r in b["models"].values() for x in r["preprocess_after_before"]]
            print(f"  {backend} preprocess, stock passes (takeover off) -> fusionkit rules: "
                  f"{fmt_ms(before['preprocess'])} -> {fmt_ms(after['preprocess'])} ms = "
                  f"{fmt_ratio(after['preprocess'] / before['preprocess'])}"
                  + (f" (per pair {fmt_spread(per_pair)})" if per_pair else "")
                  + f"; lowering {fmt_ms(before['total'])} -> {fmt_ms(after['total'])} ms")
        if agg["sum_ratio"] is None:
            print(f"  {backend} aggregate: no model lowered by both paths")
            continue
        print(f"  {backend} aggregate over {len(agg['models'])} of {n_zoo} zoo models "
              f"(both paths lower them): sum(adapter)/sum(stock) = {fmt_ratio(agg['sum_ratio'])} "
              f"({fmt_ms(agg['adapter_sum_s'])} / {fmt_ms(agg['stock_sum_s'])} ms); per-model ratios: "
              f"median {fmt_ratio(agg['median_ratio'])}, geometric mean {fmt_ratio(agg['gmean_ratio'])}, "
              f"min-max {agg['ratio_min']:.2f}-{agg['ratio_max']:.2f}; "
              f"export..pte {fmt_ratio(agg['end_to_end_sum_ratio'])}")
    print("  Each model exported from its module and lowered with to_edge_transform_and_lower "
          "then serialized, stock partitioner vs the fusionkit adapter (transform_passes() + "
          "its partitioner), in interleaved pairs alternating which runs first, after one "
          "warm-up per path and backend; CPU time, medians per model. The ratio is judged on "
          "the lowering (edge..preprocess); export..pte adds export and serialization. "
          "Stages as in section 3. 'stock's program is wrong at run time': stock lowers it, "
          "but the Vulkan runtime would reject or abort on it (tests/zoo_models.py "
          "STOCK_FAILS).")


def add_targets(out: dict[str, Any], targets: Targets) -> None:
    """Judged on the aggregate sum ratio: the zoo's total lowering time, as a user pays it."""
    n_zoo = len(zoo_names())
    for backend, b in out["backends"].items():
        agg, limit = b["aggregate"], LIMITS[backend]
        name = f"zoo: {backend} lowering <= {limit:.1f}x stock (aggregate)"
        if agg["sum_ratio"] is None:
            targets.add(name, None, "no model lowered by both paths")
            continue
        left_out = [n for n in b["models"] if n not in agg["models"]]
        targets.add(name, agg["sum_ratio"] <= limit,
                    f"sum(adapter)/sum(stock) {agg['sum_ratio']:.2f}x over "
                    f"{len(agg['models'])} of {n_zoo} models (judged on this); per-model "
                    f"median {agg['median_ratio']:.2f}x, gmean {agg['gmean_ratio']:.2f}x, "
                    f"min-max {agg['ratio_min']:.2f}-{agg['ratio_max']:.2f}"
                    + (f"; not compared: {', '.join(left_out)}" if left_out else ""))


def _code_state() -> dict[str, Any]:
    """The commit measured and the files that differ from it or are new (a shared working tree)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True,
                                  timeout=30).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = [line[3:] for line in git("status", "--porcelain").splitlines() if len(line) > 3]
    return {"head": git("rev-parse", "--short", "HEAD") or "unknown", "dirty": dirty}


def section(models: Sequence[str] | None, pairs: int, warmup: bool, results: dict[str, Any],
            targets: Targets, json_path: str | None = None, takeover_off: bool = False) -> None:
    """Run, print and judge section 6; every sample goes to ``results['zoo_e2e']``.

    With ``json_path``, the figures so far are written there after each model (marked
    ``"partial": true``), so a long run that is cut short keeps what it measured; the
    caller's final write replaces them.
    """
    print("\n== 6. end-to-end over the model zoo: stock vs adapters, by stage ==")
    names = list(models) if models else zoo_names()
    unknown = [n for n in names if n not in zoo_names()]
    if unknown:
        raise SystemExit(f"unknown zoo model(s): {', '.join(unknown)}; known: "
                         f"{', '.join(zoo_names())}")
    print(f"  {len(names)} model(s), {pairs} pair(s) each: {', '.join(names)}")
    load0 = os.getloadavg()
    code = _code_state()
    print(f"  code: commit {code['head']}" + (f", uncommitted changes in {', '.join(code['dirty'])}"
                                             if code["dirty"] else ""))

    def checkpoint(partial: dict[str, Any]) -> None:
        if json_path:
            with open(json_path, "w") as f:
                json.dump({**results, "partial": True, "zoo_e2e": partial}, f, indent=2,
                          default=str)

    out = bench_zoo(names, pairs, warmup, checkpoint=checkpoint, takeover_off=takeover_off)
    # other processes do not count in CPU time, but they share caches and memory bandwidth
    out["code"] = code
    out["load_average_1_5_15"] = {"start": load0, "end": os.getloadavg()}
    print(f"  machine load average (1/5/15 min): start {load0[0]:.2f}/{load0[1]:.2f}/"
          f"{load0[2]:.2f}, end " + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    results["zoo_e2e"] = out
    report(out)
    add_targets(out, targets)


def markdown(out: dict[str, Any]) -> str:
    """The per-model figures of a run as one markdown table (for the README)."""
    def cell(r: dict[str, Any]) -> list[str]:
        if r["ratio"] is None:
            fails = "; ".join(f"{k} fails" for k, v in r["errors"].items() if v)
            return [_s(r["stock_cpu_s"]), _s(r["adapter_cpu_s"]), fails or "-"]
        spread = f" ({fmt_spread(r['pair_ratios'])})" if len(r["pair_ratios"]) > 1 else ""
        return [_s(r["stock_cpu_s"]), _s(r["adapter_cpu_s"]), f"{r['ratio']:.2f}x{spread}"]

    b = out["backends"]
    lines = ["| model | Vulkan stock s | Vulkan adapter s | adapter/stock (pairs) | "
             "XNNPACK stock s | XNNPACK adapter s | adapter/stock (pairs) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in out["models"]:
        row = [name]
        for backend in BACKENDS:
            r = b[backend]["models"].get(name)
            row += cell(r) if r else ["-", "-", "-"]
        lines.append("| " + " | ".join(row) + " |")
    agg_row = ["**sum(adapter)/sum(stock)**"]
    other = ["median / gmean of per-model ratios"]
    for backend in BACKENDS:
        a = b[backend]["aggregate"]
        if a["sum_ratio"] is None:
            agg_row += ["-", "-", "-"]
            other += ["", "", "-"]
            continue
        agg_row += [_s(a["stock_sum_s"]), _s(a["adapter_sum_s"]),
                    f"**{a['sum_ratio']:.2f}x** ({len(a['models'])} models)"]
        other += ["", "", f"{a['median_ratio']:.2f}x / {a['gmean_ratio']:.2f}x "
                          f"(min-max {a['ratio_min']:.2f}-{a['ratio_max']:.2f})"]
    lines.append("| " + " | ".join(agg_row) + " |")
    lines.append("| " + " | ".join(other) + " |")
    return "\n".join(lines)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":  # python -m benchmarks.zoo_e2e RESULTS.json: the README table
    with open(sys.argv[1]) as f:
        print(markdown(json.load(f)["zoo_e2e"]))
