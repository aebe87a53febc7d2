"""ExecuTorch's example zoo under fusionkit, the fast slice CI runs (issue 46, item 3).

ExecuTorch's own ``python -m executorch.examples.xnnpack.aot_compiler --model_name linear
--delegate`` (and ``--quantize``), unedited, under ``fusionkit exec --backend xnnpack``:
it exports, the ``.pte`` runs through ``portable_lib``, the ``--report`` JSON shows the
XNNPACK adapter installed and its rules deciding, and the program computes what eager
computes (quantized: what the fake-quantized model computes) and what the stock command's
program computes on the same seeded weights. Then one example model through the Vulkan
adapter on the real runtime and the Arm adapter on the TOSA reference model.

The whole zoo: ``bash scripts/example-zoo`` (``benchmarks/example_zoo.py``; the last table
is ``benchmarks/results/example-zoo.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import example_zoo as zoo  # noqa: E402

pytest.importorskip("executorch.examples.xnnpack.aot_compiler")

MODEL = "linear"  # in the command's MODEL_NAME_TO_OPTIONS (so --quantize works); builds offline
#: float programs against eager (XNNPACK's GEMM accumulates in another order)
FP_ATOL = 1e-5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("example-zoo")


@pytest.fixture(scope="module")
def literal(work: Path) -> dict[str, Any]:
    """The command exactly as a user types it, in front of it the launcher."""
    out = work / "literal"
    out.mkdir()
    report = work / "literal-report.json"
    proc = subprocess.run(
        [*zoo.fusionkit_exec_argv("xnnpack", str(report)), "-m", zoo.AOT_COMPILER,
         "--model_name", MODEL, "--delegate", "-o", str(out)],
        cwd=out, env=zoo._env(), capture_output=True, text=True, timeout=600, check=False)
    return {"proc": proc, "out": out,
            "report": json.loads(report.read_text()) if report.exists() else None}


def test_unedited_command_exports_under_fusionkit_exec(literal: dict[str, Any]) -> None:
    proc = literal["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fusionkit exec: xnnpack:" in proc.stderr  # the launcher's summary
    ptes = list(literal["out"].glob("*.pte"))
    assert [p.name for p in ptes] == [f"{MODEL}_xnnpack_fp32.pte"]
    report = literal["report"]
    assert report is not None and report["exit_code"] == 0
    command = report["command"]
    assert command[command.index("--model_name") + 1] == MODEL
    assert command[command.index("-m") + 1] == zoo.AOT_COMPILER  # unedited: the module itself
    xnn = report["backends"]["xnnpack"]
    assert xnn["installed_in"] >= 1 and xnn["install_errors"] == []
    # the adapter's rules ran on the program: each XNNPACK rule fused or declined it
    assert sum(xnn["fused"].values()) + sum(xnn["declined"].values()) >= 1, xnn


def test_unedited_program_runs(literal: dict[str, Any]) -> None:
    import torch

    pte = next(literal["out"].glob("*.pte")).read_bytes()
    x = torch.randn(3, 3)
    (y,) = zoo.run_pte(pte, [x])
    assert tuple(y.shape) == (3, 3) and bool(torch.isfinite(y).all())
    # it is affine in its input, as a linear layer is: f(2x) - f(x) == f(x) - f(0)
    (y2,) = zoo.run_pte(pte, [2 * x])
    (y0,) = zoo.run_pte(pte, [torch.zeros(3, 3)])
    torch.testing.assert_close(y2 - y, y - y0, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module", params=["fp32", "q8"])
def observed(request: pytest.FixtureRequest, work: Path) -> dict[str, Any]:
    quantize = request.param == "q8"
    stock = zoo.aot_compile(MODEL, quantize=quantize, fusionkit=False, work=work, timeout=600)
    fk = zoo.aot_compile(MODEL, quantize=quantize, fusionkit=True, work=work, timeout=600)
    for side in (stock, fk):
        assert side["exit_code"] == 0, side.get("stderr_tail")
    return {"mode": request.param, **zoo._check_aot(stock, fk, quantize)}


def test_fusionkit_program_equals_eager_and_stock(observed: dict[str, Any]) -> None:
    stock, fk = observed["stock"], observed["fusionkit"]
    assert observed["same_model"], "the two runs built different weights or inputs"
    assert stock["runs"] and fk["runs"], (stock.get("run_error"), fk.get("run_error"))
    if observed["mode"] == "fp32":
        assert fk["error_vs_eager"] is not None and fk["error_vs_eager"] <= FP_ATOL
    else:
        # against the fake-quantized model the command itself built: within rounding of
        # one int8 step, and no worse than stock's program
        assert fk["error_vs_fake_quantized"] is not None
        assert fk["error_vs_fake_quantized"] <= stock["error_vs_fake_quantized"] + 1e-6
        assert fk["error_vs_fake_quantized"] <= fk["error_vs_eager"]
    assert observed["fusionkit_vs_stock"] == 0.0
    rules = fk["report"]["backends"]["xnnpack"]
    assert rules["installed_in"] >= 1
    assert sum(rules["fused"].values()) + sum(rules["declined"].values()) >= 1


def _worker(name: str, step: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{name}-{step}.json"
    zoo.worker(name, step, str(out))
    return json.loads(out.read_text())


@pytest.mark.usefixtures("vulkan_runtime")
def test_example_model_on_vulkan_runtime(tmp_path: Path) -> None:
    result = _worker("conv1d", "vulkan", tmp_path)
    fk, stock = result["fusionkit"], result["stock"]
    assert fk["exports"] and fk["delegates"] >= 1, fk
    assert fk["runs"], fk.get("run_error")
    assert fk["error_vs_eager"] <= FP_ATOL
    assert stock["runs"] and result["fusionkit_vs_stock"] <= FP_ATOL


def test_example_model_on_tosa_reference_model(tmp_path: Path) -> None:
    pytest.importorskip("tosa_reference_model")
    result = _worker("conv1d", "arm", tmp_path)
    fk = result["fusionkit"]
    assert fk["exports"] and fk["delegates"] >= 1, fk
    assert fk["runs"], fk.get("run_error")
    assert fk["error_vs_eager"] <= FP_ATOL
    assert result["fusionkit_vs_stock"] <= FP_ATOL
