"""The end-to-end benchmark's stage attribution (section 3), on one tiny lowering per path.

Timing values are not asserted (noisy machines); where the time is *booked* is:
the adapter's transform passes are ``fusion``, ExecuTorch's checks around them
``verify``, and a stock lowering (no transform passes) has neither.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import load_adapter, stage_timer, stock_partitioner  # noqa: E402
from benchmarks.models import RMSNorm  # noqa: E402


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(16)
        self.lin = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.norm(x))


@pytest.fixture(scope="module")
def program() -> Any:
    torch.manual_seed(0)
    return _Tiny().eval(), (torch.randn(1, 4, 16),)


def _lower(program: Any, passes: list[Any], part: Any) -> dict[str, float]:
    from executorch.exir import program as ex_program
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.backend_details import BackendDetails

    model, example = program
    ep = torch.export.export(model, example)
    epm = ex_program._program.EdgeProgramManager
    before = (BackendDetails.__dict__["preprocess_multimethod"], epm.__dict__["transform"],
              epm.__dict__["to_backend"], ex_program._program.lift_constant_tensor_pass)
    with stage_timer(passes, part) as acc:
        to_edge_transform_and_lower(ep, transform_passes=passes or None, partitioner=[part])
    after = (BackendDetails.__dict__["preprocess_multimethod"], epm.__dict__["transform"],
             epm.__dict__["to_backend"], ex_program._program.lift_constant_tensor_pass)
    assert after == before  # the timer leaves ExecuTorch as it found it
    return dict(acc)


def test_stock_lowering_books_no_fusion_and_no_verify(program: Any) -> None:
    acc = _lower(program, [], stock_partitioner("xnnpack"))
    assert acc["fusion"] == 0.0 and acc["verify"] == 0.0
    assert acc["preprocess"] > 0.0


def test_adapter_transform_checks_are_verify_not_fusion(program: Any) -> None:
    adapter, why = load_adapter("xnnpack")
    assert adapter is not None, why
    passes = adapter.passes()
    assert passes, "the XNNPACK adapter's transform_passes() is expected to be non-empty"
    try:
        acc = _lower(program, passes, adapter.partitioner())
    finally:
        adapter.uninstall()
    # ExecuTorch validates the program before and after the passes, whatever they do
    assert acc["verify"] > 0.0
    assert acc["preprocess"] > 0.0
    assert all(v >= 0.0 for v in acc.values())
