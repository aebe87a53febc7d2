"""What ``fusionkit.verify`` runs the TOSA dialect's ops through is what the TOSA reference
model computes: SLICE on windows of lowered slices, TABLE on every int8 input through a
drawn table; and a wrong slice fusion is found different through them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from fusionkit import PythonReplacement, Rewriter
from fusionkit.authoring.verify import DIFFERENT, verify
from fusionkit.passes.arm import tosa_semantics
from fusionkit.passes.arm.consecutive_slices import consecutive_slices_rule

pytest.importorskip("tosa_reference_model")


def _windows(seed: int, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """A start and a size inside ``shape`` per dim, drawn with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    start, size = [], []
    for extent in shape:
        s = int(torch.randint(0, extent, (1,), generator=g))
        start.append(s)
        size.append(int(torch.randint(1, extent - s + 1, (1,), generator=g)))
    return start, size


class _Window(torch.nn.Module):
    def __init__(self, start: list[int], size: list[int]) -> None:
        super().__init__()
        self.window = tuple(slice(s, s + z) for s, z in zip(start, size, strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.window] + 0.0  # (an op after it: the slice is not the whole program)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_slice_reference_is_the_reference_models_slice(seed: int) -> None:
    """A window of a rank-3 input, lowered to TOSA-1.0+FP (RewriteSlicePass makes it a
    tosa.SLICE) and run on the reference model, equals ``slice_reference`` on the window."""
    from fusionkit.backends.arm_adapter.reference_model import FP, lower, run_on_reference_model

    shape = (3, 4, 5)
    start, size = _windows(seed, shape)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    edge = lower(_Window(start, size), (x,), fusionkit=False, spec=FP)
    (got,) = run_on_reference_model(edge, (x,))
    want = tosa_semantics.slice_reference(x, start, size)
    assert tuple(got.shape) == tuple(size)
    assert torch.equal(got, want), (start, size)


def test_the_table_reference_is_the_reference_models_table() -> None:
    """Every int8 input through a drawn 256-entry table, as a one-op TOSA graph on the
    reference model (ExecuTorch's ``make_tosa_reference_model_impl`` serializes it)."""
    from executorch.backends.arm.tosa.dialect.ops import table
    from executorch.backends.arm.tosa.dialect.real_impl import make_tosa_reference_model_impl

    run = make_tosa_reference_model_impl(table.TABLE, "TABLE(Tensor input1, Tensor table) -> Tensor")
    codes = torch.arange(-128, 128, dtype=torch.int8).reshape(16, 16)
    lut = torch.randint(-128, 128, (256,), generator=torch.Generator().manual_seed(0)).to(torch.int8)
    with tosa_semantics.lowering_context():
        got = run(codes, lut)
    assert torch.equal(got, tosa_semantics.table_reference(codes, lut))
    assert not torch.equal(got, codes)  # (the table is not the identity)


def test_the_shape_marker_is_the_one_the_tosa_mapping_writes() -> None:
    from executorch.backends.arm.tosa.mapping import TosaSpecialDtype

    assert tosa_semantics.SPECIAL_DTYPE_KEY == TosaSpecialDtype.meta_key()


def test_a_slice_fusion_that_drops_the_first_start_is_different() -> None:
    """The fused slice given only the second start (not the sum): verify runs both
    programs through the SLICE reference and finds a window where they differ."""
    right = consecutive_slices_rule()
    fused: Any = right.replacement.fn  # type: ignore[attr-defined]

    def second_start_only(rw: Rewriter, outer: Any, inner: Any, size2: Any) -> Any:
        new = fused(rw, outer, inner, size2)
        new.args = (new.args[0], outer.args[1], new.args[2])
        return new

    wrong = dataclasses.replace(right, name="slices_drop_first_start",
                                replacement=PythonReplacement(second_start_only))
    v = verify(wrong, cases=8, max_examples=80)
    assert v.status == DIFFERENT and v.counterexample is not None, v


def test_a_rescale_fold_that_reads_the_codes_without_their_zero_point_is_different() -> None:
    """tosa.RESCALE runs on the reference model (its eager kernel serializes a one-op graph):
    a fold that rescales the int8 codes back with zero point 0, not the first rescale's,
    is off by ``zp * scale`` and found different; the shipped fold verifies equal."""
    from fusionkit.authoring.verify import EQUAL
    from fusionkit.passes.arm._common import RESCALE
    from fusionkit.passes.arm.consecutive_rescales import consecutive_rescales_rule

    right = consecutive_rescales_rule()
    assert verify(right, cases=2, max_examples=40).status == EQUAL

    def ignores_zero_point(rw: Rewriter, r1: Any, r2: Any) -> Any:
        new = rw.call(RESCALE, r1, torch.int32, list(r2.args[2]), 0, 0)
        new.target = r2.target
        return new

    wrong = dataclasses.replace(right, name="rescales_ignore_zero_point",
                                replacement=PythonReplacement(ignores_zero_point))
    v = verify(wrong, cases=8, max_examples=80)
    assert v.status == DIFFERENT and v.counterexample is not None, v
    assert v.counterexample.literals["in_zp"] != 0, v.counterexample


def _rescale_cases() -> list[tuple[Any, ...]]:
    """(input, dtype, scales, in_zp, out_zp, unsigned flags) drawn from a seeded generator:
    int32 -> int8/int16 (the quantized ops' outputs), int8/int16 -> int32 (their inputs),
    int8 -> int8, per tensor and per channel of the last dim, scales over many octaves,
    values that round half up and that clamp."""
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[Any, ...]] = []
    ranges = {torch.int8: (-128, 127), torch.int16: (-32768, 32767), torch.int32: (-40000, 40000)}
    pairs = [(torch.int32, torch.int8), (torch.int32, torch.int16), (torch.int8, torch.int32),
             (torch.int16, torch.int32), (torch.int8, torch.int8)]
    for i in range(20):
        src, dst = pairs[i % len(pairs)]
        lo, hi = ranges[src]
        x = torch.randint(lo, hi + 1, (2, 3), generator=g).to(src)
        channels = 3 if i % 4 == 3 else 1
        scales = [float(2.0 ** torch.randint(-14, 4, (1,), generator=g)
                        * (0.5 + torch.rand(1, generator=g))) for _ in range(channels)]
        in_zp = int(torch.randint(-128, 128, (1,), generator=g)) if src == torch.int8 else 0
        out_zp = int(torch.randint(-128, 128, (1,), generator=g)) if dst == torch.int8 else 0
        cases.append((x, dst, scales, in_zp, out_zp, False, False))
    x = torch.randint(-128, 128, (2, 3), generator=g).to(torch.int8)
    cases.append((x, torch.int8, [0.75], 200, -3, True, False))  # uint8 codes in
    x = torch.randint(-128, 128, (2, 3), generator=g).to(torch.int8)
    cases.append((x, torch.int8, [1.5], 0, 130, False, True))  # int8 to uint8 codes
    return cases


def test_the_rescale_reference_is_the_reference_models_rescale() -> None:
    """``rescale_reference`` on 22 drawn cases equals tosa.RESCALE's own eager kernel, which
    serializes the op (ExecuTorch's RescaleVisitor: multiplier, shift, SINGLE_ROUND) and
    runs it on the TOSA reference model."""
    from fusionkit.targets import resolve_op

    kernel = resolve_op("tosa.RESCALE.default")
    clamped = 0
    with tosa_semantics.lowering_context():
        for x, dtype, scales, in_zp, out_zp, u_in, u_out in _rescale_cases():
            flags = {"input_unsigned": u_in, "output_unsigned": u_out}
            want = kernel(x, dtype, scales, in_zp, out_zp, **flags)
            got = tosa_semantics.rescale_reference(x, dtype, scales, in_zp, out_zp, **flags)
            assert got.dtype == want.dtype and torch.equal(got, want), (x, dtype, scales, in_zp,
                                                                         out_zp, got, want)
            info = torch.iinfo(dtype)
            clamped += int(((want == info.min) | (want == info.max)).sum())
    assert clamped > 0  # (the cases reach the output type's bounds)


class _Tanh(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.tanh.default(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("in_scale", "in_zp", "out_scale", "out_zp"),
                         [(1 / 32, 5, 1 / 128, 0), (1 / 8, -3, 1 / 100, 7), (0.02, 0, 1 / 128, -128)])
def test_a_quantized_tanh_is_the_table_insert_table_ops_builds(in_scale: float, in_zp: int,
                                                               out_scale: float, out_zp: int) -> None:
    """What the verifier runs an int8 tanh with qparams through (before InsertTableOpsPass
    replaces it) is the TABLE that pass builds for it, on all 256 int8 codes; without
    qparams the node is left to torch."""
    from executorch.backends.arm._passes.insert_table_ops import InsertTableOpsPass

    from fusionkit.passes.arm import pipeline_form

    codes = torch.arange(-128, 128, dtype=torch.int8)
    ep = torch.export.export(_Tanh(), (codes,), strict=False)
    pipeline_form.edge_dialect(ep)
    (tanh,) = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert pipeline_form.table_op_semantics(tanh, (codes,), {}) is NotImplemented
    tanh.meta["input_qparams"] = {0: pipeline_form.quant_args(in_scale, in_zp, torch.int8)}
    tanh.meta["output_qparams"] = {0: pipeline_form.quant_args(out_scale, out_zp, torch.int8)}
    got = pipeline_form.table_op_semantics(tanh, (codes,), {})
    with tosa_semantics.lowering_context():
        assert InsertTableOpsPass(ep).call(ep.graph_module).modified
    (table,) = [n for n in ep.graph.nodes if "TABLE" in str(n.target)]
    lut = ep.state_dict[ep.graph_signature.inputs_to_buffers[table.args[1].name]]
    assert torch.equal(got, tosa_semantics.table_reference(codes, lut))
    assert len(set(got.tolist())) > 16  # (a table with many levels, not a constant)


_CONV2D_SCHEMA = ("CONV2D(Tensor input, Tensor weight, Tensor bias, int[2] stride, SymInt[4] pad, "
                  "int[2] dilation) -> Tensor")


@pytest.mark.parametrize(("x_zp", "w_zp", "pad", "per_channel"),
                         [(0, 0, 0, True), (5, 0, 1, True), (-7, 3, 1, False)])
def test_a_quantized_convolution_is_tosa_conv2d_then_its_output_rescale(
        monkeypatch: pytest.MonkeyPatch, x_zp: int, w_zp: int, pad: int, per_channel: bool) -> None:
    """What the verifier runs an int8 convolution with qparams through (before RewriteConvPass
    makes it a tosa.CONV2D and the output RESCALE) is what the reference model computes for
    that pair: CONV2D on the NHWC codes and OHWI weights with the qparams' zero points (read
    by ExecuTorch's serializer from the node's qparams), then RESCALE by in * w / out per
    output channel to the output's zero point."""
    import executorch.backends.arm.operators.ops_quant_utils as quant_utils
    from executorch.backends.arm.tosa.dialect.ops import conv2d
    from executorch.backends.arm.tosa.dialect.real_impl import make_tosa_reference_model_impl
    from executorch.exir.dialects._ops import ops as exir_ops

    from fusionkit.passes.arm import pipeline_form
    from fusionkit.targets import resolve_op

    g = torch.Generator().manual_seed(x_zp + 8 * pad)
    x = torch.randint(-128, 128, (1, 3, 4, 5), generator=g).to(torch.int8)
    w = torch.randint(-128, 128, (4, 3, 2, 2), generator=g).to(torch.int8)
    b = torch.randint(-5000, 5000, (4,), generator=g).to(torch.int32)
    w_scales = [0.01, 0.02, 0.005, 0.04] if per_channel else 0.01
    q_x = pipeline_form.quant_args(0.05, x_zp, torch.int8)
    q_w = pipeline_form.quant_args(w_scales, [w_zp] * 4 if per_channel else w_zp, torch.int8,
                                   per_channel=per_channel)
    q_out = pipeline_form.quant_args(0.5, -3, torch.int8)
    node = torch.fx.Graph().call_function(exir_ops.edge.aten.convolution.default)
    node.meta["input_qparams"] = {0: q_x, 1: q_w}
    node.meta["output_qparams"] = {0: q_out}
    got = pipeline_form.quantized_conv_semantics(
        node, (x, w, b, [1, 1], [pad, pad], [1, 1], False, [0, 0], 1), {})

    conv = make_tosa_reference_model_impl(conv2d.CONV2D, _CONV2D_SCHEMA)
    monkeypatch.setattr(quant_utils, "get_input_qparams",
                        lambda n: {0: q_x, 1: pipeline_form.quant_args(0.01, w_zp, torch.int8)})
    scales = [0.05 * s / 0.5 for s in (w_scales if isinstance(w_scales, list) else [w_scales])]
    with tosa_semantics.lowering_context():
        acc = conv(x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous(), b,
                   [1, 1], [pad] * 4, [1, 1])
        want = resolve_op("tosa.RESCALE.default")(acc, torch.int8, scales, 0, -3)
    assert got.dtype == torch.int8 and torch.equal(got, want.permute(0, 3, 1, 2))
    assert len(set(got.flatten().tolist())) > 8  # (not one clamped value)
    plain = torch.fx.Graph().call_function(exir_ops.edge.aten.convolution.default)
    assert pipeline_form.quantized_conv_semantics(plain, (x, w, b), {}) is NotImplemented
