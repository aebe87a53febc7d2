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
              only: Sequence[str] = (), real_skip: Sequence[str] = ()
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One shard in a pytest subprocess; ``real``: every program the tests run also runs on
    the real Vulkan runtime (one child for the shard) but ``real_skip``'s;
    ``path="stock"``: fusionkit not installed; ``only``: just these tests (before sharding)."""
    spy = tmp / "spy.json"
    env = {**os.environ, "FUSIONKIT_DELEGATE_SPY": str(spy),
           "FUSIONKIT_SHARD": f"{shard}/{SHARDS}", "FUSIONKIT_DELEGATE_PATH": path,
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    if real:
        env["FUSIONKIT_DELEGATE_REAL"] = "1"
        env["FUSIONKIT_DELEGATE_REAL_SKIP"] = ",".join(real_skip)
    if only:
        env["FUSIONKIT_DELEGATE_ONLY"] = ",".join(only)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(stock_suite()), "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-p", "stock_vulkan_tests.simulator_runtime_plugin", "-W", "ignore"],
        capture_output=True, text=True, env=env, cwd=str(tmp), timeout=1800,
    )
    data = json.loads(spy.read_text()) if spy.exists() else {}
    return proc, data


#: tests of the 1.5.1 suite that need what the public runtime built here lacks (the wheel's
#: own runtime commit is not public): the real runtime refuses their programs or computes
#: garbage, and the simulator stops on the same condition (inspect/runtime_conditions.py)
RUNTIME_GAPS = {
    "test_vulkan_backend_dynamic_arange_float_step": "resize_arange_node",
    "test_vulkan_backend_dynamic_arange_start": "add_arange_node",
    "test_vulkan_backend_dynamic_float_clamp": "add_clamp_node",
    "test_vulkan_backend_index_tensor_nonzero_axis": "indices_list->size() == 1",
    "test_vulkan_backend_dynamic_replicate_pad_time_reduction": "indices_list->size() == 1",
}
#: run by CI's shards with the simulator only: each of its 6 programs kills the runtime's
#: child process (SIGFPE), a fresh child apiece (python3 tests/vulkan_delegate_stock.py
#: --real runs it on the real runtime too)
REAL_SKIP = ("test_vulkan_backend_dynamic_arange_float_step",)


def check_shard(shard: int, tmp: Path) -> None:
    """One shard with the simulator as the suite's runtime and the real runtime as its
    second oracle: every test passes but the :data:`RUNTIME_GAPS`, which fail on their
    runtime condition; every program the tests ran (but :data:`REAL_SKIP`'s) ran on the
    real runtime equal to eager, or — a gap — not, and the simulator predicted which."""
    proc, data = run_shard(shard, tmp, real=True, real_skip=REAL_SKIP)
    keep = os.environ.get("FUSIONKIT_DELEGATE_KEEP")  # a path: the spy's figures, kept
    if keep:
        Path(keep).write_text(json.dumps({**data, "summary": proc.stdout.strip()[-300:],
                                          "stdout": proc.stdout[-20000:]}))
    tail = (proc.stdout + proc.stderr)[-8000:]
    selected = data["selected"]
    assert len(selected) > 40, selected  # about half of the suite's ~100 tests
    failed = failed_tests(proc.stdout)
    gaps = {t for t in selected if t in RUNTIME_GAPS}
    assert failed == gaps, (sorted(failed ^ gaps), tail)
    for t in gaps:
        assert RUNTIME_GAPS[t] in proc.stdout, (t, tail)
    m = re.search(r"(\d+) passed", proc.stdout)
    assert m and int(m.group(1)) >= len(selected) - len(gaps), tail
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
           if r["sim"] not in ("not run", r["real"])
           or (r["real"] != "ok" and r["test"] not in RUNTIME_GAPS)]
    assert not bad, bad
    # each gap shows on the runtime (a program of it may still come out right by chance)
    shown = {r["test"] for r in real if r["real"] != "ok"}
    assert gaps - set(REAL_SKIP) <= shown, sorted(gaps - set(REAL_SKIP) - shown)


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
    whose outcome the simulator (the suite's runtime in the session) did not predict."""
    assert "real_error" not in data, data["real_error"]
    bad = []
    for rec in real_verdicts(data):
        if rec["real"] != "ok" or rec["sim"] != rec["real"]:
            bad.append(f"{rec['key']}: real={rec['real']} ({rec['message']}), "
                       f"simulator={rec['sim']}, max |real - eager|={rec['max_abs_err']}")
    return bad


def run_whole_suite(out_json: Path, paths: Sequence[str] = ("fusionkit", "stock")) -> None:
    """Every shard, both lowerings, on the real runtime; the spies saved to ``out_json``."""
    import tempfile
    import time

    runs: dict[str, Any] = {}
    for path in paths:
        for shard in range(SHARDS):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                proc, data = run_shard(shard, Path(d), real=True, path=path)
                data["wall_seconds"] = time.perf_counter() - t0
                data["returncode"] = proc.returncode
                data["summary"] = (proc.stdout.strip().splitlines() or [""])[-1]
                data["failed"] = sorted(failed_tests(proc.stdout))
                runs[f"{path}/{shard}"] = data
                print(path, shard, data["summary"], f"{data['wall_seconds']:.0f} s", flush=True)
                out_json.write_text(json.dumps(runs, indent=1))


def suite_markdown(runs: dict[str, Any]) -> str:
    """The fidelity doc's section on ExecuTorch's delegate suite, from :func:`run_whole_suite`."""
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
    lines = [SECTION[0], "", "## ExecuTorch's own Vulkan delegate suite on the real runtime", "",
             "Written by `python3 tests/vulkan_delegate_stock.py --real` (device: "
             f"{device}). Every test of `executorch/backends/vulkan/test/test_vulkan_delegate.py` "
             "(1.5.1 wheel) runs with the simulator as its in-session runtime; every program a "
             "test runs (each input set of `sample_inputs` and `test_inputs`) is recorded and "
             "run afterwards on the real runtime, one child process per shard, and judged with "
             "the test's own `torch.allclose(atol, rtol)` against eager. *fusionkit*: the suite "
             "with fusionkit's takeover installed; *stock*: ExecuTorch 1.5.1 alone.", "",
             "| lowering | pytest (2 shards) | programs run | equal to eager | wrong | refused "
             "| simulator agrees | wall (s) | of it on the runtime (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path, recs in by_path.items():
        m = meta[path]
        count = {k: sum(r["real"] == k for r in recs) for k in ("ok", "wrong", "refused")}
        agree = sum(r["sim"] == r["real"] for r in recs)
        lines.append(f"| {path} | {'; '.join(m['summary'])} | {len(recs)} | {count['ok']} | "
                     f"{count['wrong']} | {count['refused']} | {agree}/{len(recs)} | "
                     f"{m['wall']:.0f} | {m['real']:.0f} |")
    notok = [(p, r) for p, recs in by_path.items() for r in recs
             if r["real"] != "ok" or r["sim"] != r["real"]]
    if notok:
        lines += ["", "Programs not equal to eager on the runtime, or whose outcome the simulator "
                  "did not predict:", "", "| lowering | test#program | real runtime | simulator "
                  "| max abs err |", "|---|---|---|---|---|"]
        for path, r in notok:
            msg = f": `{_short(r['message'] or '', 130)}`" if r["message"] else ""
            lines.append(f"| {path} | {r['key']} | {r['real']}{msg} | {r['sim']} | "
                         f"{r['max_abs_err']} |")
    if {"fusionkit", "stock"} <= set(by_path):
        ours = {r["key"]: r for r in by_path["fusionkit"]}
        theirs = {r["key"]: r for r in by_path["stock"]}
        differ = [k for k in ours if k in theirs and ours[k]["real"] != theirs[k]["real"]]
        only = sorted(set(ours) ^ set(theirs))
        lines += ["", f"Stock's program and fusionkit's differ in outcome on {len(differ)} of "
                  f"{len(set(ours) & set(theirs))} programs both ran"
                  + (":" if differ else ".")]
        for k in differ:
            lines.append(f"- {k}: fusionkit {ours[k]['real']}, stock {theirs[k]['real']}"
                         + (f" (`{_short(theirs[k]['message'] or ours[k]['message'] or '', 110)}`)"
                            if (theirs[k]["message"] or ours[k]["message"]) else ""))
        if only:
            lines.append(f"- run by one lowering only: {', '.join(only)}")
    for path, m in meta.items():
        if m["failed"]:
            lines.append(f"- {path}: pytest failures (the simulator as runtime): "
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


def main(argv: list[str]) -> int:
    """``--real [JSON]``: the whole suite both ways on the real runtime (about 15 minutes of
    CPU), spies kept in JSON; ``--render JSON``: rewrite the doc's section from them."""
    doc = HERE.parent / "docs" / "vulkan-runtime-fidelity.md"
    if argv[:1] == ["--render"]:
        runs = json.loads(Path(argv[1]).read_text())
    elif argv[:1] == ["--real"]:
        out = Path(argv[1] if len(argv) > 1 else "/tmp/fusionkit-delegate-suite-real.json")
        run_whole_suite(out)
        runs = json.loads(out.read_text())
    else:
        print(main.__doc__)
        return 2
    write_section(doc, suite_markdown(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
