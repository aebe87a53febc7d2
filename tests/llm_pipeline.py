"""ExecuTorch's LLM exporter (``export_llm``) as users run it, for tests and benchmarks.

A model is a params file and a seeded random checkpoint (no download); it is exported by
the unedited exporter in a child process, stock (``python -m ...export_llm``) or under
``fusionkit exec``; the program runs prefill then decode steps in a child process, on
the CPU (XNNPACK through ``portable_lib``, the llama custom ops loaded) or on the real
Vulkan runtime; the eager model is ExecuTorch's own ``Llama2Model`` built from the same
files. Run as a script, this module is that child: ``python llm_pipeline.py PTE cpu|vulkan
OUT.pt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXPORT_LLM = "executorch.extension.llm.export.export_llm"

#: a 2-layer llama3 with grouped-query heads: every fusion of the Vulkan llama path
#: (RMSNorm, rope, select_as_symint, the KV-cache sdpa) and XNNPACK's linears occur
TINY_LLAMA: dict[str, Any] = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                              "vocab_size": 128, "multiple_of": 32, "norm_eps": 1e-5,
                              "rope_theta": 500000.0, "use_scaled_rope": True}
MAX_SEQ = 32
PROMPT_LEN = 5
DECODE_STEPS = 3


def write_model(directory: Path, params: dict[str, Any] | None = None, seed: int = 0
                ) -> tuple[Path, Path]:
    """``params.json`` and a seeded checkpoint (weights ~ N(0, 0.2), norms ~ 1) in
    ``directory``; the checkpoint's keys are the llama transformer's own."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    params = dict(TINY_LLAMA if params is None else params)
    directory.mkdir(parents=True, exist_ok=True)
    params_path = directory / "params.json"
    params_path.write_text(json.dumps(params))
    torch.manual_seed(seed)
    model = construct_transformer(ModelArgs(**params))
    state = {}
    for k, v in model.state_dict().items():
        if any(s in k for s in ("cache", "rope", "mask")):
            continue
        state[k] = 1 + 0.1 * torch.randn_like(v) if k.endswith("norm.weight") else 0.2 * torch.randn_like(v)
    checkpoint = directory / "checkpoint.pth"
    torch.save(state, checkpoint)
    return params_path, checkpoint


def export_args(params: Path, checkpoint: Path, out_dir: Path, backend: Sequence[str],
                model_class: str = "llama3", extra: Sequence[str] = ()) -> list[str]:
    """export_llm's own command-line overrides (hydra) for a KV-cache export."""
    return [f"base.model_class={model_class}", f"base.params={params}",
            f"base.checkpoint={checkpoint}", "model.use_kv_cache=True",
            f"export.max_seq_length={MAX_SEQ}", f"export.max_context_length={MAX_SEQ}",
            f"export.output_dir={out_dir}", *backend, *extra]


def export(args: Sequence[str], out_dir: Path, *, fusionkit: str | None = None,
           report: Path | None = None, timeout: float = 900.0) -> tuple[Path | None, str]:
    """Run export_llm in a child: stock, or under ``fusionkit exec --backend BACKENDS``.
    Returns the .pte written (None when the export failed) and the child's stderr."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if fusionkit is None:
        cmd = [sys.executable, "-m", EXPORT_LLM, *args]
    else:
        cmd = [sys.executable, "-m", "fusionkit.app.cli", "exec", "--backend", fusionkit,
               *(["--report", str(report)] if report else []), "-m", EXPORT_LLM, *args]
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=out_dir)
    ptes = sorted(out_dir.glob("*.pte"))
    return (ptes[0] if done.returncode == 0 and ptes else None), done.stderr


def tokens() -> tuple[Any, list[Any]]:
    """The prompt and the decode tokens every run uses (fixed, so runs compare)."""
    import torch

    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, TINY_LLAMA["vocab_size"], (1, PROMPT_LEN), generator=g)
    steps = [torch.randint(0, TINY_LLAMA["vocab_size"], (1, 1), generator=g)
             for _ in range(DECODE_STEPS)]
    return prompt, steps


def run_program(pte: Path, where: str, timeout: float = 300.0, *, kv_cache: bool = True
                ) -> list[Any]:
    """The logits of prefill then each decode step, from a child process (``where``:
    ``cpu`` or ``vulkan``); ``kv_cache=False``: of the prompt, then of the prompt and the
    decode tokens, each a whole sequence. Raises RuntimeError with the child's last lines
    on failure."""
    import torch

    out = pte.with_suffix(f".{where}.pt")
    env = dict(os.environ)
    if where == "vulkan":
        from fusionkit.backends.vulkan_adapter import runtime as rt

        env = rt.child_environment()
    done = subprocess.run([sys.executable, __file__, str(pte), where, str(out), str(kv_cache)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0 or not out.exists():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"{pte.name} on {where}: exit {done.returncode}: {tail}")
    result: list[Any] = torch.load(out)
    return result


def eager_logits(params: Path, checkpoint: Path, *, kv_cache: bool = True) -> list[Any]:
    """ExecuTorch's own eager llama (``Llama2Model``) on the same tokens (as
    :func:`run_program` feeds them)."""
    import torch
    from executorch.examples.models.llama.model import Llama2Model
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    config = LlmConfig()
    config.base.params, config.base.checkpoint = str(params), str(checkpoint)
    config.model.use_kv_cache = kv_cache
    config.export.max_seq_length = config.export.max_context_length = MAX_SEQ
    model = Llama2Model(llm_config=config).get_eager_model().eval()
    prompt, steps = tokens()
    outs = []
    with torch.no_grad():
        if not kv_cache:
            return [model(x).detach().clone() for x in _whole_sequences(prompt, steps)]
        outs.append(model(prompt, {"input_pos": torch.tensor([0])}))
        for i, t in enumerate(steps):
            outs.append(model(t, {"input_pos": torch.tensor([PROMPT_LEN + i])}))
    return [o.detach().clone() for o in outs]


def exported_reference(args: Sequence[str]) -> list[Any]:
    """What the exporter's own model computes for export_llm's overrides ``args``, before
    any lowering, on the same tokens: ExecuTorch's ``_prepare_for_llama_export`` (the
    source transforms, ``quantization.qmode``'s quantized linears among them), ``export()``,
    then ``pt2e_quantize`` with the quantizers ``args`` select (the fake-quantized model,
    calibrated on the exporter's example inputs as export_llm does); run eagerly."""
    import torch
    from executorch.examples.models.llama import export_llama_lib as lib
    from executorch.extension.llm.export.config.llm_config import LlmConfig
    from omegaconf import OmegaConf

    config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(LlmConfig),
                                                 OmegaConf.from_dotlist(list(args))))
    _, quantizers, _ = lib.get_quantizer_and_quant_params(config)
    builder = lib._prepare_for_llama_export(config).export()
    builder.run_canonical_optimizations()
    m = builder.pt2e_quantize(quantizers).pre_autograd_graph_module
    prompt, steps = tokens()
    with torch.no_grad():
        outs = [m(prompt, {"input_pos": torch.tensor([0])})]
        for i, t in enumerate(steps):
            outs.append(m(t, {"input_pos": torch.tensor([PROMPT_LEN + i])}))
    return [o.detach().clone() for o in outs]


def max_abs(a: Sequence[Any], b: Sequence[Any]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def _whole_sequences(prompt: Any, steps: list[Any]) -> list[Any]:
    """A program without KV cache reads whole sequences: the prompt, then the prompt and
    the decode tokens."""
    import torch

    return [prompt, torch.cat([prompt, *steps], dim=1)]


def _child(pte: str, where: str, out: str, kv_cache: str = "True") -> None:
    import torch

    if where == "vulkan":
        from fusionkit.backends.vulkan_adapter import runtime as rt

        rt.load()
    import executorch.extension.llm.custom_ops.custom_ops
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    with contextlib.suppress(Exception):  # an install without the quantized kernels
        import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed CPU ops)
    data = Path(pte).read_bytes()  # kept alive while the module runs
    module = _load_for_executorch_from_buffer(data)
    prompt, steps = tokens()
    if kv_cache != "True":
        torch.save([module.forward((x,))[0].clone() for x in _whole_sequences(prompt, steps)],
                   out)
        return
    outs = [module.forward((prompt, torch.tensor([0])))[0].clone()]
    for i, t in enumerate(steps):
        outs.append(module.forward((t, torch.tensor([PROMPT_LEN + i])))[0].clone())
    torch.save(outs, out)


# ---------------------------------------------------------------- qwen3 and other model classes
# (export_llm's other ``base.model_class`` values on the Vulkan path; separate from the
# llama3 helpers above)

#: a 2-layer Qwen3 (examples/models/qwen3's 0.6B config, shrunk): q/k RMSNorms before the
#: HF-style rope, ``n_heads * head_dim`` (128) != ``dim`` (64) as in the 0.6B model, GQA
TINY_QWEN3: dict[str, Any] = {"dim": 64, "hidden_dim": 128, "ffn_dim_multiplier": 1,
                              "n_heads": 4, "head_dim": 32, "n_kv_heads": 2, "n_layers": 2,
                              "vocab_size": TINY_LLAMA["vocab_size"], "norm_eps": 1e-6,
                              "rope_theta": 1000000.0, "use_scaled_rope": False,
                              "use_hf_rope": True, "attention_qkv_bias": False,
                              "use_qk_norm": True, "qk_norm_before_rope": True}


_T: dict[str, Any] = {"dim": 64, "hidden_dim": 128, "n_heads": 4, "n_kv_heads": 2,
                      "n_layers": 2, "vocab_size": TINY_LLAMA["vocab_size"],
                      "ffn_dim_multiplier": 1, "use_scaled_rope": False}

#: export_llm's model classes that build offline from a params file, each at tiny width
#: with what sets it apart (its published config's switches): ``name -> (base.model_class,
#: params)``. qwen3_5 needs ``flash-linear-attention``-style layers the wheel builds but
#: its runtime cannot run on either backend path; it is left out.
MODEL_CLASSES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3_2": ("llama3_2", {**TINY_LLAMA, "ffn_dim_multiplier": 1.5}),
    "smollm2": ("smollm2", {**_T, "norm_eps": 1e-5, "rope_theta": 10000.0,
                            "use_hf_rope": False, "attention_qkv_bias": False}),
    "qwen2_5": ("qwen2_5_0_5b", {**_T, "norm_eps": 1e-6, "rope_theta": 1e6,
                                 "use_hf_rope": True, "attention_qkv_bias": True}),
    "qwen3": ("qwen3_0_6b", TINY_QWEN3),
    "phi_4_mini": ("phi_4_mini", {**_T, "norm_eps": 1e-5, "rope_theta": 10000.0,
                                  "use_hf_rope": True, "partial_rotary_factor": 0.75,
                                  "attention_qkv_bias": False}),
    "lfm2": ("lfm2_350m", {**_T, "norm_eps": 1e-5, "rope_theta": 1e6, "use_hf_rope": True,
                           "use_qk_norm": True, "qk_norm_before_rope": True,
                           "layer_types": ["conv", "full_attention"]}),
}


def export_pair(args: Sequence[str], out_dir: Path, fusionkit: str, report: Path,
                timeout: float = 900.0) -> tuple[tuple[Path | None, str], tuple[Path | None, str]]:
    """:func:`export`'s two runs (stock, then under ``fusionkit exec``) started together:
    each is mostly the exporter's own work in its own process, so on two cores the pair
    takes about as long as one. ``args`` must not name ``export.output_dir``: each run
    writes into ``out_dir/stock`` or ``out_dir/fk``."""
    import concurrent.futures

    def one(kind: str) -> tuple[Path | None, str]:
        d = out_dir / kind
        own = [*args, f"export.output_dir={d}"]
        if kind == "stock":
            return export(own, d, timeout=timeout)
        return export(own, d, fusionkit=fusionkit, report=report, timeout=timeout)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        stock, ours = pool.submit(one, "stock"), pool.submit(one, "fk")
        return stock.result(), ours.result()


def delegate_arity(pte: Path | bytes) -> list[tuple[int, int]]:
    """Each Vulkan delegate call of a .pte (a file or its bytes): (arguments the call
    supplies, inputs + outputs its serialized graph declares). The runtime aborts at
    execute when they differ (``VulkanBackend::execute``: ``args.size() == num_inputs +
    num_outputs``)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    from fusionkit.backends.vulkan_adapter.inspect.payload import decode_payload

    prog = deserialize_pte_binary(pte if isinstance(pte, bytes) else pte.read_bytes())
    prog = getattr(prog, "program", prog)
    found = []
    for plan in prog.execution_plan:
        for chain in plan.chains:
            for ins in chain.instructions:
                call = ins.instr_args
                if type(call).__name__ != "DelegateCall":
                    continue
                delegate = plan.delegates[call.delegate_index]
                if delegate.id != "VulkanBackend":
                    continue
                data = prog.backend_delegate_data[delegate.processed.index].data
                g = decode_payload(data).graph
                found.append((len(call.args), len(g.input_ids) + len(g.output_ids)))
    return found


if __name__ == "__main__":
    _child(*sys.argv[1:5])
