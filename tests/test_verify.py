"""``fusionkit.verify``: a rule's replacement computes what its pattern computes.

Held-out wrong rules (a dropped activation, a swapped operand of a non-commutative op, a
wrong epsilon, a constraint missing for a broadcast) are each reported different with a
small counterexample; their correct twins verify equal in seconds; every shipped rule
(each registered rule set, the YAML in passes/specs and every YAML example in the docs)
is equal or "cannot check" with a reason, never different.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fusionkit import (
    Custom,
    DtypeIn,
    PythonReplacement,
    Rank,
    Rule,
    SameDtype,
    capture,
    lit,
    op,
    ref,
    replace_with,
    scalar,
)
from fusionkit.authoring.verify import (
    CANNOT_CHECK,
    DIFFERENT,
    EQUAL,
    TOLERANCES,
    OperandHint,
    verify,
)
from fusionkit.passes.registry import registered
from fusionkit.passes.registry import rule_set as rules_of
from fusionkit.passes.rms_norm import rms_norm_rule
from fusionkit.rule import OpSemantics, ProgramForm

ROOT = Path(__file__).resolve().parents[1]

#: cases compared per rule in this file (the command's default is 20)
CASES = 4


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _assert_small_counterexample(v: Any, most: int = 8) -> None:
    """Different, with a shrunk counterexample: every operand has at most ``most`` elements."""
    assert v.status == DIFFERENT, v
    cx = v.counterexample
    assert cx is not None and cx.reason
    assert cx.inputs, cx
    for name, operand in cx.inputs.items():
        assert _numel(operand["shape"]) <= most, (name, operand)
        assert operand["dtype"] and "values" in operand


# ------------------------------------------------------------------ held-out wrong rules

X, Y = capture("x"), capture("y")


def _add_relu(drop: bool) -> Rule:
    """relu(x + y): the quantized add that dropped its relu, in float."""
    add = op("aten.add.Tensor", X, Y)
    if drop:
        return Rule("add_relu_dropped", op("aten.relu.default", add),
                    replace_with("aten.add.Tensor", ref("x"), ref("y")))

    def fused(rw: Any, x: Any, y: Any) -> Any:
        return rw.call("aten.clamp.default", rw.call("aten.add.Tensor", x, y), 0.0)

    return Rule("add_relu", op("aten.relu.default", add), PythonReplacement(fused))


def _reciprocal_mul(swap: bool) -> Rule:
    """x * (1 / y) -> x / y; swapped: y / x."""
    first, second = (ref("y"), ref("x")) if swap else (ref("x"), ref("y"))
    return Rule("reciprocal_mul_swapped" if swap else "reciprocal_mul",
                op("aten.mul.Tensor", X, op("aten.reciprocal.default", Y)),
                replace_with("aten.div.Tensor", first, second))


def _rms_norm_fixed_eps() -> Rule:
    """The shipped RMSNorm rule with the fused op given 1e-6 instead of the model's eps."""
    good = rms_norm_rule()
    return dataclasses.replace(good, name="rms_norm_fixed_eps",
                               replacement=replace_with("et_vk.rms_norm.default", ref("x"),
                                                        ref("weight"), 1e-6))


def _batch_norm(rw: Any, x: Any, mean: Any, var: Any, eps: Any) -> Any:
    out = rw.call("aten._native_batch_norm_legit_no_training.default", x, None, None, mean, var,
                  0.0, eps)
    return rw.getitem(out, 0)


def _channels_last_dim(ctx: Any, x: Any, mean: Any, var: Any) -> str | None:
    """The statistics are one per channel of a (N, C) input: dim 1 is the last dim."""
    xs, ms, vs = (ctx.val(n).shape for n in ("x", "mean", "var"))
    if len(xs) == 2 and tuple(ms) == (xs[1],) and tuple(vs) == (xs[1],):
        return None
    return f"x {tuple(xs)}, mean {tuple(ms)}, var {tuple(vs)}: not one statistic per channel of (N, C)"


def _normalize(checked: bool) -> Rule:
    """(x - mean) * rsqrt(var + eps) -> batch norm over dim 1. The pattern broadcasts the
    statistics over the *last* dim: equal only when that is the channel dim."""
    pattern = op("aten.mul.Tensor", op("aten.sub.Tensor", X, capture("mean")),
                 op("aten.rsqrt.default", op("aten.add.Tensor", capture("var"),
                                             scalar("eps", lo=0.0))))
    constraints = [Rank("x", {2} if checked else {2, 3, 4}), Rank("mean", {1}), Rank("var", {1}),
                   SameDtype("mean", "x"), SameDtype("var", "x"), DtypeIn("x", {torch.float32})]
    if checked:
        constraints.append(Custom(_channels_last_dim, "channels_last_dim"))
    return Rule("normalize" if checked else "normalize_unchecked_broadcast", pattern,
                PythonReplacement(_batch_norm), constraints)


@pytest.fixture(scope="module")
def held_out() -> dict[str, Any]:
    rules = [_add_relu(True), _add_relu(False), _reciprocal_mul(True), _reciprocal_mul(False),
             _rms_norm_fixed_eps(), _normalize(False), _normalize(True)]
    out = {}
    for r in rules:  # a wrong rule stops at its first difference; a right one after 8 cases
        started = time.monotonic()
        cases = 4 if r.name in TWINS else 20
        out[r.name] = (verify(r, cases=cases), time.monotonic() - started)
    return out


#: the held-out rules that are right
TWINS = ("add_relu", "reciprocal_mul", "normalize")


def test_a_dropped_activation_is_different(held_out: dict[str, Any]) -> None:
    v, _ = held_out["add_relu_dropped"]
    _assert_small_counterexample(v, most=1)  # one negative sum shows it
    cx = v.counterexample
    assert "differs" in cx.reason
    assert min(cx.expected) >= 0 and min(cx.got) < 0  # relu's output vs the bare sum


def test_a_swapped_operand_is_different(held_out: dict[str, Any]) -> None:
    v, _ = held_out["reciprocal_mul_swapped"]
    _assert_small_counterexample(v, most=1)


def test_a_wrong_epsilon_is_different(held_out: dict[str, Any]) -> None:
    v, _ = held_out["rms_norm_fixed_eps"]
    _assert_small_counterexample(v, most=4)
    assert v.counterexample.literals["eps"] != 1e-6


def test_a_missing_broadcast_constraint_is_different(held_out: dict[str, Any]) -> None:
    v, _ = held_out["normalize_unchecked_broadcast"]
    _assert_small_counterexample(v, most=16)


@pytest.mark.parametrize("name", TWINS)
def test_the_correct_twins_verify_in_seconds(held_out: dict[str, Any], name: str) -> None:
    v, seconds = held_out[name]
    assert v.status == EQUAL, v
    assert v.cases >= 4 and v.counterexample is None
    if name != "normalize":  # (most of its draws are declined: slower)
        assert seconds < 120, seconds  # seconds on an idle machine; the bound allows a loaded one


def test_a_verdict_says_its_tolerances_and_what_it_compared(held_out: dict[str, Any]) -> None:
    v, _ = held_out["reciprocal_mul"]
    record = json.loads(json.dumps(v.to_dict()))
    assert record["status"] == EQUAL and record["cases"] >= 4
    assert record["tolerances"]["float32"] == TOLERANCES[torch.float32]
    assert record["shapes"] and record["dtypes"]
    wrong = json.loads(json.dumps(held_out["reciprocal_mul_swapped"][0].to_dict()))
    assert wrong["status"] == DIFFERENT and wrong["counterexample"]["inputs"]


@pytest.mark.parametrize(("a", "b"), [(2.0, 2.0), (2.0, 3.0)])
def test_a_literal_in_the_replacement_is_checked_against_the_pattern(a: float, b: float) -> None:
    """x * a -> x * b is equal exactly when a == b."""
    rule = Rule("scale", op("aten.mul.Tensor", X, lit(a)), replace_with("aten.mul.Tensor", ref("x"), b))
    v = verify(rule, cases=2)
    assert v.status == (EQUAL if a == b else DIFFERENT), v


def test_a_reference_implementation_that_raises_is_cannot_check_naming_the_op(monkeypatch: Any
                                                                               ) -> None:
    """conv_with_clamp(..., 0, sys.float_info.max), the bound the stock pass gives a relu:
    without the kernel reference the Vulkan rule carries (``Rule.semantics``), ExecuTorch's
    CPU reference clamps a float32 tensor with a bound float32 cannot hold, and raises; with
    it, the rule is equal."""
    (relu,) = [r for r in rules_of("vulkan_preprocess") if r.name == "conv_relu_clamp"]
    assert "et_vk.conv_with_clamp.default" in relu.semantics.kernel_references
    assert verify(relu, cases=2, max_examples=60).status == EQUAL
    v = verify(dataclasses.replace(relu, semantics=OpSemantics()), cases=2, max_examples=60)
    assert v.status == CANNOT_CHECK and "et_vk.conv_with_clamp" in v.reason, v


def test_a_kernel_reference_a_backend_registers_is_what_the_replacement_runs(monkeypatch: Any
                                                                             ) -> None:
    """A backend states what its kernel computes (``OpSemantics.kernel_references``, on the
    rule): the verifier runs the replacement's op through it, so a kernel that computes
    something else than torch's op is judged as the kernel, not as torch's op."""
    rule = Rule("neg_as_mul", op("aten.neg.default", X),
                replace_with("aten.mul.Tensor", ref("x"), -1.0), [DtypeIn("x", {torch.float32})])
    assert verify(rule, cases=2, max_examples=30).status == EQUAL
    kernel = OpSemantics(kernel_references={"aten.mul.Tensor": lambda a, b: a * b + 1.0})
    v = verify(dataclasses.replace(rule, semantics=kernel), cases=2, max_examples=30)
    assert v.status == DIFFERENT and v.counterexample is not None, v


def test_a_context_a_backend_registers_is_open_while_its_rules_ops_run(monkeypatch: Any) -> None:
    """``OpSemantics.op_contexts``: the context is entered around a rule whose pattern has an
    op of its namespace (and not around others); without the TOSA context the Arm slice
    rule's ops refuse to run, with it the rule verifies."""
    import contextlib

    entered: list[str] = []

    @contextlib.contextmanager
    def recording(name: str) -> Any:
        entered.append(name)
        yield

    recorded = dataclasses.replace(_reciprocal_mul(False),
                                   semantics=OpSemantics(op_contexts={"aten": lambda: recording("aten")}))
    # (in this process: the recording is made where the cases run)
    assert verify(recorded, cases=2, isolate=False).status == EQUAL
    assert entered == ["aten"]
    (slices,) = [r for _, _, r in SHIPPED if r.name == "arm_fuse_consecutive_slices"]
    assert verify(slices, cases=2, max_examples=40, isolate=False).status == EQUAL
    assert entered == ["aten"]  # (its pattern has no aten op)
    v = verify(dataclasses.replace(slices, semantics=OpSemantics()), cases=2, max_examples=40)
    assert v.status == CANNOT_CHECK and "TosaLoweringContext" in v.reason, v


def test_a_pattern_the_generator_cannot_satisfy_is_cannot_check_with_the_reason() -> None:
    never = Custom(lambda ctx, x: "never", "never")
    rule = Rule("never", op("aten.neg.default", X), replace_with("aten.neg.default", ref("x")),
                [never])
    v = verify(rule, cases=2, max_examples=30)
    assert v.status == CANNOT_CHECK and "custom:never" in v.reason, v


def _zero_shift(ctx: Any, x: Any, shift: Any) -> str | None:
    ref = ctx.inputs.constant(shift)
    t = None if ref is None else ref.tensor
    if t is None or bool((t != 0).any()):
        return f"`{shift.name}` is not a constant of zeros"
    xs = tuple(x.meta["val"].shape)
    if tuple(torch.broadcast_shapes(xs, tuple(t.shape))) != xs:
        return f"`{shift.name}` broadcasts `{x.name}` to another shape"
    return None


def test_an_operand_hint_makes_the_case_a_check_asks_for() -> None:
    """x + shift -> x when shift is a constant of zeros: drawn by chance rarely (a constant,
    and all zeros); an OperandHint makes it, and the rule verifies."""

    rule = Rule("zero_shift", op("aten.add.Tensor", X, capture("shift")),
                replace_with("aten.mul.Tensor", ref("x"), 1.0),
                [Custom(_zero_shift, "zero_shift"), DtypeIn("x", {torch.float32}),
                 DtypeIn("shift", {torch.float32})])
    blind = verify(rule, cases=2, max_examples=15)
    assert blind.status == CANNOT_CHECK and "zero_shift" in blind.reason, blind
    hinted = verify(rule, cases=2, max_examples=15,
                    hints={"shift": OperandHint(constant=True, fill="zeros")})
    assert hinted.status == EQUAL, hinted


def _marked(ctx: Any, x: Any) -> str | None:
    return None if ctx.root.meta.get("marked") else "the root carries no `marked` metadata"


def test_a_program_form_puts_the_exported_program_in_the_form_the_rule_sees(monkeypatch: Any) -> None:
    """A rule that runs after a backend's passes reads what they wrote (here node metadata):
    the program form the rule carries (``Rule.program_form``) gives the exported pattern that
    form, and the rule is judged; without it the rule declines every case."""
    rule = Rule("marked_neg", op("aten.neg.default", X),
                replace_with("aten.mul.Tensor", ref("x"), -1.0),
                [Custom(_marked, "marked"), DtypeIn("x", {torch.float32})])
    blind = verify(rule, cases=2, max_examples=15)
    assert blind.status == CANNOT_CHECK and "marked" in blind.reason, blind
    seen: list[int] = []

    def mark(ep: Any) -> None:
        negs = [n for n in ep.graph.nodes if n.op == "call_function"]
        seen.append(len(negs))
        for n in negs:
            n.meta["marked"] = True

    v = verify(dataclasses.replace(rule, program_form=ProgramForm(mark)), cases=2, max_examples=15,
               isolate=False)  # (``seen`` is this process's)
    assert v.status == EQUAL and seen and all(k in (1, 2) for k in seen), (v, seen)  # (the neg; a clone reading it)

    def broken(ep: Any) -> None:
        raise RuntimeError("no such pass")

    v = verify(dataclasses.replace(rule, program_form=ProgramForm(broken)), cases=2, max_examples=15)
    assert v.status == CANNOT_CHECK and "program form failed: RuntimeError: no such pass" in v.reason, v


def test_a_program_forms_namespaces_open_their_contexts(monkeypatch: Any) -> None:
    """A site whose operands a hint builds from a backend's ops (Arm's affine site: a TABLE
    and RESCALEs before an ATen convolution) needs that backend's context although the
    pattern names none of its ops: the form's namespaces open it."""
    import contextlib

    entered: list[str] = []

    @contextlib.contextmanager
    def context() -> Any:
        entered.append("in")
        yield

    rule = Rule("held_neg", op("aten.neg.default", X), replace_with("aten.mul.Tensor", ref("x"), -1.0),
                [Custom(lambda ctx, x: None, "held"), DtypeIn("x", {torch.float32})],
                semantics=OpSemantics(op_contexts={"heldns": context}))
    assert verify(rule, cases=2, max_examples=15, isolate=False).status == EQUAL and not entered
    held = dataclasses.replace(rule, program_form=ProgramForm(lambda ep: None, namespaces={"heldns"}))
    assert verify(held, cases=2, max_examples=15, isolate=False).status == EQUAL and entered


def _scaled_neg(node: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A neg whose ``gain`` metadata (written by the program form below) scales its result."""
    gain = node.meta.get("gain")
    return NotImplemented if gain is None else -args[0] * gain


def test_node_semantics_say_what_a_node_computes_from_its_metadata(monkeypatch: Any) -> None:
    """A node whose meaning at its pipeline position is in metadata an earlier pass wrote (a
    requantized tanh on int8 codes): the node semantics its program form states run it in both
    programs. Here ``neg`` marked with ``gain=2`` computes ``-2x``: folded into ``mul(x, -2)``
    it verifies equal with the semantics and is different without them (the plain neg); a
    node without the metadata runs as torch runs it (``NotImplemented``)."""
    def gain_two(ep: Any) -> None:
        for n in ep.graph.nodes:
            if n.op == "call_function":
                n.meta["gain"] = 2.0

    rule = Rule("gained_neg", op("aten.neg.default", X),
                replace_with("aten.mul.Tensor", ref("x"), -2.0),
                [Custom(lambda ctx, x: None, "gained"), DtypeIn("x", {torch.float32})])
    blind = verify(dataclasses.replace(rule, program_form=ProgramForm(gain_two)), cases=4, max_examples=40)
    assert blind.status == DIFFERENT, blind
    form = ProgramForm(gain_two, node_semantics={"aten.neg.default": _scaled_neg})
    assert verify(dataclasses.replace(rule, program_form=form), cases=4, max_examples=40).status == EQUAL
    plain = Rule("neg_as_mul", op("aten.neg.default", X),
                 replace_with("aten.mul.Tensor", ref("x"), -1.0), [DtypeIn("x", {torch.float32})])
    assert verify(plain, cases=4, max_examples=40).status == EQUAL  # (no gain: torch's neg)


def test_an_integer_output_may_differ_by_its_tolerance_only() -> None:
    """An int8 output is codes: one quantization step of tolerance, whatever the value's size
    (not ``1 + |expected|``, under which ``-2x`` for ``-x`` would pass on every code)."""
    from fusionkit.authoring.verify import OperandHint

    rule = Rule("neg_doubled", op("aten.neg.default", X),
                replace_with("aten.mul.Tensor", ref("x"), -2), [DtypeIn("x", {torch.int8})])
    v = verify(rule, cases=4, max_examples=40)
    assert v.status == DIFFERENT and v.counterexample is not None, v
    assert "(tolerance for int8: 1)" in v.reason, v.reason
    off_by_one = Rule("neg_off_by_one", op("aten.neg.default", X),
                      replace_with("aten.sub.Tensor", ref("x"), ref("x")),
                      [DtypeIn("x", {torch.int8})])
    assert verify(off_by_one, cases=2, max_examples=40,
                  hints={"x": OperandHint(int_range=(0, 1))}).status == EQUAL


def test_a_fused_activation_recorded_in_metadata_is_applied(monkeypatch: Any) -> None:
    """XNNPACK's fused relu lives in XNN_FUSED_ACTIVATION: the verifier clamps the node's
    result as XNNPACK does; without that the rule would be the dropped relu."""
    (relu,) = [r for r in rules_of("xnnpack") if r.name == "xnnpack_fuse_relu"]
    assert verify(relu, cases=2, max_examples=40).status == EQUAL
    ignored = OpSemantics(metadata={"XNN_FUSED_ACTIVATION": lambda recorded, out: out})
    v = verify(dataclasses.replace(relu, semantics=ignored), cases=8, max_examples=60)  # (stops at the first negative sum)
    assert v.status == DIFFERENT and v.counterexample is not None, v


class _HalfNormFloatWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.native_layer_norm.default(x, [8], self.weight, None, 1e-5)[0]


def test_layer_norm_affine_gives_a_missing_bias_the_dtype_of_the_weight() -> None:
    """Found by verify: an fp16 layer norm with an fp32 weight and no bias got an fp16 zeros
    bias, and native_layer_norm raised 'mixed dtype (CPU): expect parameter to have scalar
    type of Float'. The bias now has the weight's dtype; the values are the model's."""
    from fusionkit import FusionPass
    from fusionkit.passes.vulkan.layer_norm_affine import layer_norm_affine_rule

    x = torch.randn(3, 8).half()
    ep = torch.export.export(_HalfNormFloatWeight(), (x,))
    want = ep.module()(x)
    fuse = FusionPass([layer_norm_affine_rule()])
    fuse(ep)
    assert fuse.report.total_fused == 1
    assert torch.equal(ep.module()(x), want)


# ------------------------------------------------------------------------- shipped rules


def _shipped() -> list[tuple[str, str, Any]]:
    """(id, set, rule) for each shipped rule, once per registered factory."""
    out = []
    for f in registered():
        for r in f.rules():
            out.append((f"{sorted(f.sets)[0]}:{r.name}", sorted(f.sets)[0], r))
    return out


SHIPPED = _shipped()


#: the shipped rules `verify` cannot check in this file's budget, each with a pattern its
#: reason must match and why that is so; every other shipped rule must verify equal, so a
#: rule that stops verifying (or a reason that changes) fails here. Shrink this list.
CANNOT_CHECK_ALLOWED: dict[str, tuple[str, str]] = {
    # -- a TOSA site an exported program built from ops cannot hold (the TOSA context, the
    #    kernel references of passes/arm/tosa_semantics.py and the pipeline's program form
    #    and node semantics of passes/arm/pipeline_form.py run the rest)
    "arm_fuse_consecutive_concat_shapes": ("CONCAT_SHAPE.default: it takes no tensor",
                                           "CONCAT_SHAPE takes and returns no tensor: no eager "
                                           "call dispatches it, and a traced program holds it "
                                           "only with symbolic sizes"),
}


@pytest.mark.parametrize("rule", [r for _, _, r in SHIPPED], ids=[i for i, _, _ in SHIPPED])
def test_every_shipped_rule_computes_what_it_replaces(rule: Rule) -> None:
    v = verify(rule, cases=2, max_examples=40)
    assert v.status != DIFFERENT, str(v)
    assert v.reason
    allowed = CANNOT_CHECK_ALLOWED.get(rule.name)
    if allowed is None:
        assert v.status == EQUAL, str(v)
    elif v.status == CANNOT_CHECK:  # for the reason stated
        assert re.search(allowed[0], v.reason), (allowed, v.reason)


def test_a_quantized_rule_whose_geometry_is_drawn_jointly_is_judged() -> None:
    """The torchao int8 weight-only linear: its check wants one block [1, K] per output
    channel and scales of [N] or [N, 1], drawn together (the hint the Vulkan rule registers).
    The same rule without its zero-point correction is different (a nonzero zero point)."""
    (affine,) = [r for _, _, r in SHIPPED if r.name == "linear_weight_int8_affine"]
    assert verify(affine, cases=2, max_examples=40).status == EQUAL
    from fusionkit.passes.vulkan import weight_only_linear as wl

    def drops_zero_points(rw: Any, x: Any, weight: Any, scales: Any, bias: Any = None,
                          zeros: Any = None) -> Any:
        return wl._int8_mm_per_row(rw, x, weight, scales, bias, None)

    wrong = dataclasses.replace(affine, name="affine_drops_zero_points",
                                replacement=PythonReplacement(drops_zero_points))
    v = verify(wrong, cases=8, max_examples=80)
    assert v.status == DIFFERENT and v.counterexample is not None, v
    assert any(x != 0 for row in v.counterexample.inputs["zeros"]["values"]
               for x in (row if isinstance(row, list) else [row])), v.counterexample


class _QuantizeDequantize(torch.nn.Module):
    """A per-tensor int8 quantize (scale 0.5) read by a dequantize of scale ``dq_scale``,
    doubled (an op after it: the program's output is not its input)."""

    def __init__(self, dq_scale: float) -> None:
        super().__init__()
        self.dq_scale = dq_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        q = qd.quantize_per_tensor(x, 0.5, 0, -128, 127, torch.int8)
        return qd.dequantize_per_tensor(q, self.dq_scale, 0, -128, 127, torch.int8) * 2.0  # type: ignore[no-any-return]


def test_fold_qdq_declines_a_dequantize_with_other_parameters() -> None:
    """Folding a pair gives up what quantizing loses; a dequantize of scale 0.25 of codes
    quantized with 0.5 also halves the value (stock FoldQDQPass drops it all the same):
    the rule declines it, naming the scale."""
    import torch.ao.quantization.fx._decomposed  # (registers the quantized_decomposed ops)

    from fusionkit import FusionPass

    (fold,) = [r for r in rules_of("vulkan_preprocess") if r.name == "fold_qdq"]
    t = torch.tensor([2.0])
    ep = torch.export.export(_QuantizeDequantize(0.25), (t,))
    fuse = FusionPass([fold])
    fuse(ep)
    assert fuse.report.total_fused == 0
    (declined,) = fuse.report.declined
    assert "scale 0.25" in declined.reason and "wrote them with 0.5" in declined.reason, declined
    assert float(ep.module()(t)[0]) == 2.0  # (the pair kept: 2.0 -> code 4 -> 1.0, doubled)


def test_fold_qdq_gives_up_saturation_by_design() -> None:
    """What the fold gives up on its own pair (the precision the Vulkan graph trades by
    running in float): a value beyond the range is not saturated. ``verify`` judges the fold
    on the grid, inside the range."""
    import torch.ao.quantization.fx._decomposed  # (registers the quantized_decomposed ops)

    from fusionkit import FusionPass

    (fold,) = [r for r in rules_of("vulkan_preprocess") if r.name == "fold_qdq"]
    t = torch.tensor([1000.0])
    ep = torch.export.export(_QuantizeDequantize(0.5), (t,))
    assert float(ep.module()(t)[0]) == 127.0  # saturated at 127 steps of 0.5, doubled
    fuse = FusionPass([fold])
    fuse(ep)
    assert fuse.report.total_fused == 1
    assert float(ep.module()(t)[0]) == 2000.0


def test_fold_qdq_is_judged_on_every_kind_of_pair_and_a_weaker_check_is_found_different(
        monkeypatch: Any) -> None:
    """The hint builds the quantize the drawn dequantize undoes (per tensor with literal or
    tensor parameters, per channel, per token, torchao's affine); the rule is equal on each.
    With stock's checks only (dtype and shape, the parameters not compared), a dequantize
    reading another scale is found different."""
    (fold,) = [r for r in rules_of("vulkan_preprocess") if r.name == "fold_qdq"]
    v = verify(fold, cases=20, max_examples=300)
    assert v.status == EQUAL, v
    inputs = " ".join(v.shapes)
    for made in ("q_scale(", "q_scales("):  # tensor parameters (per tensor / affine, per row)
        assert made in inputs, inputs

    from fusionkit.passes.vulkan import fold_qdq as fq

    monkeypatch.setattr(fq, "_reads_the_quantize_parameters", lambda ctx, q: None)
    weak = dataclasses.replace(  # (the per-tensor pair only: its scale is a literal)
        fq.fold_qdq_rules()[0],
        pattern=op("quantized_decomposed.dequantize_per_tensor.default", capture("q"),
                   strict_defaults=False))
    v = verify(weak, cases=8, max_examples=120,
               hints={"*scale": OperandHint(values=(1.0,))})
    assert v.status == DIFFERENT and v.counterexample is not None, v


def test_a_check_reading_the_module_runs_the_pattern_inside_one(monkeypatch: Any) -> None:
    """xnnpack_linear_module reads the nn.Linear source partition its mm ran in: XNNPACK
    states the module scope on the rule (``Rule.module_scope``), the verifier runs the
    pattern's ops inside an nn.Linear, and the rule is judged; without it no case is
    accepted. A replacement that drops the bias of an addmm is different."""
    (module_rule,) = [r for r in rules_of("xnnpack") if r.name == "xnnpack_linear_module"]
    assert verify(module_rule, cases=2, max_examples=40).status == EQUAL

    def drops_bias(rw: Any, mm: Any) -> Any:
        from fusionkit.passes.xnnpack.convert_to_linear import module_plan

        found = module_plan(mm)
        assert not isinstance(found, str)
        return rw.call("aten.linear.default", found[1].x, found[1].w)

    wrong = dataclasses.replace(module_rule, name="module_drops_bias",
                                replacement=PythonReplacement(drops_bias))
    v = verify(wrong, cases=8, max_examples=80)
    assert v.status == DIFFERENT, v
    v = verify(dataclasses.replace(module_rule, module_scope=None), cases=2, max_examples=40)
    assert v.status == CANNOT_CHECK and "no nn.Linear source partition" in v.reason, v


def test_the_reshaped_module_rule_is_judged_on_a_3d_input_the_module_flattens() -> None:
    """xnnpack_linear_module_reshaped: the hint builds a [B, L, K] input viewed as
    [B * L, K] inside the nn.Linear, and the view back to [B, L, N]; a replacement that
    drops the addmm's bias from the 3-D linear is different."""
    (reshaped,) = [r for r in rules_of("xnnpack") if r.name == "xnnpack_linear_module_reshaped"]
    v = verify(reshaped, cases=2, max_examples=40)
    assert v.status == EQUAL and all("a_3d(" in s for s in v.shapes), v

    def drops_bias(rw: Any, mm: Any) -> Any:
        from fusionkit.passes.xnnpack.convert_to_linear import module_plan

        found = module_plan(mm)
        assert not isinstance(found, str)
        if found[0].graph is rw.graph:
            rw.insert_before = found[0]
        return rw.call("aten.linear.default", found[1].x, found[1].w)

    wrong = dataclasses.replace(reshaped, name="reshaped_drops_bias",
                                replacement=PythonReplacement(drops_bias))
    v = verify(wrong, cases=8, max_examples=80)
    assert v.status == DIFFERENT and v.counterexample is not None, v
    assert len(v.counterexample.inputs["a_3d"]["shape"]) == 3, v.counterexample


def _causal_sdpa_with(build: Any) -> Rule:
    """The shipped causal_sdpa rule with another replacement (a wrong variant)."""
    from fusionkit.passes.vulkan.sdpa import causal_sdpa_rule

    rule = causal_sdpa_rule()
    return dataclasses.replace(rule, name=f"causal_sdpa_{build.__name__}",
                               replacement=PythonReplacement(build))


def _fused_sdpa(rw: Any, q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, pos: Any, mask: Any,
                dropout_p: Any, is_causal: Any, scale: Any) -> tuple[Any, None, None]:
    from fusionkit.passes.vulkan.sdpa import SDPA_WITH_KV_CACHE

    fused = rw.call(SDPA_WITH_KV_CACHE, q, k, v, k_cache, v_cache, pos, 1, mask, dropout_p, is_causal, scale)
    return fused, None, None


def _sdpa_variant(rw: Any, q: Any, k_proj: Any, v_proj: Any, k_cache: Any, v_cache: Any, start_pos: Any,
                  attn_mask: Any, dropout_p: Any, is_causal: Any, scale: Any) -> tuple[Any, None, None]:
    """The right replacement, written as a test's variant is."""
    return _fused_sdpa(rw, q, k_proj, v_proj, k_cache, v_cache, start_pos, attn_mask, dropout_p,
                       is_causal, scale)


def test_the_kv_cache_fusion_is_judged_in_place_from_zero_caches(monkeypatch: Any) -> None:
    """causal_sdpa: both cache updates built before the sdpa (in-place parts of the match),
    their results no outputs, the caches zero buffers each run starts from; the llama ops
    run through the kernel references ``passes/vulkan/sdpa_reference.py`` registers."""
    (rule,) = [r for _, _, r in SHIPPED if r.name == "causal_sdpa"]
    v = verify(rule, cases=6, max_examples=80)
    assert v.status == EQUAL and v.cases >= 6, str(v)
    seq = [tuple(int(x) for x in re.findall(r"(?:k_proj|k_cache)\((\d+), (\d+)", s)[i])
           for s in v.shapes for i in (0, 1)]
    assert any(c[1] > p[1] for p, c in zip(seq[::2], seq[1::2], strict=True)), v.shapes  # max_S > S
    # every run, of either program, starts from zero caches: the memoised programs do not
    # carry one case's writes into the next (cases of one structure share the programs)
    from fusionkit.authoring import verify as verify_module

    starts: list[float] = []
    run = verify_module._Runner.run

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        starts.extend(float(b.abs().sum()) for n, b in self.module.named_buffers() if "cache" in n)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(verify_module._Runner, "run", spy)
    # a later step, one structure for every case: start_pos 3 of a 6-position cache, 4
    # query heads over 2 kv heads
    later = {"q": OperandHint(shapes=((1, 2, 4, 4),), dtype=torch.float32),
             **{p: OperandHint(shapes=((1, 2, 2, 4),), dtype=torch.float32) for p in ("k_proj", "v_proj")},
             **{c: OperandHint(shapes=((1, 6, 2, 4),), dtype=torch.float32) for c in ("k_cache", "v_cache")},
             **{p: OperandHint(values=(3,)) for p in ("start_pos", "k_pos", "v_pos")},
             "scale": OperandHint(values=(None,))}
    assert verify(rule, cases=4, max_examples=40, hints=later, isolate=False).status == EQUAL
    assert len(starts) >= 16 and not any(starts), starts  # 2 caches x 2 programs x 4 cases


def test_the_kv_cache_form_is_the_one_preprocess_gives_the_rule() -> None:
    """The form causal_sdpa registers returns the exported program functionalized (as
    ``to_edge``) and in place again: both updates ``llama.update_cache`` itself, no
    ``auto_functionalized``, the caches buffer mutations of the program."""
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from kv_cache_models import KVAttention

    from fusionkit.passes.vulkan.sdpa import in_place_updates

    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 2, 4, 8, generator=g), torch.randn(1, 2, 2, 8, generator=g),
            torch.randn(1, 2, 2, 8, generator=g), torch.tensor([3]))
    ep = in_place_updates(torch.export.export(KVAttention(), args, strict=False))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("llama.update_cache.default") == 2, targets
    assert not any("auto_functionalized" in t for t in targets), targets
    mutated = [o.target for o in ep.graph_signature.output_specs
               if o.kind == torch.export.graph_signature.OutputKind.BUFFER_MUTATION]
    assert sorted(mutated) == ["kc", "vc"], ep.graph_signature.output_specs


def test_wrong_kv_cache_fusions_are_different() -> None:
    """A fused op that writes one position later, or that is given the key projection for
    the value one, computes something else; one that writes copies of the caches computes the
    same output but leaves the program's caches unwritten; caches that start non-zero are
    declined."""
    def shifted(rw: Any, q: Any, k_proj: Any, v_proj: Any, k_cache: Any, v_cache: Any, start_pos: Any,
                attn_mask: Any, dropout_p: Any, is_causal: Any, scale: Any) -> tuple[Any, None, None]:
        return _fused_sdpa(rw, q, k_proj, v_proj, k_cache, v_cache, start_pos + 1, attn_mask,
                           dropout_p, is_causal, scale)

    def keys_as_values(rw: Any, q: Any, k_proj: Any, v_proj: Any, k_cache: Any, v_cache: Any,
                       start_pos: Any, attn_mask: Any, dropout_p: Any, is_causal: Any, scale: Any
                       ) -> tuple[Any, None, None]:
        return _fused_sdpa(rw, q, k_proj, k_proj, k_cache, v_cache, start_pos, attn_mask, dropout_p,
                           is_causal, scale)

    def writes_copies(rw: Any, q: Any, k_proj: Any, v_proj: Any, k_cache: Any, v_cache: Any,
                      start_pos: Any, attn_mask: Any, dropout_p: Any, is_causal: Any, scale: Any
                      ) -> tuple[Any, None, None]:
        k_copy, v_copy = (rw.call("aten.clone.default", c) for c in (k_cache, v_cache))
        return _fused_sdpa(rw, q, k_proj, v_proj, k_copy, v_copy, start_pos, attn_mask, dropout_p,
                           is_causal, scale)

    for build in (shifted, keys_as_values):
        v = verify(_causal_sdpa_with(build), cases=4, max_examples=80)
        assert v.status == DIFFERENT and v.counterexample is not None, str(v)
        assert v.counterexample.reason.startswith("output 0"), str(v)
    # the same output, but the caches the program keeps are never written
    v = verify(_causal_sdpa_with(writes_copies), cases=4, max_examples=80)
    assert v.status == DIFFERENT and v.counterexample is not None, str(v)
    assert v.counterexample.reason.startswith("buffer `"), str(v)
    filled = verify(_causal_sdpa_with(_sdpa_variant), cases=2, max_examples=20,
                    hints={"k_cache": OperandHint(fill="positive")})
    assert filled.status != DIFFERENT, str(filled)
    assert any("caches_start_zero" in why and "starts non-zero" in why for why in filled.declined), \
        filled.declined


def test_the_cannot_check_allow_list_names_shipped_rules() -> None:
    assert set(CANNOT_CHECK_ALLOWED) <= {r.name for _, _, r in SHIPPED}


def test_linear_batch_norm_folds_only_a_batch_norm_over_the_linears_features() -> None:
    """Found by verify: a linear of a rank-3 input (N, L, F) followed by a BatchNorm1d
    normalizes over dim 1 (L), not over the linear's output features; the fold scales the
    features instead (same shape when L equals the output features, other values: 3.5 off
    eager on Linear(3, 4) + BatchNorm1d(4) of a (2, 4, 3) input, the linear kept as the
    partitioners keep it). Stock FuseBatchNormPass checks no rank either. The rules need
    the linear's input to be rank 2 (``Rank("x", {2})``)."""
    for set_name, name in (("vulkan_preprocess", "linear_batch_norm"),
                           ("xnnpack", "xnnpack_linear_batch_norm")):
        (rule,) = [r for r in rules_of(set_name) if r.name == name]
        v = verify(rule, cases=8, max_examples=150)
        assert v.status != DIFFERENT, str(v)


class _ConvBatchNorm(torch.nn.Module):
    def __init__(self, var: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([[[0.0]], [[-3.0]]]), requires_grad=False)
        self.bn_w = torch.nn.Parameter(torch.tensor([-1.0, -2.0]), requires_grad=False)
        self.bn_b = torch.nn.Parameter(torch.tensor([-1.0, 3.0]), requires_grad=False)
        self.register_buffer("mean", torch.tensor([0.0, 1.0]))
        self.register_buffer("var", var)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten.convolution.default(x, self.w, None, [1], [0], [1], False, [0], 1)
        return torch.ops.aten._native_batch_norm_legit_no_training.default(
            y, self.bn_w, self.bn_b, self.mean, self.var, 1e-5, 1e-5)[0]


@pytest.mark.parametrize("set_name", ["vulkan_preprocess", "xnnpack"])
def test_conv_batch_norm_folds_only_statistics_over_the_channels(set_name: str) -> None:
    """Found by verify: a running variance of one element for a conv of two output
    channels was folded (broadcast) where eager batch norm reads past its end (2532.8 vs
    8.66 for the second channel). The statistics must be vectors over the channels."""
    from fusionkit import FusionPass

    (rule,) = [r for r in rules_of(set_name) if r.name.endswith("conv_batch_norm")]
    x = torch.ones(1, 1, 1)
    for var, fused in ((torch.tensor([2.0]), 0), (torch.tensor([2.0, 2.0]), 1)):
        ep = torch.export.export(_ConvBatchNorm(var), (x,))
        ep.graph_module.graph.eliminate_dead_code()  # the statistics outputs nothing reads
        ep.graph_module.recompile()
        want = ep.module()(x)
        fuse = FusionPass([rule])
        fuse(ep)
        assert fuse.report.total_fused == fused, (var, fuse.report)
        if fused:
            assert torch.allclose(ep.module()(x), want)


def _yaml_blocks() -> list[tuple[str, str]]:
    """(where, text) of every YAML rule spec: passes/specs and the docs' examples."""
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "passes/specs").glob("*.yaml"))]
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", md.read_text(), re.S)):
            if re.search(r"^rules:", block, re.M):
                out.append((f"{md.relative_to(ROOT)}#{i}", block))
    return out


YAML = _yaml_blocks()


def test_the_yaml_examples_are_found() -> None:
    where = {w.split("#")[0] for w, _ in YAML}
    assert {"passes/specs/rms_norm.yaml", "README.md", "docs/yaml.md", "docs/verify.md"} <= where


@pytest.mark.parametrize("text", [t for _, t in YAML], ids=[w for w, _ in YAML])
def test_every_yaml_example_computes_what_it_replaces(text: str) -> None:
    from fusionkit.specs.compile import load_spec_text

    rules = load_spec_text(text)
    assert rules
    for rule in rules:
        v = verify(rule, cases=CASES, max_examples=60)
        if rule.name.endswith("_wrong"):  # docs/verify.md's example of a wrong rule
            assert v.status == DIFFERENT and v.counterexample is not None, v
        else:
            assert v.status != DIFFERENT, str(v)


# ---------------------------------------------------------------------------- command line


def test_the_command_reports_a_wrong_spec_with_exit_status_1(tmp_path: Path, capsys: Any) -> None:
    from fusionkit.app.cli import main

    spec = tmp_path / "wrong.yaml"
    spec.write_text(
        "version: 1\nrules:\n- name: reciprocal_mul_swapped\n  pattern:\n    op: aten.mul.Tensor\n"
        "    args: [{capture: x}, {op: aten.reciprocal.default, args: [{capture: y}]}]\n"
        "  replacement: {op: aten.div.Tensor, args: [{ref: y}, {ref: x}]}\n")
    assert main(["verify", str(spec), "--json", "--cases", "2"]) == 1
    (record,) = json.loads(capsys.readouterr().out)
    assert record["rule"] == "reciprocal_mul_swapped" and record["status"] == DIFFERENT
    assert record["counterexample"]["inputs"]["x"]["shape"]


def test_the_command_verifies_module_rules(capsys: Any) -> None:
    from fusionkit.app.cli import main

    target = "fusionkit.passes.vulkan.quantized_unary:quantized_unary_rule"
    assert main(["verify", target, "--cases", "2"]) == 0
    out = capsys.readouterr().out
    assert "quantized_unary: equal" in out and "1 rule(s): 1 equal" in out


def test_the_command_refuses_a_target_naming_no_rules(capsys: Any) -> None:
    from fusionkit.app.cli import main

    assert main(["verify", "no_such_rule_set"]) == 2
    assert "not a .yaml spec" in capsys.readouterr().err


def test_the_html_picture_shows_the_verification() -> None:
    from fusionkit.app.html_report import render_html

    v = verify(_reciprocal_mul(True), cases=2)
    page = render_html([], "t", {v.rule: v})
    assert 'class="verify-different"' in page and "reciprocal_mul_swapped" in page
    assert "Verification" in page
