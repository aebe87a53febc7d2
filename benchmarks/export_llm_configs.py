"""ExecuTorch's ``export_llm`` over many configurations, stock beside ``fusionkit exec``.

Each case is a set of export_llm's own overrides (backend, quantization, cache and shape
options) on a tiny seeded model of one class (``tests/llm_pipeline.py``'s, no download).
For each: the unedited exporter runs stock and under ``fusionkit exec --backend B``, one
after the other; each program that exports runs in a child (XNNPACK on the CPU through
``portable_lib``, Vulkan on the real runtime), prefill and decode steps; outputs are
compared with each other and with ExecuTorch's eager ``Llama2Model``. One JSON line per
case is appended to ``--jsonl``; ``--md`` writes the table of the last run of each case.

    python -m benchmarks.export_llm_configs [--cases a,b | --backends vulkan] \\
        --work DIR --jsonl FILE [--md FILE]

What it shows: where stock exports, whether fusionkit exports too and computes what
stock's program does; where stock fails, what fusionkit does. Quantized cases are far from
the float eager model by their quantization error, for stock and fusionkit alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:  # the pipeline tests' tiny models and exporter calls
    sys.path.insert(0, _TESTS)

import llm_pipeline as llm  # noqa: E402

XNN = ["backend.xnnpack.enabled=True"]
XNN_SDPA = [*XNN, "model.use_sdpa_with_kv_cache=True"]
VK = ["backend.vulkan.enabled=True"]
VK_SDPA = [*VK, "model.use_sdpa_with_kv_cache=True"]
Q8DA4W = ["quantization.qmode=8da4w", "quantization.group_size=32"]
Q4W = ["quantization.qmode=4w", "quantization.group_size=32"]
STATIC = ["model.enable_dynamic_shape=False"]

#: name -> (overrides, model, run mode, use_kv_cache, max_seq_length). Run modes: kv_seq
#: (the prompt at once, then decode steps), kv_tok (one token at a time: static shapes),
#: nokv (the prompt, then prompt + steps), nokv_full (one sequence of max_seq tokens)
CASES: dict[str, tuple[list[str], str, str, bool, int]] = {
    "xnn-nosdpa": (XNN, "llama3", "kv_seq", True, 32),
    "xnn-nokv": (XNN, "llama3", "nokv", False, 32),
    "xnn-nokv-static": ([*XNN, *STATIC], "llama3", "nokv_full", False, 32),
    "xnn-nokv-8da4w": ([*XNN, *Q8DA4W], "llama3", "nokv", False, 32),
    "xnn-static": ([*XNN_SDPA, *STATIC], "llama3", "kv_tok", True, 32),
    "xnn-seq64-nosdpa": (XNN, "llama3", "kv_seq", True, 64),
    "xnn-ctx64": ([*XNN_SDPA, "export.max_context_length=64"], "llama3", "kv_seq", True, 16),
    "xnn-fulllogits": ([*XNN_SDPA, "debug.generate_full_logits=True"], "llama3", "kv_seq",
                       True, 32),
    "xnn-extended": ([*XNN_SDPA, "backend.xnnpack.extended_ops=True"], "llama3", "kv_seq",
                     True, 32),
    "xnn-fp16": ([*XNN_SDPA, "model.dtype_override=fp16"], "llama3", "kv_seq", True, 32),
    "xnn-bf16": ([*XNN_SDPA, "backend.xnnpack.enable_bf16=True"], "llama3", "kv_seq", True,
                 32),
    "xnn-dtype-bf16": ([*XNN_SDPA, "model.dtype_override=bf16"], "llama3", "kv_seq", True,
                       32),
    "xnn-8da4w-emb4": ([*XNN_SDPA, *Q8DA4W, "quantization.embedding_quantize='4,32'"],
                       "llama3", "kv_seq", True, 32),
    "xnn-8da4w-static": ([*XNN_SDPA, *Q8DA4W, *STATIC], "llama3", "kv_tok", True, 32),
    "xnn-int8": ([*XNN_SDPA, "quantization.qmode=int8"], "llama3", "kv_seq", True, 32),
    "xnn-int8-static": ([*XNN_SDPA, "quantization.qmode=int8", *STATIC], "llama3", "kv_tok",
                        True, 32),
    "xnn-4w": ([*XNN_SDPA, *Q4W], "llama3", "kv_seq", True, 32),
    "xnn-4w-nosdpa": ([*XNN, *Q4W], "llama3", "kv_seq", True, 32),
    "xnn-4w-static": ([*XNN_SDPA, *Q4W, *STATIC], "llama3", "kv_tok", True, 32),
    "xnn-pt2e-dyn": ([*XNN_SDPA, "quantization.pt2e_quantize=xnnpack_dynamic"], "llama3",
                     "kv_seq", True, 32),
    "xnn-qc4": ([*XNN_SDPA, "quantization.pt2e_quantize=xnnpack_dynamic_qc4"], "llama3",
                "kv_seq", True, 32),
    "xnn-qkv": ([*XNN_SDPA, "model.quantize_kv_cache=True"], "llama3", "kv_seq", True, 32),
    "xnn-static-qkv-nosdpa": ([*XNN, "model.static_quantize_kv_cache=True", *STATIC],
                              "llama3", "kv_tok", True, 32),
    "xnn-localglobal": ([*XNN_SDPA, "model.local_global_attention=[16]"], "llama3", "kv_seq",
                        True, 32),
    "xnn-sink": ([*XNN_SDPA, "model.use_attention_sink='4,16'"], "llama3", "kv_seq", True,
                 32),
    "xnn-expand-rope-mha": ([*XNN_SDPA, "model.expand_rope_table=True"], "mha", "kv_seq",
                            True, 32),
    "xnn-qwen3-8da4w": ([*XNN_SDPA, *Q8DA4W], "qwen3", "kv_seq", True, 32),
    "xnn-phi4-8da4w": ([*XNN_SDPA, *Q8DA4W], "phi_4_mini", "kv_seq", True, 32),
    "vk-nosdpa-static": ([*VK, *STATIC], "llama3", "kv_tok", True, 32),
    "vk-nosdpa": (VK, "llama3", "kv_seq", True, 32),
    "vk-nokv": (VK, "llama3", "nokv", False, 32),
    "vk-nokv-static": ([*VK, *STATIC], "llama3", "nokv_full", False, 32),
    "vk-static": ([*VK_SDPA, *STATIC], "llama3", "kv_tok", True, 32),
    "vk-seq64": (VK_SDPA, "llama3", "kv_seq", True, 64),
    "vk-ctx64": ([*VK_SDPA, "export.max_context_length=64"], "llama3", "kv_seq", True, 16),
    "vk-fulllogits": ([*VK_SDPA, "debug.generate_full_logits=True"], "llama3", "kv_seq", True,
                      32),
    "vk-fp16-static": ([*VK_SDPA, "backend.vulkan.force_fp16=True", *STATIC], "llama3",
                       "kv_tok", True, 32),
    "vk-emb4": ([*VK_SDPA, "quantization.embedding_quantize='4,32'"], "llama3", "kv_seq",
                True, 32),
    "vk-emb8": ([*VK_SDPA, "quantization.embedding_quantize='8,0'"], "llama3", "kv_seq",
                True, 32),
    "vk-8da4w-fp16": ([*VK_SDPA, *Q8DA4W, "backend.vulkan.force_fp16=True"], "llama3",
                      "kv_seq", True, 32),
    "vk-8da4w-emb4": ([*VK_SDPA, *Q8DA4W, "quantization.embedding_quantize='4,32'"],
                      "llama3", "kv_seq", True, 32),
    "vk-4w-static": ([*VK_SDPA, *Q4W, *STATIC], "llama3", "kv_tok", True, 32),
    "vk-int8": ([*VK_SDPA, "quantization.qmode=int8"], "llama3", "kv_seq", True, 32),
    "vk-qkv": ([*VK_SDPA, "model.quantize_kv_cache=True"], "llama3", "kv_seq", True, 32),
    "vk-localglobal": ([*VK_SDPA, "model.local_global_attention=[16]"], "llama3", "kv_seq",
                       True, 32),
    "vk-expand-rope-mha": ([*VK_SDPA, "model.expand_rope_table=True"], "mha", "kv_seq",
                           True, 32),
    "vk-llama3_2-8da4w": ([*VK_SDPA, *Q8DA4W], "llama3_2", "kv_seq", True, 32),
    "vk-qwen3-8da4w": ([*VK_SDPA, *Q8DA4W], "qwen3", "kv_seq", True, 32),
    "vk-qwen3-static": ([*VK_SDPA, *STATIC], "qwen3", "kv_tok", True, 32),
    "vk-qwen2_5-8da4w": ([*VK_SDPA, *Q8DA4W], "qwen2_5", "kv_seq", True, 32),
    "vk-phi4-8da4w": ([*VK_SDPA, *Q8DA4W], "phi_4_mini", "kv_seq", True, 32),
    "vk-smollm2-fp16": ([*VK_SDPA, "backend.vulkan.force_fp16=True"], "smollm2", "kv_seq",
                        True, 32),
    "vk-lfm2-8da4w": ([*VK_SDPA, *Q8DA4W], "lfm2", "kv_seq", True, 32),
}

_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|SymNode)\b.*")


def _backend(overrides: list[str]) -> str:
    return "vulkan" if "backend.vulkan.enabled=True" in overrides else "xnnpack"


def _error(stderr: str) -> str:
    """The exception lines of a failed export (the last two), one line."""
    lines = [ln for ln in stderr.splitlines() if _ERROR_LINE.match(ln)
             and not ln.startswith("Error executing job")]  # hydra's, naming the overrides
    return " | ".join(lines[-2:] or stderr.strip().splitlines()[-3:])[:600]


def _model(work: Path, key: str) -> tuple[Path, Path, str]:
    d = work / "models" / key
    if key == "llama3":
        cls, params = "llama3", None
    elif key == "mha":  # expand_rope_table needs as many kv heads as heads
        cls, params = "llama3", {**llm.TINY_LLAMA, "n_kv_heads": llm.TINY_LLAMA["n_heads"]}
    else:
        cls, params = llm.MODEL_CLASSES[key]
    if not (d / "checkpoint.pth").exists():
        llm.write_model(d, params)
    return d / "params.json", d / "checkpoint.pth", cls


# ------------------------------------------------------------------ the child's side


def _feed(call: Any, mode: str, max_seq: int) -> list[Any]:
    import torch

    prompt, steps = llm.tokens()
    if mode == "kv_seq":
        return [call(prompt, 0), *(call(t, llm.PROMPT_LEN + i) for i, t in enumerate(steps))]
    if mode == "kv_tok":
        for p in range(llm.PROMPT_LEN):
            last = call(prompt[:, p:p + 1], p)
        return [last, *(call(t, llm.PROMPT_LEN + i) for i, t in enumerate(steps))]
    full = torch.cat([prompt, *steps], dim=1)
    if mode == "nokv":
        return [call(prompt, None), call(full, None)]
    pad = (torch.arange(max_seq - full.shape[1]) * 7 + 3) % 127  # nokv_full
    return [call(torch.cat([full, pad.unsqueeze(0)], dim=1), None)]


def _child(argv: list[str]) -> None:
    """``PTE cpu|vulkan MODE MAX_SEQ OUT`` or ``EAGER PARAMS CKPT MODE MAX_SEQ OUT``."""
    import torch

    if argv[0] == "EAGER":
        from executorch.examples.models.llama.model import Llama2Model
        from executorch.extension.llm.export.config.llm_config import LlmConfig

        params, ckpt, mode, max_seq, out = argv[1:6]
        config = LlmConfig()
        config.base.params, config.base.checkpoint = params, ckpt
        config.model.use_kv_cache = not mode.startswith("nokv")
        config.export.max_seq_length = config.export.max_context_length = int(max_seq)
        model = Llama2Model(llm_config=config).get_eager_model().eval()

        def call(tok: Any, pos: int | None) -> Any:
            with torch.no_grad():
                r = model(tok) if pos is None else model(tok, {"input_pos": torch.tensor([pos])})
            return r.detach().clone()
    else:
        pte, where, mode, max_seq, out = argv[0:5]
        if where == "vulkan":
            from fusionkit.backends.vulkan_adapter import runtime as rt

            rt.load()
        import executorch.extension.llm.custom_ops.custom_ops  # (the llama::* kernels)
        from executorch.extension.pybindings.portable_lib import (
            _load_for_executorch_from_buffer,
        )

        with contextlib.suppress(Exception):
            import executorch.kernels.quantized  # noqa: F401
        data = Path(pte).read_bytes()  # kept alive while the module runs
        module = _load_for_executorch_from_buffer(data)

        def call(tok: Any, pos: int | None) -> Any:
            args = (tok,) if pos is None else (tok, torch.tensor([pos]))
            return module.forward(args)[0].clone()
    torch.save(_feed(call, mode, int(max_seq)), out)


# ------------------------------------------------------------------ the parent's side


def _outputs(args: list[str], out: Path, vulkan: bool) -> list[Any] | str:
    """The child's outputs, or why it failed (one line)."""
    import torch

    env = dict(os.environ)
    if vulkan:
        from fusionkit.backends.vulkan_adapter import runtime as rt

        env = rt.child_environment()
    done = subprocess.run([sys.executable, "-m", "benchmarks.export_llm_configs", "--child",
                           *args, str(out)], capture_output=True, text=True, timeout=900,
                          env=env, cwd=str(Path(__file__).resolve().parent.parent))
    if done.returncode != 0 or not out.exists():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return f"exit {done.returncode}: {tail[-500:]}"
    result: list[Any] = torch.load(out)
    return result


def _max_abs(a: Any, b: Any) -> float | None:
    if isinstance(a, str) or isinstance(b, str) or len(a) != len(b):
        return None

    def one(x: Any, y: Any) -> float:
        x, y = x.float(), y.float()
        if x.numel() != y.numel():  # full logits against last-token logits: the last row
            v = min(x.shape[-1], y.shape[-1])
            x, y = x.reshape(-1, v)[-1], y.reshape(-1, v)[-1]
        return float((x.reshape(-1) - y.reshape(-1)).abs().max())

    return max(one(x, y) for x, y in zip(a, b, strict=True))


def run_case(name: str, work: Path) -> dict[str, Any]:
    overrides, model_key, mode, kv, max_seq = CASES[name]
    backend = _backend(overrides)
    params, ckpt, cls = _model(work, model_key)
    case_dir = work / "cases" / name
    rec: dict[str, Any] = {"case": name, "overrides": overrides, "model_class": cls,
                           "model": model_key, "mode": mode, "backend": backend}
    outs: dict[str, Any] = {}
    for kind in ("stock", "fusionkit"):
        d = case_dir / kind
        shutil.rmtree(d, ignore_errors=True)
        args = [f"base.model_class={cls}", f"base.params={params}",
                f"base.checkpoint={ckpt}", f"model.use_kv_cache={kv}",
                f"export.max_seq_length={max_seq}", f"export.output_dir={d}", *overrides]
        if not any(o.startswith("export.max_context_length=") for o in overrides):
            args.append(f"export.max_context_length={max_seq}")
        report = case_dir / "report.json"
        t0 = time.perf_counter()
        pte, stderr = llm.export(args, d, fusionkit=None if kind == "stock" else backend,
                                 report=None if kind == "stock" else report, timeout=1500)
        rec[f"{kind}_export_s"] = round(time.perf_counter() - t0)
        if pte is None:
            rec[f"{kind}_export_error"] = _error(stderr)
            continue
        got = _outputs([str(pte), "vulkan" if backend == "vulkan" else "cpu", mode,
                        str(max_seq)], d / "outputs.pt", backend == "vulkan")
        if isinstance(got, str):
            rec[f"{kind}_run_error"] = got
        else:
            outs[kind] = got
    with contextlib.suppress(Exception):
        b = json.loads((case_dir / "report.json").read_text())["backends"][backend]
        rec["fused"], rec["declined"] = b.get("fused"), b.get("declined")
        rec["placed"] = [p["what"] for p in b.get("placed", [])]
    eager = _outputs(["EAGER", str(params), str(ckpt), mode, str(max_seq)],
                     case_dir / "eager.pt", False)
    if "stock" in outs and "fusionkit" in outs:
        rec["fusionkit_vs_stock"] = _max_abs(outs["fusionkit"], outs["stock"])
    for kind, got in outs.items():
        rec[f"{kind}_vs_eager"] = _max_abs(got, eager)
    return rec


def _cell(rec: dict[str, Any], kind: str) -> str:
    if f"{kind}_export_error" in rec:
        return f"export fails: `{rec[kind + '_export_error'][:160]}`"
    if f"{kind}_run_error" in rec:
        return f"exports; the program fails: `{rec[kind + '_run_error'][-160:]}`"
    e = rec.get(f"{kind}_vs_eager")
    return "runs" + ("" if e is None else f", {e:.1e} from eager")


def markdown(records: list[dict[str, Any]]) -> str:
    last = {r["case"]: r for r in records}  # the last run of each case
    rows = ["| case | overrides | stock | fusionkit | fusionkit vs stock |", "|---|---|---|---|---|"]
    for name, r in last.items():
        over = " ".join(o.split(".", 1)[-1] for o in r["overrides"])
        d = r.get("fusionkit_vs_stock")
        rows.append(f"| {name} ({r['model']}, {r['mode']}) | `{over}` | {_cell(r, 'stock')} | "
                    f"{_cell(r, 'fusionkit')} | {'-' if d is None else f'{d:.1e}'} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated (default: every case)")
    parser.add_argument("--backends", default="xnnpack,vulkan")
    parser.add_argument("--work", required=True, help="models, programs and reports")
    parser.add_argument("--jsonl", required=True, help="one line per case, appended")
    parser.add_argument("--md", default=None, help="the table of every case in --jsonl")
    a = parser.parse_args(argv)
    names = [c for c in (a.cases.split(",") if a.cases else CASES) if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    wanted = set(a.backends.split(","))
    work, out = Path(a.work), Path(a.jsonl)
    for name in names:
        if _backend(CASES[name][0]) not in wanted:
            continue
        rec = run_case(name, work)
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(name, _cell(rec, "stock"), "||", _cell(rec, "fusionkit"), flush=True)
    if a.md:
        records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        Path(a.md).write_text(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
