"""Smoke run of the Arm held-out check's machinery (``benchmarks/arm_held_out.py``, run by
``scripts/arm-held-out``) on a model of this file's own, so the held-out models stay out
of the tests: both paths, float and int8, judged on the TOSA reference model, the module
watched, the table and the markdown record made."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("tosa_reference_model")
pytest.importorskip("executorch.backends.arm.tosa.partitioner")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import arm_held_out as ho  # noqa: E402

pytestmark = pytest.mark.slow


class ConvTimesTwo(torch.nn.Module):
    """conv -> relu -> conv * 2: stock's quantizer writes the scaled weight into the
    module; the adapter's does not."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.c1(x))) * 2.0


def test_the_check_judges_both_paths_and_watches_the_module(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setitem(ho.MODELS, "smoke", ho.HeldOut(ConvTimesTwo, (1, 3, 6, 6)))
    row = ho.check_model("smoke")
    fp, i8 = row["specs"][ho.FP], row["specs"][ho.INT]
    assert row["ok"] and fp["ours_ok"] and i8["ours_ok"]
    assert fp["fusionkit"]["fused"]["FoldScalarMulIntoConvPass"] == 1
    assert fp["fusionkit"]["error"] <= fp["limit"] and i8["fusionkit"]["error"] == 0.0
    assert i8["fake_quantized_equal"]
    # the stock quantizer's fold scales the user's conv; ours leaves it
    assert i8["stock"]["changed_tensors"] == ["c2.weight", "c2.bias"]
    assert not row["stock_ok"]
    assert fp["stock"]["module_unchanged"] and fp["fusionkit"]["module_unchanged"]
    assert i8["fusionkit"]["module_unchanged"]
    (cells,) = ho.table_rows([row])
    assert cells[0] == "smoke" and cells[ho.HEAD.index("ours")] == "ok"
    data = {"started_utc": "-", "git_head": "-", "git_dirty": [], "seconds": 0.0,
            "command": "-", "versions": {"torch": "-", "executorch": "-"}, "models": [row]}
    assert "stock changed the user's module: c2.weight, c2.bias" in ho.markdown(data)
