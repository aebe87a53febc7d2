"""A number in a pattern matches what ``to_edge`` makes of it (issue 23, point 4).

``to_edge`` lifts ``x * c`` into a 0-d float32 constant (cast to the program's
dtype in fp16/bf16 programs). A literal written in a pattern must match that
constant — compared in the constant's dtype, with that dtype's rounding — and
must not match a constant one rounding step or more away. Generated over float
literals and dtypes, through the real ``to_edge``; the exact-value comparison
of an ATen program is checked on the same models. A miss of a user's own rule on
a literal is reported (with the constant's dtype), whatever the threshold.
"""

from __future__ import annotations

import math

import pytest
import torch
from executorch.exir import to_edge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusionkit import FusionPass, Rule, capture, find_matches, lit, one_of, op, ref, replace_with
from fusionkit.targets import op_key

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Scaled(torch.nn.Module):
    """One ``x * c`` per constant, each its own output (so each mul is findable)."""

    def __init__(self, constants: list[float]) -> None:
        super().__init__()
        self.constants = constants

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x * c for c in self.constants)


def _rounded(c: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(c, dtype=torch.float64).to(dtype).item())


def _rule(c: float, name: str = "scale") -> Rule:
    # the replacement is a core op with an out variant: executable anywhere
    return Rule(name, op("aten.mul.Tensor", capture("x"), c),
                replace_with("aten.mul.Tensor", ref("x"), ref("x")))


def _output_muls(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    out = next(n for n in ep.graph.nodes if n.op == "output")
    muls = list(out.args[0])
    assert all(op_key(n.target) == "aten.mul.Tensor" for n in muls)
    return muls


magnitudes = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
literals = st.builds(lambda m, neg: -m if neg else m, magnitudes, st.booleans())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(constants=st.lists(literals, min_size=1, max_size=4),
       dtype=st.sampled_from(DTYPES))
def test_a_float_literal_matches_its_to_edge_constant_in_every_dtype(
        constants: list[float], dtype: torch.dtype) -> None:
    # distinct in the program's dtype, so each rule names exactly one mul
    rounded = [_rounded(c, dtype) for c in constants]
    constants = [c for i, c in enumerate(constants) if rounded[i] not in rounded[:i]]
    model = Scaled(constants)
    ep = torch.export.export(model, (torch.randn(2, 4, dtype=dtype),))
    edge = to_edge(ep)
    muls = _output_muls(edge.exported_program())
    eps = torch.finfo(dtype).eps
    for c, mul in zip(constants, muls, strict=True):
        ms = find_matches(edge, [_rule(c)])
        assert [m.root for m in ms.accepted] == [mul], (c, dtype)
        # a literal 4 ulps away in the program's dtype is another constant: no match there
        other = c * (1 + 4 * eps)
        assert _rounded(other, dtype) != _rounded(c, dtype)
        ms = find_matches(edge, [_rule(other)])
        assert mul not in [m.root for m in ms.accepted], (c, other, dtype)
    # the ATen program keeps the Python float: the literal compares exactly there
    aten_muls = _output_muls(ep)
    for c, mul in zip(constants, aten_muls, strict=True):
        assert [m.root for m in find_matches(ep, [_rule(c)]).accepted] == [mul]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_float32_spelling_of_the_constant_matches_too(dtype: torch.dtype) -> None:
    """The constant ``to_edge`` made (0.044714998453855515 in float32) written back
    as a literal also matches, and so does ``one_of`` holding the decimal."""
    ep = torch.export.export(Scaled([0.044715]), (torch.randn(2, 4, dtype=dtype),))
    edge = to_edge(ep)
    (mul,) = _output_muls(edge.exported_program())
    as_f32 = _rounded(0.044715, torch.float32)
    assert as_f32 == pytest.approx(0.044714998453855515, abs=0)
    for pattern_literal in (0.044715, as_f32):
        assert [m.root for m in find_matches(edge, [_rule(pattern_literal)]).accepted] == [mul]
    wide = Rule("one_of", op("aten.mul.Tensor", capture("x"), one_of([0.5, 0.044715])),
                replace_with("aten.mul.Tensor", ref("x"), ref("x")))
    assert [m.root for m in find_matches(edge, [wide]).accepted] == [mul]


def test_integer_literal_matches_the_cast_integer_constant() -> None:
    """``x + 1`` lifts an int64 constant cast to float32: ``lit(1)`` matches it,
    ``lit(2)`` does not, ``lit(True)`` does not (a bool is not a number)."""

    class AddOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    edge = to_edge(torch.export.export(AddOne(), (torch.randn(3),)))

    def rule(v: object) -> Rule:
        return Rule("add", op("aten.add.Tensor", capture("x"), lit(v)),
                    replace_with("aten.mul.Tensor", ref("x"), ref("x")))

    assert len(find_matches(edge, [rule(1)]).accepted) == 1
    assert find_matches(edge, [rule(2)]).accepted == []
    assert find_matches(edge, [rule(True)]).accepted == []


class TanhGelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * torch.pow(x, 3))))


def _gelu_rule(cubic: float = 0.044715, name: str = "gelu_tanh") -> Rule:
    x = capture("x")
    inner = op("aten.add.Tensor", x,
               op("aten.mul.Tensor", op("aten.pow.Tensor_Scalar", x, 3), cubic))
    tanh = op("aten.tanh.default", op("aten.mul.Tensor", inner, math.sqrt(2.0 / math.pi)))
    pattern = op("aten.mul.Tensor", op("aten.mul.Tensor", x, 0.5),
                 op("aten.add.Tensor", tanh, 1.0))
    return Rule(name, pattern, replace_with("aten.gelu.default", ref("x"), approximate="tanh"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tanh_gelu_written_with_python_floats_fuses_and_runs(dtype: torch.dtype) -> None:
    """The issue's case end to end: a user's tanh-GELU with Python float literals fuses
    in fp32/fp16/bf16 edge programs, and the .pte runs on the portable runtime and
    agrees with eager."""
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.app.runtime import run_pte

    x = torch.randn(4, 16, dtype=dtype)
    ep = torch.export.export(TanhGelu(), (x,))
    fusion = FusionPass([_gelu_rule()])
    edge = to_edge_transform_and_lower(ep, transform_passes=[fusion])
    assert fusion.report.rules["gelu_tanh"].fused == 1
    keys = {op_key(n.target) for n in edge.exported_program().graph.nodes
            if n.op == "call_function"}
    assert "aten.gelu.default" in keys and "aten.tanh.default" not in keys
    (got,) = run_pte(bytes(edge.to_executorch().buffer), (x,))
    want = TanhGelu()(x)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(got.to(dtype), want, atol=tol, rtol=tol)


def test_a_user_rules_literal_miss_is_reported_with_the_constant_dtype() -> None:
    """A literal that differs from the model's (0.04472 for 0.044715) is reported as a
    structural decline of the user's rule, naming the constant met and its dtype —
    before issue 23 it sat below the near-miss threshold and nothing was said. In an
    fp16 program the two literals are the same float16 constant: there it fuses."""
    edge = to_edge(torch.export.export(TanhGelu(), (torch.randn(2, 8),)))
    ms = find_matches(edge, [_gelu_rule(0.04472, "gelu_typo")])
    assert ms.accepted == []
    (decline,) = ms.declined
    assert decline.step == "structure"
    assert "expected == 0.04472, got 0.0447149" in decline.reason
    assert "float32 constant" in decline.reason
    # the same rule with the model's literal fuses: the decline was about the literal
    assert len(find_matches(edge, [_gelu_rule()]).accepted) == 1
    half = to_edge(torch.export.export(TanhGelu(), (torch.randn(2, 8, dtype=torch.float16),)))
    assert _rounded(0.04472, torch.float16) == _rounded(0.044715, torch.float16)
    assert len(find_matches(half, [_gelu_rule(0.04472, "gelu_typo")]).accepted) == 1
