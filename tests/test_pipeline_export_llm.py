"""ExecuTorch's ``export_llm``, unedited, under ``fusionkit exec``: the pipeline LLM users run.

Each case exports the same tiny llama3 (params file + seeded checkpoint) twice — stock and
under ``fusionkit exec`` — runs both programs (prefill, then decode steps; the Vulkan ones
on the real runtime) and holds fusionkit's to stock's and to ExecuTorch's eager model.
The default run takes the two paths users hit first (XNNPACK float, Vulkan with the
KV-cache sdpa); ``-m pipeline_full`` adds the rest of the matrix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llm_pipeline as llm
import pytest
import vulkan_runtime_oracle as oracle

from fusionkit.backends.vulkan_adapter import runtime as rt

pytestmark = pytest.mark.slow

XNNPACK = ["backend.xnnpack.enabled=True", "model.use_sdpa_with_kv_cache=True"]
VULKAN_SDPA = ["backend.vulkan.enabled=True", "model.use_sdpa_with_kv_cache=True"]
VULKAN_PLAIN = ["backend.vulkan.enabled=True"]
XNNPACK_8DA4W = [*XNNPACK, "quantization.qmode=8da4w", "quantization.group_size=32"]

#: float programs vs eager (the runtimes' kernels reorder sums)
EAGER_TOL = 1e-4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Any]]:
    d = tmp_path_factory.mktemp("llm")
    params, checkpoint = llm.write_model(d)
    return params, checkpoint, llm.eager_logits(params, checkpoint)


def _needs_runtime(where: str) -> None:
    if where == "vulkan" and rt.find_runtime() is None:
        if oracle.required():
            pytest.fail("no real Vulkan runtime (FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1 / CI)")
        pytest.skip("no real Vulkan runtime installed (scripts/vulkan-runtime)")


def _both(model: tuple[Path, Path, list[Any]], tmp: Path, backend: list[str], fk: str
          ) -> tuple[Path, Path, dict[str, Any]]:
    params, checkpoint, _ = model
    stock_pte, stock_err = llm.export(llm.export_args(params, checkpoint, tmp / "stock", backend),
                                      tmp / "stock")
    assert stock_pte is not None, f"stock export_llm failed:\n{stock_err[-2000:]}"
    report = tmp / "report.json"
    fk_pte, fk_err = llm.export(llm.export_args(params, checkpoint, tmp / "fk", backend),
                                tmp / "fk", fusionkit=fk, report=report)
    assert fk_pte is not None, f"export_llm under fusionkit exec failed:\n{fk_err[-3000:]}"
    return stock_pte, fk_pte, json.loads(report.read_text())


#: fusions every Vulkan export of the tiny llama must make (all of its norms, ropes and
#: KV-cache attentions, whose ops each read the position themselves)
VULKAN_FUSED = {"rms_norm": 2 * llm.TINY_LLAMA["n_layers"] + 1,
                "export_llama_rope": llm.TINY_LLAMA["n_layers"],
                "causal_sdpa": llm.TINY_LLAMA["n_layers"]}

CASES = [
    pytest.param(XNNPACK, "xnnpack", "cpu", True, {}, id="xnnpack-fp32"),
    pytest.param(VULKAN_SDPA, "vulkan", "vulkan", True, VULKAN_FUSED, id="vulkan-sdpa"),
    pytest.param(XNNPACK_8DA4W, "xnnpack", "cpu", False, {}, id="xnnpack-8da4w",
                 marks=pytest.mark.pipeline_full),
]


@pytest.mark.parametrize(("backend", "fk", "where", "float_program", "must_fuse"), CASES)
def test_export_llm_under_fusionkit_exec(model: tuple[Path, Path, list[Any]], tmp_path: Path,
                                         backend: list[str], fk: str, where: str,
                                         float_program: bool, must_fuse: dict[str, int]
                                         ) -> None:
    _needs_runtime(where)
    stock_pte, fk_pte, report = _both(model, tmp_path, backend, fk)
    # fusionkit was in the exporter's process and its rules decided there (XNNPACK's
    # linears arrive as linears: its rules decline them, nothing to fuse)
    assert report["exit_code"] == 0 and report["processes"] >= 1
    done = report["backends"][fk]
    assert done["installed_in"] >= 1 and not done["install_errors"], done
    assert sum(done["fused"].values()) + sum(done["declined"].values()) > 0, done
    for rule, n in must_fuse.items():
        assert done["fused"].get(rule) == n, (rule, done["fused"])
    stock, ours = llm.run_program(stock_pte, where), llm.run_program(fk_pte, where)
    assert len(ours) == 1 + llm.DECODE_STEPS
    # what stock's program computes, on the same runtime
    assert llm.max_abs(ours, stock) <= (1e-6 if float_program else 1e-5)
    if float_program:  # and what the eager model computes
        assert llm.max_abs(ours, model[2]) <= EAGER_TOL


@pytest.mark.pipeline_full
def test_xnnpack_weight_only_4w_computes_the_quantized_model(
        model: tuple[Path, Path, list[Any]], tmp_path: Path) -> None:
    """``quantization.qmode=4w`` on XNNPACK: each linear's weight is torchao's
    ``dequantize_affine`` of int4 values. Stock's ``ConvertToLinearPass`` walks to the
    integer weight and drops the dequantize: its program multiplies by the raw integers
    (measured 92 off the quantized model, no error). Under ``fusionkit exec`` the
    dequantize is evaluated at lowering (``passes/xnnpack/convert_to_linear.py``): the
    program computes the exporter's own 4w model."""
    params, checkpoint, _ = model
    overrides = [*XNNPACK, "quantization.qmode=4w", "quantization.group_size=32"]
    args = [a for a in llm.export_args(params, checkpoint, tmp_path, overrides)
            if not a.startswith("export.output_dir=")]
    (stock_pte, stock_err), (ours_pte, ours_err) = llm.export_pair(
        args, tmp_path, "xnnpack", tmp_path / "report.json")
    assert ours_pte is not None, ours_err[-2000:]
    assert stock_pte is not None, stock_err[-2000:]
    reference = llm.exported_reference(args)
    assert llm.max_abs(llm.run_program(ours_pte, "cpu"), reference) <= 1e-4  # measured 3e-6
    assert llm.max_abs(llm.run_program(stock_pte, "cpu"), reference) > 1.0  # stock's bug


@pytest.mark.pipeline_full
def test_vulkan_without_kv_cache_runs_where_stock_aborts(model: tuple[Path, Path, list[Any]],
                                                        tmp_path: Path) -> None:
    """``model.use_kv_cache=False``: the attention mask's ``logical_not``, which ExecuTorch's
    partitioner delegates and the runtime does not register, aborts stock's program at load
    (``Missing operator``). Under ``fusionkit exec`` ExecuTorch's own partitioner keeps it
    on the CPU (``vulkan_adapter.missing_operators``): the program runs, equal to eager."""
    _needs_runtime("vulkan")
    params, checkpoint, _ = model
    args = [a for a in llm.export_args(params, checkpoint, tmp_path, VULKAN_PLAIN)
            if a != "model.use_kv_cache=True"] + ["model.use_kv_cache=False"]
    (stock_pte, stock_err), (ours_pte, ours_err) = llm.export_pair(
        [a for a in args if not a.startswith("export.output_dir=")], tmp_path, "vulkan",
        tmp_path / "report.json")
    assert ours_pte is not None, ours_err[-2000:]
    ours = llm.run_program(ours_pte, "vulkan", kv_cache=False)
    assert llm.max_abs(ours, llm.eager_logits(params, checkpoint, kv_cache=False)) <= EAGER_TOL
    assert stock_pte is not None, stock_err[-2000:]
    with pytest.raises(RuntimeError, match=r"Missing operator: aten\.logical_not\.default"):
        llm.run_program(stock_pte, "vulkan", kv_cache=False)


@pytest.mark.pipeline_full
def test_vulkan_expanded_rope_tables_compute_the_eager_model(tmp_path: Path) -> None:
    """``model.expand_rope_table=True`` (multi-head attention: the tables are [seq, heads,
    head_dim / 2]). Stock's rope fusion takes the expanded tables as if they were
    [seq, head_dim / 2]: its program runs, measured 6.7 off eager. fusionkit's rope rule
    declines them; the rope's 5-D ``cat`` then stays on the CPU and splits the graph, and
    ExecuTorch's partitioner put the position's assertions in another partition than the
    ``narrow`` reading it (Vulkan's re-trace failed: ``GuardOnDataDependentSymNode``).
    Under ``fusionkit exec`` they move with the value
    (``fusionkit.integration.runtime_assertions``): the program runs, equal to eager."""
    _needs_runtime("vulkan")
    params, checkpoint = llm.write_model(
        tmp_path / "mha", {**llm.TINY_LLAMA, "n_kv_heads": llm.TINY_LLAMA["n_heads"]})
    args = [a for a in llm.export_args(params, checkpoint, tmp_path,
                                       [*VULKAN_SDPA, "model.expand_rope_table=True"])
            if not a.startswith("export.output_dir=")]
    (stock_pte, stock_err), (ours_pte, ours_err) = llm.export_pair(
        args, tmp_path, "vulkan", tmp_path / "report.json")
    assert ours_pte is not None, ours_err[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())["backends"]["vulkan"]
    assert "export_llama_rope" not in report["fused"], report["fused"]
    reference = llm.eager_logits(params, checkpoint)
    assert llm.max_abs(llm.run_program(ours_pte, "vulkan"), reference) <= EAGER_TOL
    assert stock_pte is not None, stock_err[-2000:]
    stock = llm.max_abs(llm.run_program(stock_pte, "vulkan"), reference)
    assert stock > 1.0 or stock <= EAGER_TOL, stock  # stock's bug, or an ExecuTorch that fixed it


def _vulkan_pair(model: tuple[Path, Path, list[Any]], tmp_path: Path, overrides: list[str]
                 ) -> tuple[str | None, Path, dict[str, Any]]:
    """Stock's Vulkan export beside ``fusionkit exec``'s, which must export: stock's error
    (None when it exported), fusionkit's ``.pte`` and the Vulkan part of its report."""
    _needs_runtime("vulkan")
    params, checkpoint, _ = model
    args = [a for a in llm.export_args(params, checkpoint, tmp_path, overrides)
            if not a.startswith("export.output_dir=")]
    report = tmp_path / "report.json"
    (stock_pte, stock_err), (ours_pte, ours_err) = llm.export_pair(args, tmp_path, "vulkan",
                                                                   report)
    assert ours_pte is not None, ours_err[-2000:]
    return (None if stock_pte else stock_err), ours_pte, json.loads(
        report.read_text())["backends"]["vulkan"]


@pytest.mark.pipeline_full
def test_vulkan_local_global_attention_runs_where_stock_fails(
        model: tuple[Path, Path, list[Any]], tmp_path: Path) -> None:
    """``model.local_global_attention=[16]`` (a ring-buffer KV cache of 16 positions):
    stock's export fails (``IndexError`` in Vulkan's sdpa pattern). Under ``fusionkit exec``
    it exports, and ExecuTorch's own partitioner keeps on the CPU what the runtime gets
    wrong (``vulkan_adapter.broken_conditions``): the masked ``custom_sdpa`` (``is_causal``
    only), a same-dtype ``_to_copy`` (a texture-only blit), ``lt.Scalar`` against the
    position (read at the first call only: every later step attended to the new token
    alone). The program runs on the real runtime, equal to eager at prefill and each
    decode step; the report lists each node kept off and why."""
    stock_err, ours, report = _vulkan_pair(
        model, tmp_path, [*VULKAN_SDPA, "model.local_global_attention=[16]"])
    assert llm.max_abs(llm.run_program(ours, "vulkan"), model[2]) <= EAGER_TOL
    placed = " ".join(p["why"] for p in report["placed"])
    for condition in ("causal_no_mask", "blit_needs_textures", "scalar_known_when_built"):
        assert f"condition {condition!r}" in placed, placed
    assert stock_err is None or "IndexError" in stock_err, stock_err[-2000:]


@pytest.mark.pipeline_full
def test_vulkan_without_kv_cache_sdpa_runs_where_stock_fails(
        model: tuple[Path, Path, list[Any]], tmp_path: Path) -> None:
    """Without ``use_sdpa_with_kv_cache`` ExecuTorch 1.5.1's own memory planning fails in
    Vulkan's preprocess (``graph_output_allocated not set``): a partition gives the CPU
    ``input_pos[0].item()`` and nothing else. Under ``fusionkit exec`` such partitions run
    on the CPU (``vulkan_adapter.int_only_partitions``); the program runs on the real
    runtime, equal to eager at prefill and each decode step."""
    stock_err, ours, report = _vulkan_pair(model, tmp_path, VULKAN_PLAIN)
    assert llm.max_abs(llm.run_program(ours, "vulkan"), model[2]) <= EAGER_TOL
    placed = [p["what"] for p in report["placed"]]
    assert "partition kept on the CPU: ints only" in placed, placed
    assert stock_err is None or "graph_output_allocated not set" in stock_err, stock_err[-2000:]


@pytest.mark.pipeline_full
def test_vulkan_quantized_kv_cache_computes_what_xnnpack_computes(
        model: tuple[Path, Path, list[Any]], tmp_path: Path) -> None:
    """``model.quantize_kv_cache=True`` (an int8 KV cache, ExecuTorch's quantized
    ``update_cache``): stock's Vulkan export fails (``GuardOnDataDependentSymNode`` in
    ``FuseBatchNormPass``). Under ``fusionkit exec`` it exports (the cache's updates stay
    with the CPU program, and the position's ``.item()`` partition, left giving the CPU an
    int only, goes with them) and runs on the real runtime; the quantized cache is not the
    float model, so the reference is stock's XNNPACK program of the same checkpoint and
    options, which it equals at prefill and each decode step."""
    qkv = ["model.quantize_kv_cache=True"]
    stock_err, ours, _ = _vulkan_pair(model, tmp_path, [*VULKAN_SDPA, *qkv])
    params, checkpoint, _ = model
    xnn_pte, xnn_err = llm.export(llm.export_args(params, checkpoint, tmp_path / "x",
                                                  [*XNNPACK, *qkv]), tmp_path / "x")
    assert xnn_pte is not None, xnn_err[-2000:]
    reference = llm.run_program(xnn_pte, "cpu")
    assert llm.max_abs(llm.run_program(ours, "vulkan"), reference) <= EAGER_TOL
    assert stock_err is None or "GuardOnDataDependentSymNode" in stock_err, stock_err[-2000:]


@pytest.mark.pipeline_full
def test_tosa_float_export_is_stocks_byte_for_byte(model: tuple[Path, Path, list[Any]],
                                                   tmp_path: Path) -> None:
    """``backend.tosa.enabled`` alone: export_llm's default profile, TOSA-1.0+INT, on the float
    model (3 TOSA delegates in this llama; TOSA-1.0+FP proper fails stock and fusionkit alike,
    ``test_pipeline_export_llm_quantized``): fusionkit's rules decide inside the Arm
    lowering and change nothing this llama needs; the .pte is stock's, byte for byte, so it
    computes what stock's does (running a whole KV-cache .pte on the TOSA reference model
    is not done here)."""
    params, checkpoint, _ = model
    tosa = ["backend.tosa.enabled=True"]
    stock_pte, stock_err = llm.export(llm.export_args(params, checkpoint, tmp_path / "s", tosa),
                                      tmp_path / "s")
    assert stock_pte is not None, stock_err[-2000:]
    report = tmp_path / "r.json"
    ours_pte, ours_err = llm.export(llm.export_args(params, checkpoint, tmp_path / "f", tosa),
                                    tmp_path / "f", fusionkit="arm", report=report)
    assert ours_pte is not None, ours_err[-2000:]
    arm = json.loads(report.read_text())["backends"]["arm"]
    assert arm["installed_in"] == 1 and sum(arm["fused"].values()) + sum(arm["declined"].values()) > 0
    assert ours_pte.read_bytes() == stock_pte.read_bytes()
