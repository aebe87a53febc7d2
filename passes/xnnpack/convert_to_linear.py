"""``mm`` / ``addmm`` back into the ``linear`` they came from, for XNNPACK's linear visitor.

Takes over ``ConvertToLinearPass`` (``_passes/convert_to_linear.py``, ExecuTorch 1.5.1). It
has two halves, run in this order, and so do the rules:

1. **An nn.Linear source partition** (``get_source_partitions(graph, [nn.Linear,
   F.linear])``) holding an ``mm`` / ``addmm`` becomes one ``linear(x, w, b)``: its input,
   weight and bias are found by walking each operand back (``args[0]``) out of the
   partition, and the linear replaces the partition's one output (a 3-D ``view`` /
   ``mm`` / ``view`` becomes one 3-D linear). The stock pass creates it bare: no debug
   handle, and neither here. *Whether a node belongs to such a partition changes the
   output* (the same ``view -> mm -> view`` outside a Linear keeps its views and gets a
   2-D linear from half 2), so it is a constraint, computed with torch's own
   ``get_source_partitions``. In torch 2.13 ``export`` writes no ``source_fn_stack``: that
   function falls back to the innermost ``nn_module_stack`` entry, and never matches
   ``F.linear`` (it compares the name ``"linear"`` with the function object) -- so only
   ``nn.Linear`` modules form partitions, here as in stock.
2. **The ``AddmmToLinearTransform`` fallback** (``transforms/addmm_mm_to_linear.py``): the
   rules of :mod:`fusionkit.passes.vulkan.addmm_to_linear` (``addmm(b, x, t(w))`` ->
   ``linear(x, w, b)``, ``mm(x, t(w))`` -> ``linear(x, w)``, a view to the linear's own
   shape dropped; they decline what that pass rewrites wrongly: a ``permute_copy`` that
   is not a transpose, ``beta`` / ``alpha`` != 1), each keeping the old node's metadata as
   the stock pass does (``linear_node.meta = node.meta``), plus its quantized half, here
   as rules too: a linear reading a ``view_copy`` chain from a dynamically quantized
   input (``dequantize_per_tensor.tensor``) reads the dequantize, and the view after it
   that restores the shape goes.

Stock checks stated as constraints: a single partition output (stock asserts), the
transposed weight, the single user of the bypassed view's input. **Stock bugs fixed**
(each shown by ``tests/test_xnnpack_convert_to_linear.py`` on the runtime):

* a bias-free ``nn.Linear`` whose ``mm`` is read by an ``add`` outside the module
  (``self.l(x) + x``): ``find_bias_for_mm`` takes the add's other operand as the linear's
  bias, and the add still adds it -- ``x`` counted twice. Here no bias is taken from
  outside the partition;
* a weight-only quantized ``nn.Linear`` (its weight ``dequantize_affine`` of integer
  constants: ``export_llm``'s ``quantization.qmode=4w``): the walk ends at the integer
  weight and the stock linear multiplies by the raw integers, the dequantize dropped (a
  tiny llama's logits 94 off eager, no error). Here the dequantize is evaluated once at
  lowering and the linear reads that float32 weight;
* one ``nn.Linear`` module called twice (``l(l(x))``, shared weights): both calls form
  one partition, whose walk from the second ``addmm`` ends at the *first* call's input --
  one linear of ``x`` in place of two. Here a partition holding more than one linear's
  ops is declined, and the fallback converts each ``addmm`` alone.

Declined with the reason, left to the fallback (or as they are): partitions holding any
op that is not the matmul, its input reshapes (``view_copy`` / ``unsqueeze_copy`` that
keep the last dim), one transpose of a 2-D weight and an output reshape; a non-1-D
bias; a bypass that would change a linear's output shape (stock rewrites the input of
every user of the view, and the linear's shape, regardless). Not rewritten: ``bmm`` (an
``nn.Linear`` never decomposes to it in torch 2.13; stock's rewrite of one would take
its batched weight as a linear weight).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

from fusionkit import (
    CheckContext,
    MatchResult,
    PythonReplacement,
    Rewriter,
    Rule,
    any_value,
    capture,
    op,
    op_key,
)
from fusionkit.edit.builder import PROVENANCE_KEYS, Computed
from fusionkit.passes.registry import (
    OperandHint,
    Pick,
    register_rules,
)
from fusionkit.passes.vulkan.addmm_to_linear import addmm_to_linear_rules

from ._common import LINEAR, constraint, keep_provenance

STOCK_PASS = "ConvertToLinearPass"
MM = "aten.mm.default"
ADDMM = "aten.addmm.default"
VIEW = "aten.view_copy.default"
UNSQUEEZE = "aten.unsqueeze_copy.default"
SQUEEZE = "aten.squeeze_copy.dims"
TRANSPOSES = ("aten.t_copy.default", "aten.permute_copy.default")
DQ_TENSOR = "quantized_decomposed.dequantize_per_tensor.tensor"
#: a weight-only quantized weight (torchao's ``dequantize_affine``: export_llm's ``4w``)
DQ_AFFINE = "torchao.dequantize_affine.default"
#: reshapes a Linear decomposes into around its matmul (flatten / restore leading dims)
INPUT_RESHAPES = (VIEW, UNSQUEEZE)
OUTPUT_RESHAPES = (VIEW, SQUEEZE)


@dataclasses.dataclass(frozen=True)
class ModulePlan:
    """The linear an nn.Linear partition becomes (the stock pass's walk, checked)."""

    x: Node
    w: Node
    b: Node | None
    #: the ``dequantize_affine`` of ``w`` the module's weight is (evaluated at lowering)
    dequantize: Node | None = None


def _key(n: Any) -> str:
    return str(op_key(n.target)) if isinstance(n, Node) and n.op == "call_function" else ""


def _shape(n: Any) -> tuple[int, ...] | None:
    val = n.meta.get("val") if isinstance(n, Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _partition_of(mm: Node) -> Any:
    """The nn.Linear / F.linear source partition holding ``mm`` (torch's own grouping,
    as the stock pass computes it), or None."""
    from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

    parts = get_source_partitions(mm.graph, [torch.nn.Linear, torch.nn.functional.linear])
    for partitions in parts.values():
        for sp in partitions:
            if mm in sp.nodes:
                return sp
    return None


def _dims(permute: Node) -> list[Any]:
    dims: Any = permute.args[1]
    return list(dims)


def _walk(node: Any, inside: set[Node]) -> tuple[Any, list[Node]]:
    """``ConvertToLinearPass.find``: follow ``args[0]`` while inside the partition."""
    chain: list[Node] = []
    while isinstance(node, Node) and node in inside and node.op != "placeholder":
        chain.append(node)
        node = node.args[0]
    return node, chain


def _outputs(sp: Any) -> list[Node]:
    return [n for n in sp.output_nodes
            if n.target != torch.ops.aten.sym_size.int and n.op != "placeholder"]


def module_plan(mm: Node) -> tuple[Node, ModulePlan] | str:
    """The output of ``mm``'s nn.Linear partition and the linear it becomes, or why not."""
    sp = _partition_of(mm)
    if sp is None:
        return f"`{mm.name}` is in no nn.Linear source partition"
    # a placeholder may carry the module's source_fn_stack too; the walk stops at it
    inside = {n for n in sp.nodes if n.op != "placeholder"}
    outs = _outputs(sp)
    if len(outs) != 1:  # stock: AssertionError, the lowering dies
        return (f"`{mm.name}`'s nn.Linear source partition has {len(outs)} outputs "
                f"({', '.join(n.name for n in outs)}): the module is called more than once")
    out = outs[0]
    addmm = _key(mm) == ADDMM
    x, x_chain = _walk(mm.args[1] if addmm else mm.args[0], inside)
    w, w_chain = _walk(mm.args[2] if addmm else mm.args[1], inside)
    b, b_chain = _walk(mm.args[0], inside) if addmm else (None, [])
    reshaped = [] if out is mm else [out]
    extra = inside - {mm, *reshaped, *x_chain, *w_chain, *b_chain}
    # the shape arithmetic of a dynamic batch (``operator.mul`` of SymInts) feeding the
    # reshapes goes dead with them (the stock pass's dead-code sweep removes it: so does
    # the rule pass, preprocess_rules.SWEEPS_DEAD_CODE)
    extra = {n for n in extra if isinstance(n.meta.get("val"), torch.Tensor)
             or any(u not in inside for u in n.users)}
    if extra or any(_key(n) not in OUTPUT_RESHAPES or n.args[0] is not mm for n in reshaped):
        # e.g. a second call of the module (stock: one linear from the first call's input)
        return (f"`{mm.name}`'s nn.Linear source partition holds more than one linear's "
                f"ops ({', '.join(sorted(n.name for n in inside))})")
    if any(_key(n) not in INPUT_RESHAPES for n in x_chain) or b_chain:
        return f"`{mm.name}`'s input or bias is computed inside the module"
    dequantize = w_chain[1] if len(w_chain) == 2 and _key(w_chain[1]) == DQ_AFFINE else None
    t = w_chain[0] if len(w_chain) == 1 or dequantize is not None else None
    if t is None or _key(t) not in TRANSPOSES or (
            _key(t) == TRANSPOSES[1] and [int(d) % 2 for d in _dims(t)] != [1, 0]):
        return f"`{mm.name}`'s weight is not one transpose of a weight"
    xs, ws, out_shape, bs = _shape(x), _shape(w), _shape(out), _shape(b)
    if xs is None or ws is None or len(ws) != 2 or not xs or xs[-1] != ws[1] \
            or out_shape != (*xs[:-1], ws[0]):
        return (f"`{out.name}` {out_shape} is not linear({getattr(x, 'name', x)} {xs}, "
                f"{w.name} {ws}): the reshapes do more than flatten the leading dims")
    if b is not None and bs != (ws[0],):
        return f"the bias `{b.name}` {bs} is not 1-D of the {ws[0]} output features"
    # stock's find_bias_for_mm would take an operand of an add after the module (outside
    # the partition, which keeps adding it) as the bias: not taken (bug fixed)
    return out, ModulePlan(x, w, b, dequantize)


def _linear_module(ctx: CheckContext, mm: Node) -> str | None:
    found = module_plan(mm)
    if isinstance(found, str):
        return found
    if found[0] is not ctx.root:
        return f"the output of `{mm.name}`'s nn.Linear source partition is `{found[0].name}`"
    dq = found[1].dequantize
    if dq is not None:
        if not ctx.allow_folding:
            return f"`{mm.name}`'s weight is `{dq.name}`, evaluated by a fold this caller cannot add"
        computed = [a.name for a in dq.all_input_nodes if ctx.inputs.constant(a) is None]
        if computed:
            return (f"`{mm.name}`'s weight `{dq.name}` dequantizes "
                    f"{', '.join(f'`{c}`' for c in computed)}, not constants")
    return None


def _module_linear(rw: Rewriter, mm: Node) -> Node:
    found = module_plan(mm)
    assert not isinstance(found, str), found  # the constraint accepted it
    out, plan = found
    w = plan.w
    if plan.dequantize is not None:  # the float weight, once (stock drops the dequantize)
        dq = plan.dequantize

        def value(a: Any) -> Any:
            return rw.tensor(a) if isinstance(a, Node) else a

        dequantize: Callable[..., torch.Tensor] = dq.target  # type: ignore[assignment]
        val = dq.meta["val"]  # (the probe needs its shape and dtype only: not computed there)
        w = rw.fresh_constant(f"{plan.w.name}_dequantized", Computed(
            tuple(val.shape), val.dtype,
            lambda: dequantize(*(value(a) for a in dq.args),
                               **{k: value(v) for k, v in dq.kwargs.items()})))
        rw.move_before(w, plan.w)
    rw.insert_at(out)  # the stock pass inserts before the partition output
    args = (plan.x, w) if plan.b is None else (plan.x, w, plan.b)
    new = rw.call(LINEAR, *args)
    for key in PROVENANCE_KEYS:  # the stock pass creates it bare (no debug handle)
        new.meta.pop(key, None)
    return new


def _not_a_linear_module(ctx: CheckContext) -> str | None:
    """Half 2 converts what half 1 does not: a matmul whose nn.Linear partition it takes
    is left to it (found at the partition's output, later in graph order)."""
    found = module_plan(ctx.root)
    if isinstance(found, str):
        return None
    return (f"`{ctx.root.name}` is converted with its nn.Linear source partition (at "
            f"`{found[0].name}`)")


# ----------------------------------------------------------------------------- half 2


def _addmm_to_linear(rw: Rewriter, b: Any, x: Node, wt: Node) -> Node:
    new = rw.call(LINEAR, x, wt.args[0], b)
    keep_provenance(new, rw.root)  # linear_node.meta = node.meta
    return new


def _mm_to_linear(rw: Rewriter, x: Node, wt: Node) -> Node:
    new = rw.call(LINEAR, x, wt.args[0])
    keep_provenance(new, rw.root)
    return new


def _keep_linear(rw: Rewriter, linear: Node) -> Node:
    rw.insert_at(linear)  # the stock pass keeps the linear where it was
    new = rw.call(LINEAR, *linear.args, **linear.kwargs)
    keep_provenance(new, linear)
    return new


def _dequantized_source(a: Any) -> Node | None:
    """``get_dqlinear_input``: ``a``'s view_copy chain back to a dynamic-quant dequantize."""
    node = a
    while isinstance(node, Node) and node.op != "placeholder":
        if _key(node) == DQ_TENSOR:
            return node
        if _key(node) != VIEW:
            return None
        node = node.args[0]
    return None


def _bypass_shape(a: Any, linear: Node) -> tuple[str | MatchResult | None, Any]:
    """(why not, the linear's output shape once it reads the dequantize)."""
    dq = _dequantized_source(a)
    if dq is None or dq is a:
        return f"`{linear.name}` does not read a view chain from a dynamic-quant dequantize", None
    if len(a.args[0].users) != 1:  # the stock pass's check (it prints and skips)
        return f"`{a.args[0].name}` has {len(a.args[0].users)} users", None
    if len(a.users) != 1:  # stock would reroute every user of the view to the dequantize
        return f"the view `{a.name}` is read by {len(a.users)} nodes, not only the linear", None
    dqs, ws = _shape(dq), _shape(linear.args[1])
    if dqs is None or ws is None:
        return "shapes unknown", None
    return None, (*dqs[:-1], ws[0])


def _reads_dequantize_same_shape(ctx: CheckContext, a: Any, linear: Node) -> Any:
    why, shape = _bypass_shape(a, linear)
    if why is None and shape != _shape(linear):
        why = (f"reading `{a.name}`'s dequantize would change `{linear.name}`'s shape "
               f"{_shape(linear)} to {shape}" + (
                   ": left to the view after it" if _restoring_view(linear, shape) else
                   " and its users read the flattened shape (stock changes it anyway)"))
    return why


def _restoring_view(linear: Node, shape: Any) -> bool:
    users = list(linear.users)
    return len(users) == 1 and _key(users[0]) == VIEW and _shape(users[0]) == shape


def _reads_dequantize_view_restores(ctx: CheckContext, a: Any, linear: Node) -> Any:
    why, shape = _bypass_shape(a, linear)
    if why is None and _shape(ctx.root) != shape:
        why = ctx.fail(f"`{ctx.root.name}` {_shape(ctx.root)} is not the shape {shape} the "
                       "linear has once it reads the dequantize", at=ctx.root)
    return why


def _read_dequantize(rw: Rewriter, a: Node, linear: Node) -> Node:
    rw.insert_at(linear)
    dq = _dequantized_source(a)
    new = rw.call(LINEAR, dq, *linear.args[1:], **linear.kwargs)
    keep_provenance(new, linear)
    return new


@register_rules("xnnpack", takes_over=STOCK_PASS)
def convert_to_linear_rules() -> list[Rule]:
    """nn.Linear partitions -> linear; then addmm/mm of a transposed weight -> linear."""
    matmul = (op(ADDMM, capture("b"), capture("a"), capture("wt"))
              | op(MM, capture("a"), capture("wt"))).bind("mm")
    module = constraint("linear_source_partition", hints=module_operands)(_linear_module)
    as_module = PythonReplacement(_module_linear)
    half_2: dict[str, Callable[..., Node]] = {"addmm_to_linear": _addmm_to_linear, "mm_to_linear": _mm_to_linear,
              "linear_identity_view": _keep_linear}
    fallback = []
    for r in addmm_to_linear_rules():
        extra = [constraint("not_a_linear_module")(_not_a_linear_module)] \
            if r.name != "linear_identity_view" else []
        fallback.append(dataclasses.replace(
            r, name=f"xnnpack_{r.name}", constraints=[*r.constraints, *extra],
            replacement=PythonReplacement(half_2[r.name])))
    linear = (op(LINEAR, capture("a"), capture("w"))
              | op(LINEAR, capture("a"), capture("w"), capture("b"))).bind("linear")
    return [
        # (the partition the check reads is the nn.Linear module the ops ran in)
        Rule(name="xnnpack_linear_module", pattern=matmul, constraints=[module], module_scope=torch.nn.Linear,
             replacement=as_module,
             description="an nn.Linear's addmm/mm (2-D input) as one linear"),
        Rule(name="xnnpack_linear_module_reshaped",
             pattern=op(OUTPUT_RESHAPES, matmul, any_value("restored_shape")),
             constraints=[module], module_scope=torch.nn.Linear,
             replacement=as_module,
             description="an nn.Linear's view/mm/view as one linear of the unflattened input"),
        *fallback,
        Rule(name="xnnpack_linear_reads_dequantize", pattern=linear,
             constraints=[constraint("reads_dequantize", hints=reads_dequantize_operands)(_reads_dequantize_same_shape)],
             replacement=PythonReplacement(_read_dequantize),
             description="a linear reads a dynamic-quant dequantize, not a view chain of it"),
        Rule(name="xnnpack_linear_reads_dequantize_view",
             pattern=op(VIEW, linear, any_value("restored_shape")),
             constraints=[constraint("reads_dequantize_view_restores", hints=reads_dequantize_view_operands)(
                 _reads_dequantize_view_restores)],
             replacement=PythonReplacement(_read_dequantize),
             description="... and the view restoring its shape goes"),
    ]


def _view_of_a_dequantize(shape: tuple[int, int], flatten: bool) -> Callable[[Any], Any]:
    """For ``fusionkit.verify``: a linear's [M, K] input as a view_copy of a dynamic-quant
    dequantize (``dequantize_per_tensor.tensor`` of int8 codes): of the same shape, or a
    [1, M, K] dequantize flattened (the view a linear of a 3-D input reads)."""

    def make_it(make: Any) -> Any:
        q = make.input("q", (1, *shape) if flatten else shape, torch.int8,
                       make.randint(-128, 127, (1, *shape) if flatten else shape).to(torch.int8))
        scale = make.input("scale", (), torch.float32, torch.tensor(0.5))
        zero_point = make.input("zero_point", (), torch.int64, torch.tensor(0))
        dq = make.call(DQ_TENSOR, q, scale, zero_point, -128, 127, torch.int8)
        return make.call(VIEW, dq, list(shape))

    return make_it


def reads_dequantize_operands(pick: Pick) -> dict[str, OperandHint]:
    """The same-shape route: an identity view of the dequantize."""
    shape = (pick((1, 2, 3)), pick((1, 2, 4)))
    return {"a": OperandHint(producer=_view_of_a_dequantize(shape, False))}


def reads_dequantize_view_operands(pick: Pick) -> dict[str, OperandHint]:
    """The restoring route: a [1, M, K] dequantize viewed to [M, K], an [N, K] weight, and
    the view after the linear restoring [1, M, N]."""
    m, k, n = pick((1, 2, 3)), pick((1, 2, 4)), pick((1, 3))
    return {"a": OperandHint(producer=_view_of_a_dequantize((m, k), True)),
            "w": OperandHint(shapes=((n, k),)), "restored_shape": OperandHint(values=([1, m, n],))}




def module_operands(pick: Pick) -> dict[str, OperandHint]:
    """For ``fusionkit.verify``: what an nn.Linear's mm / addmm reads: the transpose of a
    parameter (the check reads the matmul, so a per-capture hint would not apply); in half
    the cases a 3-D input ``[B, L, K]`` the module flattens to ``[B * L, K]``, an addmm's
    bias ``[N]`` and the view back to ``[B, L, N]`` (the reshaped rule's)."""
    hints = {"wt": OperandHint(producer="transpose")}
    if pick((False, True)):
        b, length, k, n = pick((1, 2)), pick((2, 3)), pick((2, 3)), pick((2, 4))

        def flattened(make: Any) -> Any:
            return make.call(VIEW, make.input("3d", (b, length, k), torch.float32),
                             [b * length, k])

        hints.update(a=OperandHint(producer=flattened, shapes=((b * length, k),)),
                     wt=OperandHint(producer="transpose", shapes=((k, n),)),
                     b=OperandHint(shapes=((n,),)),
                     restored_shape=OperandHint(values=([b, length, n],)))
    return hints



__all__ = ["STOCK_PASS", "ModulePlan", "convert_to_linear_rules", "module_plan"]
