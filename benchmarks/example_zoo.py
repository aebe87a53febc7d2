"""ExecuTorch's example zoo (``executorch.examples.models``) under fusionkit, as a user runs it.

For every model of ``MODEL_NAME_TO_MODEL``:

* **build**: ``EagerModelFactory.create_model`` offline (``HF_HUB_OFFLINE=1``); a model that
  does not build is recorded with the exact exception.
* **xnnpack**: ExecuTorch's own ``python -m executorch.examples.xnnpack.aot_compiler
  --model_name NAME --delegate`` (and ``--quantize`` where ``MODEL_NAME_TO_OPTIONS`` has
  the model), unedited, once stock and once under ``fusionkit exec --backend xnnpack``;
  each ``.pte`` run through ``portable_lib`` and compared with eager (quantized: with the
  fake-quantized, pt2e-converted model the command itself built) and with each other.
  A model the command refuses (it looks every model up in ``MODEL_NAME_TO_OPTIONS``, even
  without ``--quantize``) is lowered in-process the way the command lowers
  (``XnnpackPartitioner`` + ``get_transform_passes()``), stock and with the adapter.
* **vulkan**: stock ``VulkanPartitioner`` and fusionkit's (+ ``transform_passes()``), each
  program run on the real Vulkan runtime in a child process.
* **arm**: stock ``TOSAPartitioner`` and the adapter's, ``TOSA-1.0+FP``, run on the TOSA
  reference model.

Weights: torch seeds its generator randomly at start here, and the example models are
randomly initialised, so two runs of the command build different weights. To compare a
program with eager and stock with fusionkit, the command is run through :func:`observe`
(``python -m benchmarks.example_zoo observe OUT -- MODULE ARGS...``): it seeds torch,
wraps ``EagerModelFactory.create_model`` and the example's ``quantize`` to record the
example inputs, the eager outputs and the fake-quantized outputs, then runs the module as
``python -m`` would (``runpy``) -- the command's code is not changed.

Run from the repository root (``scripts/example-zoo`` does)::

    python3 -m benchmarks.example_zoo [--models mul,linear] [--backends xnnpack,vulkan,arm]
        [--json OUT.json] [--md OUT.md] [--timeout 1800]

Each export runs in its own process, one at a time.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AOT_COMPILER = "executorch.examples.xnnpack.aot_compiler"
SEED = 0
BACKENDS = ("xnnpack", "vulkan", "arm")

__all__ = [
    "AOT_COMPILER",
    "BACKENDS",
    "aot_compile",
    "compare",
    "fusionkit_exec_argv",
    "main",
    "model_names",
    "observe",
    "run_pte",
    "zoo_row",
]


# ----------------------------------------------------------------------------- helpers


def model_names() -> list[str]:
    from executorch.examples.models import MODEL_NAME_TO_MODEL

    return list(MODEL_NAME_TO_MODEL)


def aot_options() -> dict[str, str]:
    """Model -> the quantization ``aot_compiler --quantize`` uses for it."""
    from executorch.examples.xnnpack import MODEL_NAME_TO_OPTIONS

    return {k: v.quantization.name for k, v in MODEL_NAME_TO_OPTIONS.items()}


def _leaves(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out.detach()]
    return [t.detach() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _flat_inputs(inputs: Any) -> list[Any]:
    import torch

    return list(torch.utils._pytree.tree_leaves(inputs))


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:400]


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    f = tb[-1]
    path = f.filename.split("site-packages/")[-1]
    return f"{path}:{f.lineno}"


def compare(got: Sequence[Any], want: Sequence[Any]) -> float | None:
    """Largest absolute difference over every output; None when the outputs do not pair
    (count, shape) or either side is missing."""
    if got is None or want is None or len(got) != len(want):
        return None
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if tuple(g.shape) != tuple(w.shape):
            return None
        if g.numel():
            worst = max(worst, float((g.double() - w.double()).abs().max()))
    return worst


def run_pte(pte: bytes, inputs: Sequence[Any]) -> list[Any]:
    """Run a program's ``forward`` through ExecuTorch's ``portable_lib`` (XNNPACK and the
    portable and quantized CPU kernels registered)."""
    import importlib

    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    # quantize/dequantize outside a delegate; needs portable_lib loaded first
    importlib.import_module("executorch.kernels.quantized")

    module = _load_for_executorch_from_buffer(pte)
    return _leaves(list(module.run_method("forward", tuple(inputs))))


# ----------------------------------------------------------------------------- observe


def observe(out: str, module: str, args: Sequence[str]) -> None:
    """Run ``python -m module args`` in this process with torch seeded, recording what the
    example factory built (inputs, eager outputs) and what ``quantize`` returned (its
    outputs on the example inputs) to ``out`` (``torch.save``)."""
    import torch
    from executorch.examples.models import model_factory
    from executorch.examples.xnnpack.quantization import utils as quant_utils

    record: dict[str, Any] = {"module": module, "args": list(args), "seed": SEED}
    original_create = model_factory.EagerModelFactory.create_model
    original_quantize = quant_utils.quantize

    def save() -> None:
        torch.save(record, out)

    def create_model(*a: Any, **k: Any) -> Any:
        made = original_create(*a, **k)
        model, inputs = made[0], made[1]
        with torch.no_grad():
            record["eager"] = _leaves(copy.deepcopy(model).eval()(*inputs))
        record["inputs"] = _flat_inputs(inputs)
        record["inputs_tree"] = inputs
        save()
        return made

    def quantize(model: Any, inputs: Any, *a: Any, **k: Any) -> Any:
        quantized = original_quantize(model, inputs, *a, **k)
        with torch.no_grad():
            record["fake_quantized"] = _leaves(quantized(*inputs))
        save()
        return quantized

    model_factory.EagerModelFactory.create_model = staticmethod(create_model)  # type: ignore[method-assign]
    quant_utils.quantize = quantize
    torch.manual_seed(SEED)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


# ----------------------------------------------------------------------------- subprocesses


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def fusionkit_exec_argv(backends: str, report: str | None = None) -> list[str]:
    """``fusionkit exec --backend ...`` as this Python runs it (the console script's own
    entry point, so the same interpreter and install)."""
    argv = [sys.executable, "-c", "import sys; from fusionkit.app.cli import main; sys.exit(main())",
            "exec", "--backend", backends]
    return argv + (["--report", report] if report else [])


def _tail(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and "Warning" not in ln
             and "warn(" not in ln and "return cls.__new__" not in ln]
    return "\n".join(lines[-n:])


def _error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("fusionkit exec:") or ln.startswith("    "):
            continue
        if "Error" in ln or "Exception" in ln:
            return ln[:400]
    return (lines[-1] if lines else "no output")[:400]


def aot_compile(name: str, *, quantize: bool, fusionkit: bool, work: Path,
                timeout: float = 1800, observed: bool = True) -> dict[str, Any]:
    """Run ExecuTorch's XNNPACK ``aot_compiler`` for ``name`` (stock, or under ``fusionkit
    exec --backend xnnpack``) into ``work``; with ``observed``, through :func:`observe`.
    Returns the exit code, seconds, the ``.pte`` path, the observation and the report."""
    out_dir = work / ("fusionkit" if fusionkit else "stock") / ("q8" if quantize else "fp32")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["--model_name", name, "--delegate", *(["--quantize"] if quantize else []),
            "-o", str(out_dir)]
    obs = out_dir / "observed.pt"
    report = out_dir / "report.json"
    command = ([sys.executable, "-m", "benchmarks.example_zoo", "observe", str(obs), "--",
                AOT_COMPILER, *args] if observed else [sys.executable, "-m", AOT_COMPILER, *args])
    if fusionkit:  # the launcher takes the same command after `--`
        command = [*fusionkit_exec_argv("xnnpack", str(report)), "--", *command]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        code, stderr = -9, f"timeout after {timeout:.0f} s\n{e.stderr or ''}"
    result: dict[str, Any] = {"exit_code": code, "seconds": round(time.perf_counter() - t0, 1),
                              "command": command}
    ptes = sorted(out_dir.glob("*.pte"))
    result["pte"] = str(ptes[0]) if ptes and code == 0 else None
    result["observed"] = str(obs) if obs.exists() else None
    if report.exists():
        result["report"] = json.loads(report.read_text())
    if code != 0:
        result["error"] = _error_line(stderr)
        result["stderr_tail"] = _tail(stderr)
    return result


def _worker(name: str, step: str, out: Path, timeout: float) -> dict[str, Any]:
    """Run one in-process step (``build``, ``xnnpack``, ``vulkan``, ``arm``) for ``name`` in
    a child; what it wrote to ``out``, or how the child died."""
    command = [sys.executable, "-m", "benchmarks.example_zoo", "worker", name, step, str(out)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        code, stderr = -9, f"timeout after {timeout:.0f} s"
    if out.exists():
        data: dict[str, Any] = json.loads(out.read_text())
    else:
        data = {"error": f"worker exited {code}: {_error_line(stderr)}"}
    data["seconds"] = round(time.perf_counter() - t0, 1)
    return data


# ----------------------------------------------------------------------------- the worker


def _build(name: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from executorch.examples.models import MODEL_NAME_TO_MODEL
    from executorch.examples.models.model_factory import EagerModelFactory

    torch.manual_seed(SEED)
    model, inputs, _, _ = EagerModelFactory.create_model(*MODEL_NAME_TO_MODEL[name])
    return model.eval(), inputs


def _lowered_count(edge: Any) -> int:
    gm = edge.exported_program().graph_module
    return sum(1 for n in gm.graph.nodes if n.op == "get_attr" and n.target.startswith("lowered_module"))


def _lower(ep: Any, partitioner: Any, passes: list[Any], **kw: Any) -> Any:
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[partitioner],
                                       transform_passes=passes or None, **kw)


def _side(fn: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        side = fn()
    except Exception as e:  # recorded: a stock failure is data, a fusionkit one a finding
        side = {"exports": False, "error": _one_line(e), "where": _where(e)}
    side["seconds"] = round(time.perf_counter() - t0, 1)
    return side


def worker(name: str, step: str, out: str) -> None:
    """One step for one model in this process; writes JSON to ``out`` (tensors as errors)."""
    import torch

    result: dict[str, Any] = {"model": name, "step": step}

    def write() -> None:
        Path(out).write_text(json.dumps(result, indent=1, default=str))

    try:
        model, inputs = _build(name)
    except Exception as e:
        result.update(builds=False, error=_one_line(e), where=_where(e))
        write()
        return
    result["builds"] = True
    with torch.no_grad():
        eager = _leaves(copy.deepcopy(model)(*inputs))
    flat = _flat_inputs(inputs)
    result["params"] = sum(p.numel() for p in model.parameters())
    if step == "build":
        write()
        return
    ep = torch.export.export(model, inputs, strict=False)
    outputs: dict[str, Any] = {}

    def finish(side: dict[str, Any], key: str, got: Any) -> dict[str, Any]:
        side["runs"] = got is not None
        if got is not None:
            outputs[key] = got
            side["error_vs_eager"] = compare(got, eager)
        return side

    if step == "xnnpack":  # the aot_compiler's lowering, in-process
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.backends.xnnpack.utils.configs import get_transform_passes
        from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig

        from fusionkit.backends import xnnpack_adapter as xa

        def xnn(fusionkit: bool) -> dict[str, Any]:
            part = xa.XnnpackPartitioner() if fusionkit else XnnpackPartitioner()
            passes = list(get_transform_passes()) + (list(xa.transform_passes()) if fusionkit else [])
            edge = _lower(ep, part, passes,
                          compile_config=EdgeCompileConfig(_check_ir_validity=True,
                                                           _skip_dim_order=True))
            pte = edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=False)).buffer
            side: dict[str, Any] = {"exports": True, "delegates": _lowered_count(edge)}
            try:
                got = run_pte(pte, flat)
            except Exception as e:
                side["run_error"] = _one_line(e)
                got = None
            return finish(side, "fusionkit" if fusionkit else "stock", got)

        result["stock"] = _side(lambda: xnn(False))
        result["fusionkit"] = _side(lambda: xnn(True))
    elif step == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
            VulkanPartitioner as StockVulkan,
        )

        from fusionkit.backends import vulkan_adapter as va
        from fusionkit.backends.vulkan_adapter.runtime import run_in_child

        def vk(fusionkit: bool) -> dict[str, Any]:
            part = va.VulkanPartitioner() if fusionkit else StockVulkan()
            edge = _lower(ep, part, list(va.transform_passes()) if fusionkit else [])
            pte = edge.to_executorch().buffer
            side: dict[str, Any] = {"exports": True, "delegates": _lowered_count(edge)}
            run = run_in_child(pte, flat, timeout=600)
            if not run.ok:
                side["run_error"] = f"{run.status}: {run.message}"
            return finish(side, "fusionkit" if fusionkit else "stock",
                          _leaves(run.outputs) if run.ok else None)

        result["stock"] = _side(lambda: vk(False))
        result["fusionkit"] = _side(lambda: vk(True))
    elif step == "arm":
        from fusionkit.backends.arm_adapter import reference_model as rm

        def arm(fusionkit: bool) -> dict[str, Any]:
            edge = rm.lower(ep, tuple(flat), fusionkit=fusionkit, spec=rm.FP)
            side: dict[str, Any] = {"exports": True, "delegates": len(rm.tosa_flatbuffers(edge))}
            try:
                got = rm.run_on_reference_model(edge, tuple(inputs))
            except Exception as e:
                side["run_error"] = _one_line(e)
                got = None
            return finish(side, "fusionkit" if fusionkit else "stock", got)

        result["stock"] = _side(lambda: arm(False))
        result["fusionkit"] = _side(lambda: arm(True))
    else:
        raise SystemExit(f"unknown step {step!r}")
    if "stock" in outputs and "fusionkit" in outputs:
        result["fusionkit_vs_stock"] = compare(outputs["fusionkit"], outputs["stock"])
    write()


# ----------------------------------------------------------------------------- one model


def _check_aot(stock: dict[str, Any], fk: dict[str, Any], quantized: bool) -> dict[str, Any]:
    """Run both programs on the inputs the command built from; compare with eager
    (fake-quantized for ``quantized``) and with each other."""
    import torch

    def load(side: dict[str, Any]) -> dict[str, Any] | None:
        return torch.load(side["observed"], weights_only=False) if side.get("observed") else None

    got: dict[str, Any] = {}
    for key, side in (("stock", stock), ("fusionkit", fk)):
        side["exports"] = side.get("pte") is not None
        obs = load(side)
        side["runs"] = False
        if not side["exports"] or obs is None:
            continue
        try:
            outs = run_pte(Path(side["pte"]).read_bytes(), obs["inputs"])
        except Exception as e:
            side["run_error"] = _one_line(e)
            continue
        side["runs"] = True
        got[key] = outs
        side["error_vs_eager"] = compare(outs, obs.get("eager"))
        if quantized:
            side["error_vs_fake_quantized"] = compare(outs, obs.get("fake_quantized"))
    out: dict[str, Any] = {"stock": stock, "fusionkit": fk}
    if "stock" in got and "fusionkit" in got:
        out["fusionkit_vs_stock"] = compare(got["fusionkit"], got["stock"])
        a, b = load(stock), load(fk)
        if a is not None and b is not None:  # the same seeded model and inputs on both sides
            out["same_model"] = compare(a["eager"], b["eager"]) == 0.0
    return out


def zoo_row(name: str, backends: Sequence[str], work: Path, timeout: float = 1800,
            say: Any = print) -> dict[str, Any]:
    """Everything for one model (see the module docstring)."""
    row: dict[str, Any] = {"model": name}
    built = _worker(name, "build", work / f"{name}-build.json", timeout)
    row["build"] = built
    if not built.get("builds"):
        say(f"{name}: does not build: {built.get('error')}")
        return row
    options = aot_options()
    if "xnnpack" in backends:
        xnn: dict[str, Any] = {}
        for quantize in ([False, True] if name in options else [False]):
            mode = "q8" if quantize else "fp32"
            stock = aot_compile(name, quantize=quantize, fusionkit=False, work=work / name,
                                timeout=timeout)
            fk = aot_compile(name, quantize=quantize, fusionkit=True, work=work / name,
                             timeout=timeout)
            xnn[mode] = _check_aot(stock, fk, quantize)
            if quantize:
                xnn[mode]["quantization"] = options[name]
            say(f"{name}: xnnpack aot_compiler {mode}: stock exit {stock['exit_code']}, "
                f"fusionkit exit {fk['exit_code']}")
        if name not in options:  # the command refuses it: the command's lowering in-process
            xnn["fp32 (in-process)"] = _worker(name, "xnnpack", work / f"{name}-xnnpack.json",
                                               timeout)
        row["xnnpack"] = xnn
    for backend in ("vulkan", "arm"):
        if backend in backends:
            row[backend] = _worker(name, backend, work / f"{name}-{backend}.json", timeout)
            say(f"{name}: {backend}: stock {_cell(row[backend].get('stock'))}; "
                f"fusionkit {_cell(row[backend].get('fusionkit'))}")
    return row


# ----------------------------------------------------------------------------- the table


def _num(x: Any) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.2g}"


def _cell(side: dict[str, Any] | None, key: str = "error_vs_eager") -> str:
    if not side:
        return "-"
    if not side.get("exports"):
        return "export fails"
    if not side.get("runs"):
        return "exports; run fails"
    return f"ok {_num(side.get(key))}"


def _pair(entry: dict[str, Any] | None, key: str = "error_vs_eager") -> tuple[str, str, str]:
    if not entry:
        return "-", "-", "-"
    if "builds" in entry and not entry.get("stock") and entry.get("error"):
        return f"worker: {entry['error'][:60]}", "-", "-"
    return (_cell(entry.get("stock"), key), _cell(entry.get("fusionkit"), key),
            _num(entry.get("fusionkit_vs_stock")))


def markdown(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# ExecuTorch's example zoo under fusionkit",
        "",
        f"Date: {meta['date']}. Machine: {meta['machine']}. ExecuTorch {meta['executorch']}, "
        f"torch {meta['torch']}.",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Cells: `ok E` = exports, runs, max abs error E against eager (for `q8`: against the "
        "fake-quantized model the command built); `fk vs stock` = max abs difference between "
        "fusionkit's and stock's outputs on the same inputs and the same seeded weights. "
        "XNNPACK rows run ExecuTorch's `aot_compiler` (stock, and under `fusionkit exec "
        "--backend xnnpack`); `in-process` rows lower the way the command does, for models "
        "the command refuses. Vulkan runs on the real runtime (lavapipe), Arm (TOSA-1.0+FP) "
        "on the TOSA reference model.",
        "",
        "| model | backend | stock | fusionkit | fk vs stock | fusionkit rules (exec report) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    not_built: list[tuple[str, str]] = []
    for row in rows:
        name = row["model"]
        build = row.get("build", {})
        if not build.get("builds"):
            where = f" ({build['where']})" if build.get("where") else ""
            not_built.append((name, f"{build.get('error')}{where}"))
            continue
        for mode, entry in row.get("xnnpack", {}).items():
            key = "error_vs_fake_quantized" if mode == "q8" else "error_vs_eager"
            s, f, d = _pair(entry, key)
            if entry.get("stock", {}).get("exit_code") not in (0, None):
                s = f"command fails: {entry['stock'].get('error', '')[:80]}"
            if entry.get("fusionkit", {}).get("exit_code") not in (0, None):
                f = f"command fails: {entry['fusionkit'].get('error', '')[:80]}"
            rules = _rules(entry.get("fusionkit", {}).get("report"))
            lines.append(f"| {name} | xnnpack {mode} | {s} | {f} | {d} | {rules} |")
        for backend in ("vulkan", "arm"):
            if backend in row:
                s, f, d = _pair(row[backend])
                extra = []
                for side in ("stock", "fusionkit"):
                    e = (row[backend].get(side) or {})
                    if e.get("error") or e.get("run_error"):
                        extra.append(f"{side}: {(e.get('error') or e.get('run_error'))[:120]}")
                label = "vulkan" if backend == "vulkan" else "arm FP"
                lines.append(f"| {name} | {label} | {s} | {f} | {d} | {'; '.join(extra)} |")
    stand_ins = {m: w for m, w in meta.get("stand_in_weights", {}).items()
                 if w.startswith("stand-in ")}
    if stand_ins:
        lines += ["", "## Stand-in weights", "",
                  "These models download published weights; they ran with seeded stand-ins of "
                  "their own architecture (`benchmarks.stand_in_weights`: batch-norm "
                  "statistics and affine parameters away from the identity, no tensor left "
                  "constant), through the same unedited commands.", "", "| model | checkpoint |", "| --- | --- |"]
        lines += [f"| {m} | `{w.removeprefix('stand-in ')}` |" for m, w in stand_ins.items()]
    if not_built:
        lines += ["", "## Models that do not build offline", "",
                  "| model | why |", "| --- | --- |"]
        lines += [f"| {n} | `{why}` |" for n, why in not_built]
    return "\n".join(lines) + "\n"


def _rules(report: dict[str, Any] | None) -> str:
    if not report:
        return ""
    b = report.get("backends", {}).get("xnnpack", {})
    fused = sum(b.get("fused", {}).values())
    declined = sum(b.get("declined", {}).values())
    return (f"installed in {b.get('installed_in', 0)} process(es); {fused} fused, "
            f"{declined} declined")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["observe"]:
        rest = argv[1:]
        if len(rest) < 3 or rest[1] != "--":
            raise SystemExit("usage: observe OUT -- MODULE [ARGS...]")
        observe(rest[0], rest[2], rest[3:])
        return 0
    if argv[:1] == ["worker"]:
        worker(*argv[1:4])
        return 0
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.example_zoo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated (default: every model)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per export")
    parser.add_argument("--work", default=None, help="keep the programs here")
    parser.add_argument("--stand-in-weights", action="store_true",
                        help="seeded stand-ins for the checkpoints torchvision models download "
                             "(benchmarks.stand_in_weights), in a TORCH_HOME of the run's own")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n] or model_names()
    backends = [b for b in args.backends.split(",") if b]
    import torch

    meta = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "executorch": version("executorch"),
        "torch": torch.__version__,
        "command": "python3 -m benchmarks.example_zoo " + " ".join(argv),
    }
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="example-zoo-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.stand_in_weights:
        from benchmarks.stand_in_weights import write_stand_ins

        os.environ["TORCH_HOME"] = str(work / "torch_home")  # the children's, not the user's
        meta["stand_in_weights"] = write_stand_ins(names, work / "torch_home")
    rows = []
    try:
        for name in names:
            rows.append(zoo_row(name, backends, work, args.timeout,
                                say=lambda m: print(m, flush=True)))
            if args.json:
                Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1,
                                                      default=str) + "\n")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    text = markdown(rows, meta)
    if args.md:
        Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
