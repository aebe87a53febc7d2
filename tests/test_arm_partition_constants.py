"""Arm float: a convolution whose weight or bias is not a constant stays on the CPU.

Stock: Arm's partitioner delegates it and ``RewriteConvPass`` crashes the lowering
(``get_param_tensor``: ``unsupported param type, placeholder``). The adapter's partitioner
keeps it off the delegate with a reason in its report; the program runs equal to eager
(TOSA reference model for the delegated part, the CPU for the rest).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusionkit.backends.arm_adapter import reference_model as rm
from fusionkit.backends.arm_adapter.constant_operands import non_constant_operand
from fusionkit.program_inputs import ProgramInputs


class WeightInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(torch.relu(x), w).sigmoid()


class ComputedBias(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv1d(x, self.conv.weight, self.conv.bias * 2) + 1


class TransposedWeightInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose2d(x, w, stride=2) * 2


MODELS = {
    "weight_input": (WeightInput, lambda: (torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3))),
    "computed_bias": (ComputedBias, lambda: (torch.randn(1, 3, 8),)),
    "transposed_weight_input": (TransposedWeightInput,
                                lambda: (torch.randn(1, 3, 4, 4), torch.randn(3, 2, 3, 3))),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    cls, inputs = MODELS[request.param]
    return request.param, cls().eval(), inputs()


def _chain(e: BaseException | None) -> str:
    """The messages of an exception and of every exception it was raised from."""
    out = []
    while e is not None:
        out.append(str(e)[:2000])
        e = e.__cause__ or e.__context__
    return " | ".join(out)


def test_stock_delegates_what_arm_cannot_compile(case: tuple[str, torch.nn.Module, tuple]
                                                 ) -> None:
    """Stock: a graph-input weight crashes Arm's RewriteConvPass; a computed bias is
    computed by stock on the CPU path of its own lowering (no crash to show)."""
    name, model, inputs = case
    if name == "computed_bias":
        run = rm.evaluate(model, inputs, fusionkit=False, spec=rm.FP)
        assert run.error < 1e-5
        return
    with pytest.raises(Exception) as raised:
        rm.evaluate(model, inputs, fusionkit=False, spec=rm.FP)
    assert "unsupported param type" in _chain(raised.value)


def test_adapter_keeps_the_convolution_on_the_cpu(case: tuple[str, torch.nn.Module, tuple]
                                                  ) -> None:
    name, model, inputs = case
    run = rm.evaluate(model, inputs, fusionkit=True, spec=rm.FP)
    assert run.error < 1e-5, (name, run.error)
    assert run.delegated >= 1  # the rest still goes to TOSA
    program = run.edge.exported_program()
    convs = [n for n in program.graph.nodes if "convolution" in str(n.target)]
    assert len(convs) == 1  # on the CPU, outside every delegate
    assert "not a constant" in (non_constant_operand(ProgramInputs(program), convs[0]) or "")
