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
  a user input or a constant), of a shape drawn around one base shape (the same
  shape, a suffix of it, ones in some dims, or any other rank-0..4 shape of sizes
  1..5), of a dtype a :class:`~fusionkit.check.constraints.DtypeIn` admits (else mostly
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
the functions a backend states its kernels compute (``register_kernel_reference``), inside
the context a backend states its ops need (``register_op_context``: the TOSA dialect's
``TosaLoweringContext``); an op with none makes the rule "cannot check" and is named. A
check that runs inside a backend's pipeline has the exported program put in that
pipeline's form first (``register_program_form``), and a node whose meaning there is in
its metadata runs through what the backend states it computes (``register_node_semantics``).

Results are compared per output with the tolerance of its dtype (:data:`TOLERANCES`):
``|got - expected| <= tol * (1 + |expected|)`` for floats, NaN equal to NaN; integer codes
within ``tol``; shapes and dtypes exactly.
"""

from __future__ import annotations

import contextlib
import copy
import math
import operator
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fusionkit.authoring.semantics import (
    FORM_NAMESPACES,
    KERNEL_REFERENCES,
    METADATA_SEMANTICS,
    MODULE_SCOPES,
    NODE_SEMANTICS,
    OP_CONTEXTS,
    OPERAND_HINTS,
    PROGRAM_FORMS,
    REFERENCE_IS_NOT_THE_KERNEL,
    OperandHint,
    Pick,
)
from fusionkit.check.constraints import (
    Custom,
    DtypeIn,
    GraphLeaf,
    PrepackableConstant,
    Rank,
    ScalarRange,
    UserInput,
)
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
from fusionkit.match.targets import _overload_of, op_key, resolve_op
from fusionkit.rule import Rule

__all__ = ["CHECK_HINTS", "TOLERANCES", "Counterexample", "OperandHint", "Verification", "verify",
           "verify_rules"]

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

#: op namespaces whose CPU kernels (ExecuTorch's C++ custom ops) abort the process on
#: operands they refuse, instead of raising: the verifier never runs them, only the kernel
#: reference a backend registered for one (``register_kernel_reference``)
UNSAFE_TO_RUN: tuple[str, ...] = ("llama.",)
UNSAFE_TO_RUN_WHY = "its C++ kernel aborts the process on operands it refuses"

#: node metadata that says where a node came from, not what it computes
_BOOKKEEPING_META = frozenset({"val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack",
                               "torch_fn", "from_node", "seq_nr", "original_aten", "debug_handle",
                               "fusionkit_rule", "fusionkit_folded_from", "requested_name",
                               "unbacked_bindings", "custom", "example_value",
                               # XNNPACK: a q/dq pair the partitioner folds into the quantized
                               # op next to it; the graph computes the pair itself
                               "IS_IMPLICIT_Q_DQ_TAG"})

EQUAL, DIFFERENT, CANNOT_CHECK = "equal", "different", "cannot check"


#: hints for the shipped rules' checks, by check name, then by the capture (a parameter of
#: the check) they make; :func:`verify`'s ``hints`` adds to them by capture name
CHECK_HINTS: dict[str, Mapping[str, OperandHint]] = {
    # a matmul whose weight is a transpose of a 2-D weight is a linear (addmm/mm -> linear)
    "transposed_weight": {"wt": OperandHint(producer="transpose")},
    # symmetric quantization: an all-zero constant zero point
    "weight_zero_points_zero": {"w_zp": OperandHint(constant=True, fill="zeros")},
    "symmetric_weight": {"zeros": OperandHint(constant=True, fill="zeros")},
    "zero_point_is_zero": {"zero_point": OperandHint(constant=True, fill="zeros")},
    # Arm's quantized activation: the relu / hardtanh reads a conv or a linear
    "fusable_input": {"pre": OperandHint(producer="linear")},
    # folded or prepacked at lowering time: constants
    "optional_affine_is_constant": {"bn_w": OperandHint(constant=True),
                                    "bn_b": OperandHint(constant=True)},
    "conv1d_with_constant_weight": {"w": OperandHint(constant=True)},
    "scale_is_a_constant_channel_scale": {"scale": OperandHint(constant=True)},
    # the weight-only linears' weight is [N, K], one scale per output channel
    "per_output_channel": {"weight": OperandHint(shapes=((2, 4), (3, 4), (1, 4)))},
    # _weight_int8pack_mm takes a 2-D input (K as the weights above)
    "int8pack_mm_input": {"x": OperandHint(shapes=((2, 4), (1, 4), (3, 4)))},
    # the 8-bit weight-only kernel takes weights whose values do not fit in 4 bits
    "values_beyond_4_bits": {"weight": OperandHint(fill="int8")},
    # Arm's hardtanh(0, hi) folded into a quantize whose qmax hi quantizes to: a bound far
    # enough to saturate at qmax for the drawn scales (0.25, 0.5), and one that does not
    "quantize_clamp": {"lo": OperandHint(values=(0.0,)), "hi": OperandHint(values=(1000.0, 6.0))},
    # a view that only drops size-1 dims needs an input that has some
    "drops_size1_dims": {"x": OperandHint(shapes=((2, 1, 3), (1, 4), (3, 1, 1, 2)))},
    # the Vulkan int8 linears load the input channels in texels of 4
    "in_channels_multiple_of_4": {"x": OperandHint(shapes=((2, 4), (1, 8), (3, 4)))},
    # XNNPACK's quantized pad: the pad reads a per-tensor dequantize
    "quantized_zero_pad": {"input": OperandHint(producer="dequantize_per_tensor")},
}


def _hints_of(rule: Rule, extra: Mapping[str, OperandHint] | None
              ) -> tuple[dict[str, OperandHint], list[Callable[[Pick], Mapping[str, OperandHint]]]]:
    """The hints for ``rule``'s checks (:data:`CHECK_HINTS`, then those backends registered,
    then ``extra``), and the functions that draw a check's hints jointly, once per case."""
    out: dict[str, OperandHint] = {}
    joint: list[Callable[[Pick], Mapping[str, OperandHint]]] = []
    for c in rule.constraints:
        if isinstance(c, Custom):
            for table in (CHECK_HINTS, OPERAND_HINTS):
                hints = table.get(c.name, {})
                if callable(hints):
                    joint.append(hints)
                    continue
                for capture, hint in hints.items():
                    if capture in c.reads:  # two checks' hints for one capture: both apply
                        out[capture] = _merged(out[capture], hint) if capture in out else hint
    for capture, hint in (extra or {}).items():
        out[capture] = _merged(out[capture], hint) if capture in out else hint
    return out, joint


def _merged(a: OperandHint, b: OperandHint) -> OperandHint:
    """``a`` with the fields ``b`` sets (``b`` wins where both do)."""
    import dataclasses

    unset = OperandHint()
    return dataclasses.replace(a, **{f.name: getattr(b, f.name) for f in dataclasses.fields(b)
                                     if getattr(b, f.name) != getattr(unset, f.name)})


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
    #: the module type the pattern's calls run inside (:data:`MODULE_SCOPES`), or None
    scope: Any = None

    def key(self) -> str:
        """The structure (not the values of user inputs): what export depends on."""
        ins = [(i.name, i.shape, str(i.dtype), i.constant,
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


def _shape_hint(key: str, index: int, before: list[Any], draw: Callable[[Any], Any]) -> tuple[int, ...] | None:
    """A shape for argument ``index`` of op ``key`` that fits the arguments ``before`` it
    (the weight of a convolution or a linear, a batch norm's statistics, a matmul's operand)."""
    from hypothesis import strategies as st

    x = before[0] if before and isinstance(before[0], torch.Tensor) else None
    prev = before[-1] if before and isinstance(before[-1], torch.Tensor) else None
    name = key.split(".")[1] if key.count(".") >= 2 else key
    if x is None:
        return None
    if name in ("convolution", "conv2d", "conv1d", "conv_with_clamp") and x.dim() in (3, 4):
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
    if name in ("convolution", "conv_with_clamp"):
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
        self.constant = {c.capture for c in rule.constraints if isinstance(c, PrepackableConstant)}
        self.leaf = {c.capture for c in rule.constraints if isinstance(c, (GraphLeaf, UserInput))}
        self.dtypes: dict[str, list[torch.dtype]] = {}
        self.ranks: dict[str, list[int]] = {}
        self.ranges: dict[str, list[float]] = {}
        for c in rule.constraints:
            if isinstance(c, DtypeIn):
                self.dtypes[c.capture] = sorted(c.dtypes, key=lambda d: (d != torch.float32, str(d)))
            elif isinstance(c, Rank):
                self.ranks[c.capture] = sorted(c.ranks)
            elif isinstance(c, ScalarRange):
                self.ranges[c.capture] = [b for b in (c.lo, c.hi) if b is not None]
        rank = draw(st.integers(1, 4))
        self.base = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
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
        st, draw = self.st, self.draw
        ranks = self.ranks.get(name)
        if self.context is not None:
            key, index, before = self.context
            hint = _shape_hint(key, index, before, draw)
            if hint is not None and (ranks is None or len(hint) in ranks) and draw(st.integers(0, 3)) < 3:
                return hint
        mode = draw(st.integers(0, 3))
        if mode == 0 and (ranks is None or len(self.base) in ranks):
            return self.base
        if mode == 1 and ranks is None:  # a suffix of the base shape (broadcasts)
            k = draw(st.integers(0, len(self.base)))
            return self.base[k:]
        if mode == 2 and (ranks is None or len(self.base) in ranks):  # ones in some dims
            ones = draw(st.lists(st.booleans(), min_size=len(self.base), max_size=len(self.base)))
            return tuple(1 if o else d for d, o in zip(self.base, ones, strict=True))
        rank = draw(st.sampled_from(ranks)) if ranks else draw(st.integers(0, 4))
        sizes = st.sampled_from(sorted(set(self.base) | {1})) | st.integers(1, 5)
        return tuple(draw(st.lists(sizes, min_size=rank, max_size=rank)))

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
        shape = draw(st.sampled_from(hint.shapes)) if hint.shapes else self._shape(name)
        if hint.producer is not None:
            return self._produced(name, hint.producer, shape)
        hinted = _dtype_hint(self.context[0], self.context[1]) if self.context is not None else None
        if hint.dtype is not None:
            dtype = hint.dtype
        elif name in self.dtypes:
            dtype = draw(st.sampled_from(self.dtypes[name]))
        elif hinted is not None and draw(st.integers(0, 3)) < 3:
            dtype = hinted
        else:
            dtype = self.dtype if draw(st.integers(0, 5)) < 5 else draw(st.sampled_from(_FREE_DTYPES))
        if hint.constant is not None:
            constant = hint.constant
        elif name in self.constant:
            constant = True
        elif name in self.leaf:
            constant = False
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
        if self.context is not None:
            pool.extend(_literal_hint(*self.context))
        if name is not None:
            pool.extend(self.ranges.get(name, ()))
        if kind == "ints" and self.context is not None:  # shapes and dims of the operand before
            before = self.context[2]
            x = before[0] if before and isinstance(before[0], torch.Tensor) else None
            if x is not None:
                pool.extend([list(x.shape), [*x.shape, 1], [1, *x.shape], [x.numel()],
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
        hinted = [h for h in (_literal_hint(*self.context) if self.context is not None else [])
                  if any(_same_literal(h, q) for q in pool)]
        if hinted_values:
            pool = [p for p in pool if any(_same_literal(p, h) for h in hinted_values)] or pool
        elif hinted and self.draw(self.st.integers(0, 3)) < 3:
            pool = hinted
        got = self.draw(self.st.sampled_from(pool))
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
        key = keys[self.draw(self.st.integers(0, len(keys) - 1))] if len(keys) > 1 else keys[0]
        if key.startswith(UNSAFE_TO_RUN) and key not in KERNEL_REFERENCES:
            raise _NotACase(f"{key} is not run on generated operands ({UNSAFE_TO_RUN_WHY})")
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
        reference = KERNEL_REFERENCES.get(key)  # what the backend's kernel computes
        try:
            out = (reference or target)(*real_args, **real_kwargs)
        except Exception as e:  # the drawn operands are not a case for this op
            raise _NotACase(f"{key}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        self.case.calls.append(call)
        index = len(self.case.calls) - 1
        self.values[index] = out
        return _Ref(index=index)


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


def _scope_of(rule: Rule) -> Any:
    """The module type a check of ``rule`` asks the pattern's ops to run in, or None."""
    return next((MODULE_SCOPES[c.name] for c in rule.constraints
                 if isinstance(c, Custom) and c.name in MODULE_SCOPES), None)


def _forms_of(rule: Rule) -> list[Callable[[Any], Any]]:
    """The program forms the checks of ``rule`` see (:data:`PROGRAM_FORMS`), in check order."""
    return [PROGRAM_FORMS[c.name] for c in rule.constraints
            if isinstance(c, Custom) and c.name in PROGRAM_FORMS]


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
    """Runs a graph module node by node, remembering the node that raised."""

    failed_at: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            key = (op_key(n.target) or "") if n.op == "call_function" else ""
            out = self._by_metadata(n, key)
            if out is not NotImplemented:
                pass
            elif (reference := KERNEL_REFERENCES.get(key)) is not None:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                out = reference(*args, **kwargs)
            else:
                out = super().run_node(n)
        except Exception:
            self.failed_at = n
            raise
        for meta_key, apply in METADATA_SEMANTICS.items():
            if n.meta.get(meta_key) is not None:
                out = apply(n.meta[meta_key], out)
        return out

    def _by_metadata(self, n: torch.fx.Node, key: str) -> Any:
        """What ``n`` computes by the semantics a backend registered for its op and metadata
        (:data:`NODE_SEMANTICS`), or ``NotImplemented``."""
        semantics = NODE_SEMANTICS.get(key)
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
            at = int((wf != gf).nonzero()[0][0]) if wd.dim() else 0
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


def _no_reference(gm: torch.fx.GraphModule) -> list[str]:
    """Ops in ``gm`` that torch has no implementation to run on the CPU for."""
    missing: list[str] = []
    for n in gm.graph.nodes:
        # (an edge-dialect op object, as a program form gives it, is the op it wraps)
        overload = _overload_of(n.target) if n.op == "call_function" else None
        if overload is None:
            continue
        name = overload.name()
        if op_key(n.target) in KERNEL_REFERENCES:
            continue
        if (op_key(n.target) or "").startswith(UNSAFE_TO_RUN):
            missing.append(f"{op_key(n.target)} ({UNSAFE_TO_RUN_WHY})")
        elif op_key(n.target) in REFERENCE_IS_NOT_THE_KERNEL:
            missing.append(f"{op_key(n.target)} ({REFERENCE_IS_NOT_THE_KERNEL[str(op_key(n.target))]})")
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

    @property
    def ok(self) -> bool:
        return self.status == EQUAL

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "status": self.status, "reason": self.reason, "cases": self.cases,
                "shapes": list(self.shapes), "dtypes": list(self.dtypes), "declined": dict(self.declined),
                "counterexample": self.counterexample.to_dict() if self.counterexample else None,
                "no_reference": list(self.no_reference), "seconds": round(self.seconds, 2),
                "tolerances": {str(k).removeprefix("torch."): v for k, v in TOLERANCES.items()}}

    def summary(self) -> str:
        """One line: the rule, the verdict and why."""
        return f"{self.rule}: {self.status} - {self.reason}"

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
    from fusionkit.check.executable import Delegate, ExecutionTarget

    return ExecutionTarget([Delegate("torch (fusionkit.verify runs the program eagerly)",
                                     lambda node: None, frozenset({"aten"}) | namespaces)])


class _Checker:
    """Runs drawn cases: export (memoised by structure), rewrite, evaluate, compare."""

    def __init__(self, rule: Rule, cases: int) -> None:
        self.rule = rule
        self.target = _eager_target(_context_namespaces(rule))
        self.forms = _forms_of(rule)
        self.want = cases
        self.compared = 0
        self.shapes: set[str] = set()
        self.dtypes: set[str] = set()
        self.declined: Counter[str] = Counter()
        self.not_a_case: Counter[str] = Counter()
        self.no_reference: set[str] = set()
        #: why a rewritten program cannot be judged by running it (semantics in node metadata)
        self.metadata: set[str] = set()
        self.exported: dict[str, Any] = {}
        #: the initial buffers of each exported module (by id), restored before each run
        self.buffers: dict[int, dict[str, torch.Tensor]] = {}
        self.last_difference: tuple[str, float, Any, Any] | None = None
        #: the first case found different (what is reported if shrinking cannot replay it)
        self.first_difference: _Case | None = None

    def rewritten(self, case: _Case) -> tuple[Any, Any] | str:
        """(the exported pattern, the rewritten program) or why the rule did not fuse it."""
        key = case.key()
        if key in self.exported:
            return self.exported[key]  # type: ignore[no-any-return]
        from fusionkit.fusion_pass import FusionPass
        from fusionkit.match.finder import find_matches

        program = _Program(case)
        user = tuple(case.inputs[n].value for n in program.user)
        try:
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
        ms = find_matches(rewritten, [self.rule], target=self.target)
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
            fuse = FusionPass([self.rule], name=f"verify:{self.rule.name}", target=self.target)
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
                    - set(METADATA_SEMANTICS))
        if recorded:  # e.g. XNNPACK's fused activation: the graph alone does not say the result
            got = (f"the replacement records {', '.join(sorted(recorded))} in node metadata for "
                   "the backend to apply; the graph alone does not compute the result")
            self.metadata.add(got)
        self.exported[key] = got
        return got

    def differs(self, case: _Case) -> bool:
        """Whether this case is a counterexample; counts what it was."""
        made = self.rewritten(case)
        if isinstance(made, str):
            if made not in self.metadata:
                self.declined[made] += 1
            return False
        pattern_gm, gm = made
        missing = _no_reference(gm)
        if missing:
            self.no_reference.update(missing)
            return False
        user = tuple(case.inputs[n].value.clone() for n in _Program(case).user)
        for m in made:  # each run starts from the initial state (caches written in place)
            for n, b in m.named_buffers():
                b.copy_(self.buffers[id(m)][n])
        want = _Runner(pattern_gm).run(*user)  # (its backend ops as their kernels compute)
        runner = _Runner(gm)
        try:
            got = runner.run(*user)
        except Exception as e:
            message = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            key = op_key(runner.failed_at.target) if runner.failed_at is not None else None
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
        self.shapes.add(", ".join(f"{n}{tuple(i.shape)}" for n, i in case.inputs.items()))
        self.dtypes.update(str(i.dtype).removeprefix("torch.") for i in case.inputs.values())
        return False

    @property
    def done(self) -> bool:
        """Enough cases compared equal (never once a difference was seen: it is being shrunk)."""
        return self.compared >= self.want and self.first_difference is None


def verify(rule: Rule, *, cases: int = 20, max_examples: int = 300, seed: int = 0,
           hints: Mapping[str, OperandHint] | None = None) -> Verification:
    """Whether ``rule``'s replacement computes what its pattern computes.

    Draws operands the rule's constraints admit (several shapes and dtypes, the
    bounds of its literals), lets the rule rewrite the pattern's own subgraph and
    compares both programs' results, until ``cases`` cases compared equal or
    ``max_examples`` were drawn. A difference is shrunk to the smallest
    counterexample (hypothesis). ``status`` is ``"equal"``, ``"different"`` or
    ``"cannot check"`` (no drawn case was accepted by the rule, or an op of the
    replacement has no reference implementation; ``reason`` says which).

    ``hints`` (capture name -> :class:`OperandHint`) tell the generator how to make
    operands a ``Custom`` check asks for; the shipped checks' are in :data:`CHECK_HINTS`.
    """
    try:
        from hypothesis import HealthCheck, Phase, find, settings
        from hypothesis import strategies as st
        from hypothesis.errors import NoSuchExample
    except ImportError as e:  # pragma: no cover - hypothesis is installed with fusionkit's dev extra
        raise ImportError("fusionkit.verify draws its cases with hypothesis: pip install hypothesis") from e

    started = time.monotonic()
    checker = _Checker(rule, cases)
    operand_hints, joint_hints = _hints_of(rule, hints)
    scope = _scope_of(rule)

    @st.composite
    def case(draw: Any) -> _Case:
        case_hints = dict(operand_hints)
        for joint in joint_hints:  # drawn first: the sizes the other operands must agree with
            for capture, hint in joint(lambda options: draw(st.sampled_from(list(options)))).items():
                case_hints[capture] = _merged(case_hints[capture], hint) if capture in case_hints else hint
        for capture, hint in (hints or {}).items():  # the caller's own win
            case_hints[capture] = _merged(case_hints[capture], hint) if capture in case_hints else hint
        b = _Builder(rule, draw, case_hints)
        b.case.scope = scope
        try:
            first = b.build(rule.pattern)
        except _NotACase as e:
            return _Case(literals={"__not_a_case__": str(e)})
        except Exception as e:  # operands no op was given yet (a negative size): not a case
            return _Case(literals={"__not_a_case__": f"{type(e).__name__}: {str(e)[:200]}"})
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
    with _op_contexts(rule):
        try:
            with _seeded(seed):
                found = find(case(), condition, settings=config)
        except NoSuchExample:
            found = None
        except Exception:  # hypothesis could not replay the shrinking (a flaky comparison)
            found = checker.first_difference
        return _verdict(rule, checker, found, time.monotonic() - started)


def _op_keys(p: Pattern) -> set[str]:
    """The op keys anywhere in pattern ``p`` (each sub-pattern's root ops)."""
    keys = set(p.root_keys() or ())
    for child in p.children():
        keys |= _op_keys(child)
    return keys


def _context_namespaces(rule: Rule) -> frozenset[str]:
    """The namespaces of ``rule``'s ops, and of the ops its checks' program forms hold
    (:data:`FORM_NAMESPACES`), whose backend registered a context to run them in."""
    held = {ns for c in rule.constraints if isinstance(c, Custom)
            for ns in FORM_NAMESPACES.get(c.name, ())}
    return frozenset(({k.split(".")[0] for k in _op_keys(rule.pattern)} | held) & set(OP_CONTEXTS))


def _op_contexts(rule: Rule) -> contextlib.ExitStack:
    """The contexts backends registered for the namespaces of ``rule``'s ops
    (:data:`~fusionkit.authoring.semantics.OP_CONTEXTS`), entered together."""
    stack = contextlib.ExitStack()
    for ns in sorted(_context_namespaces(rule)):
        stack.enter_context(OP_CONTEXTS[ns]())
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
    common = dict(cases=ch.compared, shapes=tuple(sorted(ch.shapes)), dtypes=tuple(sorted(ch.dtypes)),
                  declined=dict(ch.declined.most_common(5)), no_reference=tuple(sorted(ch.no_reference)),
                  seconds=seconds)
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
        sizes = len(ch.shapes)
        skipped = (f"; cases through {', '.join(sorted(ch.no_reference))} not judged"
                   if ch.no_reference else "")
        return Verification(rule.name, EQUAL, f"equal on {ch.compared} cases ({sizes} operand shapes; "
                            f"dtypes {', '.join(sorted(ch.dtypes))}){skipped}",
                            **common)  # type: ignore[arg-type]
    if ch.metadata:
        return Verification(rule.name, CANNOT_CHECK, sorted(ch.metadata)[0], **common)  # type: ignore[arg-type]
    if ch.no_reference:
        return Verification(rule.name, CANNOT_CHECK, "no reference implementation that runs: "
                            + ", ".join(sorted(ch.no_reference)), **common)  # type: ignore[arg-type]
    if ch.declined:
        why = ch.declined.most_common(1)[0][0]
        return Verification(rule.name, CANNOT_CHECK, f"the generator could not make a case the rule "
                            f"accepts ({sum(ch.declined.values())} built; most often: {why})",
                            **common)  # type: ignore[arg-type]
    why = ch.not_a_case.most_common(1)[0][0] if ch.not_a_case else "no case was drawn"
    return Verification(rule.name, CANNOT_CHECK, f"the generator could not build the pattern's "
                        f"subgraph (most often: {why})", **common)  # type: ignore[arg-type]


def verify_rules(rules: Sequence[Rule], **options: Any) -> list[Verification]:
    """:func:`verify` for each rule, in order."""
    return [verify(r, **options) for r in rules]
