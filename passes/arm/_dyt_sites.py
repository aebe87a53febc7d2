"""What ``fusionkit.verify`` needs of the DyT folds' sites: how to draw them (operand hints)
and the form the TOSA pipeline gives them where the folds run (program forms).

The folds' checks read a program after ``InsertRescaleInt32Pass``: edge-dialect op objects,
and the qparams ``FoldAndAnnotateQParamsPass`` and ``InsertRescaleInt32Pass`` write. The
hints build each site from ops with drawn rescales; each form converts the targets
(:func:`~.pipeline_form.edge_dialect`) and derives the qparams from those rescales as the
passes would have written them. ``tests/test_arm_concat_shapes_dyt.py`` and
``tests/test_arm_dyt_affine.py`` hold each form to the site the pipeline gives the rule
(ExecuTorch's DyT modules through the TOSA pipeline). Not the rules' code: the verifier's
description of where they run, which the rules carry (their checks' ``hints``, their
``program_form``); it reads no rule module (the affine form is given the rule's own
layout tracer).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, TypeGuard

import torch
from torch.fx import Node

from fusionkit.passes.registry import OperandHint, Pick, ProgramForm
from fusionkit.targets import op_key

from ._common import CONV, RESCALE
from .pipeline_form import PIPELINE_NODE_SEMANTICS, edge_dialect, quant_args, rescale_args

#: the ops of the sites drawn and read here
ADD, MUL, PERMUTE = "aten.add.Tensor", "aten.mul.Tensor", "aten.permute_copy.default"
TANH, VIEW, TABLE = "aten.tanh.default", "aten.view_copy.default", "tosa.TABLE.default"


def _is(n: Any, key: str) -> TypeGuard[Node]:
    return isinstance(n, Node) and n.op == "call_function" and op_key(n.target) == key


# --- FoldDyTAlphaIntoLUTPass ---------------------------------------------------------------

#: the int8 scale the program form takes for the DyT's sources (activation and alpha codes):
#: each int32 scale is it over the rescale's ratio, as stock's ``_source_qargs`` reads
SOURCE_SCALE = 1 / 16
#: the tanh's output qparams in the form: int8 over [-1, 1)
TANH_OUTPUT_SCALE = 1 / 128


def dyt_alpha_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: the int8 DyT site built from ops -- an int8 activation and
    a one-element int8 alpha constant (at zero point 0, or -128 as the pipeline quantizes a
    positive alpha), each rescaled to int32 (ratio 1, as ``InsertRescaleInt32Pass`` writes
    a mul's, or another stock accepts; the activation's zero point drawn), their product
    rescaled to int8. :func:`dyt_alpha_form` gives it the qparams those ratios imply; with
    them the tanh's input scale ranges over [1/128, 1/8]."""
    shape = pick(((1, 4), (2, 3)))
    act_scale, act_zp = pick((1.0, 0.5)), pick((0, -5))
    alpha_scale, out_scale = pick((1.0, 0.25)), pick((0.25, 0.5))
    alpha_zp = pick((0, -128))
    alpha_code = alpha_zp + pick((3, 5, -2) if alpha_zp == 0 else (3, 255))

    def activation(make: Any) -> Any:
        x = make.input("x", shape, torch.int8, make.randint(-128, 127, shape).to(torch.int8))
        return make.call(RESCALE, x, torch.int32, [act_scale], act_zp, 0)

    def alpha(make: Any) -> Any:
        code = make.input("code", (1,), torch.int8, torch.tensor([alpha_code], dtype=torch.int8),
                          constant=True)
        return make.call(RESCALE, code, torch.int32, [alpha_scale], alpha_zp, 0)

    return {"lhs": OperandHint(producer=activation), "rhs": OperandHint(producer=alpha),
            "out_dtype": OperandHint(values=(torch.int8,)),
            "out_scales": OperandHint(values=([out_scale],)),
            "out_in_zp": OperandHint(values=(0,)), "out_out_zp": OperandHint(values=(0, -4))}


def dyt_alpha_form(ep: Any) -> None:
    """The site as the rule sees it in the TOSA pipeline: edge-dialect targets, and the
    qparams ``FoldAndAnnotateQParamsPass`` and ``InsertRescaleInt32Pass`` write -- the
    activation int8 at :data:`SOURCE_SCALE` (its rescale's input zero point; the alpha, a
    constant, none), the mul's int32 inputs at that over each rescale's ratio and its output
    at their product, the tanh's int8 input at the product over the requantize's ratio (its
    output zero point), its output at :data:`TANH_OUTPUT_SCALE`."""
    edge_dialect(ep)
    sig = ep.graph_signature
    constants = {*sig.inputs_to_parameters, *sig.inputs_to_buffers,
                 *sig.inputs_to_lifted_tensor_constants}
    for tanh in list(ep.graph.nodes):
        if _is(tanh, TANH) and _is(tanh.args[0], RESCALE) and _is(tanh.args[0].args[0], MUL):
            _annotate_alpha_site(tanh, tanh.args[0], tanh.args[0].args[0], constants)


def _annotate_alpha_site(tanh: Node, out_rescale: Node, mul: Node,
                         constants: Collection[str] = ()) -> None:
    """The qparams of one site; a constant source (``constants``: placeholder names) gets
    none, as the pipeline leaves its frozen parameters."""
    int32 = {}
    for i, arg in enumerate(mul.args[:2]):
        node = arg
        while _is(node, VIEW):
            node = node.args[0]
        if not _is(node, RESCALE) or not isinstance(node.args[0], Node):
            return
        ratio, in_zp, _ = rescale_args(node)
        if node.args[0].name not in constants:
            node.args[0].meta["output_qparams"] = {0: quant_args(SOURCE_SCALE, in_zp,
                                                                 torch.int8)}
        int32[i] = quant_args(SOURCE_SCALE / ratio, 0, torch.int32)
    product = int32[0].scale * int32[1].scale
    mul.meta["input_qparams"] = int32
    mul.meta["output_qparams"] = {0: quant_args(product, 0, torch.int32)}
    out_ratio, _, out_zp = rescale_args(out_rescale)
    tanh.meta["input_qparams"] = {0: quant_args(product / out_ratio, out_zp, torch.int8)}
    tanh.meta["output_qparams"] = {0: quant_args(TANH_OUTPUT_SCALE, 0, torch.int8)}


#: where the alpha fold runs: the TOSA pipeline's position, and what its nodes mean there
DYT_ALPHA_FORM = ProgramForm(dyt_alpha_form, node_semantics=PIPELINE_NODE_SEMANTICS)


# --- FoldDyTAffineIntoConvPass -------------------------------------------------------------

#: the table's int8 output scale in the program form (a tanh's: [-1, 1))
TABLE_OUTPUT_SCALE = 1 / 128
#: gamma's int8 scale in the form (beta's is derived: its int32 scale is the activation's)
GAMMA_SCALE = 1 / 16
#: the convolution's int8 weight scale in the form, per output channel
WEIGHT_SCALE = 1 / 64
#: the convolution's output scale over its accumulator's (input scale times weight scale)
CONV_GAIN = 64


def dyt_affine_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: the int8 site built from ops, as the pipeline gives it -- a
    ``tosa.TABLE`` of a 256-entry int8 constant on int8 codes (NHWC), rescaled to int32
    (ratio 1 as ``InsertRescaleInt32Pass`` writes a mul's, or 2) and multiplied by gamma (an
    int8 ``[C]`` constant at zero point 0 or -128, rescaled to int32 and viewed as
    ``(1, 1, 1, C)``), requantized to int8, rescaled to int32 (ratio 1, or the pipeline's
    ``2**19`` for an add of int8 operands) and added to beta (zero point 0 or 42, its ratio
    that one or a fraction of it), requantized, ``permute(0, 3, 1, 2)``, and an int8
    convolution with int8 weight and int32 bias constants. Each requantize undoes its
    operands' ratios, so the integer map is exact where gamma's codes are small (the fold)
    or gamma is 1 (the identity gamma: 1 code, or 255 at zero point -128, as the pipeline
    quantizes it). The branch is drawn: no padding (the fold), or padding with gamma 1
    (``gamma_identity``) and beta 0 too (``identity``)."""
    branch = pick(("fold", "padded"))
    if branch == "padded":  # the fold does not apply: gamma 1, and beta 0 or not
        branch = pick(("gamma_identity", "identity"))
    c, (h, w), out_c, k = pick((2, 3)), pick(((2, 2), (3, 2))), pick((2, 4)), pick((1, 2))
    t_zp, r_t, r_g, r_a = pick((0, 39)), pick((1.0, 2.0)), pick((1.0, 4.0)), pick((1.0, 2.0**19))
    g_zp, b_zp, r_b = pick((0, -128)), pick((0, 42)), r_a * pick((1.0, 0.5587))
    one = pick((1, 255)) if g_zp == -128 else 1  # gamma 1's codes above the zero point
    z_go = t_zp if branch != "fold" else pick((t_zp, t_zp + 3))
    z_ao = z_go if branch == "identity" else pick((z_go, z_go - 2))
    padding = [0, 0] if branch == "fold" else [1, 1]

    def activation(make: Any) -> Any:
        codes = make.input("codes", (1, h, w, c), torch.int8,
                           make.randint(-128, 127, (1, h, w, c)).to(torch.int8))
        # (values around the table's zero point: gamma's product stays in int8, unclamped)
        lut = make.input("lut", (256,), torch.int8,
                         (make.randint(-20, 20, (256,)) + t_zp).to(torch.int8), constant=True)
        steps = (torch.full((c,), one) if branch != "fold"
                 else make.randint(0 if g_zp else -3, 3, (c,)))
        beta_steps = torch.zeros(c) if branch == "identity" else make.randint(-20, 20, (c,))
        gamma = make.input("gamma", (c,), torch.int8, (steps + g_zp).to(torch.int8), constant=True)
        beta = make.input("beta", (c,), torch.int8, (beta_steps + b_zp).to(torch.int8),
                          constant=True)
        table = make.call(TABLE, codes, lut)
        product = make.call(MUL, make.call(RESCALE, table, torch.int32, [r_t], t_zp, 0),
                            _channels(make, gamma, r_g, g_zp, c))
        gamma_output = make.call(RESCALE, product, torch.int8, [1 / (r_t * r_g * one)], 0, z_go)
        summed = make.call(ADD, make.call(RESCALE, gamma_output, torch.int32, [r_a], z_go, 0),
                           _channels(make, beta, r_b, b_zp, c))
        add_output = make.call(RESCALE, summed, torch.int8, [1 / r_a], 0, z_ao)
        return make.call(PERMUTE, add_output, [0, 3, 1, 2])

    return {"x": OperandHint(producer=activation),
            "w": OperandHint(constant=True, dtype=torch.int8, shapes=((out_c, c, k, k),),
                             int_range=(-8, 8)),
            "b": OperandHint(constant=True, dtype=torch.int32, shapes=((out_c,),),
                             int_range=(-50, 50)),
            "stride": OperandHint(values=([1, 1],)), "padding": OperandHint(values=(padding,)),
            "dilation": OperandHint(values=([1, 1],)),
            "output_padding": OperandHint(values=([0, 0],)), "groups": OperandHint(values=(1,))}


def _channels(make: Any, codes: Any, ratio: float, zp: int, c: int) -> Any:
    """An int8 ``[C]`` constant rescaled to int32 and viewed as ``(1, 1, 1, C)``."""
    return make.call(VIEW, make.call(RESCALE, codes, torch.int32, [ratio], zp, 0), [1, 1, 1, c])


#: the rule's tracer of the convolution's input back to its layout source (``_layout_source``)
Trace = Callable[[Node], Any]


def dyt_affine_form(ep: Any, trace: Trace) -> None:
    """The site as the rule sees it in the TOSA pipeline: edge-dialect targets, and the
    qparams the pipeline writes, derived from the drawn rescales -- the table's int8 output
    at :data:`TABLE_OUTPUT_SCALE` (its rescale's input zero point), gamma's at
    :data:`GAMMA_SCALE`, each int32 scale the int8 one over its rescale's ratio, the mul's
    output their product, each requantized int8 scale the int32 one over its ratio, the
    add's operands at one int32 scale (beta's int8 scale is that times its ratio); the
    convolution's input at the add output's, its symmetric weight per channel at
    :data:`WEIGHT_SCALE` and bias at their product, its output at the accumulator's times
    :data:`CONV_GAIN`. ``tests/test_arm_dyt_affine.py`` holds it to the site the pipeline
    gives the rule."""
    edge_dialect(ep)
    for conv in list(ep.graph.nodes):
        if _is(conv, CONV) and isinstance(conv.args[0], Node):
            _annotate_affine_site(conv, trace)


def _rescaled(arg: Any) -> tuple[Node, Node] | None:
    """(the RESCALE to int32 under ``arg``'s views, its source)."""
    node = arg
    while _is(node, VIEW):
        node = node.args[0]
    if not _is(node, RESCALE) or not isinstance(node.args[0], Node):
        return None
    return node, node.args[0]


def _binary(node: Node, is_activation: Any) -> tuple[int, Node, Node, Node, Node] | None:
    """(the activation operand's index, its rescale, its source, the constant's rescale, its
    source) of a binary op whose operands are rescaled to int32."""
    got = [_rescaled(a) for a in node.args[:2]]
    if got[0] is None or got[1] is None:
        return None
    i = 0 if is_activation(got[0][1]) else 1
    (ra, sa), (rc, sc) = got[i], got[1 - i]  # type: ignore[misc]
    return i, ra, sa, rc, sc


def _annotate_affine_site(conv: Node, trace: Trace) -> None:
    traced = trace(conv.args[0])  # type: ignore[arg-type]
    add_output = traced[0]
    if not _is(add_output, RESCALE) or not _is(add_output.args[0], ADD):
        return
    add = add_output.args[0]
    got = _binary(add, lambda n: _is(n, RESCALE))
    if got is None or not _is(got[2].args[0], MUL):
        return
    a_index, a_rescale, gamma_output, _, _ = got
    mul = gamma_output.args[0]
    assert isinstance(mul, Node)
    got = _binary(mul, lambda n: _is(n, TABLE))
    if got is None:
        return
    t_index, t_rescale, table, g_rescale, _ = got
    (r_t, t_zp, _), (r_g, _, _) = rescale_args(t_rescale), rescale_args(g_rescale)
    table.meta["output_qparams"] = {0: quant_args(TABLE_OUTPUT_SCALE, t_zp, torch.int8)}
    product = (TABLE_OUTPUT_SCALE / r_t) * (GAMMA_SCALE / r_g)
    mul.meta["input_qparams"] = {t_index: quant_args(TABLE_OUTPUT_SCALE / r_t, 0, torch.int32),
                                 1 - t_index: quant_args(GAMMA_SCALE / r_g, 0, torch.int32)}
    mul.meta["output_qparams"] = {0: quant_args(product, 0, torch.int32)}
    r_go, _, _ = rescale_args(gamma_output)
    r_a, _, _ = rescale_args(a_rescale)
    int32_scale = product / r_go / r_a  # (beta's int8 scale: this times its ratio)
    add.meta["input_qparams"] = {a_index: quant_args(int32_scale, 0, torch.int32),
                                 1 - a_index: quant_args(int32_scale, 0, torch.int32)}
    add.meta["output_qparams"] = {0: quant_args(int32_scale, 0, torch.int32)}
    r_ao, _, z_ao = rescale_args(add_output)
    in_scale = int32_scale / r_ao
    out_c = conv.meta["val"].shape[1]
    conv.meta["input_qparams"] = {
        0: quant_args(in_scale, z_ao, torch.int8),
        1: quant_args([WEIGHT_SCALE] * out_c, [0] * out_c, torch.int8, per_channel=True,
                      symmetric=True),
        2: quant_args([in_scale * WEIGHT_SCALE] * out_c, [0] * out_c, torch.int32,
                      per_channel=True, symmetric=True)}
    conv.meta["output_qparams"] = {0: quant_args(in_scale * WEIGHT_SCALE * CONV_GAIN, 0,
                                                 torch.int8)}


def dyt_affine_site_form(trace: Trace) -> ProgramForm:
    """Where the affine fold runs (its site holds TOSA ops beyond the pattern's), the form
    reading the site through the rule's ``trace``."""
    return ProgramForm(lambda ep: dyt_affine_form(ep, trace), namespaces=frozenset({"tosa"}),
                       node_semantics=PIPELINE_NODE_SEMANTICS)


__all__ = ["DYT_ALPHA_FORM", "dyt_affine_form", "dyt_affine_operands", "dyt_affine_site_form", "dyt_alpha_form",
           "dyt_alpha_operands"]
