"""``verify(rule)``: does a rule's replacement compute what its pattern computes?

A fusion that runs can still be wrong: a quantized add that drops its relu, two
affine-free batch norms given one set of statistics. :func:`verify` builds the
pattern's own subgraph for generated operands, lets the rule rewrite it with the
real matcher, constraints and replacement (:class:`~fusionkit.fusion_pass.FusionPass`
on an exported program), evaluates both programs and compares them.

How a case is made (drawn with hypothesis, so a failure shrinks to the smallest one):

* the pattern is walked once per case: an alternative (``a | b``) and an op of a
  multi-target :func:`~fusionkit.match.pattern.op` are drawn, commutative operands may
  swap; :func:`~fusionkit.match.pattern.through` adds no op;
* a capture in a tensor argument becomes a tensor: a parameter/buffer when a
  :class:`~fusionkit.check.constraints.PrepackableConstant` asks for one (else drawn:
  a user input or a constant), of a shape drawn around one base shape of rank 1..5 —
  dimension-distinct, square/cube or free (:func:`_base_shape`) — (the same shape, a
  suffix of it, ones in some dims, or any other rank-0..5 shape of sizes 1..6), of a dtype a :class:`~fusionkit.check.constraints.DtypeIn` admits (else mostly
  float32), with values drawn as small integers or normal samples;
* a literal (a value matcher, or a capture in a number/int/list argument) is drawn
  from the values its matcher and a :class:`~fusionkit.check.constraints.ScalarRange`
  admit, their bounds (the edges) included;
* a multi-output pattern returns its primary and each ``also`` part, built after it; an
  ``also`` part whose op writes an operand (a cache update) is built before the primary,
  which reads what it wrote, and is not returned; a constant an op writes is a mutable
  buffer, reset before each run and compared after it;
* the subgraph is run eagerly (a case the ops refuse is not a case), exported with
  ``torch.export`` and copied; the rule must accept the match at the pattern's root (a
  declined case is counted with its reason); the rewritten program is run.

Backend ops run through the reference implementations registered in torch (the
``et_vk`` ops' CPU implementations come with ``executorch.backends.vulkan``) or through
the functions a backend states its kernels compute (:attr:`Rule.semantics
<fusionkit.rule.OpSemantics>`' ``kernel_references``), inside the context it states its ops
need (``op_contexts``: the TOSA dialect's
``TosaLoweringContext``); an op with none makes the rule "cannot check" and is named. A
check that runs inside a backend's pipeline has the exported program put in that
pipeline's form first (:attr:`Rule.program_form <fusionkit.rule.ProgramForm>`), and a node
whose meaning there is in its metadata runs through what the form states it computes
(``node_semantics``). A check says how to make the operands it asks for itself
(:meth:`Constraint.operand_hints <fusionkit.Constraint.operand_hints>`).

Results are compared per output with the tolerance of its dtype (:data:`TOLERANCES`):
``|got - expected| <= tol * (1 + |expected|)`` for floats, NaN equal to NaN; integer codes
within ``tol``; shapes and dtypes exactly.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import mmap
import operator
import os
import pickle
import signal
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fusionkit.authoring.prove import (
    NOT_PROVED,
    PROVED,
    REFUTED,
    Proof,
    available,
    prove_equal,
    ranges_of,
)
from fusionkit.check.operand_hints import OperandHint, Pick, merged
from fusionkit.match.pattern import (
    Also,
    Alt,
    Capture,
    Named,
    Op,
    Outputs,
    Pattern,
    PatternVisitor,
    Seq,
    Through,
    Value,
)
from fusionkit.rule import OpSemantics, Rule
from fusionkit.targets import op_key, overload_of, resolve_op

__all__ = ["FIRING_CASES", "TOLERANCES", "Counterexample", "Judge", "OperandHint", "Proof",
           "Verification", "verify", "verify_rules"]

#: absolute/relative tolerance per output dtype: ``|got - want| <= tol * (1 + |want|)``;
#: an integer output may differ by at most ``tol`` (one quantization step for 8-bit)
TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 5e-2,
    torch.int8: 1,
    torch.uint8: 1,
    torch.int16: 0,
    torch.int32: 0,
    torch.int64: 0,
    torch.bool: 0,
}

def _unsafe(key: str, ops: OpSemantics) -> str | None:
    """Why the CPU kernel of op ``key`` is never run on drawn operands (its backend says it
    aborts the process on operands it refuses: ``OpSemantics.unsafe_kernels``, by op
    namespace), unless the backend states a kernel reference for it; None: it runs."""
    if key in ops.kernel_references:
        return None
    return ops.unsafe_kernels.get(key.split(".")[0])

#: ``judge(ep)`` (:func:`verify`'s ``judges``): the exported program of a case the rule
#: accepted -> None when the rule fires in it as a backend applies it, else why not
Judge = Callable[[Any], "str | None"]
#: cases a judge is asked about at most while the rule has not fired (once it fires, no more)
FIRING_CASES = 8

#: node metadata that says where a node came from, not what it computes
_BOOKKEEPING_META = frozenset({"val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack",
                               "torch_fn", "from_node", "seq_nr", "original_aten", "debug_handle",
                               "fusionkit_rule", "fusionkit_folded_from", "requested_name",
                               "unbacked_bindings", "custom", "example_value",
                               # XNNPACK: a q/dq pair the partitioner folds into the quantized
                               # op next to it; the graph computes the pair itself
                               "IS_IMPLICIT_Q_DQ_TAG"})

EQUAL, DIFFERENT, CANNOT_CHECK = "equal", "different", "cannot check"

#: why a rule "cannot check" (``Verification.cause``): never the rule's fault, so never
#: "different". ``crash``: a case crashed the process running it (a native kernel's signal
#: or abort); ``unavailable``: a backend tool is missing (an import failed); ``no
#: reference``: an op has no implementation that runs, or one that is not its kernel's;
#: ``metadata``: the replacement records its meaning where the verifier cannot apply it;
#: ``no case``: no drawn case was accepted, or none could be built
CRASH, UNAVAILABLE, NO_REFERENCE, METADATA, NO_CASE = (
    "crash", "unavailable", "no reference", "metadata", "no case")
CAUSES = (CRASH, UNAVAILABLE, NO_REFERENCE, METADATA, NO_CASE)


def _hints_of(rule: Rule, extra: Mapping[str, OperandHint] | None
              ) -> tuple[dict[str, OperandHint], list[Callable[[Pick], Mapping[str, OperandHint]]]]:
    """The hints ``rule``'s constraints state (:meth:`~fusionkit.Constraint.operand_hints`, in
    constraint order; two for one capture both apply, the later winning where both set a
    field), then ``extra``; and the functions that draw a check's hints jointly, once per case."""
    out: dict[str, OperandHint] = {}
    joint: list[Callable[[Pick], Mapping[str, OperandHint]]] = []
    for c in rule.constraints:
        hints = c.operand_hints()
        if callable(hints):
            joint.append(hints)
            continue
        for capture, hint in hints.items():
            out[capture] = merged(out[capture], hint) if capture in out else hint
    for capture, hint in (extra or {}).items():
        out[capture] = merged(out[capture], hint) if capture in out else hint
    return out, joint


class _NotACase(Exception):
    """The drawn operands do not make a case (an op refused them, a literal is missing)."""


# ----------------------------------------------------------------- what a case is


@dataclass
class _Input:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    constant: bool
    value: torch.Tensor


@dataclass
class _Call:
    target: Any  # an OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class _Ref:
    """A reference to an input (by name) or to the result of call ``index``."""

    input: str | None = None
    index: int | None = None
    #: for a call returning several tensors: the one the pattern's value is (models use [0])
    item: int | None = None


@dataclass
class _Case:
    inputs: dict[str, _Input] = field(default_factory=dict)
    calls: list[_Call] = field(default_factory=list)
    outputs: list[_Ref] = field(default_factory=list)
    literals: dict[str, Any] = field(default_factory=dict)
    #: whether the pattern's root is read by a clone (the last call) rather than returned
    tail: bool = False
    #: the module type the pattern's calls run inside (:attr:`Rule.module_scope`), or None
    scope: Any = None
    #: the declared variants this case took: a choice (an option of a hint's ``pick``, a
    #: hinted value or shape, a branch of an alternative, an op of a multi-target op) ->
    #: (the index drawn, how many there were); what :meth:`_Checker.cover` counts
    choices: dict[Any, tuple[int, int]] = field(default_factory=dict)

    def key(self) -> str:
        """The structure (not the values of user inputs): what export depends on."""
        ins = [(i.name, i.shape, str(i.dtype), i.constant,
                i.value.tolist() if i.constant else None) for i in self.inputs.values()]
        calls = [(str(c.target), _plain(c.args), _plain(c.kwargs)) for c in self.calls]
        return repr((ins, calls, _plain(self.outputs), self.tail, self.scope))

    def structure(self) -> str:
        """The key without the sizes a symbolic proof generalises: a user input's dims > 1
        (each a symbol in the dynamic export, :meth:`_Checker.rewritten`) and which float
        dtype it has (rounding is not modelled); the ops, literals, ranks and dims of 1 stay."""
        def kind(i: _Input) -> str:
            return "float" if i.dtype.is_floating_point else str(i.dtype)

        ins = [(i.name, i.shape if i.constant else tuple(1 if d == 1 else -1 for d in i.shape),
                str(i.dtype) if i.constant else kind(i), i.constant,
                i.value.tolist() if i.constant else None) for i in self.inputs.values()]
        calls = [(str(c.target), _plain(c.args), _plain(c.kwargs)) for c in self.calls]
        return repr((ins, calls, _plain(self.outputs), self.tail, self.scope))

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": {n: {"shape": list(i.shape), "dtype": str(i.dtype).removeprefix("torch."),
                           "kind": "constant" if i.constant else "user input",
                           "values": i.value.tolist()} for n, i in self.inputs.items()},
            "literals": {k: _jsonable(v) for k, v in self.literals.items()},
            "ops": [str(c.target) for c in self.calls],
        }


def _plain(v: Any) -> Any:
    if isinstance(v, _Ref):
        return ("ref", v.input, v.index, v.item)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return repr(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


# ------------------------------------------------------------ the drawn operands


def _arg_kind(a: Any) -> str:
    """What kind of value a schema argument takes (``tensor``, ``ints``, ``number``, ...)."""
    t, name = str(a.type), a.name
    if name in ("layout", "device", "memory_format", "pin_memory"):
        return "other"
    if name in ("dtype", "out_dtype", "output_dtype") and "int" in t:
        return "dtype"
    if "Tensor" in t:
        return "tensors" if "List" in t else "tensor?" if "Optional" in t else "tensor"
    if "List[int]" in t or "List[SymInt]" in t:
        return "ints"
    if "List[float]" in t:
        return "floats"
    if "number" in t or "float" in t:
        return "number"
    if "bool" in t:
        return "bool"
    if "int" in t:
        return "int"
    if "str" in t:
        return "str"
    return "other"


#: the ranks an op's tensor argument must have (by op name, then argument index): the base
#: shape is fitted to one (a matmul's operands are matrices, a convolution's input NCL/NCHW)
_RANKS_OF: dict[str, dict[int, tuple[int, ...]]] = {
    "mm": {0: (2,), 1: (2,)}, "addmm": {1: (2,), 2: (2,)}, "bmm": {0: (3,), 1: (3,)},
    "convolution": {0: (3, 4)}, "conv1d": {0: (3,)}, "conv2d": {0: (4,)},
    "pixel_shuffle": {0: (4,)}, "pixel_unshuffle": {0: (4,)},
    # (a batch norm over dim 1 of NC, NCL, NCHW: the ranks its folds and decompositions take)
    "_native_batch_norm_legit_no_training": {0: (2, 3, 4)}, "native_batch_norm": {0: (2, 3, 4)},
}

#: elementwise binary ops whose second operand is sometimes drawn broadcasting along one dim
#: of the first (a per-channel scale, a row or column bias)
_BINARY = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "pow", "where"})


def _shape_hint(key: str, index: int, before: list[Any], draw: Callable[[Any], Any]) -> tuple[int, ...] | None:
    """A shape for argument ``index`` of op ``key`` that fits the arguments ``before`` it
    (the weight of a convolution or a linear, a batch norm's statistics, a matmul's operand)."""
    from hypothesis import strategies as st

    x = before[0] if before and isinstance(before[0], torch.Tensor) else None
    prev = before[-1] if before and isinstance(before[-1], torch.Tensor) else None
    name = key.split(".")[1] if key.count(".") >= 2 else key
    if x is None:
        return None
    if name in ("convolution", "conv2d", "conv1d") and x.dim() in (3, 4):
        if index == 1:
            k = draw(st.integers(1, max(1, min(3, *x.shape[2:]))))
            return (draw(st.integers(1, 4)), x.shape[1], *([k] * (x.dim() - 2)))
        if index == 2 and prev is not None and prev.dim() >= 1:
            return (prev.shape[0],)
    if name == "linear" and x.dim() >= 1:
        if index == 1:
            return (draw(st.integers(1, 4)), x.shape[-1])
        if index == 2 and prev is not None and prev.dim() == 2:
            return (prev.shape[0],)
    if name in ("mm", "matmul", "bmm") and index == 1 and x.dim() >= 2:
        return (*x.shape[:-2], x.shape[-1], draw(st.integers(1, 4)))
    if name == "addmm" and index == 2 and prev is not None and prev.dim() == 2:
        return (prev.shape[1], x.shape[-1] if x.dim() >= 1 else 1)
    if name in _BINARY and index == 1 and x.dim() >= 1 and draw(st.integers(0, 2)) == 0:
        d = draw(st.integers(0, x.dim() - 1))  # x's sizes along dim d, ones elsewhere
        return tuple(s if i == d else 1 for i, s in enumerate(x.shape))
    if name == "addmm" and index == 1 and x.dim() >= 1:
        return (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    if "batch_norm" in name and index >= 1 and x.dim() >= 2:
        return (x.shape[1],)
    if "quantize_per_channel" in name and index in (1, 2) and x.dim() >= 1:
        return (x.shape[0],)
    if name in ("native_layer_norm", "layer_norm") and index >= 2 and len(before) > 1:
        shape = before[1]
        return tuple(shape) if isinstance(shape, list) and all(d > 0 for d in shape) else None
    return None


def _literal_hint(key: str, index: int, before: list[Any]) -> list[Any]:
    """Literals that fit op ``key``'s argument ``index`` given the arguments before it."""
    x = before[0] if before and isinstance(before[0], torch.Tensor) else None
    name = key.split(".")[1] if key.count(".") >= 2 else key
    if x is None:
        return []
    spatial = max(x.dim() - 2, 1)
    if name == "convolution":
        conv: dict[int, list[Any]] = {3: [[1] * spatial, [2] * spatial], 4: [[0] * spatial, [1] * spatial],
                                      5: [[1] * spatial], 6: [False], 7: [[0] * spatial], 8: [1]}
        return conv.get(index, [])
    if name in ("conv2d", "conv1d"):
        conv2d: dict[int, list[Any]] = {3: [[1] * spatial], 4: [[0] * spatial], 5: [[1] * spatial],
                                        6: [1]}
        return conv2d.get(index, [])
    if name in ("native_layer_norm", "layer_norm") and index == 1 and x.dim() >= 1:
        return [list(x.shape[-1:])]
    if "quantize_per_channel" in name:  # (input, scales, zero_points, axis, qmin, qmax, dtype)
        per_channel: dict[int, list[Any]] = {3: [0], 4: [-128, -127], 5: [127], 6: [torch.int8]}
        return per_channel.get(index, [])
    if name == "embedding_4bit" and index == 6:  # its reference refuses dtype=None
        return [torch.float32]
    if "quantize_per_tensor" in name:  # (input, scale, zero_point, qmin, qmax, dtype)
        per_tensor: dict[int, list[Any]] = {1: [0.5, 0.25], 2: [0, 3], 3: [-128], 4: [127],
                                            5: [torch.int8]}
        return per_tensor.get(index, [])
    return []


def _dtype_hint(key: str, index: int) -> torch.dtype | None:
    """The dtype a tensor argument of a quantization op or an embedding takes."""
    name = key.split(".")[1] if key.count(".") >= 2 else key
    if name.startswith("dequantize_per") and index == 0:
        return torch.int8
    if "quantize_per_channel" in name and index == 2:
        return torch.int64
    if name == "embedding" and index == 1:
        return torch.int64
    if name == "where" and index == 0:
        return torch.bool
    return None


#: candidate literals per argument kind (filtered by the matcher that must accept them)
_POOLS: dict[str, tuple[Any, ...]] = {
    "number": (1e-5, 1.0, 0.0, 0.5, 2.0, -1.0, 1e-6, 3.0, 6.0, -0.5),
    "int": (-1, 0, 1, 2, 3, -2, 4),
    "bool": (False, True),
    "ints": ([-1], [0], [1], [2], [-2], [0, 1], [1, 1], [0, 0], [2, 2], [], [3], [1, 2]),
    "floats": ([1.0], [0.5], [2.0], [0.25, 4.0]),
    "dtype": (None, torch.float32, torch.float16, torch.int8),
    "str": ("none", "tanh"),
    "other": (None,),
    "tensor?": (None,),
    "tensor": (1e-5, 1.0, 0.0, 0.5, 2.0, -1.0, 1e-6),
}

#: dtypes an unconstrained tensor may take (the first most often)
_FREE_DTYPES = (torch.float32, torch.float16, torch.int64, torch.int8)


def _spec_candidates(v: Value) -> list[Any]:
    """The literals a named value matcher's own arguments suggest (its edges first)."""
    if v.spec is None:
        return []
    name, kwargs = v.spec[0], dict(v.spec[1]) if len(v.spec) > 1 else {}
    out: list[Any] = []
    if name in ("lit",):
        out.append(kwargs.get("value"))
    elif name == "one_of":
        out.extend(kwargs.get("values") or ())
    elif name in ("scalar", "integer"):
        lo, hi = kwargs.get("lo"), kwargs.get("hi")
        for b in (lo, hi):
            if b is not None:
                out.append(b)
        if lo is not None and hi is not None:
            out.append((lo + hi) / 2 if name == "scalar" else (lo + hi) // 2)
        if lo is not None:
            out.append(lo + (1e-3 if name == "scalar" else 1))
    elif name == "per_row_block":
        out.append([1] * (int(kwargs.get("rank", 2)) - 1) + [2])
    elif name == "int_list" and kwargs.get("length") is not None:
        n = int(kwargs["length"])
        out.extend([[-1] * n, list(range(n))])
    return out


def _accepts(v: Value, x: Any) -> bool:
    try:
        return bool(v.accepts(x))
    except Exception:
        return False


#: sizes a dimension-distinct base shape takes its dims from (no two dims equal)
_DISTINCT_SIZES = (2, 3, 4, 5, 6)


def _base_shape(draw: Callable[[Any], Any]) -> tuple[str, tuple[int, ...]]:
    """A case's base shape and its style, rank 1-5: ``free`` (sizes 1..5, drawn apart: what a
    failure shrinks to, ``(1,)``), ``distinct`` (no two dims equal, all > 1: a rule that reads
    or reduces the wrong one of two dims computes another value or shape) or ``equal`` (a
    square or cube: a rule whose wrong dim gives the same output shape there is rewritten
    and compared, not declined): a third of the draws each."""
    from hypothesis import strategies as st

    style = ("free", "distinct", "equal", "free", "distinct", "equal")[draw(st.integers(0, 5))]
    rank = draw(st.integers(1, 5))
    if style == "distinct":
        sizes = draw(st.permutations(_DISTINCT_SIZES))
        return style, tuple(sizes[:rank])
    if style == "equal":
        size = draw(st.integers(2, 4 if rank <= 3 else 3))
        return style, (size,) * rank
    return style, tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))


def _fitted(style: str, base: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """``base`` of ``rank`` dims in the same style: its last ``rank`` dims, or more leading
    dims (distinct sizes not in it yet; an equal shape's own size; ones for a free one)."""
    if rank <= len(base):
        return base[len(base) - rank:]
    if style == "equal" and base:
        return (base[0],) * rank
    if style == "distinct":
        fresh = [d for d in (*_DISTINCT_SIZES, 7, 8, 9) if d not in base]
        return (*fresh[: rank - len(base)], *base)
    return (1,) * (rank - len(base)) + base


class _Builder(PatternVisitor[Any]):
    """Walks a rule's pattern, drawing one case; computes eagerly as it goes."""

    def __init__(self, rule: Rule, draw: Callable[[Any], Any],
                 hints: Mapping[str, OperandHint] | None = None) -> None:
        from hypothesis import strategies as st

        self.st = st
        self.rule = rule
        self.hints = dict(hints or {})
        self.draw = draw
        self.case = _Case()
        self.bound: dict[str, Any] = {}  # capture name -> _Ref or literal
        self.values: dict[int, Any] = {}  # call index -> eager value
        #: inputs an in-place op wrote while building, as it left them (the case keeps the
        #: initial value: what the program starts from)
        self.written: dict[str, torch.Tensor] = {}
        self.anonymous = 0
        #: the capture a wildcard argument (``strict_defaults=False``) is drawn as -> the
        #: argument's schema name: a hint keyed ``"*<name>"`` makes every such argument
        self.wildcards: dict[str, str] = {}
        self.optional = True  # whether the argument being built may be None
        self.kind = "tensor"  # what the argument being built takes (see _arg_kind)
        #: (op key, argument index, the eager arguments before it) while an op's argument is built
        self.context: tuple[str, int, list[Any]] | None = None
        #: what the backend states its ops compute (the kernels a rule's ops run through)
        self.kernels = rule.semantics.kernel_references
        self.style, self.base = _base_shape(draw)
        self.dtype = draw(st.sampled_from(_FREE_DTYPES[:2]))
        self.values_mode = draw(st.sampled_from(("small integers", "normal")))
        self.seed = draw(st.integers(0, 2**16))
        self.gen = torch.Generator().manual_seed(self.seed)

    # -- values

    def _eager(self, r: Any) -> Any:
        if isinstance(r, _Ref):
            if r.input is not None:
                return self.written.get(r.input, self.case.inputs[r.input].value)
            return self.values[r.index]  # type: ignore[index]
        if isinstance(r, list):
            return [self._eager(x) for x in r]
        if isinstance(r, tuple):
            return tuple(self._eager(x) for x in r)
        return r

    def _tensor(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=self.gen).bool()
        if not dtype.is_floating_point:
            lo = 0 if dtype == torch.uint8 else -3
            return torch.randint(lo, 4, shape, generator=self.gen).to(dtype)
        if self.values_mode == "small integers":
            return torch.randint(-3, 4, shape, generator=self.gen).to(dtype)
        return torch.randn(shape, generator=self.gen).to(dtype)

    def _shape(self, name: str) -> tuple[int, ...]:
        """A shape for tensor capture ``name``: mostly the case's base shape (fitted to a rank
        the capture's ``Rank`` admits), else a broadcast of it (a suffix, ones in some dims)
        or another shape of rank 0-5."""
        st, draw = self.st, self.draw
        hinted_ranks = self.hints[name].ranks if name in self.hints else ()
        ranks = list(hinted_ranks) if hinted_ranks else None
        layout = self._layout()
        if ranks is None and layout is not None:  # the ranks the op takes there
            op_name = layout[0].split(".")[1] if layout[0].count(".") >= 2 else layout[0]
            fixed = _RANKS_OF.get(op_name, {}).get(layout[1])
            ranks = list(fixed) if fixed else None
        if layout is not None:
            key, index, before = layout
            hint = _shape_hint(key, index, before, draw)
            if hint is not None and (ranks is None or len(hint) in ranks) and draw(st.integers(0, 3)) < 3:
                return hint
        base = self.base
        if ranks is not None and len(base) not in ranks:  # the base, of a rank the capture takes
            base = _fitted(self.style, base, draw(st.sampled_from(ranks)))
        mode = draw(st.integers(0, 5))  # (shrinks to the base shape)
        if mode in (0, 4, 5):
            return base
        if mode == 1 and ranks is None:  # a suffix of the base shape (broadcasts)
            k = draw(st.integers(0, len(base)))
            return base[k:]
        if mode == 2:  # ones in some dims (broadcasts)
            ones = draw(st.lists(st.booleans(), min_size=len(base), max_size=len(base)))
            return tuple(1 if o else d for d, o in zip(base, ones, strict=True))
        if mode == 1:
            return base
        rank = draw(st.sampled_from(ranks)) if ranks else draw(st.integers(0, 5))
        sizes = st.sampled_from(sorted(set(base) | {1})) | st.integers(1, 6)
        return tuple(draw(st.lists(sizes, min_size=rank, max_size=rank)))

    def _layout(self) -> tuple[str, int, list[Any]] | None:
        """The op argument being built, the op named as the one whose operands its backend
        says it takes (``OpSemantics.operands_like``: a fused convolution's are a
        convolution's): what the operand layouts below are keyed by."""
        if self.context is None:
            return None
        key, index, before = self.context
        return self.rule.semantics.operands_like.get(key, key), index, before

    def _hint(self, name: str) -> OperandHint | None:
        """The hint for capture ``name``: its own, else (a wildcard argument) the one keyed
        ``"*<argument name>"``."""
        if name in self.hints:
            return self.hints[name]
        arg = self.wildcards.get(name)
        return self.hints.get(f"*{arg}") if arg is not None else None

    def tensor_capture(self, name: str) -> _Ref:
        st, draw = self.st, self.draw
        if name in self.bound:
            return self.bound[name]  # type: ignore[no-any-return]
        hint = self._hint(name) or OperandHint()
        if hint.shapes:
            shape = draw(st.sampled_from(hint.shapes))
            if len(hint.shapes) > 1:
                self.case.choices[("shapes", name, repr(hint.shapes))] = (
                    list(hint.shapes).index(shape), len(hint.shapes))
        else:
            shape = self._shape(name)
        if hint.producer is not None:
            return self._produced(name, hint.producer, shape)
        layout = self._layout()
        hinted = _dtype_hint(layout[0], layout[1]) if layout is not None else None
        if hint.dtype is not None:
            dtype = hint.dtype
        elif hint.dtypes:
            dtype = draw(st.sampled_from(hint.dtypes))
        elif hinted is not None and draw(st.integers(0, 3)) < 3:
            dtype = hinted
        else:
            dtype = self.dtype if draw(st.integers(0, 5)) < 5 else draw(st.sampled_from(_FREE_DTYPES))
        if hint.constant is not None:
            constant = hint.constant
        else:
            constant = draw(st.booleans())
        filled = draw(st.integers(0, 5))  # mostly drawn values; sometimes all zeros (a zero
        value = self._tensor(shape, dtype)  # point), sometimes all positive (a scale)
        if hint.int_range is not None:
            lo, hi = hint.int_range
            value = torch.randint(lo, hi + 1, shape, generator=self.gen).to(dtype)
        elif hint.fill == "int8":
            value = torch.randint(-128, 128, shape, generator=self.gen).to(dtype)
        elif filled == 4 or hint.fill == "zeros":
            value = torch.zeros_like(value)
        elif filled == 5 or hint.fill == "positive":
            value = value.abs() + 1 if dtype != torch.bool else value
        return self._input(name, shape, dtype, constant, value)

    def _input(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, constant: bool,
               value: torch.Tensor) -> _Ref:
        self.case.inputs[name] = _Input(name, shape, dtype, constant, value)
        ref = _Ref(input=name)
        self.bound[name] = ref
        return ref

    def _produced(self, name: str, producer: str | Callable[[Any], Any], shape: tuple[int, ...]) -> _Ref:
        """Capture ``name`` as the result of ``producer`` on fresh operands (an OperandHint)."""
        draw, st = self.draw, self.st
        if callable(producer):  # a backend's own: its ops on fresh operands
            got = producer(_Making(self, name, shape))
            self.bound[name] = got
            return got  # type: ignore[no-any-return]
        if producer == "transpose":
            shape = shape[-2:] if len(shape) > 2 else shape  # (a weight: its last two dims)
            if len(shape) != 2:
                raise _NotACase(f"{name}: a transposed weight of shape {shape} is not 2-D")
            src = self._input(f"{name}_source", (shape[1], shape[0]), torch.float32, True,
                              self._tensor((shape[1], shape[0]), torch.float32))
            got = self.emit("aten.permute_copy.default", (src, [1, 0]))
        elif producer == "linear":
            if not shape:
                raise _NotACase(f"{name}: a linear's result is not rank 0")
            k = draw(st.integers(1, 4))
            x = self._input(f"{name}_x", (*shape[:-1], k), torch.float32, False,
                            self._tensor((*shape[:-1], k), torch.float32))
            w = self._input(f"{name}_w", (shape[-1], k), torch.float32, True,
                            self._tensor((shape[-1], k), torch.float32))
            got = self.emit("aten.linear.default", (x, w))
        elif producer == "dequantize_per_tensor":
            q = self._input(f"{name}_q", shape, torch.int8, draw(st.booleans()),
                            torch.randint(-128, 128, shape, generator=self.gen).to(torch.int8))
            got = self.emit("quantized_decomposed.dequantize_per_tensor.default",
                            (q, 0.5, 0, -128, 127, torch.int8))
        elif producer == "quantize_per_tensor":
            # float values on the quantization grid (multiples of the scale 0.5, in range):
            # quantizing them loses nothing
            f = self._input(f"{name}_float", shape, torch.float32, False,
                            torch.randint(-16, 17, shape, generator=self.gen).to(torch.float32) / 2)
            got = self.emit("quantized_decomposed.quantize_per_tensor.default",
                            (f, 0.5, 0, -128, 127, torch.int8))
        else:
            raise ValueError(f"OperandHint.producer {producer!r}: not one the generator builds")
        self.bound[name] = got
        return got

    def emit(self, key: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> _Ref:
        """Call op ``key`` (not part of the pattern: an operand's producer) on built values."""
        return self._call(key, resolve_op(key), args, dict(kwargs or {}))

    def literal(self, kind: str, value: Value | None, name: str | None) -> Any:
        if name is not None and name in self.bound:
            return self.bound[name]
        pool: list[Any] = []
        hint = self._hint(name) if name is not None else None
        hinted_values = hint.values if hint is not None else ()
        if hinted_values:
            pool.extend(hinted_values)
        if value is not None:
            pool.extend(_spec_candidates(value))
        layout = self._layout()
        if layout is not None:
            pool.extend(_literal_hint(*layout))
        if hint is not None:
            pool.extend(hint.bounds)
        if kind == "ints" and self.context is not None:  # shapes and dims of the operand before
            before = self.context[2]
            x = before[0] if before and isinstance(before[0], torch.Tensor) else None
            if x is not None:
                pool.extend([list(x.shape), [*x.shape, 1], [1, *x.shape], [x.numel()],
                             [*x.shape[:1], 1, *x.shape[1:]],
                             [d for d in x.shape if d != 1], list(x.shape[-1:]),
                             list(range(x.dim()))[::-1]])
        pool.extend(p for p in _POOLS.get(kind if kind in _POOLS else "other", (None,))
                    if not (p is None and kind == "dtype" and not self.optional))
        if kind == "other":
            pool.extend(_POOLS["number"])
        if value is not None:
            seen: list[Any] = []
            for p in pool:
                if _accepts(value, p) and not any(_same_literal(p, s) for s in seen):
                    seen.append(p)
            pool = seen
        if not pool:
            raise _NotACase(f"no literal the generator knows satisfies {value!r}")
        hinted = [h for h in (_literal_hint(*layout) if layout is not None else [])
                  if any(_same_literal(h, q) for q in pool)]
        hinted_pool = False
        if hinted_values:
            narrowed = [h for h in hinted_values if any(_same_literal(p, h) for p in pool)]
            hinted_pool = bool(narrowed)
            pool = narrowed or pool
        elif hinted and self.draw(self.st.integers(0, 3)) < 3:
            pool = hinted
        got = self.draw(self.st.sampled_from(pool))
        if hinted_pool and len(pool) > 1:  # (a hint's values: each one a case the check asks for)
            self.case.choices[("values", name, repr(pool))] = (
                next(i for i, p in enumerate(pool) if p is got), len(pool))
        if name is not None:
            self.bound[name] = got
            self.case.literals[name] = got
        return got

    # -- the walk

    def build(self, p: Pattern, kind: str = "tensor") -> Any:
        """Draw and build ``p`` standing in an argument of ``kind``; its value (a ref or a literal)."""
        saved, self.kind = self.kind, kind
        try:
            return p.accept(self)
        finally:
            self.kind = saved

    def generic(self, p: Pattern) -> Any:
        raise _NotACase(f"the generator has no case for a {type(p).__name__} pattern")

    def visit_capture(self, p: Capture) -> Any:
        if self.kind == "tensors":  # a list of tensors (cat's): 1..8 of one shape
            if p.name in self.bound:
                return self.bound[p.name]
            n = self.draw(self.st.integers(1, 8))
            first = self.tensor_capture(f"{p.name}_0")
            shape, dtype = self.case.inputs[f"{p.name}_0"].shape, self.case.inputs[f"{p.name}_0"].dtype
            got = [first]
            for i in range(1, n):
                value = self._tensor(shape, dtype)
                got.append(self._input(f"{p.name}_{i}", shape, dtype, self.draw(self.st.booleans()), value))
            self.bound[p.name] = got
            return got
        if self.kind in ("tensor", "tensor?"):
            return self.tensor_capture(p.name)
        return self.literal(self.kind, None, p.name)

    def visit_value(self, p: Value) -> Any:
        return self.literal(self.kind, p, p.name)

    def visit_named(self, p: Named) -> Any:
        if p.name in self.bound and p.inner.root_keys() is not None:  # a named op is one node
            return self.bound[p.name]
        got = self.build(p.inner, self.kind)
        self.bound.setdefault(p.name, got)
        return got

    def visit_alt(self, p: Alt) -> Any:
        i = self.draw(self.st.integers(0, len(p.options) - 1))
        self.case.choices[("alternative", id(p))] = (i, len(p.options))
        return self.build(p.options[i], self.kind)

    def visit_through(self, p: Through) -> Any:
        return self.build(p.inner, self.kind)  # no pass-through op: the inner value itself

    def visit_seq(self, p: Seq) -> Any:
        item = "tensor" if self.kind == "tensors" else self.kind
        return [self.build(i, item) for i in p.items]

    def visit_op(self, p: Op) -> Any:
        return self._op(p)

    def visit_outputs(self, p: Outputs) -> Any:
        # an in-place part (its op writes an operand: a cache update) runs before the primary,
        # which reads what it wrote; its effect is the write, and its result is no output
        in_place = [_writes_an_operand(o) for o in p.others]
        for o, first_ in zip(p.others, in_place, strict=True):
            if first_:
                self.build(o)
        first = self.build(p.primary)
        self.case.outputs.append(first)
        for o, first_ in zip(p.others, in_place, strict=True):
            if not first_:
                self.case.outputs.append(self.build(o))
        return first

    def visit_also(self, p: Also) -> Any:
        got = self.build(p.pattern)
        self.bound.setdefault(p.name, got)
        return got

    def _op(self, p: Op) -> _Ref:
        keys = sorted(p.targets, key=lambda k: (not k.startswith("aten."), k))
        key = keys[0]
        if len(keys) > 1:
            i = self.draw(self.st.integers(0, len(keys) - 1))
            key = keys[i]
            self.case.choices[("op", id(p))] = (i, len(keys))
        if (unsafe := _unsafe(key, self.rule.semantics)) is not None:
            raise _NotACase(f"{key} is not run on generated operands ({unsafe})")
        target = resolve_op(key)
        schema = target._schema
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        given = list(p.args)
        if p.commutative and len(given) >= 2 and self.draw(self.st.booleans()):
            given[0], given[1] = given[1], given[0]
        def put(i: int, a: Any, v: Any) -> None:
            if a.kwarg_only:
                kwargs[a.name] = v
                return
            while len(args) < i:  # positional up to here: the defaults
                d = schema.arguments[len(args)]
                args.append(d.default_value if d.has_default_value() else None)
            args.append(v)

        for i, a in enumerate(schema.arguments):
            kind = _arg_kind(a)
            self.context = (key, i, self._eager(args))
            self.optional = "Optional" in str(a.type)
            if i < len(given):
                put(i, a, self.build(given[i], kind))
            elif a.name in p.kwargs:
                put(i, a, self.build(p.kwargs[a.name], kind))
            elif not a.has_default_value():  # a wildcard (strict_defaults=False): any operand
                self.anonymous += 1
                wildcard = f"{a.name}_{self.anonymous}"
                self.wildcards[wildcard] = a.name
                put(i, a, self.build(Capture(wildcard), kind))
        return self._call(key, target, tuple(args), kwargs)

    def _call(self, key: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Ref:
        call = _Call(target, args, kwargs)
        for a in _written_args(target, args, kwargs):  # the input keeps its initial value
            if isinstance(a, _Ref) and a.input is not None and a.input not in self.written:
                self.written[a.input] = self.case.inputs[a.input].value.clone()
        real_args, real_kwargs = self._eager(call.args), self._eager(call.kwargs)
        try:  # shapes first, on meta tensors: a native kernel is never given operands it refuses
            target(*_to_meta(real_args), **_to_meta(real_kwargs))
        except NotImplementedError as e:
            if not key.startswith("aten."):
                why = ("it takes no tensor: outside a traced program nothing dispatches it"
                       if "no tensor arguments" in str(e) else "no meta kernel to check operands with")
                raise _NotACase(f"{key}: {why}") from None
        except Exception as e:
            if key.startswith("aten.") and "meta" in str(e):
                pass  # an ATen op that cannot run on meta tensors (.item()): ATen raises instead
            else:
                raise _NotACase(f"{key}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        reference = self.kernels.get(key)  # what the backend's kernel computes
        if _GUARD is not None:  # (in a worker: the caller learns the case if this crashes)
            _GUARD.enter("building the pattern's subgraph (its ops run eagerly)", key, self.case,
                         _arguments(real_args, real_kwargs))
        try:
            out = (reference or target)(*real_args, **real_kwargs)
        except Exception as e:  # the drawn operands are not a case for this op
            raise _NotACase(f"{key}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        self.case.calls.append(call)
        index = len(self.case.calls) - 1
        self.values[index] = out
        return _Ref(index=index)


def _arguments(args: Any, kwargs: Any) -> Any:
    """An op call's arguments, a tensor as its dtype and shape (what a crash record says)."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).removeprefix('torch.')}{tuple(v.shape)}"
        if isinstance(v, (list, tuple)):
            return [one(x) for x in v]
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        return _jsonable(v)

    return {"args": one(args), "kwargs": one(kwargs)}


class _Making:
    """What an :class:`OperandHint`'s ``producer`` function is given to build its capture:
    ``capture(name)``: a capture built before it; ``input(part, shape, dtype, values,
    constant)``: a new user input, or a constant (``values``: its tensor, else drawn); ``call(op_key, *args)``: an op on
    what was built (run eagerly as the pattern's ops are); ``item(ref, i)``: output ``i`` of
    a call returning several; ``bind(name, ref)``: what a capture not built yet will be;
    ``shape``: the shape drawn for the capture; ``op``: the op whose argument it is;
    ``randint(lo, hi, shape)``: integers drawn in [lo, hi]."""

    def __init__(self, builder: _Builder, name: str, shape: tuple[int, ...]) -> None:
        self.builder, self.name, self.shape = builder, name, tuple(shape)
        #: the op (``namespace.name.overload``) whose argument the capture is, if any: a
        #: multi-target op's drawn one
        self.op: str | None = builder.context[0] if builder.context is not None else None

    def randint(self, lo: int, hi: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(lo, hi + 1, tuple(shape), generator=self.builder.gen)

    def capture(self, name: str) -> Any:
        if name not in self.builder.bound:
            raise _NotACase(f"{self.name}: its producer reads `{name}`, not built before it")
        return self.builder.bound[name]

    def value(self, ref: Any) -> Any:
        return self.builder._eager(ref)

    def input(self, part: str, shape: tuple[int, ...], dtype: Any,
              values: torch.Tensor | None = None, constant: bool = False) -> _Ref:
        b = self.builder
        value = values if values is not None else b._tensor(tuple(shape), dtype)
        return b._input(f"{self.name}_{part}", tuple(shape), dtype, constant, value)

    def call(self, key: str, *args: Any) -> _Ref:
        return self.builder.emit(key, args)

    def item(self, ref: _Ref, i: int) -> _Ref:
        return self.builder._call("getitem", operator.getitem, (ref, i), {})

    def bind(self, name: str, ref: Any) -> None:
        self.builder.bound[name] = ref


def _written(schema: Any) -> list[Any]:
    """The arguments of ``schema`` its op writes (``Tensor(a!)``)."""
    return [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _written_args(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The operands a call of ``target`` writes in place."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    names = [a.name for a in schema.arguments]
    return [args[names.index(a.name)] if names.index(a.name) < len(args) else kwargs.get(a.name)
            for a in _written(schema)]


def _writes_an_operand(p: Also) -> bool:
    """Whether the ``also`` part ``p`` is an in-place op: each op it can be writes an operand."""
    keys = p.pattern.root_keys()
    try:
        return bool(keys) and all(_written(resolve_op(k)._schema) for k in keys or ())
    except Exception:  # an op that does not resolve: the build names it
        return False


def _to_meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.to("meta")
    if isinstance(v, list):
        return [_to_meta(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_to_meta(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_meta(x) for k, x in v.items()}
    return v


def _same_literal(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


# ------------------------------------------------------------- export and compare


def _bare(module_type: type[torch.nn.Module]) -> torch.nn.Module:
    """An instance of ``module_type`` with nothing of it but its type (no parameters): export
    records the type in the ``nn_module_stack`` of the ops its ``forward`` runs (its source
    partition); the ``forward`` is set per call."""
    scope = module_type.__new__(module_type)
    torch.nn.Module.__init__(scope)
    return scope


def _forms_of(rule: Rule) -> list[Callable[[Any], Any]]:
    """The program form ``rule`` runs in (:attr:`Rule.program_form`), if it has one."""
    return [rule.program_form.form] if rule.program_form is not None else []


class _Program(torch.nn.Module):
    """The drawn subgraph as a module: constants are parameters/buffers (a constant an op
    writes in place is a mutable buffer, a KV cache), the rest inputs; the pattern's calls
    inside a module of the case's scope, where a check asks for one."""

    def __init__(self, case: _Case) -> None:
        super().__init__()
        self.case = case
        self.user = [n for n, i in case.inputs.items() if not i.constant]
        if case.scope is not None:
            self.scope = _bare(case.scope)
        written = {a.input for c in case.calls for a in _written_args(c.target, c.args, c.kwargs)
                   if isinstance(a, _Ref) and a.input is not None}
        for n, i in case.inputs.items():
            if i.constant:
                if i.dtype.is_floating_point and n not in written:
                    self.register_parameter(f"c_{n}", torch.nn.Parameter(i.value.clone(), requires_grad=False))
                else:
                    self.register_buffer(f"c_{n}", i.value.clone())

    def forward(self, *xs: torch.Tensor) -> tuple[Any, ...]:
        env: dict[str, Any] = dict(zip(self.user, xs, strict=True))
        results: list[Any] = []

        def ev(r: Any) -> Any:
            if isinstance(r, _Ref):
                if r.input is not None:
                    return env[r.input] if r.input in env else getattr(self, f"c_{r.input}")
                got = results[r.index]  # type: ignore[index]
                return got[r.item] if r.item is not None else got
            if isinstance(r, list):
                return [ev(x) for x in r]
            if isinstance(r, tuple):
                return tuple(ev(x) for x in r)
            return r

        def call(calls: list[_Call]) -> None:
            for c in calls:
                results.append(c.target(*ev(c.args), **{k: ev(v) for k, v in c.kwargs.items()}))

        calls = self.case.calls
        inside = len(calls) - 1 if self.case.tail else len(calls)  # the tail reads the module's output
        if self.case.scope is not None:
            self.scope.forward = lambda: call(calls[:inside])
            self.scope()
            call(calls[inside:])
        else:
            call(calls)
        return tuple(ev(o) for o in self.case.outputs)


class _Runner(torch.fx.Interpreter):
    """Runs a graph module node by node, remembering the node that raised; a node of an op
    in ``semantics`` (the node semantics that apply to the rule: :func:`_node_semantics_of`)
    runs through it first, then one of an op the backend states a kernel reference for
    (``ops``: :class:`~fusionkit.rule.OpSemantics`), whose node metadata it states applies."""

    failed_at: torch.fx.Node | None = None

    def __init__(self, module: torch.fx.GraphModule,
                 semantics: Mapping[str, Callable[..., Any]] | None = None,
                 ops: OpSemantics | None = None) -> None:
        super().__init__(module)
        self.semantics = semantics or {}
        self.ops = ops or OpSemantics()

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            key = (op_key(n.target) or "") if n.op == "call_function" else ""
            if _GUARD is not None and key:
                _GUARD.at_op(key)
            out = self._by_metadata(n, key)
            if out is not NotImplemented:
                pass
            elif (reference := self.ops.kernel_references.get(key)) is not None:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                out = reference(*args, **kwargs)
            else:
                out = super().run_node(n)
        except Exception:
            self.failed_at = n
            raise
        for meta_key, apply in self.ops.metadata.items():
            if n.meta.get(meta_key) is not None:
                out = apply(n.meta[meta_key], out)
        return out

    def _by_metadata(self, n: torch.fx.Node, key: str) -> Any:
        """What ``n`` computes by the semantics the rule's program form states for its op and
        metadata (:attr:`~fusionkit.rule.ProgramForm.node_semantics`), or ``NotImplemented``."""
        semantics = self.semantics.get(key)
        if semantics is None:
            return NotImplemented
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return semantics(n, args, kwargs)


def _flat(v: Any) -> list[Any]:
    if isinstance(v, (list, tuple)):
        return [x for y in v for x in _flat(y)]
    return [v]


def tolerance(dtype: torch.dtype) -> float:
    """The tolerance :func:`verify` compares an output of ``dtype`` with."""
    return float(TOLERANCES.get(dtype, 0))


def _difference(want: Any, got: Any) -> tuple[str | None, float]:
    """Why ``got`` is not ``want`` (None: equal within tolerance), and the largest error."""
    ws, gs = _flat(want), _flat(got)
    if len(ws) != len(gs):
        return f"{len(gs)} outputs instead of {len(ws)}", math.inf
    worst = 0.0
    for i, (w, g) in enumerate(zip(ws, gs, strict=True)):
        if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if w != g:
                return f"output {i} is {g!r}, expected {w!r}", math.inf
            continue
        if w.shape != g.shape:
            return f"output {i} has shape {tuple(g.shape)}, expected {tuple(w.shape)}", math.inf
        if w.dtype != g.dtype:
            return f"output {i} has dtype {g.dtype}, expected {w.dtype}", math.inf
        if w.numel() == 0:
            continue
        tol = tolerance(w.dtype)
        wd, gd = w.double(), g.double()
        # where the pattern's value is not finite (inf, NaN), any non-finite value is the same
        # (inf - inf in one order is NaN in another); a finite value must be finite and close
        wf, gf = torch.isfinite(wd), torch.isfinite(gd)
        if bool((wf != gf).any()):
            at = int((wf != gf).flatten().nonzero()[0][0]) if wd.dim() else 0
            return (f"output {i}: {float(gd.flatten()[at])} where the pattern computes "
                    f"{float(wd.flatten()[at])}"), math.inf
        err = torch.where(wf, (gd - wd).abs(), torch.zeros_like(wd))
        err = torch.nan_to_num(err, nan=math.inf, posinf=math.inf)
        worst = max(worst, float(err.max()))
        name = str(w.dtype).removeprefix("torch.")
        if not w.dtype.is_floating_point:  # codes: at most ``tol`` steps, whatever their size
            if bool((err > tol).any()):
                return (f"output {i} differs by up to {float(err.max()):.4g} "
                        f"(tolerance for {name}: {tol:g})"), worst
            continue
        bound = tol * (1 + wd.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0))
        if bool((err > bound).any()):
            return (f"output {i} differs by up to {float(err.max()):.4g} "
                    f"(tolerance for {name}: {tol:g} x (1 + |expected|))"), worst
    return None, worst


def _buffers_difference(pattern: torch.nn.Module, rewritten: torch.nn.Module, want: Any, got: Any
                        ) -> tuple[str | None, float, Any, Any]:
    """Whether the buffers of both programs (by name) differ after a run (an in-place cache
    update left other values): why, the largest error and the two values compared."""
    mine = dict(rewritten.named_buffers())
    for name, w in pattern.named_buffers():
        g = mine.get(name)
        if g is None:
            continue
        reason, worst = _difference(w, g)
        if reason is not None:
            return f"buffer `{name}` after the run: {reason.replace('output 0', 'its value')}", worst, w, g
    return None, 0.0, want, got


def _no_reference(gm: torch.fx.GraphModule, ops: OpSemantics) -> list[str]:
    """Ops in ``gm`` that torch has no implementation to run on the CPU for (and the backend,
    ``ops``, no kernel reference), or whose implementation the backend says is not its kernel."""
    missing: list[str] = []
    for n in gm.graph.nodes:
        # (an edge-dialect op object, as a program form gives it, is the op it wraps)
        overload = overload_of(n.target) if n.op == "call_function" else None
        if overload is None:
            continue
        name = overload.name()
        if op_key(n.target) in ops.kernel_references:
            continue
        if (unsafe := _unsafe(op_key(n.target) or "", ops)) is not None:
            missing.append(f"{op_key(n.target)} ({unsafe})")
        elif op_key(n.target) in ops.reference_caveats:
            missing.append(f"{op_key(n.target)} ({ops.reference_caveats[str(op_key(n.target))]})")
        elif not any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k)
                   for k in ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                             "CompositeImplicitAutograd")):
            missing.append(op_key(n.target) or name)
    return sorted(set(missing))


# -------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Counterexample:
    """The smallest case found where the replacement computes something else."""

    inputs: Mapping[str, Any]
    literals: Mapping[str, Any]
    ops: tuple[str, ...]
    reason: str
    max_error: float
    expected: Any
    got: Any

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": dict(self.inputs), "literals": dict(self.literals), "ops": list(self.ops),
                "reason": self.reason,
                "max_error": self.max_error if math.isfinite(self.max_error) else str(self.max_error),
                "expected": _jsonable(self.expected), "got": _jsonable(self.got)}

    def __str__(self) -> str:
        ins = "; ".join(f"{n}: {v['kind']} {v['dtype']}{tuple(v['shape'])} = {v['values']}"
                        for n, v in self.inputs.items())
        lits = ", ".join(f"{k}={v!r}" for k, v in self.literals.items())
        return (f"{self.reason}\n    operands: {ins}" + (f"\n    literals: {lits}" if lits else "")
                + f"\n    pattern: {self.expected}\n    replacement: {self.got}")


@dataclass(frozen=True)
class Verification:
    """What :func:`verify` found for one rule."""

    rule: str
    status: str  # "equal", "different" or "cannot check"
    reason: str
    cases: int  # cases compared (matched, both programs ran)
    shapes: tuple[str, ...] = ()  # the distinct operand shapes compared
    dtypes: tuple[str, ...] = ()
    declined: Mapping[str, int] = field(default_factory=dict)  # decline reason -> count
    counterexample: Counterexample | None = None
    no_reference: tuple[str, ...] = ()
    seconds: float = 0.0
    #: for "cannot check", whose fault it is not the rule's: one of :data:`CAUSES`
    cause: str = ""
    #: what the compared cases covered: ``ranks`` (of the tensor operands), ``dims_over_1``
    #: (per operand, the dims, counted from the last as -1, -2, ..., that were > 1 in some
    #: case), ``distinct`` / ``square`` / ``broadcast`` (cases with an operand of two or more
    #: different sizes > 1, with two equal sizes > 1, with operands of different shapes)
    coverage: Mapping[str, Any] = field(default_factory=dict)
    #: the cases that crashed the process that ran them (a signal, an abort): the op, the
    #: signal, the stage and the case, to reproduce it
    crashes: tuple[Mapping[str, Any], ...] = ()
    #: backend -> whether the rule fires there on the compared cases, as ``explain`` decides
    #: (``verify``'s ``judges``): ``fires`` (True, False, or None: no case judged),
    #: ``cases`` (judged), ``reason`` (when it never fired: the most frequent decline, the
    #: ``executable`` step's or the partitioner's), ``not_judged`` (a judge that raised)
    firing: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: whether the solver proved the pattern's and the replacement's programs equal for every
    #: value and size (:mod:`fusionkit.authoring.prove`), refuted them, or why not
    proof: Proof | None = None

    @property
    def ok(self) -> bool:
        return self.status == EQUAL

    @property
    def never_fires(self) -> dict[str, str]:
        """Backend -> why the rule never fired there on any case judged (its replacement
        declined at ``executable`` or by the partitioner, on every case)."""
        return {b: str(f.get("reason", "")) for b, f in self.firing.items() if f.get("fires") is False}

    @property
    def verdict(self) -> str:
        """The status, and where the rule never fires: ``equal, but never fires on vulkan``."""
        never = self.never_fires
        if not never:
            return self.status
        return f"{self.status}, but never fires on {', '.join(never)}"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "status": self.status, "reason": self.reason, "cases": self.cases,
                "shapes": list(self.shapes), "dtypes": list(self.dtypes), "declined": dict(self.declined),
                "counterexample": self.counterexample.to_dict() if self.counterexample else None,
                "no_reference": list(self.no_reference), "seconds": round(self.seconds, 2),
                "cause": self.cause, "coverage": dict(self.coverage),
                "crashes": [dict(c) for c in self.crashes],
                "firing": {b: dict(f) for b, f in self.firing.items()},
                "never_fires": self.never_fires, "verdict": self.verdict,
                "proof": self.proof.to_dict() if self.proof is not None else None,
                "tolerances": {str(k).removeprefix("torch."): v for k, v in TOLERANCES.items()}}

    def summary(self) -> str:
        """One line: the rule, the verdict and why (and why it never fires where it does not)."""
        never = "".join(f"; never fires on {b}: {why}" for b, why in self.never_fires.items())
        proof = f"; {self.proof}" if self.proof is not None else ""
        return f"{self.rule}: {self.verdict} - {self.reason}{never}{proof}"

    def __str__(self) -> str:
        out = self.summary()
        if self.counterexample is not None:
            out += f"\n  smallest counterexample: {self.counterexample}"
        return out


def _single(v: Any) -> Any:
    return v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v


def _short(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.tolist() if v.numel() <= 64 else f"tensor{tuple(v.shape)}"
    if isinstance(v, (list, tuple)):
        return [_short(x) for x in v]
    return v


def _eager_target(namespaces: frozenset[str] = frozenset()) -> Any:
    """Where the verifier runs the rewritten program: in torch, where every ATen op runs
    (one outside the core opset too: whether a lowering could take it is the executability
    check's question, not whether the replacement computes what the pattern computes), and
    so do the ops of ``namespaces``, run in the context their backend registered."""
    from fusionkit.find.executable import Delegate, ExecutionTarget

    return ExecutionTarget([Delegate("torch (fusionkit.verify runs the program eagerly)",
                                     lambda node: None, frozenset({"aten"}) | namespaces)])


#: what :meth:`_Checker.rewritten` says of a case the rule never saw
_NOT_JUDGED = ("torch.export failed", "the program form failed")


class _Checker:
    """Runs drawn cases: export (memoised by structure), rewrite, evaluate, compare."""

    def __init__(self, rule: Rule, cases: int, max_examples: int = 300,
                 judges: Mapping[str, Judge] | None = None) -> None:
        self.rule = rule
        #: backend -> its judge of whether the rule fires there; what each said
        self.judges = dict(judges or {})
        self.fired: dict[str, bool] = {}
        self.judged: Counter[str] = Counter()
        self.not_fired: dict[str, Counter[str]] = {b: Counter() for b in self.judges}
        self.not_judged: dict[str, str] = {}
        #: cases drawn, and compared cases with an operand of two or more dims > 1 (where a
        #: rule that mixes up dims can show it, values not all one): half the cases must be
        #: such, unless half the draws gave too few (a rule of vectors)
        self.drawn = 0
        self.informative = 0
        self.patience = max(max_examples // 2, 2 * cases)
        #: the declared variants (``_Case.choices``) of the cases the rule judged (compared,
        #: or declined): each one's options drawn, and how many it has. Every option of each
        #: must have been judged before the verdict is equal (or half the draws were made):
        #: a rule's registered hints, its pattern's alternatives are its cases, not the
        #: first options hypothesis tries first
        self.variants: dict[Any, set[int]] = {}
        self.variant_options: dict[Any, int] = {}
        self.target = _eager_target(_context_namespaces(rule))
        self.forms = _forms_of(rule)
        self.semantics = _node_semantics_of(rule)
        self.want = cases
        self.compared = 0
        self.shapes: set[str] = set()
        self.dtypes: set[str] = set()
        self.declined: Counter[str] = Counter()
        self.not_a_case: Counter[str] = Counter()
        self.no_reference: set[str] = set()
        #: backend tools a case needed and the environment lacks (an import that failed)
        self.unavailable: set[str] = set()
        #: cases not run again: they crashed an earlier worker process (:func:`_isolated`)
        self.crashed = 0
        #: what the compared cases covered (``Verification.coverage``)
        self.ranks: set[int] = set()
        self.over_1: dict[str, set[int]] = {}
        self.styles: Counter[str] = Counter()
        #: why a rewritten program cannot be judged by running it (semantics in node metadata)
        self.metadata: set[str] = set()
        self.exported: dict[str, Any] = {}
        #: the initial buffers of each exported module (by id), restored before each run
        self.buffers: dict[int, dict[str, torch.Tensor]] = {}
        self.last_difference: tuple[str, float, Any, Any] | None = None
        #: the first case found different (what is reported if shrinking cannot replay it)
        self.first_difference: _Case | None = None
        #: one compared case per structure (:meth:`_Case.structure`), a float one where there
        #: was: what :func:`_proof` proves; the size ranges of each dynamic export
        self.structures: dict[str, _Case] = {}
        self.ranges: dict[str, dict[str, tuple[int, int | None]]] = {}
        #: whether operand hints shape the drawn operands (then a solver's counterexample,
        #: which hints do not bound, does not overturn a sampled "equal")
        self.hinted = False

    def rewritten(self, case: _Case, dynamic: bool = False) -> tuple[Any, Any] | str:
        """(the exported pattern, the rewritten program) or why the rule did not fuse it.
        ``dynamic``: every dim > 1 of a user input exported as a symbol (``Dim.AUTO``), for
        :func:`_proof`; not judged for firing."""
        key = ("dynamic " if dynamic else "") + case.key()
        if key in self.exported:
            return self.exported[key]  # type: ignore[no-any-return]
        from fusionkit.find.finder import find_matches
        from fusionkit.fusion_pass import FusionPass

        if _GUARD is not None:  # (raises _Crashed: this case crashed an earlier worker)
            _GUARD.enter("exporting and rewriting the pattern's program", "torch.export", case)
        program = _Program(case)
        user = tuple(case.inputs[n].value for n in program.user)
        try:
            if dynamic:
                ep = _exported_dynamic(program, user)
                self.ranges[key] = ranges_of(ep)
            else:
                ep = torch.export.export(program, user, strict=False)
        except Exception as e:
            got: tuple[Any, Any] | str = f"torch.export failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            self.exported[key] = got
            return got
        ep.graph_module.graph.eliminate_dead_code()  # the unused outputs of a tuple-valued op
        ep.graph_module.recompile()
        for form in self.forms:  # the program as the rule's pass pipeline gives it to the rule
            try:
                ep = form(ep) or ep  # a new program, or None: ep edited in place
            except Exception as e:
                got = f"the program form failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                self.exported[key] = got
                return got
            ep.graph_module.recompile()
        out = next(n for n in ep.graph.nodes if n.op == "output")
        user_outputs = {getattr(s.arg, "name", None) for s in ep.graph_signature.output_specs
                        if s.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT}
        roots = [a for a in _flat(out.args[0]) if isinstance(a, torch.fx.Node) and a.name in user_outputs]
        root = roots[0] if roots else None
        if root is not None and case.tail and root.args:
            root = root.args[0]  # type: ignore[assignment]
        if root is not None and root.target is operator.getitem:
            root = root.args[0]  # type: ignore[assignment]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rewritten = copy.deepcopy(ep)
        # (never strict: a rule's own error is a decline the verdict counts, not the end of
        # the search, whatever FUSIONKIT_STRICT says)
        ms = find_matches(rewritten, [self.rule], target=self.target, strict=False)
        if not any(m.root.name == getattr(root, "name", None) for m in ms.accepted):
            at_root = [d for d in ms.declined if d.root.name == getattr(root, "name", None)]
            why = (f"declined: {at_root[0].step}: {at_root[0].reason}" if at_root
                   else "the pattern did not match its own subgraph (as exported: "
                        f"{', '.join(str(n.target) for n in ep.graph.nodes if n.op == 'call_function')})")
            self.exported[key] = why
            return why
        before = {k for n in ep.graph.nodes for k in n.meta}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fuse = FusionPass([self.rule], name=f"verify:{self.rule.name}", target=self.target,
                              strict=False)
            fuse.call(rewritten)
            got = (ep.module(), rewritten.module())
        for m in got:  # what each run starts from: the buffers an op writes in place reset
            self.buffers[id(m)] = {n: b.clone() for n, b in m.named_buffers()}
        if not fuse.report.total_fused:
            # the match was accepted but the rewrite was not made (its replacement raised,
            # or built a value the root's users cannot read): nothing to compare
            errors = fuse.report.errors
            why = (f"accepted, then not rewritten: {errors[0].step}: {errors[0].reason}" if errors
                   else "accepted, then not rewritten")
            self.exported[key] = why
            return why
        recorded = ({k for n in rewritten.graph.nodes for k in n.meta} - before - _BOOKKEEPING_META
                    - set(self.rule.semantics.metadata))
        if recorded:  # e.g. XNNPACK's fused activation: the graph alone does not say the result
            got = (f"the replacement records {', '.join(sorted(recorded))} in node metadata for "
                   "the backend to apply; the graph alone does not compute the result")
            self.metadata.add(got)
        self.exported[key] = got
        if not dynamic:
            self._judge_firing(ep)
        return got

    def _judge_firing(self, ep: Any) -> None:
        """Ask each backend's judge whether the rule fires in this accepted case's program,
        until it fired once (or :data:`FIRING_CASES` were judged)."""
        for backend, judge in self.judges.items():
            if self.fired.get(backend) or self.judged[backend] >= FIRING_CASES:
                continue
            if _GUARD is not None:
                _GUARD.at_op(f"judging whether {self.rule.name} fires on {backend}")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    why = judge(ep)
            except Exception as e:  # (to_edge of the case failed): not a judgement
                self.not_judged[backend] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                continue
            self.judged[backend] += 1
            if why is None:
                self.fired[backend] = True
            else:
                self.not_fired[backend][why] += 1

    def firing(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for b in self.judges:
            n = self.judged[b]
            f: dict[str, Any] = {"fires": True if self.fired.get(b) else (False if n else None),
                                 "cases": n}
            if f["fires"] is False:
                f["reason"] = self.not_fired[b].most_common(1)[0][0]
            if b in self.not_judged:
                f["not_judged"] = self.not_judged[b]
            out[b] = f
        return out

    def differs(self, case: _Case) -> bool:
        """Whether this case is a counterexample; counts what it was."""
        try:
            return self._differs(case)
        except _Crashed:
            self.crashed += 1
            return False

    def _differs(self, case: _Case) -> bool:
        made = self.rewritten(case)
        if isinstance(made, str):
            missing_tool = _unavailable_in(made)
            if missing_tool is not None:  # the environment's, not the rule's
                self.unavailable.add(missing_tool)
            elif made not in self.metadata:
                self.declined[made] += 1
                if not made.startswith(_NOT_JUDGED):  # the rule saw it (and declined it)
                    self._judged(case)
            return False
        pattern_gm, gm = made
        missing = _no_reference(gm, self.rule.semantics)
        if missing:
            self.no_reference.update(missing)
            return False
        user = tuple(case.inputs[n].value.clone() for n in _Program(case).user)
        for m in made:  # each run starts from the initial state (caches written in place)
            for n, b in m.named_buffers():
                b.copy_(self.buffers[id(m)][n])
        if _GUARD is not None:
            _GUARD.enter("running the pattern's program", "", case)
        try:
            want = _Runner(pattern_gm, self.semantics, self.rule.semantics).run(*user)  # (its backend ops as their kernels compute)
        except Exception as e:
            message = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if _unavailable_in(message) is not None:
                self.unavailable.add(message)
            else:  # it ran eagerly: the exported program is not a case the rule is judged on
                self.declined[f"the exported pattern's program raised {message}"] += 1
            return False
        if _GUARD is not None:
            _GUARD.enter("running the rewritten program", "", case)
        runner = _Runner(gm, self.semantics, self.rule.semantics)
        try:
            got = runner.run(*user)
        except Exception as e:
            message = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            key = op_key(runner.failed_at.target) if runner.failed_at is not None else None
            if _unavailable_in(message) is not None:  # a backend tool missing: not the rule's fault
                self.unavailable.add(f"{key or 'an op'} needs {message}")
                return False
            if isinstance(e, NotImplementedError) or (key is not None and not key.startswith("aten.")):
                # a backend op's reference implementation is not the backend: name it, judge nothing
                self.no_reference.add(f"{key or 'an op'} (its reference implementation raised {message})")
                return False
            raised = f"the rewritten program raised {message}"
            self.last_difference = (raised, math.inf, want, None)
            return True
        reason, worst = _difference(want, got)
        if reason is None:  # and the state both leave: the buffers written in place
            reason, worst, want, got = _buffers_difference(pattern_gm, gm, want, got)
        if reason is not None:
            self.last_difference = (reason, worst, want, got)
            return True
        self.compared += 1
        structure = case.structure()
        if structure not in self.structures or (
                not _floating(self.structures[structure]) and _floating(case)):
            self.structures[structure] = case
        self.shapes.add(", ".join(f"{n}{tuple(i.shape)}" for n, i in case.inputs.items()))
        self.dtypes.update(str(i.dtype).removeprefix("torch.") for i in case.inputs.values())
        self._cover(case)
        self._judged(case)
        return False

    def _judged(self, case: _Case) -> None:
        """Count the declared variants a case the rule judged took."""
        for key, (i, n) in case.choices.items():
            self.variants.setdefault(key, set()).add(i)
            self.variant_options[key] = n

    @property
    def variants_left(self) -> int:
        """Options of the declared variants seen so far that no judged case drew yet."""
        return sum(n - len(self.variants[k]) for k, n in self.variant_options.items())

    def _cover(self, case: _Case) -> None:
        """Count what a compared case covered: ranks, the dims > 1, its shapes' kinds."""
        shapes = [i.shape for i in case.inputs.values()]
        for n, i in case.inputs.items():
            self.ranks.add(len(i.shape))
            self.over_1.setdefault(n, set()).update(-k for k, d in enumerate(reversed(i.shape), 1) if d > 1)
        big = [[d for d in s if d > 1] for s in shapes]
        if any(len([d for d in i.shape if d > 1]) >= 2 and i.value.numel() > 1
               and bool((i.value.flatten() != i.value.flatten()[0]).any()) for i in case.inputs.values()):
            self.informative += 1  # (two dims > 1, and values that are not all one)
        if any(len(set(b)) >= 2 for b in big):
            self.styles["distinct"] += 1
        if any(len(set(b)) < len(b) for b in big):
            self.styles["square"] += 1
        if len(set(shapes)) > 1:
            self.styles["broadcast"] += 1

    def coverage(self) -> dict[str, Any]:
        total = sum(self.variant_options.values())
        return {"ranks": sorted(self.ranks),
                "dims_over_1": {n: sorted(ds, reverse=True) for n, ds in self.over_1.items()},
                **{k: self.styles[k] for k in ("distinct", "square", "broadcast")},
                "variants": [total - self.variants_left, total]}

    @property
    def done(self) -> bool:
        """Enough cases compared equal (never once a difference was seen: it is being shrunk)."""
        return (self.compared >= self.want and self.first_difference is None
                and ((2 * self.informative >= self.want and not self.variants_left)
                     or self.drawn >= self.patience))


def _picker(draw: Callable[[Any], Any], st: Any, joint: int,
            picked: dict[Any, tuple[int, int]]) -> Pick:
    """The ``pick`` a joint hint (a check's ``operand_hints()`` function) draws with: one option, by
    hypothesis (a failing case shrinks to the first options), recording which option of
    which call it was (the ``n``-th pick of the ``joint``-th hint, over these options)."""
    def pick(options: Sequence[Any]) -> Any:
        options = list(options)
        i = draw(st.integers(0, len(options) - 1))
        if len(options) > 1:
            picked[("pick", joint, len(picked), repr(options))] = (i, len(options))
        return options[i]

    return pick


def verify(rule: Rule, *, cases: int = 20, max_examples: int = 300, seed: int = 0,
           hints: Mapping[str, OperandHint] | None = None, isolate: bool = True,
           judges: Mapping[str, Judge] | None = None) -> Verification:
    """Whether ``rule``'s replacement computes what its pattern computes.

    Draws operands the rule's constraints admit (several shapes and dtypes, the
    bounds of its literals), lets the rule rewrite the pattern's own subgraph and
    compares both programs' results, until ``cases`` cases compared equal or
    ``max_examples`` were drawn. A difference is shrunk to the smallest
    counterexample (hypothesis). ``status`` is ``"equal"``, ``"different"`` or
    ``"cannot check"`` (``cause`` says why, never the rule's fault: a case crashed a
    native kernel, a backend tool is missing, an op has no reference implementation,
    no drawn case was accepted; ``reason`` names it).

    ``hints`` (capture name -> :class:`OperandHint`) tell the generator how to make
    operands a check asks for, beyond (and over) those its constraints state
    (:meth:`Constraint.operand_hints <fusionkit.Constraint.operand_hints>`).

    ``isolate`` (on Linux): the cases run in a worker process forked for this call, so a
    case that crashes a native kernel (a signal, an abort) cannot end the caller's
    process; the worker is restarted without that case (:data:`MAX_CRASHES` times at
    most) and the crash is reported, "cannot check: OP crashed on CASE". ``False`` runs
    them in the caller's process (where a hook the caller set must see them).

    ``judges`` (backend -> :data:`Judge`): whether the rule fires there, asked about the
    cases the rule accepted (:data:`FIRING_CASES` at most until it fires), as ``explain``
    decides (:func:`fusionkit.app.firing.judges`, what ``fusionkit verify`` passes):
    :attr:`Verification.firing`; an ``equal`` rule declined on every case judged is
    ``equal, but never fires on BACKEND`` (:attr:`Verification.verdict`).
    """
    if isolate and _can_isolate():
        return _isolated([rule.name], [lambda: _verify(rule, cases, max_examples, seed, hints, judges)])[0]
    return _verify(rule, cases, max_examples, seed, hints, judges)


def _verify(rule: Rule, cases: int, max_examples: int, seed: int,
            hints: Mapping[str, OperandHint] | None,
            judges: Mapping[str, Judge] | None = None) -> Verification:
    try:
        from hypothesis import HealthCheck, Phase, find, settings
        from hypothesis import strategies as st
        from hypothesis.errors import NoSuchExample
    except ImportError as e:  # pragma: no cover - hypothesis is installed with fusionkit's dev extra
        raise ImportError("fusionkit.verify draws its cases with hypothesis: pip install hypothesis") from e

    started = time.monotonic()
    checker = _Checker(rule, cases, max_examples, judges)
    operand_hints, joint_hints = _hints_of(rule, hints)
    checker.hinted = bool(operand_hints or joint_hints)
    scope = rule.module_scope

    @st.composite
    def case(draw: Any) -> _Case:
        case_hints = dict(operand_hints)
        picked: dict[Any, tuple[int, int]] = {}
        for j, joint in enumerate(joint_hints):  # drawn first: the sizes the other operands must agree with
            for capture, hint in joint(_picker(draw, st, j, picked)).items():
                case_hints[capture] = merged(case_hints[capture], hint) if capture in case_hints else hint
        for capture, hint in (hints or {}).items():  # the caller's own win
            case_hints[capture] = merged(case_hints[capture], hint) if capture in case_hints else hint
        b = _Builder(rule, draw, case_hints)
        b.case.scope = scope
        b.case.choices.update(picked)
        try:
            first = b.build(rule.pattern)
        except _Crashed:  # an op crashed an earlier worker on these operands: not run again
            return _Case(literals={"__crashed__": True})
        except _NotACase as e:
            return _Case(literals={"__not_a_case__": str(e)})
        except Exception as e:  # operands no op was given yet (a negative size): not a case
            message = f"{type(e).__name__}: {str(e)[:200]}"
            if _unavailable_in(message) is not None:
                return _Case(literals={"__unavailable__": message})
            return _Case(literals={"__not_a_case__": message})
        if not b.case.outputs:
            b.case.outputs.append(first)
        for o in b.case.outputs:  # a tuple-valued root: its first tensor is what models use
            if o.index is not None and isinstance(b.values[o.index], (tuple, list)):
                o.item = 0
        root = b.case.outputs[0]
        if root.index is not None and draw(st.booleans()):
            # the root's value used by an op after it, not returned as it is (a rule may
            # rightly decline to make the program return one of its inputs)
            b.case.calls.append(_Call(torch.ops.aten.clone.default, (root,), {}))
            b.case.outputs[0] = _Ref(index=len(b.case.calls) - 1)
            b.case.tail = True
        return b.case

    def condition(c: _Case) -> bool:
        if checker.done:
            return False
        checker.drawn += 1
        if "__crashed__" in c.literals:
            checker.crashed += 1
            return False
        if "__unavailable__" in c.literals:
            checker.unavailable.add(c.literals["__unavailable__"])
            return False
        if "__not_a_case__" in c.literals:
            if c.literals["__not_a_case__"]:
                checker.not_a_case[c.literals["__not_a_case__"]] += 1
            return False
        differs = checker.differs(c)
        if differs and checker.first_difference is None:
            checker.first_difference = c
        return differs

    config = settings(max_examples=max_examples, database=None, derandomize=True, deadline=None,
                      phases=[Phase.generate, Phase.shrink],
                      suppress_health_check=list(HealthCheck))
    found: _Case | None = None
    try:
        contexts = _op_contexts(rule)
    except Exception as e:  # the backend's context needs a tool this environment lacks
        message = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if _unavailable_in(message) is None:
            raise
        return Verification(rule.name, CANNOT_CHECK, f"a backend tool is unavailable: the context "
                            f"its ops run in needs {message}", 0, cause=UNAVAILABLE,
                            seconds=time.monotonic() - started)
    with contexts:
        try:
            with _seeded(seed):
                found = find(case(), condition, settings=config)
        except NoSuchExample:
            found = None
        except Exception:  # hypothesis could not replay the shrinking (a flaky comparison)
            found = checker.first_difference
        return _verdict(rule, checker, found, time.monotonic() - started)


# ------------------------------------------------------------- whose fault it is


def _unavailable_in(message: str) -> str | None:
    """The missing tool a failure's message names (an import that failed: a backend's
    optional package, ``tosa_serializer`` without ``tosa-tools``), or None."""
    import re

    found = re.search(r"(ModuleNotFoundError|ImportError): [^;)]*", message)
    return found.group(0).strip() if found else None


def _node_semantics_of(rule: Rule) -> dict[str, Callable[..., Any]]:
    """The node semantics that apply to ``rule``: those of the pipeline position its program
    form gives (:attr:`~fusionkit.rule.ProgramForm.node_semantics`); none without one."""
    return dict(rule.program_form.node_semantics) if rule.program_form is not None else {}


# ------------------------------------------------------------------ isolation


#: how many crashing cases one verification survives (a worker restarted after each)
MAX_CRASHES = 2

#: in a worker process: the record of what it is running, shared with the caller (None in
#: the caller's process: nothing is recorded)
_GUARD: _Guard | None = None


class _Crashed(Exception):
    """The case about to run crashed an earlier worker: it is not run again."""


class _Guard:
    """What a worker is running, written where the caller reads it after a crash: the case
    (its operands, literals, the stage) and the op running. A record the caller names as
    crashed (by its fingerprint) raises :class:`_Crashed` instead of running again."""

    SIZE = 1 << 21
    OP_AT = SIZE - 1024

    def __init__(self, shared: mmap.mmap, crashed: frozenset[str]) -> None:
        self.shared, self.crashed = shared, crashed

    def enter(self, stage: str, op: str, case: _Case, call: Any = None) -> None:
        record: dict[str, Any] = {"stage": stage, "case": _described(case)}
        if call is not None:
            record["arguments"] = call
        text = json.dumps(record, default=str, sort_keys=True)
        fingerprint = hashlib.sha1(f"{op}|{text}".encode()).hexdigest()
        if fingerprint in self.crashed:
            raise _Crashed(stage)
        data = json.dumps({"fingerprint": fingerprint, **record}, default=str).encode()
        if len(data) > self.OP_AT - 8:  # (the values of large operands left out)
            record["case"] = _described(case, values=False)
            data = json.dumps({"fingerprint": fingerprint, **record}, default=str).encode()[: self.OP_AT - 8]
        self.shared[4:4 + len(data)] = data
        self.shared[0:4] = len(data).to_bytes(4, "little")
        self.at_op(op)

    def at_op(self, op: str) -> None:
        b = op.encode()[:1000]
        self.shared[self.OP_AT + 2:self.OP_AT + 2 + len(b)] = b
        self.shared[self.OP_AT:self.OP_AT + 2] = len(b).to_bytes(2, "little")


def _described(case: _Case, values: bool = True) -> dict[str, Any]:
    d = case.describe()
    for i in d["inputs"].values():
        if not values or len(str(i["values"])) > 20000:
            i["values"] = "(left out)"
    return d


def _read_record(shared: mmap.mmap) -> dict[str, Any]:
    n = int.from_bytes(shared[0:4], "little")
    record: dict[str, Any] = {}
    if n:
        try:
            record = json.loads(shared[4:4 + n].decode())
        except ValueError:
            record = {"stage": "(the record was cut short)"}
    k = int.from_bytes(shared[_Guard.OP_AT:_Guard.OP_AT + 2], "little")
    record["op"] = shared[_Guard.OP_AT + 2:_Guard.OP_AT + 2 + k].decode(errors="replace") or "an op"
    return record


def _can_isolate() -> bool:
    """Whether cases can run in a forked worker (Linux: fork keeps the caller's rules,
    hooks and registered references without pickling them)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def _isolated(names: Sequence[str], runs: Sequence[Callable[[], Verification]],
              progress: Callable[[int], None] | None = None) -> list[Verification]:
    """Each ``runs[i]()`` (the verification of rule ``names[i]``) in one forked worker, in
    order; after a crash, the rest in a fresh worker that does not run the crashing case
    again (by its fingerprint), at most :data:`MAX_CRASHES` crashes per rule.
    ``progress(i)`` is called before rule ``i`` starts."""
    out: list[Verification] = []
    crashes: dict[str, dict[str, Any]] = {}  # the crashes of rule len(out)
    started = time.monotonic()
    while len(out) < len(runs):
        first = len(out)
        shared = mmap.mmap(-1, _Guard.SIZE)
        try:
            status, got = _in_worker(runs, first, shared, frozenset(crashes), out, progress)
            record = _read_record(shared) if status == "crashed" else {}
        finally:
            shared.close()
        if len(out) > first:  # rules finished before the end: the crashes were the first's
            out[first] = _with_crashes(out[first], list(crashes.values()))
            crashes, started = {}, time.monotonic()
        if status == "ok":
            break
        if status == "error":
            raise got
        record["signal"] = got
        fingerprint = record.pop("fingerprint", None)
        crashes[fingerprint or f"outside a case {len(crashes)}"] = record
        if fingerprint is None or len(crashes) > MAX_CRASHES:  # give this rule up
            out.append(_with_crashes(Verification(names[len(out)], CANNOT_CHECK, "", 0),
                                     list(crashes.values()), time.monotonic() - started))
            crashes, started = {}, time.monotonic()
    return out


def _in_worker(runs: Sequence[Callable[[], Verification]], first: int, shared: mmap.mmap,
               crashed: frozenset[str], out: list[Verification],
               progress: Callable[[int], None] | None) -> tuple[str, Any]:
    """Run ``runs[first:]`` in a forked worker, appending each verification to ``out`` as
    it arrives; then ("ok", None), ("error", the exception a run raised) or ("crashed", the
    signal or exit status that ended the worker)."""
    import gc

    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # (the worker's collections leave the caller's objects alone: no page copied for them)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0:
            gc.unfreeze()
    if pid == 0:  # the worker: run, send each result, and leave without the caller's exit hooks
        os.close(read)
        try:
            _work(runs, first, shared, crashed, write)
        finally:
            os._exit(0)
    os.close(write)
    status: tuple[str, Any] | None = None
    try:
        with os.fdopen(read, "rb") as pipe:
            if progress is not None:
                progress(first)
            while status is None:
                head = pipe.read(8)
                if len(head) < 8:
                    break
                message = pickle.loads(pipe.read(int.from_bytes(head, "little")))
                if message[0] == "ok":
                    out.append(message[1])
                    if progress is not None and len(out) < len(runs):
                        progress(len(out))
                else:
                    status = message
        _, code = os.waitpid(pid, 0)
    except BaseException:  # (interrupted: the worker goes too)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    if status is not None:
        return status
    if len(out) == len(runs):
        return "ok", None
    if os.WIFSIGNALED(code):
        sig = os.WTERMSIG(code)
        try:
            return "crashed", signal.Signals(sig).name
        except ValueError:
            return "crashed", f"signal {sig}"
    return "crashed", f"exit status {os.waitstatus_to_exitcode(code)}"


def _work(runs: Sequence[Callable[[], Verification]], first: int, shared: mmap.mmap,
          crashed: frozenset[str], write: int) -> None:
    global _GUARD
    _GUARD = _Guard(shared, crashed)
    torch.set_num_threads(1)  # (the cases are small; no thread pool inherited across fork)
    with os.fdopen(write, "wb") as pipe:
        for i in range(first, len(runs)):
            if i > first:
                _GUARD = _Guard(shared, frozenset())  # (the crashes were the first rule's)
            message: tuple[str, Any]
            try:
                message = ("ok", runs[i]())
            except BaseException as e:
                message = ("error", e)
            try:
                data = pickle.dumps(message)
            except Exception:
                data = pickle.dumps(("error", RuntimeError(f"fusionkit.verify's worker: {message[1]!r}")))
            pipe.write(len(data).to_bytes(8, "little") + data)
            pipe.flush()
            if message[0] == "error":
                break
    sys.stdout.flush()
    sys.stderr.flush()


def _crash_text(c: Mapping[str, Any]) -> str:
    """``OP crashed (SIGNAL) on CASE while STAGE``: the operands and literals to reproduce it."""
    case = c.get("case") or {}
    def values(v: Mapping[str, Any]) -> str:  # (all of them in ``Verification.crashes``)
        return f" = {v['values']}" if len(str(v["values"])) <= 200 else ""

    ins = "; ".join(f"{n}: {v['kind']} {v['dtype']}{tuple(v['shape'])}{values(v)}"
                    for n, v in (case.get("inputs") or {}).items())
    lits = ", ".join(f"{k}={v!r}" for k, v in (case.get("literals") or {}).items())
    on = f"{ins}" + (f"; literals {lits}" if lits else "") if case else "no case (before the first)"
    stage = f" while {c['stage']}" if c.get("stage") else ""
    return f"{c.get('op', 'an op')} crashed ({c.get('signal', 'a crash')}) on {on}{stage}"


def _with_crashes(v: Verification, crashes: list[dict[str, Any]], seconds: float | None = None
                  ) -> Verification:
    """``v`` with the crashes of earlier workers: "cannot check: OP crashed on CASE" unless
    a difference was found (a counterexample is the rule's, whatever else crashed)."""
    import dataclasses

    if not crashes:
        return v
    more: dict[str, Any] = dict(crashes=tuple(crashes), seconds=seconds if seconds is not None else v.seconds)
    if v.status == DIFFERENT:
        return dataclasses.replace(v, **more)  # type: ignore[arg-type]
    others = f" ({len(crashes) - 1} more crashing case(s))" if len(crashes) > 1 else ""
    compared = f"; {v.cases} other cases compared equal" if v.cases else ""
    return dataclasses.replace(v, status=CANNOT_CHECK, cause=CRASH,  # type: ignore[arg-type]
                               reason=f"{_crash_text(crashes[0])}{others}{compared}", **more)


def _op_keys(p: Pattern) -> set[str]:
    """The op keys anywhere in pattern ``p`` (each sub-pattern's root ops)."""
    keys = set(p.root_keys() or ())
    for child in p.children():
        keys |= _op_keys(child)
    return keys


def _context_namespaces(rule: Rule) -> frozenset[str]:
    """The namespaces of ``rule``'s ops, and of the ops its program form holds
    (:attr:`~fusionkit.rule.ProgramForm.namespaces`), that its backend states a context for
    (:attr:`~fusionkit.rule.OpSemantics.op_contexts`)."""
    held = frozenset(rule.program_form.namespaces) if rule.program_form is not None else frozenset()
    return frozenset(({k.split(".")[0] for k in _op_keys(rule.pattern)} | held)
                     & set(rule.semantics.op_contexts))


def _op_contexts(rule: Rule) -> contextlib.ExitStack:
    """The contexts ``rule``'s backend states for the namespaces of its ops, entered together."""
    stack = contextlib.ExitStack()
    for ns in sorted(_context_namespaces(rule)):
        stack.enter_context(rule.semantics.op_contexts[ns]())
    return stack


class _seeded:
    """torch's generator seeded for the run; fake-tensor tracebacks not logged (a rule's
    probe of a replacement on operands it declines logs each at ERROR, then declines)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        import logging

        self.state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)
        self.log = logging.getLogger("torch._subclasses.fake_tensor")
        self.level = self.log.level
        self.log.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: Any) -> None:
        torch.random.set_rng_state(self.state)
        self.log.setLevel(self.level)


def _verdict(rule: Rule, ch: _Checker, found: _Case | None, seconds: float) -> Verification:
    """The sampled verdict, with the proof (:func:`_proof`); a refutation confirmed by running
    its case makes an "equal" rule different, with that case as the counterexample."""
    sampled = _sampled_verdict(rule, ch, found, seconds)
    started = time.monotonic()
    try:
        proof, confirmed = _proof(rule, ch, found)
    except Exception as e:  # the prover's failure is never the rule's: the sampled verdict stands
        proof = Proof(NOT_PROVED, f"the prover failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        confirmed = None
    seconds += time.monotonic() - started
    if confirmed is not None and sampled.status == EQUAL and ch.hinted:
        proof = dataclasses.replace(proof, reason=proof.reason + " (with operands the rule's hints "
                                    "do not draw: the sampled verdict stands)")
    elif confirmed is not None and sampled.status == EQUAL:
        return dataclasses.replace(sampled, status=DIFFERENT, counterexample=confirmed,
                                   reason=f"the replacement computes something else: {confirmed.reason} "
                                          "(a case the solver found, confirmed by running it)",
                                   proof=proof, seconds=seconds)
    return dataclasses.replace(sampled, proof=proof, seconds=seconds)


def _sampled_verdict(rule: Rule, ch: _Checker, found: _Case | None, seconds: float) -> Verification:
    common = dict(cases=ch.compared, shapes=tuple(sorted(ch.shapes)), dtypes=tuple(sorted(ch.dtypes)),
                  declined=dict(ch.declined.most_common(5)), no_reference=tuple(sorted(ch.no_reference)),
                  seconds=seconds, coverage=ch.coverage(), firing=ch.firing())
    if found is not None:
        ch.last_difference = None
        ch.differs(found)  # recompute the shrunk case's outputs
        reason, worst, want, got = ch.last_difference or ("differs", math.inf, None, None)
        d = found.describe()
        cx = Counterexample(d["inputs"], d["literals"], tuple(d["ops"]), reason, worst,
                            _short(_single(want)), _short(_single(got)))
        return Verification(rule.name, DIFFERENT, f"the replacement computes something else: {reason}",
                            counterexample=cx, **common)  # type: ignore[arg-type]
    if ch.compared:
        skipped = (f"; cases through {', '.join(sorted(ch.no_reference))} not judged"
                   if ch.no_reference else "")
        if ch.unavailable:
            skipped += f"; cases needing {', '.join(sorted(ch.unavailable))} not judged"
        return Verification(rule.name, EQUAL, f"equal on {ch.compared} cases ({_covered(ch)}){skipped}",
                            **common)  # type: ignore[arg-type]
    if ch.unavailable:
        return Verification(rule.name, CANNOT_CHECK, "a backend tool is unavailable: "
                            + ", ".join(sorted(ch.unavailable)), cause=UNAVAILABLE,
                            **common)  # type: ignore[arg-type]
    if ch.metadata:
        return Verification(rule.name, CANNOT_CHECK, sorted(ch.metadata)[0], cause=METADATA,
                            **common)  # type: ignore[arg-type]
    if ch.no_reference:
        return Verification(rule.name, CANNOT_CHECK, "no reference implementation that runs: "
                            + ", ".join(sorted(ch.no_reference)), cause=NO_REFERENCE,
                            **common)  # type: ignore[arg-type]
    if ch.declined:
        why = ch.declined.most_common(1)[0][0]
        return Verification(rule.name, CANNOT_CHECK, f"the generator could not make a case the rule "
                            f"accepts ({sum(ch.declined.values())} built; most often: {why})",
                            cause=NO_CASE, **common)  # type: ignore[arg-type]
    why = ch.not_a_case.most_common(1)[0][0] if ch.not_a_case else "no case was drawn"
    return Verification(rule.name, CANNOT_CHECK, f"the generator could not build the pattern's "
                        f"subgraph (most often: {why})", cause=NO_CASE, **common)  # type: ignore[arg-type]


#: how long proving a rule may take (its case structures are proved in turn until then), and
#: how long the solver may think about one structure
PROOF_SECONDS = 20.0
SOLVER_MS = 5000


def _floating(case: _Case) -> bool:
    return all(i.dtype.is_floating_point for i in case.inputs.values() if not i.constant)


def _exported_dynamic(program: torch.nn.Module, user: tuple[torch.Tensor, ...]) -> Any:
    """``program`` exported with every dim of its user inputs a symbol (``Dim.AUTO``: a dim of
    1 stays 1, export specialises it, as broadcasting needs), its notes about that silenced.
    Two dims of one size get two symbols (export does not share one between equal sizes): a
    square case proves its structure for every pair of sizes, unless the program's own ops
    need them equal (a view to drawn sizes: export then fixes or equates them)."""
    import logging

    from torch.export import Dim

    if not user:
        return torch.export.export(program, user, strict=False)
    spec = (tuple(tuple(Dim.AUTO for _ in x.shape) for x in user),)
    log = logging.getLogger("torch._export.non_strict_utils")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return torch.export.export(program, user, dynamic_shapes=spec, strict=False)
    finally:
        log.setLevel(level)


def _proof(rule: Rule, ch: _Checker, found: _Case | None) -> tuple[Proof, Counterexample | None]:
    """Prove the pattern's and the replacement's programs equal (:mod:`fusionkit.authoring.prove`)
    for each case structure the compared cases had (and the different case ``found``): each
    exported again with symbolic sizes and rewritten by the rule; where that fails, at the
    case's own sizes (for every value). A refutation is run as a case (:meth:`_Checker.differs`):
    the counterexample returned is that run's; one that does not reproduce is "not proved"."""
    missing = available()
    if missing is not None:
        return Proof(NOT_PROVED, missing), None
    cases = ([found] if found is not None else []) + list(ch.structures.values())
    if not cases:
        return Proof(NOT_PROVED, "no case was compared"), None
    made = ch.rewritten(cases[0])  # (cheap: already exported) an op outside the fragment ends it here
    if isinstance(made, str):
        return Proof(NOT_PROVED, f"the case was not rewritten: {made}"), None
    stated = _stated_meaning(rule, ch, made)
    if stated is not None:
        return Proof(NOT_PROVED, stated), None
    first = prove_equal(made[0], made[1], timeout_ms=SOLVER_MS)
    if first.outside:
        return Proof(NOT_PROVED, first.reason), None
    deadline = time.monotonic() + PROOF_SECONDS
    fixed: list[str] = []
    declined: list[str] = []
    pinned = 0  # structures whose program fixes or ties some of its dims > 1 (export did)
    ranks: set[int] = set()
    for n, case in enumerate(cases):
        if time.monotonic() > deadline:
            return Proof(NOT_PROVED, f"{n} of {len(cases)} case structures proved before the "
                         f"time allowed ({PROOF_SECONDS:g} s) ran out", (n, len(cases))), None
        made = ch.rewritten(case, dynamic=True)
        ranges = ch.ranges.get("dynamic " + case.key(), {})
        over_1 = sum(d > 1 for i in case.inputs.values() if not i.constant for d in i.shape)
        if not isinstance(made, str):
            pinned += len(ranges) < over_1
        else:  # the export or the rule failed on symbolic sizes
            made, ranges = ch.rewritten(case), {}
            fixed.append(", ".join(f"{k}{tuple(i.shape)}" for k, i in case.inputs.items() if not i.constant))
        if isinstance(made, str):
            return Proof(NOT_PROVED, f"a case was not rewritten: {made}", (n, len(cases))), None
        stated = _stated_meaning(rule, ch, made)
        if stated is not None:
            return Proof(NOT_PROVED, stated, (n, len(cases))), None
        out = prove_equal(made[0], made[1], ranges=ranges, timeout_ms=SOLVER_MS)
        if out.status == REFUTED:
            proof, cx = _refutation(ch, case, out, (n, len(cases)))
            if proof is not None:
                return proof, cx
            declined.append(", ".join(f"{k}{tuple(s)}" for k, s in zip(_Program(case).user, out.shapes,
                                                                          strict=False)))
        elif out.status != PROVED:
            return Proof(NOT_PROVED, out.reason, (n, len(cases))), None
        ranks.add(max((len(i.shape) for i in case.inputs.values()), default=0))
    rs = sorted(ranks)
    span = f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}"
    sizes = ("at the drawn sizes" if len(fixed) == len(cases)
             else "and every size >= 2 of the dims > 1")
    what = (f"for every user-input value {sizes}, on its {len(cases)} case "
            f"structure{'s' if len(cases) > 1 else ''} ({span}; its ops and literals as drawn; "
            "over the reals)")
    if fixed:
        shown = "; ".join(dict.fromkeys(fixed[:3]))
        what += (f"; {'each' if len(fixed) == len(cases) else f'{len(fixed)} of them'} at its drawn "
                 f"sizes only, as exported with symbolic sizes the rule did not rewrite it ({shown})")
    if pinned:
        what += (f"; in {pinned} of them the program itself fixes or ties some of those sizes "
                 "(a view to drawn sizes, a broadcast), which the proof keeps")
    if declined:
        what += (f"; where the replacement's value has the pattern's shape (fusionkit declines a "
                 f"rewrite whose shape differs, as it did at {declined[0]})")
    if found is not None:
        what += "; the sampled difference is one of floating point (rounding, overflow, NaN)"
    return Proof(PROVED, what, (len(cases), len(cases))), None


def _stated_meaning(rule: Rule, ch: _Checker, made: tuple[Any, Any]) -> str | None:
    """Why the graphs alone do not say what a case computes, where a backend states it
    elsewhere (node metadata it applies, a node's meaning in its program form, a kernel
    reference for an ATen op): the solver reads only the graph, so it does not prove these."""
    for gm in made:
        for n in gm.graph.nodes:
            keys = sorted(k for k in rule.semantics.metadata if n.meta.get(k) is not None)
            if keys:
                return (f"the replacement records what it computes in node metadata ({', '.join(keys)}) "
                        "that the backend applies; the solver reads the graph only")
            key = op_key(n.target) if n.op == "call_function" else None
            if key is not None and (key in ch.semantics or key in rule.semantics.kernel_references):
                return f"{key} runs as its backend states (a kernel reference or node semantics), not as its graph"
    return None


def _refutation(ch: _Checker, case: _Case, out: Any, structures: tuple[int, int]
                ) -> tuple[Proof | None, Counterexample | None]:
    """The solver's counterexample run as a case: refuted with the run's counterexample when
    the programs differ there, else not proved (the rule declines those sizes, or the
    difference is one of the real-number model's); None when only the shapes differed there
    and the rule declined it (fusionkit's own check of the replacement's shape)."""
    user = _Program(case).user
    inputs = dict(case.inputs)
    for name, shape, values in zip(user, out.shapes, out.values, strict=False):
        i = case.inputs[name]
        value = (torch.tensor(values, dtype=torch.float64) if values is not None
                 else torch.randn(shape, dtype=torch.float64))
        inputs[name] = _Input(name, tuple(shape), i.dtype, False, value.reshape(shape).to(i.dtype))
    trial = dataclasses.replace(case, inputs=inputs)
    sizes = ", ".join(f"{n}{tuple(s)}" for n, s in zip(user, out.shapes, strict=False))
    solver = {"shapes": {n: list(s) for n, s in zip(user, out.shapes, strict=False)},
              "index": list(out.index), "values": dict(zip(user, out.values, strict=False))}
    ch.last_difference = None
    if not ch.differs(trial) or ch.last_difference is None:
        made = ch.rewritten(trial)
        if out.shapes_differ and isinstance(made, str) and not made.startswith(_NOT_JUDGED):
            return None, None
        why = (made if isinstance(made, str) else "the programs agree when run (the difference is "
               "the real-number model's: an uninterpreted function, or a literal rounded in float)")
        return Proof(NOT_PROVED, f"the solver's counterexample ({sizes}) does not reproduce when run: "
                     f"{why}", structures, solver), None
    reason, worst, want, got = ch.last_difference
    d = trial.describe()
    cx = Counterexample(d["inputs"], d["literals"], tuple(d["ops"]), reason, worst,
                        _short(_single(want)), _short(_single(got)))
    return Proof(REFUTED, f"the solver found operands {sizes} where they differ (at output index "
                 f"{tuple(out.index)}); running them: {reason}", structures,
                 {**solver, "confirmed": reason}), cx


def _covered(ch: _Checker) -> str:
    """What the compared cases covered, in words: operand shapes, ranks, the dims > 1 of
    each operand, how many cases had distinct sizes, equal (square) sizes, broadcasting."""
    ranks = sorted(ch.ranks)
    span = (f"rank {ranks[0]}" if len(ranks) == 1 else
            f"ranks {ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1))
            else "ranks " + ", ".join(map(str, ranks)))
    over = "; ".join(f"{n} {', '.join(map(str, sorted(ds, reverse=True)))}" if ds else f"{n} none"
                     for n, ds in ch.over_1.items())
    kinds = ", ".join(f"{ch.styles[k]} {k}" for k in ("distinct", "square", "broadcast"))
    judged, total = ch.coverage()["variants"]
    variants = (f"; {judged} of {total} options of its hints and alternatives judged"
                if total else "")
    return (f"{len(ch.shapes)} operand shapes; {span}; dims > 1: {over}; {kinds}; "
            f"dtypes {', '.join(sorted(ch.dtypes))}{variants}")


def verify_rules(rules: Sequence[Rule], *, cases: int = 20, max_examples: int = 300, seed: int = 0,
                 hints: Mapping[str, OperandHint] | None = None, isolate: bool = True,
                 progress: Callable[[Rule], None] | None = None,
                 judges: Callable[[Rule], Mapping[str, Judge]] | None = None) -> list[Verification]:
    """:func:`verify` for each rule, in order: isolated, in one worker process for them all
    (restarted after a crash); ``progress(rule)`` before each; ``judges(rule)``: that rule's
    (:func:`verify`'s ``judges``), made in the worker."""
    def run(r: Rule) -> Callable[[], Verification]:
        return lambda: _verify(r, cases, max_examples, seed, hints,
                               None if judges is None else judges(r))

    if isolate and _can_isolate():
        return _isolated([r.name for r in rules], [run(r) for r in rules],
                         None if progress is None else lambda i: progress(rules[i]))
    out = []
    for r in rules:
        if progress is not None:
            progress(r)
        out.append(run(r)())
    return out
