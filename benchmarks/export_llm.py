"""ExecuTorch's ``export_llm`` at published model sizes: fusionkit beside stock.

``python -m benchmarks.export_llm [--models smollm2_135m,...] [--backends xnnpack,vulkan]
[--modes fp32,8da4w] [--pairs N]`` writes each model's params file and a seeded random
checkpoint (the published dimensions; no download), then exports it with the unedited
exporter, stock (``python -m ...export_llm``) and under ``fusionkit exec``, in turn
(stock, fusionkit, stock, ...), each a fresh child process measured by the kernel
(``wait4``): wall seconds, CPU seconds (user + system) and peak RSS. Prints each pair's
ratios (fusionkit / stock) and their medians; with ``--json FILE`` writes every figure.
fusionkit's own share: the seconds its searches and applications took inside the
exporter (``fusionkit exec --report``), over the export's CPU seconds.

Peak RSS under glibc's default allocator follows its *dynamic* mmap threshold: after a
large block is freed, blocks up to 32 MiB (a layer's weights) come from the heap, which
keeps freed pages, so the same export's peak moves by a GB run to run (a 0.6B Vulkan
8da4w export: 6574 to 8060 MiB, stock against itself). ``--allocator fixed-mmap`` runs
both sides with ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB: every tensor-sized block is
mapped and unmapped, and the peak is what both sides hold live. The line prints each
side's own spread (its largest peak over its smallest) beside the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

EXPORT_LLM = "executorch.extension.llm.export.export_llm"

#: published dimensions, as ExecuTorch's own params files give them (model class, params)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    # HuggingFaceTB/SmolLM2-135M; examples/models/smollm2/135M_config.json
    "smollm2_135m": ("llama3", {"dim": 576, "ffn_dim_multiplier": 1, "hidden_dim": 1536,
                                "n_heads": 9, "n_kv_heads": 3, "n_layers": 30,
                                "norm_eps": 1e-5, "rope_theta": 10000.0,
                                "use_scaled_rope": False, "vocab_size": 49152,
                                "use_hf_rope": False, "attention_qkv_bias": False}),
    # Qwen/Qwen3-0.6B; examples/models/qwen3/config/0_6b_config.json
    "qwen3_0_6b": ("qwen3_0_6b", {"dim": 1024, "ffn_dim_multiplier": 1, "hidden_dim": 3072,
                                  "n_heads": 16, "head_dim": 128, "n_kv_heads": 8,
                                  "n_layers": 28, "norm_eps": 1e-6, "rope_theta": 1000000.0,
                                  "use_scaled_rope": False, "vocab_size": 151936,
                                  "use_hf_rope": True, "attention_qkv_bias": False,
                                  "use_qk_norm": True, "qk_norm_before_rope": True}),
    # meta-llama/Llama-3.2-1B; its params.json
    "llama3_2_1b": ("llama3_2", {"dim": 2048, "ffn_dim_multiplier": 1.5, "multiple_of": 256,
                                 "n_heads": 32, "n_kv_heads": 8, "n_layers": 16,
                                 "norm_eps": 1e-5, "rope_theta": 500000.0,
                                 "use_scaled_rope": True, "vocab_size": 128256}),
}

BACKENDS = {"xnnpack": ["backend.xnnpack.enabled=True", "model.use_sdpa_with_kv_cache=True"],
            "vulkan": ["backend.vulkan.enabled=True", "model.use_sdpa_with_kv_cache=True"]}
MODES = {"fp32": [], "8da4w": ["quantization.qmode=8da4w", "quantization.group_size=128"]}


def write_model(directory: Path, params: dict[str, Any]) -> tuple[Path, Path]:
    """The params file and a seeded random checkpoint of the transformer it describes."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    directory.mkdir(parents=True, exist_ok=True)
    params_path = directory / "params.json"
    params_path.write_text(json.dumps(params))
    torch.manual_seed(0)
    with torch.device("meta"):
        shapes = construct_transformer(ModelArgs(**params)).state_dict()
    state = {}
    for k, v in shapes.items():
        if any(s in k for s in ("cache", "rope", "mask")):
            continue
        t = torch.randn(v.shape, dtype=torch.float32)
        state[k] = 1 + 0.1 * t if k.endswith("norm.weight") else 0.02 * t
    checkpoint = directory / "checkpoint.pth"
    torch.save(state, checkpoint)
    return params_path, checkpoint


#: allocator settings, the same for both sides: name -> environment
ALLOCATORS: dict[str, dict[str, str]] = {
    "default": {},
    # glibc: a fixed threshold (which also turns the dynamic one off); 128 KiB is its default
    "fixed-mmap": {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)},
}


#: a small process between the benchmark and the export: the kernel's peak RSS of a process
#: (``ru_maxrss``) includes the memory image it was spawned from (a vfork child's exec keeps
#: the parent's high-water mark), and this process, which wrote GBs of checkpoint, would
#: otherwise be the floor of every export's figure
_LAUNCHER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": time.perf_counter() - start,
               "cpu_s": usage.ru_utime + usage.ru_stime,
               "peak_rss_mib": usage.ru_maxrss / 1024,
               "exit": os.waitstatus_to_exitcode(status)}, f)
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One child, measured by the kernel: wall, CPU seconds, peak RSS (MiB), exit code."""
    figures = cwd / "figures.json"
    with open(cwd / "log.txt", "ab") as log:
        subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, str(figures), *cmd], cwd=cwd,
                       stdout=log, stderr=log, env={**os.environ, **(env or {})}, check=False)
    result: dict[str, Any] = json.loads(figures.read_text())
    figures.unlink()
    return result


def measure(name: str, backend: str, mode: str, pairs: int, work: Path,
            allocator: str = "default") -> dict[str, Any]:
    model_class, params = MODELS[name]
    params_path, checkpoint = write_model(work / name, params)
    runs: dict[str, list[dict[str, Any]]] = {"stock": [], "fusionkit": []}
    for i in range(pairs):
        for label in ("stock", "fusionkit"):
            out = work / f"{name}-{backend}-{mode}-{label}-{i}"
            out.mkdir(parents=True, exist_ok=True)
            args = [f"base.model_class={model_class}", f"base.params={params_path}",
                    f"base.checkpoint={checkpoint}", "model.use_kv_cache=True",
                    "export.max_seq_length=128", "export.max_context_length=128",
                    f"export.output_dir={out}", *BACKENDS[backend], *MODES[mode]]
            report = out / "fusionkit-report.json"
            if label == "stock":
                cmd = [sys.executable, "-m", EXPORT_LLM, *args]
            else:
                cmd = [sys.executable, "-m", "fusionkit.app.cli", "exec", "--backend", backend,
                       "--report", str(report), "-m", EXPORT_LLM, *args]
            r = _run(cmd, out, ALLOCATORS[allocator])
            if r["exit"] != 0:  # the reason, kept with the figures (the work dir goes)
                lines = (out / "log.txt").read_text(errors="replace").strip().splitlines()
                r["error_tail"] = [ln for ln in lines if not ln.startswith(("W1", "E1"))][-8:]
            r["pte_bytes"] = sum(p.stat().st_size for p in out.glob("*.pte"))
            if report.exists():
                rep = json.loads(report.read_text())
                b = rep["backends"].get(backend, {})
                r["fused"] = sum(b.get("fused", {}).values())
                r["fusionkit_s"] = rep.get("fusionkit_seconds", 0.0)
                # a run where fusionkit was not installed in every process that imported
                # ExecuTorch measured stock again (the summary counts them per backend)
                r["installed"] = bool(rep.get("processes")) and \
                    b.get("installed_in") == rep.get("processes")
                if rep.get("errors"):
                    r["errors"] = rep["errors"]
            runs[label].append(r)
            for p in out.glob("*.pte"):
                p.unlink()  # GBs each: only the size is kept
    ratios = {k: [f[k] / s[k] for s, f in zip(runs["stock"], runs["fusionkit"], strict=True)
                  if s["exit"] == 0 and f["exit"] == 0 and f.get("installed") is True]
              for k in ("wall_s", "cpu_s", "peak_rss_mib")}
    return {"model": name, "backend": backend, "mode": mode, "allocator": allocator,
            "runs": runs,
            "median_ratio": {k: statistics.median(v) if v else None for k, v in ratios.items()}}


def spread_of(rows: list[dict[str, Any]]) -> float:
    """One side's largest peak RSS over its smallest (1.0 for a single run)."""
    peaks = [x["peak_rss_mib"] for x in rows]
    return max(peaks) / min(peaks)


def _line(r: dict[str, Any]) -> str:
    s, f = r["runs"]["stock"], r["runs"]["fusionkit"]

    def med(rows: list[dict[str, Any]], k: str) -> float:
        return statistics.median(x[k] for x in rows)

    if any(x["exit"] != 0 for x in s + f):
        tails = [" / ".join(x.get("error_tail", [])[-2:]) for x in s + f if x["exit"] != 0]
        return (f"{r['model']:<13} {r['backend']:<8} {r['mode']:<6} exits stock "
                f"{[x['exit'] for x in s]} fusionkit {[x['exit'] for x in f]}: {tails[0][:300]}")
    m = r["median_ratio"]
    share = med(f, "fusionkit_s") / med(f, "cpu_s") if f and "fusionkit_s" in f[0] else float("nan")
    spread = " ".join(f"{label} {spread_of(rows):.3f}" for label, rows in (("stock", s),
                                                                          ("fusionkit", f)))
    return (f"{r['model']:<13} {r['backend']:<8} {r['mode']:<6} "
            f"[{r.get('allocator', 'default')}] "
            f"wall {med(s, 'wall_s'):7.1f} / {med(f, 'wall_s'):7.1f} s ({m['wall_s']:.3f}x)  "
            f"cpu {med(s, 'cpu_s'):7.1f} / {med(f, 'cpu_s'):7.1f} s ({m['cpu_s']:.3f}x)  "
            f"rss {med(s, 'peak_rss_mib'):7.0f} / {med(f, 'peak_rss_mib'):7.0f} MiB "
            f"({m['peak_rss_mib']:.3f}x; own spread {spread})  fusionkit's passes {share:.1%} of its CPU  "
            f"fused per run {[x.get('fused') for x in f]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.export_llm", description=__doc__)
    p.add_argument("--models", default="smollm2_135m")
    p.add_argument("--backends", default="xnnpack,vulkan")
    p.add_argument("--modes", default="fp32")
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--allocator", choices=sorted(ALLOCATORS), default="default",
                   help="the allocator setting both sides run with (see above)")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    results = []
    print("model         backend  mode   stock / fusionkit (median ratio fusionkit/stock)")
    with tempfile.TemporaryDirectory(prefix="fk-export-llm-") as tmp:
        for name in a.models.split(","):
            for backend in a.backends.split(","):
                for mode in a.modes.split(","):
                    r = measure(name, backend, mode, a.pairs, Path(tmp), a.allocator)
                    results.append(r)
                    print(_line(r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
