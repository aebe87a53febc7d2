"""``fusionkit run --backend arm``: a model on the TOSA reference model beside eager, and a
``.pte``'s TOSA delegates run alone."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("tosa_reference_model")
pytest.importorskip("executorch.backends.arm.tosa.partitioner")

from fusionkit.app.cli import main

pytestmark = pytest.mark.slow


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.linear = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(torch.nn.functional.hardtanh(self.conv(x), -1.0, 2.0))
        return torch.clamp(self.linear(y)[:, 1:3][:, :, 1:4], max=0.5)


def make() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 3, 8, 8),)


def test_run_a_model_on_the_reference_model_beside_eager(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["run", "test_arm_cli:make", "--backend", "arm", "--int", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["matches_eager"]
    assert report["device"].startswith("TOSA reference model")
    assert report["outputs"][0]["shape"] == [1, 2, 3, 5]
    # int8 against the fake-quantized model: within one output step, and not float eager
    assert "max |reference model - float eager|" in report["message"]


def test_run_a_pte_runs_its_tosa_delegates(tmp_path, capsys: pytest.CaptureFixture[str]  # type: ignore[no-untyped-def]
                                           ) -> None:
    from fusionkit.backends.arm_adapter import reference_model as rm

    model, inputs = make()
    edge = rm.lower(model, inputs, fusionkit=True, spec=rm.FP)
    pte = tmp_path / "net.pte"
    pte.write_bytes(edge.to_executorch().buffer)
    assert main(["run", str(pte), "--backend", "arm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "ok" and "1 TOSA delegate(s) ran" in report["message"]
    assert report["outputs"][0]["shape"] == [1, 2, 3, 5]
    # a .pte without a TOSA delegate is the user's mistake: one line naming it, exit 2
    plain = tmp_path / "plain.pte"
    from executorch.exir import to_edge

    plain.write_bytes(to_edge(torch.export.export(model, inputs)).to_executorch().buffer)
    assert main(["run", str(plain), "--backend", "arm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plain.pte" in err[0] and "TOSA" in err[0], err
