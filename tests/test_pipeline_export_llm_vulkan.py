"""``export_llm`` for Qwen3 on Vulkan, unedited, stock and under ``fusionkit exec``.

A tiny Qwen3 (q/k RMSNorms, HF rope, ``n_heads * head_dim != dim``) is exported twice
with the KV-cache sdpa, in two child processes started together; both programs run
prefill and decode steps on the real Vulkan runtime, each in a child process (a program
the runtime aborts on kills its process), and fusionkit's must compute what stock's does
and what ExecuTorch's eager model does. Every Vulkan delegate call must supply the
arguments its serialized graph declares (the runtime's first check at execute). Without a
runtime the module skips, unless ``FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1`` (or ``CI=true``).
"""

from __future__ import annotations

import json
from typing import Any

import llm_pipeline as llm
import pytest
import vulkan_runtime_oracle as oracle

from fusionkit.backends.vulkan_adapter import runtime as rt

pytestmark = pytest.mark.slow

VULKAN_SDPA = ["backend.vulkan.enabled=True", "model.use_sdpa_with_kv_cache=True"]

#: float programs vs eager (the runtime's kernels reorder sums)
EAGER_TOL = 1e-4


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The model, both exports, both programs' logits on the runtime and eager's."""
    if rt.find_runtime() is None:
        if oracle.required():
            pytest.fail("no real Vulkan runtime (FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1 / CI): "
                        "run `bash scripts/vulkan-runtime`")
        pytest.skip("no real Vulkan runtime installed (scripts/vulkan-runtime)")
    d = tmp_path_factory.mktemp("qwen3")
    params, checkpoint = llm.write_model(d, llm.TINY_QWEN3)
    args = [a for a in llm.export_args(params, checkpoint, d, VULKAN_SDPA,
                                       model_class="qwen3_0_6b")
            if not a.startswith("export.output_dir=")]
    report = d / "report.json"
    (stock_pte, stock_err), (fk_pte, fk_err) = llm.export_pair(args, d, "vulkan", report)
    assert stock_pte is not None, f"stock export_llm failed:\n{stock_err[-2000:]}"
    assert fk_pte is not None, f"export_llm under fusionkit exec failed:\n{fk_err[-3000:]}"
    return {"stock": stock_pte, "fk": fk_pte, "report": json.loads(report.read_text()),
            "eager": llm.eager_logits(params, checkpoint)}


def test_fusionkit_fused_in_the_exporter(qwen3: dict[str, Any]) -> None:
    report = qwen3["report"]
    assert report["exit_code"] == 0
    done = report["backends"]["vulkan"]
    assert done["installed_in"] >= 1 and not done["install_errors"], done
    n = llm.TINY_QWEN3["n_layers"]
    # every norm (attention, ffn, q and k per layer; the final one) and every rope
    assert done["fused"].get("rms_norm") == 4 * n + 1, done["fused"]
    assert done["fused"].get("hf_rope") == n, done["fused"]


@pytest.mark.parametrize("kind", ["stock", "fk"])
def test_delegate_calls_supply_what_the_graphs_declare(qwen3: dict[str, Any], kind: str
                                                       ) -> None:
    arity = llm.delegate_arity(qwen3[kind])
    assert arity and all(supplied == declared for supplied, declared in arity), arity


def test_runs_on_the_real_runtime_as_stock_and_eager(qwen3: dict[str, Any]) -> None:
    stock = llm.run_program(qwen3["stock"], "vulkan")
    ours = llm.run_program(qwen3["fk"], "vulkan")
    assert len(ours) == 1 + llm.DECODE_STEPS
    # what stock's program computes on the same runtime, and what the eager model computes
    assert llm.max_abs(ours, stock) <= 1e-6
    assert llm.max_abs(ours, qwen3["eager"]) <= EAGER_TOL


#: a llama as deep as SmolLM2-135M's 30 layers, at tiny width: every layer's rope reads the
#: same two tables, so each layer's search meets every earlier layer's outputs first
DEEP_LLAMA: dict[str, Any] = {**llm.TINY_LLAMA, "n_layers": 30}


@pytest.mark.pipeline_full
def test_deep_llama_fuses_every_layer_and_runs_as_stock(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    if rt.find_runtime() is None:
        if oracle.required():
            pytest.fail("no real Vulkan runtime (FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1 / CI)")
        pytest.skip("no real Vulkan runtime installed (scripts/vulkan-runtime)")
    d = tmp_path_factory.mktemp("deep_llama")
    params, checkpoint = llm.write_model(d, DEEP_LLAMA)
    args = [a for a in llm.export_args(params, checkpoint, d, VULKAN_SDPA)
            if not a.startswith("export.output_dir=")]
    report = d / "report.json"
    (stock_pte, stock_err), (fk_pte, fk_err) = llm.export_pair(args, d, "vulkan", report,
                                                               timeout=1800)
    assert stock_pte is not None, f"stock export_llm failed:\n{stock_err[-2000:]}"
    assert fk_pte is not None, f"export_llm under fusionkit exec failed:\n{fk_err[-3000:]}"
    fused = json.loads(report.read_text())["backends"]["vulkan"]["fused"]
    n = DEEP_LLAMA["n_layers"]
    assert fused.get("export_llama_rope") == n and fused.get("rms_norm") == 2 * n + 1, fused
    assert len(llm.delegate_arity(fk_pte)) == 1  # one delegate: no layer left on the CPU
    ours = llm.run_program(fk_pte, "vulkan", timeout=900)
    assert llm.max_abs(ours, llm.run_program(stock_pte, "vulkan", timeout=900)) <= 1e-6
    assert llm.max_abs(ours, llm.eager_logits(params, checkpoint)) <= 1e-3
