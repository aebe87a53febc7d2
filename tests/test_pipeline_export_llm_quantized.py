"""``export_llm``'s quantized and fp16 modes on Vulkan and TOSA, and TOSA's float profile,
unedited, stock and under ``fusionkit exec`` (``-m pipeline_full``: a few minutes per case
on a loaded 2-core machine).

Each mode exports the tiny llama3 of ``test_pipeline_export_llm`` twice (stock, fusionkit)
with the same overrides. Where stock exports, fusionkit must export too, and each Vulkan
program runs prefill and decode steps on the real Vulkan runtime: fusionkit's computes
what stock's computes and what the exporter's own model computes before lowering
(:func:`llm_pipeline.exported_reference`: the source-transformed or PT2E fake-quantized
model, run eagerly). Where stock fails, the test says how, and fusionkit fails with the
same message or runs equal to that reference. A TOSA program is not run here (a whole
KV-cache ``.pte`` with TOSA delegates cannot run on the reference model in this setup).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import llm_pipeline as llm
import pytest
import vulkan_runtime_oracle as oracle

from fusionkit.backends.vulkan_adapter import runtime as rt

pytestmark = [pytest.mark.slow, pytest.mark.pipeline_full]

VULKAN = ["backend.vulkan.enabled=True", "model.use_sdpa_with_kv_cache=True"]


class Mode(NamedTuple):
    overrides: list[str]
    backend: str  #: fusionkit exec --backend
    #: fusionkit's program vs the exporter's own model (None: not run, TOSA)
    reference_tol: float | None
    #: how stock ExecuTorch 1.5.1 fails (a line of its error), None: it exports
    stock_failure: str | None = None


MODES = {
    # PT2E, VulkanQuantizer (8-bit weights): stock's Vulkan FusePatternsPass reads the
    # RMSNorm's eps with float() of a data-dependent value and fails; fusionkit's rms_norm
    # rule fuses it
    "vulkan-8w": Mode([*VULKAN, "quantization.pt2e_quantize=vulkan_8w"], "vulkan", 1e-4,
                      "GuardOnDataDependentSymNode: Could not guard on data-dependent "
                      "expression"),
    # source transforms (torchao): dynamically quantized int8 activations, int4 weights; the
    # Vulkan kernel quantizes the activations its own way (~0.1 from torchao's eager)
    "vulkan-8da4w": Mode([*VULKAN, "quantization.qmode=8da4w", "quantization.group_size=32"],
                         "vulkan", 0.2),
    "vulkan-4w": Mode([*VULKAN, "quantization.qmode=4w", "quantization.group_size=32"],
                      "vulkan", 1e-4),
    # the delegate computes in fp16 (0.014 from the fp32 model at logits of ~5)
    "vulkan-fp16": Mode([*VULKAN, "backend.vulkan.force_fp16=True"], "vulkan", 0.05),
    # PT2E, TOSAQuantizer, TOSA-1.0+INT (export_llm's default TOSA version), dynamic shapes
    # (export_llm's default): the Arm pass pipeline meets arange(sym_size)
    "tosa-8a8w": Mode(["backend.tosa.enabled=True", "quantization.pt2e_quantize=tosa_8a8w"],
                      "arm", None,
                      "RuntimeError: aten::arange() Expected a value of type 'number' for "
                      "argument 'end' but instead found type 'Node'."),
    # the same with static shapes: one TOSA delegate, stock's .pte byte for byte
    "tosa-8a8w-static": Mode(["backend.tosa.enabled=True", "quantization.pt2e_quantize=tosa_8a8w",
                              "model.enable_dynamic_shape=False"], "arm", None),
    # TOSA float proper (``backend.tosa.enabled`` alone is export_llm's TOSA-1.0+INT profile,
    # test_pipeline_export_llm's byte-identical case): ExecuTorch's dim_maps meets a
    # symbolic view size
    "tosa-fp": Mode(["backend.tosa.enabled=True", "backend.tosa.version=TOSA-1.0+FP"],
                    "arm", None, "AttributeError: 'Node' object has no attribute 'node'"),
}

_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|SymNode): ")


def _errors(stderr: str) -> list[str]:
    """The exception lines of a failed export's traceback (root cause first)."""
    return [line for line in stderr.splitlines() if _ERROR_LINE.match(line)]


def _same_failure(stock: str, ours: str) -> bool:
    """The same exception types and messages, data-dependent symbol names aside."""
    def norm(lines: list[str]) -> list[str]:
        return [re.sub(r"\b[uz]u?f?\d+\b", "SYM", line) for line in lines]
    return bool(_errors(stock)) and norm(_errors(stock)) == norm(_errors(ours))


def _run_both(stock: Path, ours: Path) -> tuple[list[Any], list[Any]]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(llm.run_program, stock, "vulkan"), pool.submit(
            llm.run_program, ours, "vulkan")
        return a.result(), b.result()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return llm.write_model(tmp_path_factory.mktemp("llm"))


@pytest.mark.parametrize("name", sorted(MODES))
def test_quantized_mode_under_fusionkit_exec(model: tuple[Path, Path], tmp_path: Path,
                                             name: str) -> None:
    mode = MODES[name]
    if mode.backend == "vulkan" and rt.find_runtime() is None:
        if oracle.required():
            pytest.fail("no real Vulkan runtime (FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1 / CI)")
        pytest.skip("no real Vulkan runtime installed (scripts/vulkan-runtime)")
    params, checkpoint = model
    args = [a for a in llm.export_args(params, checkpoint, tmp_path, mode.overrides)
            if not a.startswith("export.output_dir=")]
    report = tmp_path / "report.json"
    (stock_pte, stock_err), (fk_pte, fk_err) = llm.export_pair(args, tmp_path, mode.backend,
                                                               report)
    if stock_pte is None:
        if mode.stock_failure is not None:  # the failure this ExecuTorch is known for
            assert mode.stock_failure in stock_err, _errors(stock_err) or stock_err[-2000:]
        if fk_pte is None:  # fusionkit fails no worse: the same way
            assert _same_failure(stock_err, fk_err), (_errors(stock_err), _errors(fk_err))
            return
    else:
        assert fk_pte is not None, f"export_llm under fusionkit exec failed:\n{fk_err[-3000:]}"
    done = json.loads(report.read_text())["backends"][mode.backend]
    assert done["installed_in"] >= 1 and not done["install_errors"], done
    # no rule's own code raised in the exporter (strict mode would have failed the export)
    assert not [r for r in done["top_decline_reasons"] if ": error: " in r["reason"]], done
    if mode.reference_tol is None:  # TOSA: the program is not run here
        assert stock_pte is not None and fk_pte is not None
        assert fk_pte.read_bytes() == stock_pte.read_bytes()
        return
    if stock_pte is not None:
        stock, ours = _run_both(stock_pte, fk_pte)
        assert llm.max_abs(ours, stock) <= 1e-6  # what stock's program computes
    else:
        ours = llm.run_program(fk_pte, "vulkan")
    assert len(ours) == 1 + llm.DECODE_STEPS
    # and what the exporter's own (quantized) model computes
    assert llm.max_abs(ours, llm.exported_reference(args)) <= mode.reference_tol
