"""``FuseQuantizedActivationPass`` taken over: a relu whose output quantization is shared
(the inputs of a ``cat``) is not the quantize's clamp, and the TOSA lowering never clamps to
a quantize's ``qmin``. Judged on the TOSA reference model against the fake-quantized
model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tosa_reference_model")
pytest.importorskip("executorch.backends.arm.tosa.partitioner")

from fusionkit import find_matches
from fusionkit.backends.arm_adapter import preprocess_rules
from fusionkit.backends.arm_adapter import reference_model as rm
from fusionkit.passes.registry import rules_taking_over

pytestmark = pytest.mark.slow


class ReluCat(torch.nn.Module):
    """``cat([relu(conv a), conv b])`` and a plain ``conv -> relu`` beside it: Arm's
    quantizer gives a cat's inputs one scale and zero point, so the first relu's quantize
    has a zero point above its qmin; the second's range starts at 0 (zp == qmin)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.b = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.c = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([F.relu(self.a(x)), self.b(x)], 1), F.relu(self.c(x))


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = ReluCat().eval(), (torch.randn(1, 3, 6, 6),)
    out: dict[str, Any] = {}
    for way in ("stock", "fusionkit"):
        preprocess_rules.reset_counts()
        out[way] = rm.evaluate(model, inputs, fusionkit=way == "fusionkit", spec=rm.INT)
        out[f"{way}_counts"] = preprocess_rules.counts()
    return out


def test_a_shared_quantization_relu_stays_and_the_program_equals_fake_quantized(
        runs: dict[str, Any]) -> None:
    stock, ours = runs["stock"], runs["fusionkit"]
    # the relu before the cat is kept, the plain conv -> relu still fused
    assert runs["fusionkit_counts"]["FuseQuantizedActivationPass"]["fused"] == 1
    assert ours.error == 0.0, ours.error
    assert ours.delegated == 1
    # stock drops it: the relu half of the cat comes back negative
    cat_stock, cat_ref = stock.outputs[0], stock.reference[0]
    assert float(cat_ref[:, :4].min()) == 0.0
    assert float(cat_stock[:, :4].min()) < -0.5
    assert stock.tosa != ours.tosa


def test_the_decline_names_the_zero_point_and_qmin() -> None:
    torch.manual_seed(0)
    model, inputs = ReluCat().eval(), (torch.randn(1, 3, 6, 6),)
    from executorch.exir import to_edge

    quantized = rm.fake_quantized(model, inputs)
    ep = to_edge(torch.export.export(quantized, inputs)).exported_program()
    ms = find_matches(ep, rules_taking_over("arm", "FuseQuantizedActivationPass"))
    assert len(ms.accepted) == 1
    reasons = [d.reason for d in ms.declined if d.rule == "arm_fuse_quantized_relu"
               and "zero point" in d.reason]
    assert len(reasons) == 1, [d.reason for d in ms.declined]
    assert "is above its qmin -128" in reasons[0]


def test_verify_finds_the_fold_wrong_without_a_positive_scale() -> None:
    """``fusionkit verify`` showed the relu fold wrong for a negative scale (relu then
    quantize gives codes at the zero point, the fused quantize codes above it); the rule
    declines a scale that is not positive, and verifies equal; without that check it
    is different."""
    import dataclasses

    from fusionkit.authoring.verify import DIFFERENT, EQUAL, verify
    from fusionkit.passes._constraint import constraint
    from fusionkit.passes.arm.quantized_activation import (
        _per_tensor,
        quantized_activation_rules,
    )

    rule = quantized_activation_rules()[0]
    assert _per_tensor(None, -0.5, 0, 0, 127) is not None  # type: ignore[arg-type]
    assert _per_tensor(None, 0.5, 0, 0, 127) is None  # type: ignore[arg-type]
    assert verify(rule, cases=20, max_examples=300).status == EQUAL

    def any_scale(ctx: Any, scale: Any, zp: Any, qmin: Any, qmax: Any) -> None:
        return None

    kept = [c for c in rule.constraints if getattr(c, "name", None) != "per_tensor"]
    assert len(kept) == len(rule.constraints) - 1
    weak = dataclasses.replace(rule, constraints=[*kept, constraint("per_tensor")(any_scale)])
    assert verify(weak, cases=20, max_examples=300).status == DIFFERENT
