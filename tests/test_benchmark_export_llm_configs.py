"""The export_llm configuration scan (``benchmarks/export_llm_configs.py``): its cases name
real export_llm options and models, and its table says what each side did. (A whole case
is two exports and three runs: the scan itself, not this suite, runs them.)"""

from __future__ import annotations

from typing import Any

import llm_pipeline as llm

from benchmarks import export_llm_configs as scan


def test_every_case_names_a_known_model_mode_and_backend() -> None:
    from executorch.extension.llm.export.config.llm_config import LlmConfig
    from omegaconf import OmegaConf

    for name, (overrides, model, mode, _kv, _seq) in scan.CASES.items():
        assert model in ("llama3", "mha") or model in llm.MODEL_CLASSES, name
        assert mode in ("kv_seq", "kv_tok", "nokv", "nokv_full"), name
        assert name.startswith({"vulkan": "vk-", "xnnpack": "xnn-"}[scan._backend(overrides)])
        # export_llm's own config accepts every override (a typo would fail both sides)
        OmegaConf.merge(OmegaConf.structured(LlmConfig), OmegaConf.from_dotlist(overrides))


def test_an_export_error_is_the_exception_not_hydras_line() -> None:
    stderr = ("Error executing job with overrides: ['base.model_class=llama3']\n"
              "Traceback (most recent call last):\n  File x\n"
              "AssertionError: graph_output_allocated not set\n")
    assert scan._error(stderr) == "AssertionError: graph_output_allocated not set"


def test_the_table_keeps_the_last_run_of_each_case() -> None:
    base: dict[str, Any] = {"case": "vk-x", "overrides": ["backend.vulkan.enabled=True"],
                            "model": "llama3", "mode": "kv_seq"}
    old = {**base, "fusionkit_export_error": "AssertionError: graph_output_allocated not set",
           "stock_export_error": "AssertionError: graph_output_allocated not set"}
    new = {**base, "stock_export_error": "AssertionError: graph_output_allocated not set",
           "fusionkit_vs_eager": 4.6e-6}
    table = scan.markdown([old, new])
    assert table.count("| vk-x") == 1
    assert "export fails: `AssertionError: graph_output_allocated not set`" in table
    assert "runs, 4.6e-06 from eager" in table
