"""Run one shard of ExecuTorch's Vulkan delegate suite, the simulator as its runtime and the
real Vulkan runtime as its second oracle.

``executorch/backends/vulkan/test/test_vulkan_delegate.py`` ships in the 1.5.1
wheel. It runs in a subprocess (its imports and registry edits stay out of this
process) through pytest with ``stock_vulkan_tests.simulator_runtime_plugin``:
fusionkit's takeover installed, the simulator in place of the Vulkan runtime.
The suite is split into ``SHARDS`` shards by test index (test ``i`` of the
collected order is in shard ``i % SHARDS``), one test file per shard, so the
two CI workers (``--dist loadfile``) run them in parallel; every test runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

SHARDS = 2
HERE = Path(__file__).parent

#: the suite runs by default (each shard ~4 min of CPU on this project's 2-core CI
#: machine); FUSIONKIT_STOCK_DELEGATE_SUITE=0 leaves it out of a quick local run
OPT_OUT = "FUSIONKIT_STOCK_DELEGATE_SUITE"
requires_opt_in = pytest.mark.skipif(
    os.environ.get(OPT_OUT) == "0",
    reason=f"ExecuTorch's Vulkan delegate suite left out ({OPT_OUT}=0)")


def stock_suite() -> Path:
    import executorch.backends.vulkan as vk

    return Path(next(iter(vk.__path__))) / "test" / "test_vulkan_delegate.py"


def disabled_tests() -> set[str]:
    """Test methods ExecuTorch disables (``@disable_test(...)``): they pass without running."""
    tree = ast.parse(stock_suite().read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                if isinstance(f, ast.Name) and f.id == "disable_test":
                    out.add(node.name)
    return out


def run_shard(shard: int, tmp: Path, *, real: bool = False, path: str = "fusionkit",
              only: Sequence[str] = (), real_skip: Sequence[str] = (), static: bool = False,
              timeout: float = 1800.0, shards: int = SHARDS, cpu_only: bool = False,
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One shard (of ``shards``) in a pytest subprocess; ``real``: every program the tests
    run also runs on the real Vulkan runtime (one child for the shard) but ``real_skip``'s;
    ``path="stock"``: fusionkit not installed; ``only``: just these tests (before sharding);
    ``static``: each recorded program also judged by check() and the probed simulator;
    ``cpu_only``: a program with no delegate passes ``check_vk_delegation``."""
    spy = tmp / "spy.json"
    env = {**os.environ, "FUSIONKIT_DELEGATE_SPY": str(spy),
           "FUSIONKIT_SHARD": f"{shard}/{shards}", "FUSIONKIT_DELEGATE_PATH": path,
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    if real:
        env["FUSIONKIT_DELEGATE_REAL"] = "1"
        env["FUSIONKIT_DELEGATE_REAL_SKIP"] = ",".join(real_skip)
    if only:
        env["FUSIONKIT_DELEGATE_ONLY"] = ",".join(only)
    if static:
        env["FUSIONKIT_DELEGATE_STATIC"] = "1"
    if cpu_only:
        env["FUSIONKIT_DELEGATE_CPU_ONLY"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(stock_suite()), "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "stock_vulkan_tests.simulator_runtime_plugin", "-W", "ignore"],
        capture_output=True, text=True, env=env, cwd=str(tmp), timeout=timeout,
    )
    data = json.loads(spy.read_text()) if spy.exists() else {}
    return proc, data


#: tests of the 1.5.1 suite that need what the public runtime built here lacks (the wheel's
#: own runtime commit is not public): under stock ExecuTorch the real runtime refuses their
#: programs or computes garbage, on the runtime condition named (inspect/runtime_conditions.py)
RUNTIME_GAPS = {
    "test_vulkan_backend_dynamic_arange_float_step": "resize_arange_node",
    "test_vulkan_backend_dynamic_arange_start": "add_arange_node",
    "test_vulkan_backend_dynamic_float_clamp": "add_clamp_node",
    "test_vulkan_backend_index_tensor_nonzero_axis": "indices_list->size() == 1",
    "test_vulkan_backend_dynamic_replicate_pad_time_reduction": "indices_list->size() == 1",
}
#: the gaps whose every failing op fusionkit keeps on the CPU under install()
#: (``vulkan_adapter.broken_conditions``), by the condition it names: no Vulkan delegate is
#: left, and ExecuTorch's test stops in its own ``check_vk_delegation`` (``delegates[0]``:
#: IndexError) before it runs the program. The other gap's program runs, right.
KEPT_OFF = {
    "test_vulkan_backend_dynamic_arange_float_step": "bounds_known_when_built",
    "test_vulkan_backend_dynamic_arange_start": "start_known_when_built",
    "test_vulkan_backend_dynamic_float_clamp": "bounds_known_when_built",
    "test_vulkan_backend_index_tensor_nonzero_axis": "one_index_tensor",
}
KEPT_OFF_EVIDENCE = "check_vk_delegation"
#: run by CI's shards with the simulator only: each of its 6 programs kills the runtime's
#: child process (SIGFPE), a fresh child apiece (python3 tests/vulkan_delegate_stock.py
#: --real runs it on the real runtime too)
REAL_SKIP = ("test_vulkan_backend_dynamic_arange_float_step",)


def check_shard(shard: int, tmp: Path) -> None:
    """One shard under install(), the simulator as the suite's runtime and the real runtime
    as its second oracle: every test passes but the :data:`KEPT_OFF` ones, which stop at
    ExecuTorch's delegation check after fusionkit named their condition; every program the
    tests ran (but :data:`REAL_SKIP`'s) ran on the real runtime equal to eager, and the
    simulator predicted it."""
    proc, data = run_shard(shard, tmp, real=True, real_skip=REAL_SKIP)
    keep = os.environ.get("FUSIONKIT_DELEGATE_KEEP")  # a path: the spy's figures, kept
    if keep:
        Path(keep).write_text(json.dumps({**data, "summary": proc.stdout.strip()[-300:],
                                          "stdout": proc.stdout[-20000:]}))
    tail = (proc.stdout + proc.stderr)[-8000:]
    selected = data["selected"]
    assert len(selected) > 40, selected  # about half of the suite's ~100 tests
    failed = failed_tests(proc.stdout)
    kept = {t for t in selected if t in KEPT_OFF}
    assert failed == kept, (sorted(failed ^ kept), tail)
    for t in kept:
        assert f"condition {KEPT_OFF[t]!r}" in proc.stdout, (t, tail)
    if kept:
        assert KEPT_OFF_EVIDENCE in proc.stdout, tail
    m = re.search(r"(\d+) passed", proc.stdout)
    assert m and int(m.group(1)) >= len(selected) - len(kept), tail
    assert not re.search(r"\d+ (error|skipped)", proc.stdout), tail
    running = [t for t in selected if t not in disabled_tests()]
    assert data["simulate_calls"] >= len(running) // 2, data["simulate_calls"]
    if "test_vulkan_backend_torchao_wo_quantized_linear" in selected:
        assert data["ops"].get("et_vk.linear_q4gsw.default", 0) >= 2, data["ops"]
    if os.environ.get("FUSIONKIT_REQUIRE_VULKAN_RUNTIME") == "1" or os.environ.get("CI") == "true":
        assert "real_error" not in data, data.get("real_error")
    if "real_error" in data:  # no runtime here: the simulator was the only oracle
        return
    real = real_verdicts(data)
    assert len(real) >= data["simulate_calls"] // 2, len(real)
    # "not run": the test stopped at an earlier input set, the simulator said nothing here
    bad = [f"{r['key']}: real={r['real']} ({r['message']}), simulator={r['sim']}, "
           f"max |real - eager|={r['max_abs_err']}" for r in real
           if r["sim"] not in ("not run", r["real"]) or r["real"] != "ok"]
    assert not bad, bad


def failed_tests(stdout: str) -> set[str]:
    """Tests with a failure (a subtest's too: ``SUBFAILED(step=0.5) path::test``) in
    pytest -q output."""
    return set(re.findall(r"(?:SUB)?FAIL(?:ED)?(?:[\[(][^\])]*[\])])? \S+::(test_\w+)", stdout))


# ---------------------------------------------- the real runtime as the suite's oracle

#: the fidelity doc's section this file writes (between the markers; the rest is
#: tests/vulkan_real_programs.py's)
SECTION = ("<!-- delegate-suite:begin -->", "<!-- delegate-suite:end -->")


def real_verdicts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The spy's real-runtime records, each keyed by (test, k): its k-th program run."""
    seen: dict[str, int] = {}
    out = []
    for rec in data.get("real", []):
        k = seen.get(rec["test"], 0)
        seen[rec["test"]] = k + 1
        out.append({**rec, "key": f"{rec['test']}#{k}"})
    return out


def real_failures(data: dict[str, Any]) -> list[str]:
    """Every fusionkit program the real runtime did not run equal to eager, and every one
    whose outcome the simulator (the suite's runtime while its tests run) did not predict."""
    assert "real_error" not in data, data["real_error"]
    bad = []
    for rec in real_verdicts(data):
        if rec["real"] != "ok" or rec["sim"] != rec["real"]:
            bad.append(f"{rec['key']}: real={rec['real']} ({rec['message']}), "
                       f"simulator={rec['sim']}, max |real - eager|={rec['max_abs_err']}")
    return bad


def run_whole_suite(out_json: Path, paths: Sequence[str] = ("fusionkit", "stock")) -> None:
    """Every shard, both lowerings, on the real runtime, every program also judged by
    check() and the probed simulator; the spies saved to ``out_json`` after each shard
    (a run already there is kept, so one lowering can be added to the other's)."""
    import tempfile
    import time

    runs: dict[str, Any] = json.loads(out_json.read_text()) if out_json.exists() else {}
    for path in paths:
        for shard in range(SHARDS):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                proc, data = run_shard(shard, Path(d), real=True, path=path, static=True,
                                       timeout=3600.0)
                data["wall_seconds"] = time.perf_counter() - t0
                data["returncode"] = proc.returncode
                data["summary"] = (proc.stdout.strip().splitlines() or [""])[-1]
                data["failed"] = sorted(failed_tests(proc.stdout))
                runs[f"{path}/{shard}"] = data
                print(path, shard, data["summary"], f"{data['wall_seconds']:.0f} s", flush=True)
                out_json.write_text(json.dumps(runs, indent=1))


#: op families of the suite's tests, by the first keyword in the test's name (in order)
FAMILIES = (
    ("quantized", ("quantized", "torchao", "pt2e")),
    ("convolution", ("conv",)),
    ("pooling", ("pool",)),
    ("normalization", ("norm", "softmax")),
    ("linear / matmul", ("linear", "matmul", "bmm")),
    ("indexing / arange", ("index", "arange", "embedding", "select", "slice", "grid_priors",
                           "flip", "pad")),
    ("shape / copy", ("view", "reshape", "squeeze", "permute", "cat", "split", "clone",
                      "repeat", "t_default", "full", "upsample", "high_dimensional",
                      "different_required_reprs", "sym_size", "zero_dim", "internal_data",
                      "partial")),
    ("reduction", ("sum", "mean")),
    ("binary", ("add", "sub", "mul", "div", "pow", "minimum", "arithmetic")),
    ("unary / activation", ("clamp", "cos", "sin", "exp", "neg", "relu", "sqrt", "abs",
                            "sigmoid", "tanh", "gelu", "hardshrink", "hardtanh")),
)


def family(test: str) -> str:
    name = test.removeprefix("test_vulkan_backend_")
    for fam, words in FAMILIES:
        if any(w in name for w in words):
            return fam
    return "other"


def outcome(rec: dict[str, Any]) -> str:
    """What the real runtime did: ok, wrong, refused (it raised: at load or execute),
    aborted (the child process died), timed out."""
    if rec["real"] != "refused":
        return str(rec["real"])
    return {"abort": "aborted", "timeout": "timed out"}.get(rec.get("status", ""), "refused")


def _coarse(real: str) -> str:
    return "refused" if real in ("refused", "aborted", "timed out") else real


def agreement(rec: dict[str, Any]) -> dict[str, bool | None]:
    """Whether each static tool predicted the runtime's outcome (None: it said nothing —
    the simulator did not run that input set, or no probe was cached)."""
    real = _coarse(outcome(rec))
    out: dict[str, bool | None] = {}
    for key in ("sim", "sim_probed"):
        said = rec.get(key)
        out[key] = None if said in (None, "not run", "no probe") else said == real
    for key in ("check", "check_probed"):
        said = rec.get(key)
        out[key] = None if said is None else bool(said) == (real != "ok")
    return out


TOOLS = (("sim", "simulator"), ("sim_probed", "simulator + probe"), ("check", "check()"),
         ("check_probed", "check() + probe"))
OUTCOMES = ("ok", "wrong", "refused", "aborted", "timed out")


def _agree_cell(recs: list[dict[str, Any]], key: str) -> str:
    said = [agreement(r)[key] for r in recs]
    judged = [s for s in said if s is not None]
    silent = len(said) - len(judged)
    return f"{sum(judged)}/{len(judged)}" + (f" (+{silent} silent)" if silent else "")


def _tool_cell(rec: dict[str, Any], key: str) -> str:
    said = rec.get(key)
    text = ((f"{len(said)} problem(s)" if said else "no problems")
            if key.startswith("check") and said is not None else str(said))
    return text + (" **no**" if agreement(rec)[key] is False else "")


def suite_markdown(runs: dict[str, Any], *, detail: bool = True) -> str:
    """The fidelity doc's section on ExecuTorch's delegate suite, stock vs fusionkit, from
    :func:`run_whole_suite`; ``detail``: with every program not ok or mispredicted."""
    by_path: dict[str, list[dict[str, Any]]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for name, data in runs.items():
        path = name.split("/")[0]
        by_path.setdefault(path, []).extend(real_verdicts(data))
        m = meta.setdefault(path, {"summary": [], "wall": 0.0, "real": 0.0, "failed": []})
        m["summary"].append(data.get("summary", ""))
        m["wall"] += data.get("wall_seconds", 0.0)
        m["real"] += data.get("real_seconds", 0.0)
        m["failed"] += data.get("failed", [])
    device = next((d.get("device") for d in runs.values() if d.get("device")), "unknown")
    lines = [SECTION[0], "", "## ExecuTorch's Vulkan delegate suite, stock vs fusionkit", "",
             "Written by `python3 tests/vulkan_delegate_stock.py --real JSON stock fusionkit` "
             f"(device: {device}). Every test of "
             "`executorch/backends/vulkan/test/test_vulkan_delegate.py` (1.5.1 wheel) runs in "
             "two shards with the simulator as the runtime its tests run on; every program a test "
             "runs (each input set of `sample_inputs` and `test_inputs`) is recorded and run "
             "afterwards on the real runtime, one child process per shard (a fresh one after "
             "an abort), and judged with the test's own `torch.allclose(atol, rtol)` against "
             "eager: **ok**, **wrong** (ran, values differ), **refused** (the runtime raised, "
             "at load or execute), **aborted** (it killed the process). Each program is also "
             "judged by `check()` and the simulator, plain and given the probed runtime's "
             "inventory. *fusionkit*: the suite with fusionkit's takeover installed (as the CI "
             "shards run it); *stock*: ExecuTorch 1.5.1 alone (`FUSIONKIT_DELEGATE_PATH=stock`; "
             "its constant pattern graphs built once per shard). The simulator *agrees* when it "
             "predicts the runtime's outcome (ok / wrong / stopped); `check()` when it reports "
             "problems exactly for the programs not ok; *silent*: the simulator did not run "
             "that input set (its test had stopped at an earlier one).", "",
             "| lowering | pytest (2 shards) | programs | ok | wrong | refused | aborted "
             "| simulator agrees | simulator + probe | check() agrees | check() + probe "
             "| wall (s) | on the runtime (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path, recs in by_path.items():
        m = meta[path]
        count = {k: sum(outcome(r) == k for r in recs) for k in OUTCOMES}
        summary = "; ".join(re.sub(r" in [\d.]+s( \(.*?\))?", "", s) for s in m["summary"])
        lines.append(f"| {path} | {summary} | {len(recs)} | {count['ok']} | {count['wrong']} | "
                     f"{count['refused']} | {count['aborted'] + count['timed out']} | "
                     + " | ".join(_agree_cell(recs, k) for k, _ in TOOLS)
                     + f" | {m['wall']:.0f} | {m['real']:.0f} |")
    fams = sorted({family(r["test"]) for recs in by_path.values() for r in recs})
    lines += ["", "Per op family (the test's name): programs not ok on the runtime, and the "
              "static tools' agreement, both lowerings together:", "",
              "| family | lowering | programs | not ok | simulator | simulator + probe "
              "| check() | check() + probe |", "|---|---|---|---|---|---|---|---|"]
    for fam in fams:
        for path, recs in by_path.items():
            rs = [r for r in recs if family(r["test"]) == fam]
            if rs:
                lines.append(f"| {fam} | {path} | {len(rs)} | "
                             f"{sum(outcome(r) != 'ok' for r in rs)} | "
                             + " | ".join(_agree_cell(rs, k) for k, _ in TOOLS) + " |")
    if {"fusionkit", "stock"} <= set(by_path):
        ours = {r["key"]: r for r in by_path["fusionkit"]}
        theirs = {r["key"]: r for r in by_path["stock"]}
        both = [k for k in ours if k in theirs]
        same_bytes = sum(ours[k].get("pte_sha256") is not None
                         and ours[k].get("pte_sha256") == theirs[k].get("pte_sha256")
                         for k in both)
        differ = [k for k in both if outcome(ours[k]) != outcome(theirs[k])]
        only = sorted(set(ours) ^ set(theirs))
        lines += ["", f"Both lowerings ran {len(both)} programs; {same_bytes} are byte-identical "
                  "`.pte`s (the others hold weights the tests draw unseeded in each process, "
                  "so their bytes differ between any two runs). Their outcomes on the runtime "
                  "differ on "
                  f"{len(differ)}" + (":" if differ else "."), ""]
        if differ:
            lines += ["| test#program | fusionkit | stock | stock's message / ours |",
                      "|---|---|---|---|"]
            for k in differ:
                msg = theirs[k]["message"] or ours[k]["message"] or ""
                lines.append(f"| {k} | {outcome(ours[k])} | {outcome(theirs[k])} | "
                             f"`{_short(msg, 120)}` |" if msg else
                             f"| {k} | {outcome(ours[k])} | {outcome(theirs[k])} | |")
        if only:
            lines.append(f"\nRun by one lowering only: {', '.join(only)}")
    bad = [(p, r) for p, recs in by_path.items() for r in recs
           if outcome(r) != "ok" or any(v is False for v in agreement(r).values())]
    if bad and detail:
        lines += ["", "Every program not ok on the runtime, or whose outcome a static tool did "
                  "not predict (**no**: it disagrees):", "",
                  "| lowering | test#program | real runtime | simulator | simulator + probe "
                  "| check() | check() + probe | max abs err |",
                  "|---|---|---|---|---|---|---|---|"]
        for path, r in bad:
            msg = f": `{_short(r['message'] or '', 110)}`" if r["message"] else ""
            lines.append(f"| {path} | {r['key']} | {outcome(r)}{msg} | "
                         + " | ".join(_tool_cell(r, k) for k, _ in TOOLS)
                         + f" | {r['max_abs_err']} |")
    for path, m in meta.items():
        if m["failed"]:
            lines.append(f"\n{path}: pytest failures (the simulator as runtime): "
                         f"{', '.join(m['failed'])}")
    lines += ["", SECTION[1]]
    return "\n".join(lines) + "\n"


def _short(text: str, n: int) -> str:
    text = " ".join(text.split()).replace("|", "/").replace("`", "'")
    text = re.sub(r"(RuntimeError: )?Exception raised from (\w+) at \S+/impl/", r"\2: ", text)
    return text if len(text) <= n else text[: n - 1] + "…"


def write_section(doc: Path, section: str) -> None:
    """Replace (or append) this file's section of the fidelity doc."""
    text = doc.read_text() if doc.exists() else ""
    if SECTION[0] in text and SECTION[1] in text:
        head, rest = text.split(SECTION[0], 1)
        tail = rest.split(SECTION[1], 1)[1].lstrip("\n")
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)


def write_results(prefix: Path, runs: dict[str, Any]) -> None:
    """A dated results pair: every program's verdicts (JSON) and the section (md)."""
    keep = ("path", "selected", "failed", "summary", "returncode", "wall_seconds",
            "real_seconds", "simulate_calls", "device", "real", "real_error")
    slim = {name: {k: data[k] for k in keep if k in data} for name, data in runs.items()}
    prefix.with_suffix(".json").write_text(json.dumps(slim, indent=1) + "\n")
    body = suite_markdown(runs, detail=False).replace(SECTION[0], "").replace(SECTION[1], "").strip()
    prefix.with_suffix(".md").write_text(body.replace("## ", "# ", 1) + "\n")


def main(argv: list[str]) -> int:
    """``--real [JSON [PATH ...]]``: the whole suite on the real runtime, lowered by each
    PATH (``fusionkit``, ``stock``; default both: about 20 minutes of CPU each, niced),
    spies kept in JSON (added to a run already there); ``--render JSON [--results PREFIX]``:
    rewrite the doc's section from them (and write PREFIX.json / PREFIX.md)."""
    doc = HERE.parent / "docs" / "vulkan-runtime-fidelity.md"
    if argv[:1] == ["--render"]:
        runs = json.loads(Path(argv[1]).read_text())
        if argv[2:3] == ["--results"]:  # also benchmarks/results/<PREFIX>.json and .md
            write_results(Path(argv[3]), runs)
    elif argv[:1] == ["--real"]:
        out = Path(argv[1] if len(argv) > 1 else "/tmp/fusionkit-delegate-suite-real.json")
        run_whole_suite(out, tuple(argv[2:]) or ("fusionkit", "stock"))
        runs = json.loads(out.read_text())
    else:
        print(main.__doc__)
        return 2
    write_section(doc, suite_markdown(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
