"""The RMSNorm seed table on ExecuTorch's real Vulkan runtime (lavapipe here).

Six multiplier rows x fp32/fp16, lowered by fusionkit and by stock ExecuTorch 1.5.1.
fusionkit's programs must equal eager on the runtime; stock's must be refused exactly
for the rows whose fused weight is not a constant, with the runtime's own message —
reproduced for real, in a child process. The simulator and ``check()`` must predict
what the runtime did, program by program.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rmsnorm_models import ROWS, row_case
from vulkan_real_programs import Program, lower, run_all

DTYPES = (torch.float32, torch.float16)
SEED_MESSAGE = "(graph.val_is_tref(tensor_data)) is false!"


@pytest.fixture(scope="module")
def programs(vulkan_runtime: Any) -> list[Program]:
    out = []
    for row in ROWS:
        for dtype in DTYPES:
            model, args = row_case(row, dtype)
            with torch.no_grad():
                eager = model(*args)
            ep = torch.export.export(model, args)
            name = f"{row.name}/{str(dtype).removeprefix('torch.')}"
            for path in ("fusionkit", "stock"):
                out.append(lower(name, "rmsnorm", path, ep, args, eager, dtype=dtype))
    run_all(out)
    return out


def _by(programs: list[Program], path: str) -> list[Program]:
    return [p for p in programs if p.path == path]


def test_fusionkit_programs_equal_eager_on_the_real_runtime(programs: list[Program]) -> None:
    ours = _by(programs, "fusionkit")
    assert len(ours) == len(ROWS) * len(DTYPES) == 12
    bad = [p.describe() for p in ours if p.lower_error or p.outcome != "ok"]
    assert not bad, bad


def test_stock_is_refused_exactly_where_the_seed_says(programs: list[Program]) -> None:
    stock = _by(programs, "stock")
    for p in stock:
        row = next(r for r in ROWS if p.name.startswith(r.name + "/"))
        assert p.lower_error is None, p.describe()
        if row.stock_aborts:
            assert p.outcome == "refused", p.describe()
            assert "prepack_standard" in p.real.message and SEED_MESSAGE in p.real.message
        else:
            assert p.outcome == "ok", p.describe()
    assert sum(p.outcome == "refused" for p in stock) == 4 * len(DTYPES)


def test_simulator_and_check_predict_the_real_runtime(programs: list[Program]) -> None:
    wrong = [p.describe() for p in programs if not (p.simulator_agrees and p.check_agrees)]
    assert not wrong, wrong
