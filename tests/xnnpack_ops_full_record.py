"""Run ExecuTorch's whole XNNPACK op suite with fusionkit installed, one shard at a time,
and turn what the plugin recorded into the figures of benchmarks/results.

``python3 tests/xnnpack_ops_full_record.py run SHARD OUT``: runs shard ``SHARD`` of
:data:`xnnpack_ops_stock.SHARDS` of the full suite (every ``XnnpackBackend.preprocess``
twinned: rules off, gates off, ExecuTorch's own preprocess; see
``stock_xnnpack_tests/fusionkit_xnnpack_plugin.py``) with ``OUT/shard-SHARD/`` as its
working folder: ``spy.json`` (the plugin's record), ``stdout.txt``, ``stderr.txt``,
``wall.json``.

``python3 tests/xnnpack_ops_full_record.py summarize OUT JSON MD``: reads every
``OUT/shard-*/spy.json`` and writes the figures (tests passed / failed with reasons,
preprocess calls, byte-identical counts per comparison, the mismatches, what the rules
fused, the gates' skips) as JSON and Markdown. Nothing is typed in by hand: a figure that
is not in the plugin's record is not in the output.

``python3 tests/xnnpack_ops_full_record.py repeat MODE N OUT NODEID...``: runs the given
tests ``N`` times in ``MODE`` (``stock``: fusionkit not installed; ``fusionkit``),
each run in a fresh process, and records each test's outcome and failure line per run
(``OUT/repeat-MODE.json``; with ``FUSIONKIT_XNNPACK_SEED=s`` every run is seeded the
same way, run ``i`` with seed ``s + i``, ``OUT/repeat-MODE-seeds.json``): to tell a flaky numeric check from a difference of ours.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import xnnpack_ops_stock as ops  # noqa: E402


def run(shard: int, out: Path) -> None:
    folder = out / f"shard-{shard}"
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time()
    t0 = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
    # the whole shard takes well over an hour on the loaded machine (run_shard's default
    # timeout); the plugin's record is rewritten after each test, so a stop keeps what ran
    proc, _ = ops.run_shard(shard, folder, mode="fusionkit", which="full", twin=True,
                            timeout=6 * 3600)
    end = time.time()
    (folder / "stdout.txt").write_text(proc.stdout)
    (folder / "stderr.txt").write_text(proc.stderr)
    (folder / "wall.json").write_text(json.dumps({
        "start": t0, "end": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(end)),
        "wall_s": round(end - start, 1), "returncode": proc.returncode,
        "pytest_summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "",
        "loadavg_end": os.getloadavg()}, indent=1))
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])


def _sum_counts(tables: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    total: dict[str, dict[str, int]] = {}
    for table in tables:
        for name, c in table.items():
            slot = total.setdefault(name, {})
            for k, v in c.items():
                slot[k] = slot.get(k, 0) + v
    return dict(sorted(total.items()))


def summarize(out: Path) -> dict[str, Any]:
    shards: list[dict[str, Any]] = []
    for folder in sorted(out.glob("shard-*")):
        spy = folder / "spy.json"
        if not spy.exists():
            continue
        data = json.loads(spy.read_text())
        wall = json.loads((folder / "wall.json").read_text()) if (
            folder / "wall.json").exists() else {}
        twin = data["twin"] or {}
        outcomes = data["outcomes"]
        by_outcome: dict[str, int] = {}
        for t in data["selected"]:
            o = outcomes.get(t, "not recorded")
            by_outcome[o] = by_outcome.get(o, 0) + 1
        shards.append({
            "shard": folder.name, "mode": data["mode"],
            "installed_at_start": data["installed_at_start"],
            "restored_at_end": data["restored_at_end"],
            # a record rewritten after each test says whether the run reached its end
            "finished": data.get("finished", data["restored_at_end"] is not None),
            "tests_run": len(outcomes),
            "tests": len(data["selected"]), "outcomes": by_outcome,
            "not_passed": {t: {"outcome": outcomes.get(t, "not run"),
                               "reason": data["reasons"].get(t, "")}
                           for t in data["selected"] if t in outcomes
                           and outcomes[t] != "passed"},
            "test_seconds": round(sum(data["seconds"].values()), 1),
            "wall": wall,
            "preprocess_calls": twin.get("preprocess_calls", 0),
            "identical": {"gates_off": twin.get("identical", 0),
                          "rules_off": twin.get("rules_off_identical", 0),
                          "stock": twin.get("stock_identical", 0)},
            "mismatches": {"gates_off": twin.get("mismatches", []),
                           "rules_off": twin.get("rules_off_mismatches", []),
                           "stock": twin.get("stock_mismatches", [])},
            "rule_counts": data.get("rule_counts", {}),
            "gate_counts": data.get("gate_counts", {}),
        })
    total_outcomes: dict[str, int] = {}
    for s in shards:
        for o, n in s["outcomes"].items():
            total_outcomes[o] = total_outcomes.get(o, 0) + n
    return {
        "what": "ExecuTorch 1.5.1's whole XNNPACK op suite (executorch/backends/xnnpack/test/"
                "ops, as shipped in the wheel) with fusionkit's XNNPACK adapter installed "
                "process-wide; every XnnpackBackend.preprocess twinned (rules off = stock "
                "pattern passes, gates off, ExecuTorch's own preprocess with fusionkit "
                "uninstalled) and compared byte for byte (payload, named data, debug handles)",
        "produced_by": "python3 tests/xnnpack_ops_full_record.py run 0|1 OUT; summarize",
        "shards": shards,
        "total": {
            "tests": sum(s["tests"] for s in shards), "outcomes": total_outcomes,
            "preprocess_calls": sum(s["preprocess_calls"] for s in shards),
            "identical": {k: sum(s["identical"][k] for s in shards)
                          for k in ("gates_off", "rules_off", "stock")},
            "mismatches": {k: [m for s in shards for m in s["mismatches"][k]]
                           for k in ("gates_off", "rules_off", "stock")},
            "not_passed": {t: v for s in shards for t, v in s["not_passed"].items()},
            "rule_counts": _sum_counts([s["rule_counts"] for s in shards]),
            "gate_counts": _sum_counts([s["gate_counts"] for s in shards]),
        },
    }


def probes(out: Path) -> list[dict[str, Any]]:
    """Pairs of ``xnnpack_ops_seed_probe.py`` records (stock, fusionkit; same test, seed and
    warm-up): per lowering whether the .pte, the RNG state and the inputs are the same, and
    each side's max abs error and pass/fail."""
    found: dict[tuple[str, int, bool], dict[str, Any]] = {}
    for path in sorted(out.glob("probe-*.json")):
        rec = json.loads(path.read_text())
        found.setdefault((rec["test"], rec["seed"], rec.get("warm", False)), {})[
            rec["mode"]] = rec
    pairs = []
    for (test, seed, warm), by_mode in sorted(found.items()):
        if set(by_mode) != {"stock", "fusionkit"}:
            continue
        a, b = by_mode["stock"]["lowerings"], by_mode["fusionkit"]["lowerings"]
        rows = [{"same_pte": x["pte"] == y["pte"], "same_rng": x["torch_rng"] == y["torch_rng"],
                 "same_inputs": x.get("inputs") == y.get("inputs"),
                 "stock": [(e["max_abs"], e["passed"]) for e in x["errors"]],
                 "fusionkit": [(e["max_abs"], e["passed"]) for e in y["errors"]]}
                for x, y in zip(a, b, strict=True)]
        pairs.append({"test": test, "seed": seed, "warm": warm, "lowerings": rows})
    return pairs


def markdown(fig: dict[str, Any], repeats: list[dict[str, Any]]) -> str:
    tot = fig["total"]
    lines = ["# ExecuTorch's whole XNNPACK op suite with fusionkit installed", "",
             fig["what"] + ".", "", f"Produced by `{fig['produced_by']}`.", "",
             "| shard | tests | outcomes | preprocess calls | identical: rules off / gates off /"
             " stock | test time | wall (start, load at end) |",
             "|---|---:|---|---:|---|---:|---|"]
    for s in fig["shards"]:
        w = s["wall"]
        load = w.get("loadavg_end", [0])[0]
        lines.append(
            f"| {s['shard']} | {s['tests']} | "
            + ", ".join(f"{n} {o}" for o, n in sorted(s["outcomes"].items()))
            + f" | {s['preprocess_calls']} | {s['identical']['rules_off']} / "
              f"{s['identical']['gates_off']} / {s['identical']['stock']} | "
              f"{s['test_seconds']:.0f} s | "
              + (f"{w['wall_s']:.0f} s ({w['start']}, {load:.1f}) |" if w else
                 "still running when summarized |"))
    lines.append(
        f"| **all** | {tot['tests']} | "
        + ", ".join(f"{n} {o}" for o, n in sorted(tot["outcomes"].items()))
        + f" | {tot['preprocess_calls']} | {tot['identical']['rules_off']} / "
          f"{tot['identical']['gates_off']} / {tot['identical']['stock']} | | |")
    for s in fig["shards"]:
        if not s["finished"]:
            lines += ["", f"**{s['shard']} did not finish** (running or stopped): {s['tests_run']} of "
                      f"{s['tests']} tests recorded; its figures cover those."]
    lines += ["", "Installed at start / restored at end: "
              + ", ".join(f"{s['shard']}: {s['installed_at_start']}/{s['restored_at_end']}"
                          for s in fig["shards"]), ""]
    lines += ["## Not passed", ""]
    if not tot["not_passed"]:
        lines.append("none")
    for t, v in tot["not_passed"].items():
        lines.append(f"- `{t}`: {v['outcome']}: `{v['reason'][:300]}`")
    lines += ["", "## Byte differences", ""]
    any_mismatch = False
    for k, ms in tot["mismatches"].items():
        for m in ms:
            any_mismatch = True
            lines.append(f"- against {k}: `{m['test']}`: {m['difference']}")
    if not any_mismatch:
        lines.append("none: every preprocess call byte-identical in all three comparisons")
    lines += ["", "## Rules (fused / runs, over the real run and the gates-off twin)", ""]
    for name, c in tot["rule_counts"].items():
        lines.append(f"- {name}: fused {c.get('fused', 0)}, runs {c.get('runs', 0)}")
    lines += ["", "## Gates (ran / skipped, two gated runs per call)", ""]
    for name, c in tot["gate_counts"].items():
        lines.append(f"- {name}: ran {c.get('ran', 0)}, skipped {c.get('skipped', 0)}")
    if repeats:
        lines += ["", "## Repeated runs of the tests that failed", "",
                  "Each run a fresh pytest process; `stock` = fusionkit not installed.", "",
                  "| mode | test | runs | passed | failed | max abs error of each failure |",
                  "|---|---|---:|---:|---:|---|"]
        for rep in repeats:
            mode = rep["mode"] + (f", seeds {rep['seed']}+i" if rep.get("seed") else "")
            for t, runs in rep["tests"].items():
                passed = sum(r["outcome"] == "passed" for r in runs)
                failed = sum(r["outcome"] == "failed" for r in runs)
                errs = [r["max_abs_error"] for r in runs if r.get("max_abs_error") is not None]
                why = ", ".join(f"{e:.4f}" for e in errs)
                if rep.get("seed"):
                    why = ", ".join(f"seed {r['seed']}: {r['max_abs_error']:.4f}" for r in runs
                                    if r.get("max_abs_error") is not None)
                lines.append(f"| {mode} | `{t}` | {len(runs)} | {passed} | {failed} | "
                             f"{why.replace('|', '/')} |")
    if fig.get("probes"):
        lines += ["", "## Seeded probes, stock vs fusionkit (tests/xnnpack_ops_seed_probe.py)", "",
                  "Per seed: lowerings with the same .pte / RNG state / inputs in both modes;"
                  " failures of the harness's check (max abs error).", "",
                  "| test | seed | warm | lowerings | same .pte | same RNG | same inputs |"
                  " stock failed | fusionkit failed |", "|---|---:|---|---:|---:|---:|---:|---|---|"]
        for pr in fig["probes"]:
            rows = pr["lowerings"]

            def failed(side: str, rows: list[dict[str, Any]] = rows) -> str:
                errs = [f"{e:.4f}" for r in rows for e, ok in r[side] if not ok]
                return ", ".join(errs) or "none"

            lines.append(
                f"| `{pr['test'].split('::')[-1]}` | {pr['seed']} | {pr['warm']} | {len(rows)} | "
                f"{sum(r['same_pte'] for r in rows)} | {sum(r['same_rng'] for r in rows)} | "
                f"{sum(r['same_inputs'] for r in rows)} | {failed('stock')} | "
                f"{failed('fusionkit')} |")
    return "\n".join(lines) + "\n"


def _abs_errors(stdout: str) -> dict[str, float]:
    """test name -> the max abs error the harness printed for its failing output."""
    found: dict[str, float] = {}
    sections = re.split(r"\n_{3,} (?:\w+\.)?(\w+) _{3,}\n", stdout)
    for name, body in zip(sections[1::2], sections[2::2], strict=True):
        m = re.search(r"Difference: max: [^,]+, abs: ([0-9.eE+-]+)", body)
        if m:
            found[name] = float(m.group(1))
    return found


def repeat(mode: str, n: int, out: Path, nodeids: list[str]) -> dict[str, Any]:
    base = ops.ops_dir()
    out.mkdir(parents=True, exist_ok=True)
    seed = os.environ.get("FUSIONKIT_XNNPACK_SEED", "")
    tag = f"{mode}-seed{seed}" if seed else mode
    record: dict[str, Any] = {"mode": mode, "seed": seed or None, "tests": {}}
    for i in range(n):
        folder = out / f"repeat-{tag}-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        spy = folder / "spy.json"
        env = {**os.environ, "FUSIONKIT_XNNPACK_SPY": str(spy),
               **({"FUSIONKIT_XNNPACK_SEED": str(int(seed) + i)} if seed else {}),
               "FUSIONKIT_XNNPACK_MODE": mode, "FUSIONKIT_XNNPACK_TWIN": "0",
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        env.pop("FUSIONKIT_SHARD", None)
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *[f"{base}/{t}" for t in nodeids], "-q",
             "-p", "no:cacheprovider", "-p", "no:xdist",
             "-p", "stock_xnnpack_tests.fusionkit_xnnpack_plugin", "-W", "ignore"],
            capture_output=True, text=True, env=env, cwd=str(folder), timeout=3600)
        (folder / "stdout.txt").write_text(proc.stdout)
        data = json.loads(spy.read_text()) if spy.exists() else {}
        errors = _abs_errors(proc.stdout)
        for t in data.get("selected", []):
            record["tests"].setdefault(t, []).append(
                {"run": i, "seed": int(seed) + i if seed else None, "outcome": data["outcomes"].get(t, "?"),
                 "reason": data["reasons"].get(t, ""),
                 "max_abs_error": errors.get(t.split("::")[-1]),
                 "seconds": data["seconds"].get(t, 0)})
        (out / f"repeat-{tag}.json").write_text(json.dumps(record, indent=1))
    return record


def main(argv: list[str]) -> None:
    if argv[0] == "run":
        run(int(argv[1]), Path(argv[2]))
    elif argv[0] == "repeat":
        repeat(argv[1], int(argv[2]), Path(argv[3]), argv[4:])
    elif argv[0] == "summarize":
        out = Path(argv[1])
        fig = summarize(out)
        repeats = [json.loads(p.read_text()) for p in sorted(out.glob("repeat-*.json"))]
        fig["repeats"] = repeats
        fig["probes"] = probes(out)
        Path(argv[2]).write_text(json.dumps(fig, indent=1, sort_keys=True) + "\n")
        Path(argv[3]).write_text(markdown(fig, repeats))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
