"""Section 7: the Vulkan pass list's first call in a fresh process, fusionkit and stock.

A user lowering one model meets only the first call of the pass list in their process, so
each first-call figure is taken in a fresh process (``python -m benchmarks.first_call
--child PATH BLOCKS ...`` prints one JSON line). In the child, the imports a user has made
before lowering (torch, ExecuTorch, the adapter or the stock Vulkan patterns) and the
programs (the ``norms`` chains of section 5: one fusable RMSNorm and one declined AdaLN norm
per block) are ready first, untimed, and fusionkit's bytecode is compiled beforehand (as an
installed package's is: :func:`compiled_bytecode`); then, in CPU time:

* ``first``: the first call. fusionkit: ``transform_passes()`` built and run on the
  program (rules built, the runtime's probe read, every fixed cost the pass list has);
  stock: ``FusePatternsPass`` as shipped (it re-exports its RoPE pattern graphs on every
  call);
* ``later``: the same call on fresh copies of the program, after the first;
* ``per size``: later calls at several block counts, for the marginal cost per block
  (a least-squares line through the medians; its R^2 says how linear). Stock's slope is
  taken with its pattern graphs cached (as shipped, a fixed ~seconds per call hides it).

Both paths run in their own children, one after the other, ``children`` times each; the
parent prints medians and ratios side by side.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: the block count the first call is judged at (the issue's 64 fused blocks)
BLOCKS = 64


def _fit(points: Sequence[tuple[int, float]]) -> tuple[float, float, float]:
    """Least-squares ``t = a + b * blocks``: (a, b, R^2)."""
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, (1.0 - ss_res / ss_tot) if ss_tot > 0 else 1.0


# ------------------------------------------------------------------------ the child


def _child(path: str, blocks: int, later: int, sizes: Sequence[int], size_runs: int) -> dict[str, Any]:
    import gc
    import time

    warnings.simplefilter("ignore")
    logging.disable(logging.INFO)
    clock = time.process_time
    t0 = clock()
    import executorch.exir  # noqa: F401  (what a user lowering has imported)
    import torch  # noqa: F401

    from benchmarks import graphs

    run: Callable[[Any], Any]
    if path == "fusionkit":
        from fusionkit.backends.vulkan_adapter import transform_passes

        def run(ep: Any) -> Any:
            for p in transform_passes():
                res = p(ep)
                ep = getattr(res, "exported_program", None) or ep
            return ep.graph_module

        sized = run
    else:
        from benchmarks.harness import StockVulkan

        stock = StockVulkan()

        def run(ep: Any) -> Any:
            return stock.fuse(ep).graph_module

        def sized(ep: Any) -> None:
            with stock.cached():
                stock.fuse(ep)

    import_s = clock() - t0
    programs = [graphs.build("norms", blocks) for _ in range(1 + later)]
    nodes = graphs.node_count(programs[0])
    gc.collect()
    t0 = clock()
    gm = run(programs[0])
    first = clock() - t0
    fused = sum(1 for n in gm.graph.nodes if n.op == "call_function"
                and "rms_norm" in str(getattr(n.target, "__name__", n.target)))
    later_s = []
    for ep in programs[1:]:
        gc.collect()
        t0 = clock()
        run(ep)
        later_s.append(clock() - t0)
    if path != "fusionkit" and sizes:
        stock.pattern_graphs()  # exported once, untimed: the slope is the matching's
    per_size: dict[str, list[float]] = {}
    for n in sizes:
        times = []
        for _ in range(size_runs):
            ep = graphs.build("norms", n)
            gc.collect()
            t0 = clock()
            sized(ep)
            times.append(clock() - t0)
        per_size[str(n)] = times
    return {"path": path, "blocks": blocks, "nodes": nodes, "import_s": import_s,
            "fused_rms_norms": fused, "first_s": first, "later_s": later_s, "per_size_s": per_size}


def compiled_bytecode() -> str:
    """A bytecode cache of this tree (``PYTHONPYCACHEPREFIX``), compiled now.

    An installed package has its bytecode (pip compiles it at install time), as torch's and
    ExecuTorch's have here; a source tree run with ``PYTHONDONTWRITEBYTECODE=1`` (this
    machine's setting) compiles fusionkit's modules at every import instead, and the
    modules the pass list imports on its first call would count that compilation as
    fusionkit's first-call cost. The children read this cache: they import what a user
    who installed fusionkit imports."""
    import compileall
    import tempfile

    prefix = tempfile.mkdtemp(prefix="fusionkit-bench-pyc-")
    old = sys.pycache_prefix
    sys.pycache_prefix = prefix
    try:
        for folder in ("fusionkit", "passes", "backends", "benchmarks"):
            compileall.compile_dir(str(ROOT / folder), quiet=1)
    finally:
        sys.pycache_prefix = old
    return prefix


def run_child(path: str, blocks: int, later: int, sizes: Sequence[int],
              size_runs: int, pycache: str | None = None) -> dict[str, Any]:
    """One fresh process: its JSON line (raises with its output when it fails)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = pycache
    cmd = [sys.executable, "-m", "benchmarks.first_call", "--child", path, str(blocks),
           "--later", str(later), "--sizes", ",".join(map(str, sizes)),
           "--size-runs", str(size_runs)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rec: dict[str, Any] = json.loads(lines[-1])
    return rec


# ----------------------------------------------------------------------- the parent


def measure(children: int, blocks: int, later: int, sizes: dict[str, Sequence[int]],
            size_runs: int) -> dict[str, Any]:
    """``children`` fresh processes per path, the paths alternating; medians per path."""
    out: dict[str, Any] = {"blocks": blocks, "children": children, "paths": {}}
    raw: dict[str, list[dict[str, Any]]] = {"fusionkit": [], "stock": []}
    pycache = compiled_bytecode()
    try:
        for i in range(children):
            order = ("fusionkit", "stock") if i % 2 == 0 else ("stock", "fusionkit")
            for path in order:
                # the slope is taken in the first child of each path only (it is not a
                # first-call figure, and the stock pass is slow)
                raw[path].append(run_child(path, blocks, later,
                                           sizes[path] if i == 0 else (), size_runs, pycache))
                print(f"  ... {path} child {i + 1}/{children} done", file=sys.stderr,
                      flush=True)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)
    for path, recs in raw.items():
        firsts = [r["first_s"] for r in recs]
        laters = [t for r in recs for t in r["later_s"]]
        per_size = {n: statistics.median(t for r in recs for t in r["per_size_s"].get(n, []))
                    for n in {n for r in recs for n in r["per_size_s"]}}
        points = sorted((int(n), t) for n, t in per_size.items())
        a, b, r2 = _fit(points) if len(points) >= 2 else (None, None, None)
        first, later_med = statistics.median(firsts), statistics.median(laters)
        out["paths"][path] = {
            "nodes": recs[0]["nodes"], "fused_rms_norms": recs[0]["fused_rms_norms"],
            "import_s": statistics.median(r["import_s"] for r in recs),
            "first_s": first, "first_s_all": firsts, "later_s": later_med, "later_s_all": laters,
            "first_over_later": first / later_med, "fixed_s": first - later_med,
            "per_size_s": {str(n): t for n, t in points}, "intercept_s": a,
            "ms_per_block": None if b is None else b * 1e3, "r2": r2,
        }
    fk, st = out["paths"]["fusionkit"], out["paths"]["stock"]
    out["stock_over_fusionkit_first"] = st["first_s"] / fk["first_s"]
    out["stock_over_fusionkit_later"] = st["later_s"] / fk["later_s"]
    return out


def section(quick: bool, results: dict[str, Any], targets: Any) -> dict[str, Any]:
    from benchmarks.output import fmt_ms, fmt_ratio, fmt_spread, fmt_table

    print("\n== 7. the Vulkan pass list's first call in a fresh process: fusionkit vs stock ==")
    if quick:  # the smoke form: one child per path, small programs
        children, blocks, later, size_runs = 1, 8, 1, 1
        sizes: dict[str, Sequence[int]] = {"fusionkit": (4, 8), "stock": ()}
    else:
        children, blocks, later, size_runs = 5, BLOCKS, 3, 3
        sizes = {"fusionkit": (16, 32, 64, 128, 256, 512), "stock": (16, 32, 64, 128)}
    out = measure(children, blocks, later, sizes, size_runs)
    results["first_call"] = out
    rows = []
    for path, r in out["paths"].items():
        rows.append([path, str(r["nodes"]), str(r["fused_rms_norms"]), fmt_ms(r["import_s"]), fmt_ms(r["first_s"]),
                     "-".join(fmt_ms(x) for x in (min(r["first_s_all"]), max(r["first_s_all"]))),
                     fmt_ms(r["later_s"]), fmt_ratio(r["first_over_later"]),
                     fmt_ms(r["fixed_s"]),
                     "-" if r["ms_per_block"] is None else f"{r['ms_per_block']:.3f}",
                     "-" if r["r2"] is None else f"{r['r2']:.3f}"])
    print(fmt_table(rows, ["path", "nodes", "fused", "imports ms", "first ms", "min-max", "later ms",
                           "first/later", "fixed ms", "ms/block", "R^2"]))
    print(f"  {blocks} blocks (one fused RMSNorm, one declined AdaLN norm each); CPU time; "
          f"first: median of {children} fresh processes per path; later: median of "
          f"{later} calls per process after the first; fixed = first - later. fusionkit: "
          "transform_passes() built and run; stock: FusePatternsPass as shipped (its "
          "RoPE pattern graphs re-exported on every call); fused: rms_norm nodes after the first "
          "call (stock also fuses the AdaLN norms, whose weight is computed). ms/block: least-squares slope "
          "of later calls over " + ", ".join(
              f"{p} {'/'.join(out['paths'][p]['per_size_s'])}" for p in out["paths"])
          + " blocks (stock with its pattern graphs cached). Children read fusionkit's "
          "bytecode compiled beforehand, as an installed package has it.")
    for path, r in out["paths"].items():
        print(f"  {path} later calls by size (ms): " + ", ".join(
            f"{n}: {fmt_ms(t)}" for n, t in r["per_size_s"].items()))
    print(f"  stock/fusionkit: first call {fmt_ratio(out['stock_over_fusionkit_first'])}, "
          f"later calls {fmt_ratio(out['stock_over_fusionkit_later'])}; fusionkit's first "
          "call over its later calls, per process: "
          f"{fmt_spread([x / out['paths']['fusionkit']['later_s'] for x in out['paths']['fusionkit']['first_s_all']])}")
    fk = out["paths"]["fusionkit"]
    judged = not quick
    targets.add("first pass-list call within 2x of later calls @64 blocks",
                None if not judged else fk["first_over_later"] <= 2.0,
                ("--quick: 8 blocks, 1 process" if not judged else
                 f"fusionkit first {fmt_ms(fk['first_s'])} ms, later {fmt_ms(fk['later_s'])} ms "
                 f"({fk['first_over_later']:.2f}x; stock as shipped "
                 f"{out['paths']['stock']['first_over_later']:.2f}x)"))
    slope, r2 = fk["ms_per_block"], fk["r2"]
    targets.add("marginal pass-list cost <= 0.3 ms per block, linear",
                None if not judged or slope is None else slope <= 0.3 and r2 >= 0.98,
                "-" if slope is None else
                f"{slope:.3f} ms/block, R^2 {r2:.3f} (linear when >= 0.98); stock "
                + ("-" if out["paths"]["stock"]["ms_per_block"] is None else
                   f"{out['paths']['stock']['ms_per_block']:.3f}")
                + " ms/block (cached graphs)")
    return out


def main(argv: Sequence[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m benchmarks.first_call", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("PATH", "BLOCKS"),
                    help="fusionkit|stock BLOCKS: measure in this process, print JSON")
    ap.add_argument("--later", type=int, default=3)
    ap.add_argument("--sizes", default="")
    ap.add_argument("--size-runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the smoke form (parent)")
    args = ap.parse_args(argv)
    if args.child:
        path, blocks = args.child
        if path not in ("fusionkit", "stock"):
            ap.error(f"PATH is fusionkit or stock, not {path!r}")
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        print(json.dumps(_child(path, int(blocks), args.later, sizes, args.size_runs)))
        return 0
    from benchmarks.output import Targets

    targets = Targets()
    section(args.quick, {}, targets)
    print()
    print(targets.render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
