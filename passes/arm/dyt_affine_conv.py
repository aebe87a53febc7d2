"""An int8 DyT's ``x * gamma + beta`` folded into the convolution after it.

Takes over ``FoldDyTAffineIntoConvPass`` (``_passes/fold_dyt_affine_into_conv_pass.py``,
ExecuTorch 1.5.1). Like the alpha fold (:mod:`.dyt_alpha_lut`) the pass is not in the
default TOSA pipeline: a user inserts it before ``InsertTableOpsPass``, after
``FoldDyTAlphaIntoLUTPass`` (it starts from the ``tosa.TABLE`` that fold makes), and the
takeover replaces it wherever it was inserted. The site, after ``InsertRescaleInt32Pass``
and ``MatchArgRanksPass``::

    TABLE(x, lut) -> RESCALE32 -> mul(., RESCALE32(view(gamma)))  -> RESCALE8 (gamma_output)
                  -> RESCALE32 -> add(., RESCALE32(view(beta)))   -> RESCALE8 (add_output)
                  -> permute(0, 3, 1, 2) [-> slice ...] -> convolution

On the 256 codes the table can emit, the integer affine map (TOSA's ``RESCALE`` rounding,
the stock module's ``_apply_tosa_rescale``) is computed. Where the convolution has no
padding and the map is exactly ``slope * x + offset`` per channel, slope and offset go into
the convolution's int8 weight and int32 bias (the new constants named as stock names them,
``<weight>_<conv>_dyt_affine_folded``, before the source constant; the convolution edited
in place and its input zero point set to the table's) and the convolution reads the table.
Otherwise an affine map that is the identity on those codes is dropped (the layout chain
reads the table), else a gamma that is the identity is (the add reads the table). The
arithmetic is stock's own (``_apply_tosa_rescale``, ``_fit_integer_affine``,
``_weight_zero_points``); what is the rule's is when it applies, each step with a reason.

Stock's checks, stated as one constraint: a non-transposed convolution whose input comes
through exactly one ``permute(0, 3, 1, 2)`` (and slices) from a signed int8 ``RESCALE`` of
an ``add`` with one user; the add's operands, and the mul's, signed single-scale
``RESCALE`` s to int32 (through one static view with one user at most); exactly one
operand of each a constant (beta, gamma), of int8 codes, as many as each other; the
table's values 256 int8 codes with single int8 output qparams; gamma and beta seen as
``(1, 1, 1, C)``, the activation without a view; the table NHWC with C channels and the
add's output shape; the gamma output's rescale and the mul with one user. For the fold:
the layout chain and the add output read by the convolution alone; an int8 rank-4 weight
and an int32 vector bias, constants; per-tensor int8 activation qparams whose zero point is
the add output's; int8 weight qparams (per channel on axis 0); the folded values in range.

What stock forgets: a constant here is a constant of the program. Stock reads gamma, beta,
the table's values and the convolution's weight and bias with ``get_param_tensor``, which
also returns a buffer the program mutates: a gamma the program doubles on every call is
folded into the weight with its value at lowering time (``tests/test_arm_dyt_affine.py``),
where the rule declines, naming the mutable buffer. Everything else is stock's check,
each with its own reason where stock returns None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    FusionError,
    MatchResult,
    PythonReplacement,
    Rewriter,
    Rule,
    any_value,
    capture,
    lit,
    op,
)
from fusionkit.targets import op_key

from ._common import (
    CONV,
    RESCALE,
    constraint,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)
from ._dyt_sites import (  # (the site as fusionkit.verify draws it)
    dyt_affine_operands,
    dyt_affine_site_form,
)
from .dyt_alpha_lut import TABLE, _single_qargs

ADD = "aten.add.Tensor"
MUL = "aten.mul.Tensor"
VIEW = "aten.view_copy.default"
PERMUTE = "aten.permute_copy.default"
SLICE = "aten.slice_copy.Tensor"

_STOCK = "executorch.backends.arm._passes.fold_dyt_affine_into_conv_pass"


def _stock() -> Any:
    import importlib

    return importlib.import_module(_STOCK)


def _is(n: Any, key: str) -> TypeGuard[Node]:
    return isinstance(n, Node) and n.op == "call_function" and op_key(n.target) == key


def _rescale(node: Any) -> Any:
    """Stock's ``_RescaleParams.from_node`` of a ``tosa.RESCALE`` (else None)."""
    if not _is(node, RESCALE):
        return None
    return _stock()._RescaleParams.from_node(node)


@dataclass(frozen=True)
class _Operand:
    source: Node
    rescale: Any  # _RescaleParams
    view_shape: tuple[int, ...] | None


@dataclass(frozen=True)
class Plan:
    """What the rule does at one convolution: ``kind`` is ``"fold"`` (weight and bias
    folded, ``weight`` / ``bias`` None where unchanged), ``"identity"`` (``reroute`` is
    the add output) or ``"gamma_identity"`` (``reroute`` is the gamma output)."""

    kind: str
    table: Node
    reroute: Node
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    input_qparams: dict[int, Any] | None = None


Reason = tuple[str, Node]


def _operand(arg: Any, what: str) -> _Operand | Reason:
    node, view_shape = arg, None
    while _is(node, VIEW):
        shape = node.args[1] if len(node.args) > 1 else None
        if (not isinstance(node.args[0], Node) or len(node.users) != 1 or view_shape is not None
                or not isinstance(shape, (list, tuple))
                or not all(type(d) is int for d in shape)):
            return (f"{what} `{node.name}` is not one static view with one user", node)
        view_shape = tuple(shape)
        node = node.args[0]
    rescale = _rescale(node)
    if rescale is None or rescale.output_dtype != torch.int32 or not isinstance(node.args[0],
                                                                                 Node):
        return (f"{what} is not a signed single-scale RESCALE of a tensor to int32",
                node if isinstance(node, Node) else arg)
    return _Operand(node.args[0], rescale, view_shape)


def _pair(node: Node, what: str, constant: Any, describe: Any
          ) -> tuple[_Operand, _Operand] | Reason:
    """(the activation operand, the constant one) of the binary ``node``."""
    got = [_operand(a, f"an operand of the {what}") for a in node.args[:2]]
    ops = [o for o in got if isinstance(o, _Operand)]
    if len(ops) != 2:
        return next(o for o in got if not isinstance(o, _Operand))  # type: ignore[return-value]
    consts = [o for o in ops if constant(o.source) is not None]
    if len(consts) != 1:
        return (f"{len(consts)} of the {what}'s operands are constants, not 1 "
                f"({', '.join(f'`{o.source.name}` is {describe(o.source)}' for o in ops)})",
                node)
    return next(o for o in ops if o is not consts[0]), consts[0]


def _layout_source(x: Node) -> tuple[Node, tuple[Node, ...]] | Reason:
    chain: list[Node] = []
    permutes = 0
    node = x
    while _is(node, PERMUTE) or _is(node, SLICE):
        if not isinstance(node.args[0], Node):
            return (f"`{node.name}` reads no tensor", node)
        if _is(node, PERMUTE):
            dims = node.args[1] if len(node.args) > 1 else None
            if permutes or not isinstance(dims, (list, tuple)) or tuple(dims) != (0, 3, 1, 2):
                return (f"the layout chain before the convolution is not one "
                        f"permute(0, 3, 1, 2) (and slices): `{node.name}`", node)
            permutes += 1
        chain.append(node)
        node = node.args[0]
    if permutes != 1:
        return ("the convolution's input is not NHWC made NCHW by one permute(0, 3, 1, 2)", x)
    return node, tuple(chain)


def _static_shape(node: Node) -> tuple[int, ...] | None:
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor) or not all(type(d) is int for d in v.shape):
        return None
    return tuple(v.shape)


def plan(conv: Node, x: Node, constant: Any, describe: Any) -> Plan | Reason:
    """What the rule does at ``conv``, or why (and at which node) nothing.

    ``constant(node)``: the constant tensor a node is, else None; ``describe(node)``: what it
    is instead."""
    stock = _stock()
    cls = stock.FoldDyTAffineIntoConvPass
    traced = _layout_source(x)
    if isinstance(traced[0], str):
        return traced  # type: ignore[return-value]
    add_output: Any = traced[0]
    layout: Any = traced[1]
    add_rescale = _rescale(add_output)
    if add_rescale is None or add_rescale.output_dtype != torch.int8:
        return ("the layout chain does not start at a signed single-scale RESCALE to int8",
                add_output)
    add: Any = add_output.args[0]
    if not _is(add, ADD) or len(add.users) != 1:
        return ("the int8 RESCALE does not requantize an add with one user", add_output)
    got = _pair(add, "add", constant, describe)
    if not isinstance(got[0], _Operand):
        return got  # type: ignore[return-value]
    activation, beta = got  # type: ignore[misc]
    gamma_output: Any = activation.source
    gamma_rescale = _rescale(gamma_output)
    if (gamma_rescale is None or gamma_rescale.output_dtype != torch.int8
            or len(gamma_output.users) != 1):
        return ("the add's activation is not a signed int8 RESCALE with one user",
                gamma_output)
    mul: Any = gamma_output.args[0]
    if not _is(mul, MUL) or len(mul.users) != 1:
        return ("the int8 RESCALE before the add does not requantize a mul with one user",
                gamma_output)
    got = _pair(mul, "mul", constant, describe)
    if not isinstance(got[0], _Operand):
        return got  # type: ignore[return-value]
    table_operand, gamma = got  # type: ignore[misc]
    table: Any = table_operand.source
    if not _is(table, TABLE) or len(table.args) < 2 or not isinstance(table.args[1], Node):
        return ("the mul's activation is not a TOSA TABLE of a constant", table)
    lut = constant(table.args[1])
    if lut is None:
        return (f"the table's values `{table.args[1].name}` are "
                f"{describe(table.args[1])}, not a constant", table.args[1])
    table_qargs = _single_qargs(table, "output_qparams")
    gamma_codes, beta_codes = constant(gamma.source), constant(beta.source)
    if (lut.dtype != torch.int8 or lut.numel() != 256 or table_qargs is None
            or table_qargs.dtype != torch.int8):
        return ("the table is not 256 int8 codes with single int8 output qparams", table)
    if gamma_codes.dtype != torch.int8 or beta_codes.dtype != torch.int8:
        return ("gamma or beta is not int8 codes", mul)
    channels = gamma_codes.numel()
    if beta_codes.numel() != channels:
        return (f"gamma has {channels} codes, beta {beta_codes.numel()}", add)
    bcast = (1, 1, 1, channels)
    if (table_operand.view_shape is not None or activation.view_shape is not None
            or gamma.view_shape != bcast or beta.view_shape != bcast):
        return (f"gamma and beta are not seen as {list(bcast)} with the activation "
                "unviewed", mul)
    table_shape = _static_shape(table)
    if (table_shape is None or table_shape != _static_shape(add_output)
            or len(table_shape) != 4 or table_shape[-1] != channels):
        return (f"the table is not NHWC with {channels} channels and the add's shape", table)

    # the map on the 256 codes the table can emit (stock's arithmetic)
    codes = _stock_match(stock, table, lut, table_qargs, table_operand, gamma, gamma_codes,
                         gamma_output, gamma_rescale, activation, beta, beta_codes,
                         add_output, add_rescale, conv, layout)
    pass_ = cls.__new__(cls)  # (its arithmetic helpers read nothing of the instance)
    gamma_outputs = pass_._gamma_outputs(codes)
    if gamma_outputs is None:
        return ("gamma's product leaves int32 on some code", mul)
    affine_outputs = pass_._affine_outputs(codes, gamma_outputs)
    if affine_outputs is None:
        return ("beta's sum leaves int32 on some code", add)
    why_not = "the convolution has padding (beta would not reach its padded border)"
    if not cls._has_padding(conv):
        folded = _fold(cls, codes, affine_outputs, constant)
        if isinstance(folded, Plan):
            return folded
        why_not = folded[0]
    if cls._affine_is_identity(codes, affine_outputs):
        return Plan("identity", table, add_output)
    if cls._gamma_is_identity(codes, gamma_outputs):
        return Plan("gamma_identity", table, gamma_output)
    return (f"not folded: {why_not}; and neither the affine map nor gamma is the identity "
            "on the table's codes", conv)


def _stock_match(stock: Any, table: Node, lut: torch.Tensor, table_qargs: Any,
                 table_operand: _Operand, gamma: _Operand, gamma_codes: torch.Tensor,
                 gamma_output: Node, gamma_rescale: Any, activation: _Operand,
                 beta: _Operand, beta_codes: torch.Tensor, add_output: Node,
                 add_rescale: Any, conv: Node, layout: tuple[Node, ...]) -> Any:
    """The stock pass's match record, for its arithmetic."""
    return stock._DyTAffineMatch(
        table=table, table_values=lut, table_qargs=table_qargs,
        gamma_activation_rescale=table_operand.rescale, gamma=gamma.source,
        gamma_codes=gamma_codes, gamma_rescale=gamma.rescale, gamma_output=gamma_output,
        gamma_output_rescale=gamma_rescale, add_activation_rescale=activation.rescale,
        beta=beta.source, beta_codes=beta_codes, beta_rescale=beta.rescale,
        add_output=add_output, add_output_rescale=add_rescale, conv=conv,
        layout_chain=layout)


def _fold(cls: Any, m: Any, affine_outputs: torch.Tensor, constant: Any) -> Plan | Reason:
    """The folded weight and bias (stock's ``_fold_unpadded``), or why not."""
    conv = m.conv
    if not cls._exclusive_conv_input(m):
        return ("the add output or the layout chain has users besides the convolution", conv)
    fitted = cls._fit_integer_affine(m.table_values, affine_outputs,
                                     input_zp=m.table_qargs.get_zp_per_tensor(),
                                     output_zp=m.add_output_rescale.output_zp)
    if fitted is None:
        return ("the affine map is not exactly slope * code + offset per channel", conv)
    slopes, offsets = fitted
    w_node, b_node = conv.args[1], conv.args[2]
    if not isinstance(w_node, Node) or not isinstance(b_node, Node):
        return ("the convolution has no bias", conv)
    weight, bias = constant(w_node), constant(b_node)
    if weight is None or bias is None:
        return ("the convolution's weight or bias is not a constant", conv)
    if weight.dtype != torch.int8 or weight.dim() != 4:
        return ("the convolution's weight is not a rank-4 int8 tensor", w_node)
    if bias.dtype != torch.int32 or bias.dim() != 1:
        return ("the convolution's bias is not an int32 vector", b_node)
    qparams = conv.meta.get("input_qparams", {}) or {}
    act, wq = qparams.get(0), qparams.get(1)
    if (act is None or act.per_channel or act.dtype != torch.int8
            or act.get_zp_per_tensor() != m.add_output_rescale.output_zp
            or wq is None or wq.dtype != torch.int8):
        return ("the convolution's input qparams are not per-tensor int8 at the add output's "
                "zero point with int8 weights", conv)
    groups = conv.args[8]
    out_c, in_per_group = weight.shape[0], weight.shape[1]
    if (not isinstance(groups, int) or groups <= 0 or slopes.numel() != in_per_group * groups
            or out_c % groups or bias.numel() != out_c):
        return ("the convolution's channels do not line up with the affine map's", conv)
    zps = cls._weight_zero_points(wq, out_c, weight.dim())
    if zps is None:
        return ("the weight's zero points are not per tensor or per output channel", w_node)
    out_per_group = out_c // groups
    groups_of = torch.arange(out_c, dtype=torch.int64).div(out_per_group, rounding_mode="floor")
    inputs = (groups_of.reshape(-1, 1) * in_per_group
              + torch.arange(in_per_group, dtype=torch.int64).reshape(1, -1))
    shape = (out_c, in_per_group, *([1] * (weight.dim() - 2)))
    centered = weight.to(torch.int64) - zps
    folded_w = centered * slopes[inputs].reshape(shape) + zps
    if folded_w.numel() and (int(folded_w.min()) < wq.qmin or int(folded_w.max()) > wq.qmax):
        return ("the folded weight leaves the weight's quantized range", w_node)
    folded_b = bias.to(torch.int64) + (centered * offsets[inputs].reshape(shape)).sum(
        dim=tuple(range(1, centered.dim())))
    limits = torch.iinfo(torch.int32)
    if folded_b.numel() and (int(folded_b.min()) < limits.min
                             or int(folded_b.max()) > limits.max):
        return ("the folded bias leaves int32", b_node)
    w8, b32 = folded_w.to(torch.int8), folded_b.to(torch.int32)
    from executorch.backends.arm._passes.quant_args import QuantArgs

    new_qparams = dict(qparams)
    new_qparams[0] = QuantArgs(scale=act.scale, zp=m.table_qargs.get_zp_per_tensor(),
                               qmin=act.qmin, qmax=act.qmax, dtype=act.dtype, axis=act.axis,
                               per_channel=False)
    return Plan("fold", m.table, m.add_output,
                None if torch.equal(w8, weight) else w8,
                None if torch.equal(b32, bias) else b32, new_qparams)


def _constant_fn(ctx: CheckContext) -> Any:
    def constant(n: Any) -> torch.Tensor | None:
        ref = ctx.inputs.constant(n) if isinstance(n, Node) else None
        return None if ref is None else ref.tensor
    return constant


def _applies(ctx: CheckContext, conv: Node, x: Node) -> MatchResult | None:
    got = plan(conv, x, _constant_fn(ctx), ctx.inputs.describe)
    if isinstance(got, Plan):
        return None
    reason, at = got
    return ctx.fail(reason, at=at)


def _folded_constant(rw: Rewriter, conv: Node, source: Node, value: torch.Tensor) -> Node:
    new = rw.fresh_constant(f"{source.name}_{conv.name}_dyt_affine_folded", value)
    rw.move_before(new, source)  # where stock creates it
    return new


def _fold_site(rw: Rewriter, conv: Node, x: Node) -> Node:
    def constant(n: Any) -> torch.Tensor | None:
        try:
            return rw.tensor(n) if isinstance(n, Node) else None
        except FusionError:
            return None

    got = plan(conv, x, constant, str)
    assert isinstance(got, Plan)  # (the constraint)
    out = conv
    if got.kind == "fold":
        w_node, b_node = conv.args[1], conv.args[2]
        assert isinstance(w_node, Node) and isinstance(b_node, Node)
        args = list(conv.args)
        if got.weight is not None:
            args[1] = _folded_constant(rw, conv, w_node, got.weight)
            rw.release(w_node)
        if got.bias is not None:
            args[2] = _folded_constant(rw, conv, b_node, got.bias)
            rw.release(b_node)
        out = rw.edit(conv, tuple(args))
        rw.set_meta(out, "input_qparams", got.input_qparams)
    rw.reroute(got.reroute, got.table)
    rw.release(got.reroute)
    return out  # edited in place, as stock edits it (the engine keeps it)


@register_rules("arm", takes_over="FoldDyTAffineIntoConvPass")
def dyt_affine_conv_rule() -> Rule:
    return Rule(
        name="arm_fold_dyt_affine_into_conv",
        pattern=op(CONV, capture("x"), capture("w"), capture("b") | lit(None), any_value("stride"),
                   any_value("padding"), any_value("dilation"), lit(False),
                   any_value("output_padding"), any_value("groups")).bind("conv"),
        constraints=[constraint("dyt_affine_site", hints=dyt_affine_operands)(_applies)],
        program_form=dyt_affine_site_form(_layout_source),
        replacement=PythonReplacement(_fold_site),
        description="an int8 DyT's gamma and beta folded into the following convolution "
                    "(or dropped where they are the identity on the table's codes)",
    )


__all__ = ["Plan", "dyt_affine_conv_rule", "plan"]
