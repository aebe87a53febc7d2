"""``export_llm``'s model classes, unedited, stock and under ``fusionkit exec``, on XNNPACK
and on the real Vulkan runtime (``-m pipeline_full``: about a minute per case).

Every class that builds offline from a params file (``llm.MODEL_CLASSES``: llama3_2,
smollm2, qwen2_5, qwen3, phi_4_mini, lfm2, each at tiny width with its own switches) is
exported twice with the KV-cache sdpa; both programs run prefill and decode steps in
child processes. Where stock's program runs, fusionkit's computes what it computes and
what ExecuTorch's eager model computes. Where stock's program fails, the test says how:
fusionkit's either runs equal to eager or fails with the runtime's same message. (LFM2's
exported program is not eager's, stock or not: its reference is stock's XNNPACK program.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llm_pipeline as llm
import pytest
import vulkan_runtime_oracle as oracle

from fusionkit.backends.vulkan_adapter import runtime as rt

pytestmark = [pytest.mark.slow, pytest.mark.pipeline_full]

BACKENDS = {"xnnpack": (["backend.xnnpack.enabled=True"], "cpu"),
            "vulkan": (["backend.vulkan.enabled=True"], "vulkan")}

#: float programs vs eager (the runtimes' kernels reorder sums)
EAGER_TOL = 1e-4


def _outcome(pte: Path, where: str) -> list[Any] | str:
    """The program's logits, or the runtime's last message when it fails."""
    try:
        return llm.run_program(pte, where)
    except RuntimeError as e:
        return str(e).strip().splitlines()[-1]


#: classes whose exported program (stock's, on every backend) is not ExecuTorch's eager
#: model: for them the reference is stock's XNNPACK program of the same checkpoint
EXPORT_IS_NOT_EAGER = {
    "lfm2": "its stock XNNPACK program differs from eager Llama2Model by ~0.1 already at "
            "prefill (the exporter's lfm2 path; not a fusion)",
}


def _export(name: str, backend: str, tmp: Path) -> tuple[Path, Path, Path, Path]:
    model_class, params_dict = llm.MODEL_CLASSES[name]
    params, checkpoint = llm.write_model(tmp / "model", params_dict)
    args = [a for a in llm.export_args(params, checkpoint, tmp, [
        *BACKENDS[backend][0], "model.use_sdpa_with_kv_cache=True"], model_class=model_class)
        if not a.startswith("export.output_dir=")]
    (stock_pte, stock_err), (fk_pte, fk_err) = llm.export_pair(
        args, tmp / backend, backend, tmp / f"{backend}-report.json")
    assert stock_pte is not None, f"stock export_llm failed:\n{stock_err[-2000:]}"
    assert fk_pte is not None, f"export_llm under fusionkit exec failed:\n{fk_err[-3000:]}"
    return params, checkpoint, stock_pte, fk_pte


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("name", sorted(llm.MODEL_CLASSES))
def test_model_class_under_fusionkit_exec(name: str, backend: str, tmp_path: Path) -> None:
    where = BACKENDS[backend][1]
    if where == "vulkan" and rt.find_runtime() is None:
        if oracle.required():
            pytest.fail("no real Vulkan runtime (FUSIONKIT_REQUIRE_VULKAN_RUNTIME=1 / CI)")
        pytest.skip("no real Vulkan runtime installed (scripts/vulkan-runtime)")
    params, checkpoint, stock_pte, fk_pte = _export(name, backend, tmp_path)
    stock, ours = _outcome(stock_pte, where), _outcome(fk_pte, where)
    if isinstance(stock, list):
        assert isinstance(ours, list), f"stock's program runs, fusionkit's fails: {ours}"
        assert llm.max_abs(ours, stock) <= 1e-6
    elif not isinstance(ours, list):
        assert ours == stock, f"stock fails with {stock!r}, fusionkit otherwise: {ours!r}"
        return
    # fusionkit's program runs: it computes what the model computes
    if name not in EXPORT_IS_NOT_EAGER:
        assert llm.max_abs(ours, llm.eager_logits(params, checkpoint)) <= EAGER_TOL
    elif backend != "xnnpack":
        *_, reference, _ = _export(name, "xnnpack", tmp_path)
        assert llm.max_abs(ours, llm.run_program(reference, "cpu")) <= EAGER_TOL
