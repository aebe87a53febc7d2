"""``tanh(RESCALE(mul(RESCALE(x), RESCALE(alpha))))`` -> ``TABLE(x, lut)`` (int8 DyT).

Takes over ``FoldDyTAlphaIntoLUTPass`` (``_passes/fold_dyt_alpha_into_lut_pass.py``,
ExecuTorch 1.5.1). The pass is not in the default TOSA pipeline: a user inserts it
(``register_pass_insertions_before(InsertTableOpsPass, [FoldDyTAlphaIntoLUTPass(ep)])``
or a pass-manager subclass), after ``InsertRescaleInt32Pass`` and before
``InsertTableOpsPass``; the takeover replaces it wherever it was inserted. On an int8
program it composes DyT's ``tanh(alpha * x)`` -- both operands rescaled to int32, the
product rescaled to int8, the tanh -- into one 256-entry ``tosa.TABLE`` on ``x``'s int8
codes, computed with TOSA's integer ``RESCALE`` rounding exactly (the table arithmetic is
the stock module's ``_generate_dyt_lut``; what is the rule's is when it applies). The table
is a new persistent buffer named as stock names it (``b_<tanh>_dyt_table_constant``), or
that name with a suffix when a placeholder already has it (never found by name); the
``TABLE`` node takes the tanh's metadata, with the activation's and the tanh's output
qparams, as stock builds it.

Constraints, stock's checks stated with a reason each: the product rescale writes int8 (one
scale, signed) and has the mul as its only input; the mul has two int32 qparams, each
operand a signed single-scale ``RESCALE`` to int32 (the alpha side through views only);
exactly one operand's source is a one-element constant (alpha); the activation's own
output qparams are the int8 ones its rescale reads; the tanh's qparams are single int8 ones
and its input zero point is the product rescale's. The mul and the product rescale have no
other user (the match's escape check). What stock forgets:

* the alpha is a constant of the program, not any buffer: a buffer the program mutates is
  not the value the table would bake in (stock reads any parameter, buffer or constant);
* the alpha holds integer codes (an ``int8`` / ``int16`` / ``int32`` tensor);
* the tanh's output has the activation's shape: a one-element alpha of a higher rank
  (``[1, 1, 1, 1]`` times a rank-3 activation) broadcasts the product to a higher rank,
  and the table on the activation alone gives the lower-rank tensor where every user of
  the tanh reads the higher-rank one (stock checks only that alpha has one element).
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
    capture,
    op,
)
from fusionkit.targets import op_key

from ._common import (
    RESCALE,
    constraint,
    keep_node_meta,
    register_rules,  # (Arm's: its rules carry what the TOSA ops compute)
)
from ._dyt_sites import (  # (the site as fusionkit.verify draws it)
    DYT_ALPHA_FORM,
    dyt_alpha_operands,
)

TANH = "aten.tanh.default"
MUL = "aten.mul.Tensor"
VIEW = "aten.view_copy.default"
TABLE = "tosa.TABLE.default"

_CODE_DTYPES = (torch.int8, torch.int16, torch.int32)


def _is(n: Any, key: str) -> TypeGuard[Node]:
    return isinstance(n, Node) and n.op == "call_function" and op_key(n.target) == key


def _rescale_params(node: Node) -> Any:
    """Stock's ``_RescaleParams.from_node`` (None: no single-scale signed RESCALE)."""
    from executorch.backends.arm._passes.fold_dyt_alpha_into_lut_pass import _RescaleParams

    if not _is(node, RESCALE):
        return None
    return _RescaleParams.from_node(node)


def _single_qargs(node: Node, key: str) -> Any:
    qparams = node.meta.get(key, {}) or {}
    if len(qparams) != 1:
        return None
    qargs = next(iter(qparams.values()))
    return None if qargs.per_channel else qargs


@dataclass(frozen=True)
class _Operand:
    index: int
    source: Node
    rescale: Any  # _RescaleParams
    had_view: bool


@dataclass(frozen=True)
class Plan:
    """What the table is computed from (the arguments of stock's ``_generate_dyt_lut``)."""

    activation: Node
    alpha: Node
    activation_qargs: Any
    activation_rescale: Any
    alpha_rescale: Any
    mul_output_rescale: Any
    tanh_input_qargs: Any
    tanh_output_qargs: Any


def _operand(index: int, arg: Any) -> _Operand | str:
    node = arg
    while _is(node, VIEW) and isinstance(node.args[0], Node):
        node = node.args[0]
    rescale = _rescale_params(node) if isinstance(node, Node) else None
    if rescale is None or rescale.output_dtype != torch.int32:
        return f"the mul's operand {index} is no signed single-scale RESCALE to int32"
    if not isinstance(node.args[0], Node):
        return f"the mul's operand {index} rescales no tensor"
    return _Operand(index, node.args[0], rescale, node is not arg)


def _source_qargs(source: Node, rescale: Any, int32_qargs: Any) -> Any:
    """Stock's ``_source_qargs``: the source's int8 output qparams its rescale reads."""
    import math

    for qargs in (source.meta.get("output_qparams", {}) or {}).values():
        if qargs.per_channel or qargs.dtype != torch.int8:
            continue
        if qargs.get_zp_per_tensor() != rescale.input_zp:
            continue
        expected = qargs.get_scale_per_tensor() / int32_qargs.get_scale_per_tensor()
        if math.isclose(expected, rescale.scale, rel_tol=1e-6, abs_tol=0.0):
            return qargs
    return None


def plan(tanh: Node, out_rescale: Node, mul: Node, constant: Any, describe: Any
         ) -> Plan | tuple[str, Node]:
    """The table's inputs, or why (and at which node) the fold does not apply.

    ``constant(node)``: the constant tensor a node is, else None; ``describe(node)``: what it
    is instead."""
    out = _rescale_params(out_rescale)
    if out is None or out.output_dtype != torch.int8:
        return "the tanh's input is no signed single-scale RESCALE to int8", out_rescale
    mul_qparams = mul.meta.get("input_qparams", {}) or {}
    if len(mul_qparams) != 2:
        return f"the mul has {len(mul_qparams)} input qparams, not 2", mul
    operands = [_operand(i, a) for i, a in enumerate(mul.args[:2])]
    for o in operands:
        if isinstance(o, str):
            return o, mul
    ops: list[_Operand] = [o for o in operands if isinstance(o, _Operand)]
    alphas = [o for o in ops if (t := constant(o.source)) is not None and t.numel() == 1]
    if len(alphas) != 1:
        return (f"{len(alphas)} of the mul's operands are one-element constants, not 1 "
                f"({', '.join(f'`{o.source.name}` is {describe(o.source)}' for o in ops)})",
                mul)
    alpha = alphas[0]
    activation = next(o for o in ops if o is not alpha)
    code = constant(alpha.source)
    if code.dtype not in _CODE_DTYPES:
        return f"the alpha `{alpha.source.name}` is {code.dtype}, no integer codes", alpha.source
    if activation.had_view:
        return "the activation reaches the mul through a view (a layout change)", mul
    int32_qargs = mul_qparams.get(activation.index)
    if int32_qargs is None or int32_qargs.dtype != torch.int32:
        return "the mul's activation qparams are not int32", mul
    act_qargs = _source_qargs(activation.source, activation.rescale, int32_qargs)
    if act_qargs is None:
        return (f"`{activation.source.name}` has no int8 output qparams its rescale reads",
                activation.source)
    tin, tout = _single_qargs(tanh, "input_qparams"), _single_qargs(tanh, "output_qparams")
    if tin is None or tout is None or tin.dtype != torch.int8 or tout.dtype != torch.int8:
        return "the tanh's qparams are not single per-tensor int8 ones", tanh
    if out.output_zp != tin.get_zp_per_tensor():
        return (f"the product rescale writes zero point {out.output_zp}, the tanh reads "
                f"{tin.get_zp_per_tensor()}"), tanh
    a_val, t_val = activation.source.meta.get("val"), tanh.meta.get("val")
    if not (isinstance(a_val, torch.Tensor) and isinstance(t_val, torch.Tensor)):
        return "the activation's or the tanh's shape is unknown", tanh
    if tuple(a_val.shape) != tuple(t_val.shape):
        return (f"the tanh's output is {list(t_val.shape)}, the activation "
                f"{list(a_val.shape)}: the alpha broadcasts the product, a table on the "
                "activation would not"), tanh
    return Plan(activation.source, alpha.source, act_qargs, activation.rescale,
                alpha.rescale, out, tin, tout)


def _applies(ctx: CheckContext, tanh: Node, out_rescale: Node, mul: Node
             ) -> MatchResult | None:
    def constant(n: Node) -> torch.Tensor | None:
        ref = ctx.inputs.constant(n)
        return None if ref is None else ref.tensor

    got = plan(tanh, out_rescale, mul, constant, ctx.inputs.describe)
    if isinstance(got, Plan):
        return None
    reason, at = got
    return ctx.fail(reason, at=at)


def _table(rw: Rewriter, tanh: Node, out_rescale: Node, mul: Node) -> Node:
    from executorch.backends.arm._passes.fold_dyt_alpha_into_lut_pass import _generate_dyt_lut
    from executorch.exir.dialects._ops import ops as exir_ops

    def constant(n: Node) -> torch.Tensor | None:
        try:
            return rw.tensor(n)
        except FusionError:
            return None

    got = plan(tanh, out_rescale, mul, constant, str)
    assert isinstance(got, Plan)  # (the constraint)
    lut = _generate_dyt_lut(activation_qargs=got.activation_qargs,
                            alpha_code=rw.tensor(got.alpha),
                            activation_rescale=got.activation_rescale,
                            alpha_rescale=got.alpha_rescale,
                            mul_output_rescale=got.mul_output_rescale,
                            tanh_input_qargs=got.tanh_input_qargs,
                            tanh_output_qargs=got.tanh_output_qargs)
    table = rw.fresh_constant(f"b_{tanh.name}_dyt_table_constant", lut)
    # first of the placeholders, where stock creates it (the TOSA tensors' order)
    rw.move_before(table, rw.placeholders()[0])
    rw.insert_at(tanh)
    target = exir_ops.backend.tosa.TABLE.default
    new = rw.call(target, got.activation, table)
    new.target = target  # the backend dialect's op object itself, as stock writes it
    keep_node_meta(new, tanh)
    new.meta["val"] = tanh.meta.get("val")
    new.meta["input_qparams"] = {0: got.activation_qargs}
    new.meta["output_qparams"] = {0: got.tanh_output_qargs}
    return new


@register_rules("arm", takes_over="FoldDyTAlphaIntoLUTPass")
def dyt_alpha_lut_rule() -> Rule:
    mul = op(MUL, capture("lhs"), capture("rhs")).bind("mul")
    out_rescale = op(RESCALE, mul, capture("out_dtype"), capture("out_scales"),
                     capture("out_in_zp"), capture("out_out_zp"),
                     strict_defaults=False).bind("out_rescale")
    return Rule(
        name="arm_fold_dyt_alpha_into_lut",
        pattern=op(TANH, out_rescale).bind("tanh"),
        constraints=[constraint("dyt_alpha_site", hints=dyt_alpha_operands)(_applies)],
        program_form=DYT_ALPHA_FORM,
        replacement=PythonReplacement(_table),
        description="an int8 DyT alpha multiply, requantize and tanh as one TOSA TABLE",
    )


__all__ = ["Plan", "dyt_alpha_lut_rule", "plan"]
