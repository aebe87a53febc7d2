"""The conv + batch norm and conv-scale families on Arm, judged on the TOSA reference model.

Arm's ``FuseBatchNorm2dPass`` and ``FoldScalarMulIntoConvPass`` (ExecuTorch 1.5.1) never
check that what they fold is a constant and find their folded constants by name; the
Arm quantizer's fold writes into the user's module. Each stock bug is shown here (stock
wrong or crashing on the reference model, the module scaled), and the family's rules
(``passes/arm/batch_norm.py``, ``passes/arm/scalar_mul_conv.py``) equal to eager --
integer: bit-identical to the fake-quantized model -- on generated variants of which
operands are constants, graph inputs, computed in the graph, shared or absent.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tosa_reference_model")
pytest.importorskip("executorch.backends.arm.tosa.partitioner")

from fusionkit.backends.arm_adapter import preprocess_rules
from fusionkit.backends.arm_adapter import reference_model as rm
from fusionkit.passes.families import conv_batch_norm as family
from fusionkit.passes.registry import rules_taking_over

pytestmark = pytest.mark.slow

C_IN, C = 3, 4
#: the reference model's float32 against eager (outputs of scale ~10)
FP_TOL = 1e-4
#: a stock result this far off eager is wrong, not rounding
WRONG = 1e-2

#: how an operand reaches its op
CONSTANT, INPUT, COMPUTED, FROM_CONSTANTS, ABSENT = (
    "constant", "input", "computed", "from_constants", "absent")
#: kinds under which stock's fold reads a non-constant: it crashes or computes garbage
NOT_CONSTANT = (INPUT, COMPUTED)


def _values(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(C, C_IN, 3, 3, generator=g), "b": torch.randn(C, generator=g),
            "bn_w": torch.rand(C, generator=g) + 0.5, "bn_b": torch.randn(C, generator=g),
            "mean": torch.randn(C, generator=g), "var": torch.rand(C, generator=g) + 0.5,
            "scale": torch.rand(C, 1, 1, generator=g) + 0.5}


#: constants held as parameters (as an nn.Conv2d / nn.BatchNorm2d holds them), the rest
#: as buffers
_PARAMETERS = ("w", "b", "bn_w", "bn_b")


class Variant(torch.nn.Module):
    """``bn(conv(x, w, b), mean, var, bn_w, bn_b)`` (``op="bn"``) or ``conv(x, w, b) * scale``
    (``op="mul"``), each operand reaching the op as ``kinds`` says (default: a constant).
    ``shared``: a second branch with its own operands but the first branch's conv weight."""

    def __init__(self, kinds: dict[str, str], seed: int = 0, shared: bool = False,
                 op: str = "bn") -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.kinds, self.shared, self.op = dict(kinds), shared, op
        self.given: list[tuple[str, torch.Tensor]] = []
        for i in range(2 if shared else 1):
            for name, v in _values(g).items():
                kind = self.kinds.get(name, CONSTANT)
                key = f"{name}{i}"
                if name == "w" and i > 0:
                    continue  # the shared weight is branch 0's
                if kind in (CONSTANT, FROM_CONSTANTS):
                    v = v if kind == CONSTANT else v / 2
                    if name in _PARAMETERS:
                        self.register_parameter(key, torch.nn.Parameter(v))
                    else:
                        self.register_buffer(key, v)
                elif kind in NOT_CONSTANT:
                    self.given.append((key, v if kind == INPUT else v / 2))

    def inputs(self, seed: int = 1) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        xs = [torch.randn(1, C_IN, 8, 8, generator=g) for _ in range(2 if self.shared else 1)]
        return (*xs, *[v for _, v in self.given])

    def _get(self, name: str, i: int, given: dict[str, torch.Tensor]) -> torch.Tensor | None:
        kind = self.kinds.get(name, CONSTANT)
        key = f"{name}0" if name == "w" else f"{name}{i}"
        if kind == ABSENT:
            return None
        v = getattr(self, key) if kind in (CONSTANT, FROM_CONSTANTS) else given[key]
        return v * 2 if kind in (COMPUTED, FROM_CONSTANTS) else v

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        n = 2 if self.shared else 1
        given = dict(zip([k for k, _ in self.given], args[n:], strict=True))
        out: Any = 0
        for i, x in enumerate(args[:n]):
            y = F.conv2d(x, self._get("w", i, given), self._get("b", i, given))
            if self.op == "bn":
                y = F.batch_norm(y, self._get("mean", i, given), self._get("var", i, given),
                                 self._get("bn_w", i, given), self._get("bn_b", i, given),
                                 False, 0.1, 1e-5)
            else:
                y = y * self._get("scale", i, given)
            out = out + y
        return out  # type: ignore[no-any-return]


def _stock(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> float | str:
    """Stock's error against eager on the reference model, or the exception that killed
    its lowering (the root cause)."""
    try:
        return rm.evaluate(model, inputs, fusionkit=False).error
    except Exception as e:  # any crash of the stock lowering is the finding
        while e.__cause__ is not None or e.__context__ is not None:
            e = e.__cause__ or e.__context__  # type: ignore[assignment]
        return f"{type(e).__name__}: {e}"


def _ours(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]
          ) -> tuple[float, dict[str, int]]:
    """The adapter's error against eager on the reference model, and what each of the two
    rule passes fused."""
    preprocess_rules.reset_counts()
    run = rm.evaluate(model, inputs, fusionkit=True)
    counts = preprocess_rules.counts()
    return run.error, {p: counts.get(p, {}).get("fused", 0)
                       for p in ("FuseBatchNorm2dPass", "FoldScalarMulIntoConvPass")}


def _stock_failed(result: float | str) -> bool:
    return isinstance(result, str) or result > WRONG


# --------------------------------------------------------------- one definition, three backends

def test_one_family_definition_serves_the_three_backends() -> None:
    """Vulkan's and XNNPACK's ``FuseBatchNormPass`` rules and Arm's ``FuseBatchNorm2dPass``
    rules are the family's: the same pattern, the same replacement functions."""
    sets = {"vulkan_preprocess": "FuseBatchNormPass", "xnnpack": "FuseBatchNormPass",
            "arm": "FuseBatchNorm2dPass"}
    conv_rules = {}
    for rule_set, stock in sets.items():
        rules = rules_taking_over(rule_set, stock)
        (conv,) = [r for r in rules if r.name.endswith("conv_batch_norm")]
        conv_rules[rule_set] = conv
        assert conv.replacement.fn is family.fold_conv, rule_set  # type: ignore[attr-defined]
    assert len({repr(r.pattern) for r in conv_rules.values()}) == 1
    # Arm's needs: no linear, but the standalone batch norm as a conv
    arm = {r.name for r in rules_taking_over("arm", "FuseBatchNorm2dPass")}
    assert arm == {"arm_conv_batch_norm", "arm_batch_norm_as_conv"}


def test_a_declined_fold_says_why() -> None:
    """A batch-norm weight that is a graph input: both Arm rules decline, naming it."""
    from fusionkit import find_matches

    model = Variant({"bn_w": INPUT})
    ep = torch.export.export(model, model.inputs()).run_decompositions()
    ms = find_matches(ep, rules_taking_over("arm", "FuseBatchNorm2dPass"))
    assert ms.accepted == []
    reasons = " | ".join(d.reason for d in ms.declined)
    assert "batch-norm weight `args_1` is a user input, not a constant" in reasons, reasons
    assert {d.rule for d in ms.declined} == {"arm_conv_batch_norm", "arm_batch_norm_as_conv"}


# --------------------------------------------------------------- stock's bugs, pinned

class Pair(torch.nn.Module):
    """Two variants side by side (inputs: the first's, then the second's), outputs summed."""

    def __init__(self, first: Variant, second: Variant) -> None:
        super().__init__()
        self.first, self.second = first, second

    def inputs(self, seed: int = 1) -> tuple[torch.Tensor, ...]:
        return (*self.first.inputs(seed), *self.second.inputs(seed + 1))

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        n = len(self.first.inputs())
        return self.first(*args[:n]) + self.second(*args[n:])  # type: ignore[no-any-return]


PINNED: dict[str, tuple[Any, dict[str, int]]] = {
    # a batch-norm weight that is a graph input / computed in the graph: stock's pass
    # reads it as a placeholder to delete (crash) or as "no weight"; ours declines both
    # rules and DecomposeBatchNormNoStatsPass computes it
    "bn_weight_input": (Variant({"bn_w": INPUT}), {"FuseBatchNorm2dPass": 0}),
    "bn_weight_computed": (Variant({"bn_w": COMPUTED}), {"FuseBatchNorm2dPass": 0}),
    # a conv bias that is a graph input: stock crashes; ours folds the batch norm into a
    # 1x1 depthwise conv instead
    "conv_bias_input": (Variant({"b": INPUT}), {"FuseBatchNorm2dPass": 1}),
    # convolutions sharing a weight, each with its own batch norm / scale: stock's folded
    # constants are found by name, so the second of each pair gets the first one's
    "shared_weight": (Pair(Variant({}, seed=2, shared=True),
                           Variant({}, seed=3, shared=True, op="mul")),
                      {"FuseBatchNorm2dPass": 2, "FoldScalarMulIntoConvPass": 2}),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_stock_is_wrong_or_crashes_ours_equals_eager(case: str) -> None:
    model, fused = PINNED[case]
    inputs = model.eval().inputs()
    stock = _stock(model, inputs)
    assert _stock_failed(stock), stock
    error, counts = _ours(model, inputs)
    assert error <= FP_TOL, (error, counts)
    assert {p: counts[p] for p in fused} == fused, counts


# --------------------------------------------------------------- stock's bytes where stock is right

class Folds(torch.nn.Module):
    """conv -> batch norm (``bn``), a batch norm with no conv (``bn_alone``), conv * a
    channel scale (``mul``) or conv * a number (``mul_scalar``)."""

    def __init__(self, kind: str, bias: bool = True, affine: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.conv = torch.nn.Conv2d(C_IN, C, 3, bias=bias)
        self.bn = torch.nn.BatchNorm2d(C_IN if kind == "bn_alone" else C, affine=affine)
        self.register_buffer("scale", torch.rand(C, 1, 1) + 0.5)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            if affine:
                self.bn.weight.uniform_(0.5, 1.5)
                self.bn.bias.uniform_(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "bn_alone":
            return self.bn(x + 1)  # type: ignore[no-any-return]
        y = self.conv(x)
        if self.kind == "bn":
            return self.bn(y)  # type: ignore[no-any-return]
        return y * (self.scale if self.kind == "mul" else 2.5)


STOCK_RIGHT = {
    "conv_bn": (Folds("bn"), "FuseBatchNorm2dPass"),
    "conv_bn_no_bias": (Folds("bn", bias=False), "FuseBatchNorm2dPass"),
    "bn_alone": (Folds("bn_alone"), "FuseBatchNorm2dPass"),
    "bn_alone_not_affine": (Folds("bn_alone", affine=False), "FuseBatchNorm2dPass"),
    "conv_mul": (Folds("mul"), "FoldScalarMulIntoConvPass"),
    "conv_mul_no_bias": (Folds("mul", bias=False), "FoldScalarMulIntoConvPass"),
    "conv_mul_scalar": (Folds("mul_scalar"), "FoldScalarMulIntoConvPass"),
}


@pytest.mark.parametrize("case", sorted(STOCK_RIGHT))
def test_float_folds_give_stocks_tosa_byte_for_byte(case: str) -> None:
    """Where the stock fold is right, the rule folds the same values into constants of the
    same names at the same places (the scaled convolution edited in place, keeping its
    name): the TOSA flatbuffer is stock's, byte for byte."""
    model, stock_pass = STOCK_RIGHT[case]
    inputs = (torch.randn(1, C_IN, 8, 8, generator=torch.Generator().manual_seed(1)),)
    stock = rm.evaluate(model.eval(), inputs, fusionkit=False)
    preprocess_rules.reset_counts()
    ours = rm.evaluate(model, inputs, fusionkit=True)
    assert preprocess_rules.counts()[stock_pass]["fused"] >= 1
    assert ours.tosa == stock.tosa
    assert ours.error <= FP_TOL and stock.error <= FP_TOL


def test_a_shared_weight_folds_into_unique_stock_names() -> None:
    """Two convolutions sharing a weight, each with its own batch norm (then each with its
    own scale): stock's name for the second fold is taken, so it gets ``_1`` -- its own
    constant, never the first one's (the reference model shows the program equal to eager:
    ``shared_weight`` above)."""
    from fusionkit.apply.rewrite import apply_matches
    from fusionkit.find.finder import find_matches

    model = Pair(Variant({}, seed=2, shared=True), Variant({}, seed=3, shared=True, op="mul"))
    inputs = model.eval().inputs()
    ep = torch.export.export(model, inputs).run_decompositions()
    for stock_pass in ("FuseBatchNorm2dPass", "FoldScalarMulIntoConvPass"):
        ms = find_matches(ep, rules_taking_over("arm", stock_pass))
        assert len(ms.accepted) == 2, ms.declined
        apply_matches(ep, ms.accepted, strict=True)
    names = {p.name for p in ep.graph_module.graph.find_nodes(op="placeholder")}
    assert {"p_first_w0_fused_bn", "p_first_w0_fused_bn_1", "p_first_b0_fused_bn",
            "p_first_b1_fused_bn", "p_second_w0_folded_mul", "p_second_w0_folded_mul_1",
            "p_second_b0_folded_mul", "p_second_b1_folded_mul"} <= names, sorted(names)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*inputs), model(*inputs), atol=FP_TOL, rtol=0)


# --------------------------------------------------------------- generated variants

_BN_OPERANDS = {"b": (CONSTANT, INPUT, COMPUTED, FROM_CONSTANTS, ABSENT),
                "bn_w": (CONSTANT, INPUT, COMPUTED, FROM_CONSTANTS, ABSENT),
                "bn_b": (CONSTANT, INPUT, COMPUTED, FROM_CONSTANTS, ABSENT),
                "mean": (CONSTANT, INPUT, COMPUTED, FROM_CONSTANTS),
                "var": (CONSTANT, INPUT, COMPUTED, FROM_CONSTANTS)}
_MUL_OPERANDS = {"b": (CONSTANT, INPUT, COMPUTED, ABSENT),
                 "scale": (CONSTANT, INPUT, COMPUTED, FROM_CONSTANTS)}
# (the conv weight stays a constant: Arm's RewriteConvPass, after these passes, stops on a
# convolution whose weight is not one -- stock and adapter alike)


@st.composite
def variants(draw: Any) -> tuple[str, dict[str, str], bool, int]:
    op = draw(st.sampled_from(["bn", "mul"]))
    operands = _BN_OPERANDS if op == "bn" else _MUL_OPERANDS
    # constants most of the time, so that folds happen beside the declines
    kinds = {n: draw(st.sampled_from((CONSTANT, CONSTANT, *ks[1:]))) for n, ks in operands.items()}
    return op, kinds, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(variants())
def test_generated_variants_equal_eager_stock_fails_on_non_constants(
        variant: tuple[str, dict[str, str], bool, int]) -> None:
    op, kinds, shared, seed = variant
    model = Variant(kinds, seed=seed, shared=shared, op=op).eval()
    inputs = model.inputs(seed + 1)
    error, counts = _ours(model, inputs)
    assert error <= FP_TOL, (variant, error, counts)
    branches = 2 if shared else 1
    folded_by = "FuseBatchNorm2dPass" if op == "bn" else "FoldScalarMulIntoConvPass"
    if all(k in (CONSTANT, ABSENT) for k in kinds.values()):  # nothing to decline
        assert counts[folded_by] == branches, (variant, counts)
    # stock's batch-norm fold reads whatever its operands are; its conv-scale fold declines
    # what it cannot read as a constant (its lookup raises, and it catches that), so only
    # two folds of one shared weight are wrong
    if op == "bn":
        stock_fails = shared or any(k in NOT_CONSTANT for k in kinds.values())
    else:
        stock_fails = shared and kinds["scale"] == CONSTANT and kinds["b"] in (CONSTANT, ABSENT)
    if stock_fails:
        stock = _stock(model, inputs)
        assert _stock_failed(stock), (variant, stock)


# --------------------------------------------------------------- the quantizer path

class ConvBnScale(torch.nn.Module):
    """conv -> batch norm -> conv * 2: the Arm quantizer folds the scale at prepare time."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(C_IN, C, 3)
        self.bn = torch.nn.BatchNorm2d(C)
        self.conv2 = torch.nn.Conv2d(C, C, 1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.bn(self.conv(x))) * 2.0


def _prepare(model: torch.nn.Module, x: torch.Tensor, quantizer_cls: Any) -> Any:
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    quantizer = quantizer_cls(rm._compile_spec(rm.INT))
    quantizer.set_global(get_symmetric_quantization_config())
    graph = torch.export.export(model, (x,)).module(check_guards=False)
    return prepare_pt2e(graph, quantizer)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_stock_quantizer_scales_the_users_module() -> None:
    from executorch.backends.arm.quantizer import TOSAQuantizer

    model, x = ConvBnScale().eval(), torch.randn(1, C_IN, 8, 8)
    before = _state(model)
    for times in (2.0, 4.0):
        _prepare(model, x, TOSAQuantizer)
        torch.testing.assert_close(model.conv2.weight, before["conv2.weight"] * times)
        torch.testing.assert_close(model.conv2.bias, before["conv2.bias"] * times)


def test_adapter_leaves_the_module_and_the_integer_path_equals_fake_quantized() -> None:
    """Quantized with the adapter's quantizer and lowered through the adapter: the module's
    state_dict is what it was; the quantized graph computes what stock's quantizer gives
    (the same fold); the integer program on the reference model is bit-identical to it."""
    from executorch.backends.arm.quantizer import TOSAQuantizer as StockQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    from fusionkit.backends.arm_adapter.quantizer import TOSAQuantizer

    model, x = ConvBnScale().eval(), torch.randn(1, C_IN, 8, 8)
    before = _state(model)
    prepared = _prepare(model, x, TOSAQuantizer)
    prepared(x)
    quantized = convert_pt2e(prepared)
    stock_prepared = _prepare(copy.deepcopy(model), x, StockQuantizer)
    stock_prepared(x)
    with torch.no_grad():
        want = quantized(x)
        assert torch.equal(want, convert_pt2e(stock_prepared)(x))
    edge = rm.lower(torch.export.export(quantized, (x,)), (x,), fusionkit=True, spec=rm.INT)
    assert rm.max_error(rm.run_on_reference_model(edge, (x,)), [want]) == 0.0
    # the float path through the adapter (exporting the module itself: the program shares
    # its tensors) does not touch it either
    edge = rm.lower(model, (x,), fusionkit=True)
    with torch.no_grad():
        assert rm.max_error(rm.run_on_reference_model(edge, (x,)), [model(x)]) <= FP_TOL
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), \
        [k for k in before if not torch.equal(before[k], after[k])]
