"""Proving two small programs equal with an SMT solver, for every value (and every size).

:func:`~fusionkit.authoring.verify.verify` samples: "equal on 20 cases" says nothing of the
21st. Where a rule's pattern and replacement are built only from elementwise, broadcast
and layout ops, equality can be decided instead (as TensorRight does for XLA's rewrites):
each tensor is read as a *shape* (a tuple of integer terms, fresh solver variables for the
sizes a program leaves symbolic) and an *element function* (an index tuple of integer
terms -> a term), and the solver is asked for sizes, an in-bounds index and input values
where the two programs differ. None exists (unsat): proved. One exists (sat): a
counterexample the caller confirms by running it. The solver gave up: not proved.

What a proof covers, exactly (and only):

* the two graph modules given (the caller's programs for one case structure: its ops,
  its literals, its ranks, which dims are 1), for **every** value of their user inputs and
  constants of more than :data:`CONCRETE_CONSTANT` elements (uninterpreted functions), and
  for every size of the symbolic dims within the ranges the caller gives (the sizes the
  program fixes stay fixed);
* over the **real numbers**: floating-point rounding, overflow, NaN and infinities are not
  modelled; a float-to-float cast is the identity; an op with no closed real form (sigmoid,
  exp, sqrt, ...) is an uninterpreted function, the same one in both programs, so the proof
  holds for any function there (``silu(x)`` is ``x * sigmoid(x)``, ``rsqrt(x)`` is
  ``1 / sqrt(x)``).

Anything else (a convolution, a reduction, a quantize op, a backend's op) has no symbolic
form here: :class:`NotInFragment` names it, and the answer is "not proved".
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch

from fusionkit.targets import op_key

__all__ = ["CONCRETE_CONSTANT", "NOT_PROVED", "PROVED", "REFUTED", "NotInFragment", "Outcome", "Proof",
           "available", "prove_equal", "ranges_of"]

PROVED, REFUTED, NOT_PROVED = "proved", "refuted", "not proved"

#: a constant tensor of at most this many elements is read by its values (a folded scale,
#: a scalar tensor); a larger one is an uninterpreted function of its index, the same in
#: both programs only where both read the same tensor
CONCRETE_CONSTANT = 64


class NotInFragment(Exception):
    """The programs use an op (or an argument) with no symbolic form here."""


def available() -> str | None:
    """None when the solver can be imported, else why not (z3 is an optional dependency)."""
    try:
        import z3  # noqa: F401
    except ImportError:
        return "z3-solver not installed (pip install 'fusionkit[prove]')"
    return None


@dataclass(frozen=True)
class Outcome:
    """What the solver said of two programs: ``status`` (:data:`PROVED`, :data:`REFUTED`,
    :data:`NOT_PROVED`), ``reason`` (for not proved) and, when refuted, a model: the sizes of
    the symbolic dims, each user input's shape and values, the differing index."""

    status: str
    reason: str = ""
    sizes: Mapping[str, int] = field(default_factory=dict)
    shapes: tuple[tuple[int, ...], ...] = ()
    values: tuple[Any, ...] = ()  # one nested list per user input (None: too large to list)
    index: tuple[int, ...] = ()
    #: for not proved: the programs use an op or argument with no symbolic form (rather
    #: than the solver giving up)
    outside: bool = False
    #: for refuted: the outputs' shapes differ at these sizes (their elements agree wherever
    #: the shapes do)
    shapes_differ: bool = False


@dataclass(frozen=True)
class Proof:
    """What proving said of a rule (:attr:`Verification.proof
    <fusionkit.authoring.verify.Verification.proof>`): ``status`` (:data:`PROVED`,
    :data:`REFUTED`, :data:`NOT_PROVED`), ``reason`` (what the proof covers, or why there is
    none), ``structures`` (the case structures proved, and how many the compared cases had),
    ``counterexample`` (refuted: the solver's sizes, input values and index, and what running
    that case gave)."""

    status: str
    reason: str
    structures: tuple[int, int] = (0, 0)
    counterexample: Mapping[str, Any] | None = None

    @property
    def proved(self) -> bool:
        return self.status == PROVED

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "structures": list(self.structures),
                "counterexample": dict(self.counterexample) if self.counterexample else None}

    def __str__(self) -> str:
        return f"{self.status} {self.reason}" if self.status == PROVED else f"{self.status}: {self.reason}"


# ------------------------------------------------------------------ symbolic tensors


@dataclass
class _T:
    """A symbolic tensor: its sizes (ints or solver integer terms), its element at an index
    (a tuple of integer terms, one per dim) and whether elements are booleans."""

    shape: tuple[Any, ...]
    at: Callable[[tuple[Any, ...]], Any]
    boolean: bool = False
    floating: bool = True


class _Ctx:
    """The solver's vocabulary shared by both programs: one uninterpreted function per op
    without a closed form (so ``sigmoid`` means the same in both), one per input tensor."""

    def __init__(self, z3: Any, ranges: Mapping[str, tuple[int, int | None]]) -> None:
        self.z3 = z3
        self.ranges = dict(ranges)
        self.syms: dict[str, Any] = {}
        self.funcs: dict[str, Any] = {}
        self.constants: dict[Any, Any] = {}
        #: conditions a program needs to run (a broadcast's equal sizes, a view's element
        #: count): assumed for the pattern's program, owed by the replacement's
        self.requires: list[Any] = []

    # -- integers (sizes, indices)

    def sym(self, name: str) -> Any:
        if name not in self.syms:
            self.syms[name] = self.z3.Int(name)
        return self.syms[name]

    def size(self, v: Any) -> Any:
        """A size or index argument as an int or an integer term."""
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return v
        if isinstance(v, torch.SymInt):
            return self.expr(v.node.expr)
        if self.z3.is_expr(v):
            return v
        raise NotInFragment(f"a size argument {v!r}")

    def expr(self, e: Any) -> Any:
        """A sympy size expression (export's symbols) as an integer term."""
        import sympy

        if isinstance(e, (int, sympy.Integer)):
            return int(e)
        if isinstance(e, sympy.Symbol):
            return self.sym(str(e))
        if isinstance(e, sympy.Add):
            out = 0
            for a in e.args:
                out = out + self.expr(a)
            return out
        if isinstance(e, sympy.Mul):
            out = 1
            for a in e.args:
                out = out * self.expr(a)
            return out
        name = type(e).__name__
        if name in ("FloorDiv", "CleanDiv", "IntTrueDiv") and len(e.args) == 2:
            return self.expr(e.args[0]) / self.expr(e.args[1])
        if name in ("Mod", "PythonMod") and len(e.args) == 2:
            return self.expr(e.args[0]) % self.expr(e.args[1])
        raise NotInFragment(f"the size expression {e}")

    # -- reals (elements)

    def real(self, v: Any) -> Any:
        z3 = self.z3
        if isinstance(v, bool):
            return z3.RealVal(int(v))
        if isinstance(v, int):
            return z3.RealVal(v)
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise NotInFragment(f"the literal {v} (NaN and infinities are not modelled)")
            return z3.RealVal(Fraction(v))
        if z3.is_expr(v):
            return z3.ToReal(v) if z3.is_int(v) else v
        raise NotInFragment(f"a scalar argument {v!r}")

    def func(self, name: str, arity: int = 1) -> Any:
        if name not in self.funcs:
            self.funcs[name] = self.z3.Function(name, *([self.z3.RealSort()] * (arity + 1)))
        return self.funcs[name]

    def tensor_input(self, name: str, shape: tuple[Any, ...], boolean: bool, floating: bool) -> _T:
        z3 = self.z3
        out_sort = z3.BoolSort() if boolean else z3.RealSort()
        if not shape:
            c = z3.Const(name, out_sort)
            return _T((), lambda i: c, boolean, floating)
        f = z3.Function(name, *([z3.IntSort()] * len(shape)), out_sort)
        return _T(shape, lambda i: f(*i), boolean, floating)

    def constant(self, key: Any, t: torch.Tensor) -> _T:
        """A constant tensor: by its values when small, else an uninterpreted function (one
        per distinct tensor, shared by both programs)."""
        shape = tuple(int(d) for d in t.shape)
        boolean = t.dtype == torch.bool
        if t.numel() > CONCRETE_CONSTANT:
            if t.is_floating_point() and bool(torch.isnan(t).any()):
                raise NotInFragment("a constant with NaN")
            ident = (shape, str(t.dtype), hash(t.detach().cpu().contiguous().numpy().tobytes()))
            if ident not in self.constants:
                self.constants[ident] = self.tensor_input(f"const{len(self.constants)}", shape,
                                                          boolean, t.is_floating_point())
            return self.constants[ident]  # type: ignore[no-any-return]
        flat = [self._value(v, boolean) for v in t.detach().flatten().tolist()]
        strides = [1] * len(shape)
        for k in range(len(shape) - 2, -1, -1):
            strides[k] = strides[k + 1] * shape[k + 1]

        def at(i: tuple[Any, ...]) -> Any:
            if not flat:
                return self._value(0, boolean)
            f = sum((i[k] * strides[k] for k in range(len(shape))), start=0)
            out = flat[-1]
            for j in range(len(flat) - 2, -1, -1):
                out = self.z3.If(f == j, flat[j], out)
            return out

        return _T(shape, at, boolean, t.is_floating_point())

    def _value(self, v: Any, boolean: bool) -> Any:
        return self.z3.BoolVal(bool(v)) if boolean else self.real(v)


# ------------------------------------------------------------ helpers on sizes


def _is(d: Any, n: int) -> bool:
    return isinstance(d, int) and d == n


def _norm(d: int, rank: int) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise NotInFragment(f"dim {d} of a rank-{rank} tensor")
    return d + rank if d < 0 else d


def _same(z3: Any, a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(z3.is_true(z3.simplify(_int(z3, a) == _int(z3, b))))


def _int(z3: Any, v: Any) -> Any:
    return z3.IntVal(v) if isinstance(v, int) else v


def _min(z3: Any, a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return z3.If(_int(z3, a) <= _int(z3, b), a, b)


def _max(z3: Any, a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return z3.If(_int(z3, a) >= _int(z3, b), a, b)


def _numel(shape: Sequence[Any]) -> Any:
    out: Any = 1
    for d in shape:
        out = out * d
    return out


# ------------------------------------------------------------------ the ops


def _as_real(ctx: _Ctx, v: Any) -> Any:
    return ctx.z3.If(v, ctx.z3.RealVal(1), ctx.z3.RealVal(0)) if ctx.z3.is_bool(v) else v


def _as_bool(ctx: _Ctx, v: Any) -> Any:
    return v if ctx.z3.is_bool(v) else v != 0


def _tensor(ctx: _Ctx, v: Any) -> _T:
    """An operand as a symbolic tensor (a number is a rank-0 one)."""
    if isinstance(v, _T):
        return v
    if v is None:
        raise NotInFragment("a missing operand")
    if isinstance(v, bool):
        b = ctx.z3.BoolVal(v)
        return _T((), lambda i: b, True, False)
    c = ctx.real(v)
    return _T((), lambda i: c, False, isinstance(v, float))


def _broadcast(ctx: _Ctx, ts: Sequence[_T]) -> tuple[Any, ...]:
    rank = max(len(t.shape) for t in ts)
    out: list[Any] = []
    for k in range(rank):
        sizes = [t.shape[len(t.shape) - rank + k] for t in ts if len(t.shape) - rank + k >= 0]
        size: Any = 1
        for s in sizes:
            if _is(s, 1):
                continue
            if _is(size, 1):
                size = s
            elif not _same(ctx.z3, size, s):
                ctx.requires.append(_int(ctx.z3, size) == _int(ctx.z3, s))
        out.append(size)
    return tuple(out)


def _read(t: _T, shape: tuple[Any, ...], i: tuple[Any, ...]) -> Any:
    """``t``'s element at index ``i`` of the broadcast ``shape``."""
    lead = len(shape) - len(t.shape)
    return t.at(tuple(0 if _is(d, 1) and not _is(shape[lead + k], 1) else i[lead + k]
                      for k, d in enumerate(t.shape)))


def _map(ctx: _Ctx, fn: Callable[..., Any], operands: Sequence[Any], *, boolean: bool = False,
         reals: bool = True) -> _T:
    """An elementwise op of broadcast operands; ``reals``: booleans read as 0/1."""
    ts = [_tensor(ctx, v) for v in operands]
    shape = _broadcast(ctx, ts)

    def at(i: tuple[Any, ...]) -> Any:
        vals = [_read(t, shape, i) for t in ts]
        return fn(*[_as_real(ctx, v) if reals else v for v in vals])

    floating = any(t.floating for t in ts if isinstance(t, _T))
    return _T(shape, at, boolean, floating)


def _clamp(ctx: _Ctx, x: Any, lo: Any, hi: Any) -> _T:
    z3 = ctx.z3

    def bound(b: Any) -> Any:
        if b is None or (isinstance(b, float) and b in (float("inf"), float("-inf"))):
            return None
        return b

    lo, hi = bound(lo), bound(hi)
    ops = [x] + [b for b in (lo, hi) if b is not None]

    def fn(v: Any, *bs: Any) -> Any:
        bs_ = list(bs)
        if lo is not None:
            b = bs_.pop(0)
            v = z3.If(v < b, b, v)
        if hi is not None:
            b = bs_.pop(0)
            v = z3.If(v > b, b, v)
        return v

    return _map(ctx, fn, ops)


def _uf(ctx: _Ctx, name: str) -> Callable[[Any], Any]:
    return ctx.func(name)  # type: ignore[no-any-return]


#: ops without a closed real form: an uninterpreted function of one real, applied elementwise
_OPAQUE_UNARY = frozenset({"sigmoid", "tanh", "exp", "expm1", "log", "log1p", "log2", "sqrt",
                           "sin", "cos", "erf", "atan", "asin", "acos", "sinh", "cosh", "floor",
                           "ceil", "round", "trunc", "sign"})

#: ops that copy their first operand (a float-to-float cast too: rounding is not modelled)
_COPIES = frozenset({"clone", "_clone_dim_order", "alias", "alias_copy", "detach", "detach_copy", "lift_fresh_copy",
                     "contiguous", "_assert_tensor_metadata", "dropout"})

_COMPARE = {"gt": operator.gt, "lt": operator.lt, "ge": operator.ge, "le": operator.le,
            "eq": operator.eq, "ne": operator.ne}


def _elementwise(ctx: _Ctx, name: str, args: list[Any], kwargs: dict[str, Any]) -> _T | None:
    """The elementwise op ``name`` (an ATen name without overload), or None if it is not one."""
    z3 = ctx.z3
    a = args + [None] * 4

    def kw(k: str, pos: int, default: Any) -> Any:
        if k in kwargs:
            return kwargs[k]
        return args[pos] if len(args) > pos else default

    if name in ("add", "sub"):
        alpha = kw("alpha", 2, 1)
        al = ctx.real(alpha)
        sign = 1 if name == "add" else -1
        return _map(ctx, lambda x, y: x + sign * (y if alpha == 1 else al * y), a[:2])
    if name == "rsub":
        al = ctx.real(kw("alpha", 2, 1))
        return _map(ctx, lambda x, y: y - al * x, a[:2])
    if name == "mul":
        return _map(ctx, lambda x, y: x * y, a[:2])
    if name == "div":
        if kw("rounding_mode", 2, None) is not None:
            raise NotInFragment(f"div with rounding_mode={kw('rounding_mode', 2, None)!r}")
        return _map(ctx, lambda x, y: x / y, a[:2])
    if name == "neg":
        return _map(ctx, lambda x: -x, a[:1])
    if name == "reciprocal":
        return _map(ctx, lambda x: 1 / x, a[:1])
    if name == "square":
        return _map(ctx, lambda x: x * x, a[:1])
    if name == "abs":
        return _map(ctx, lambda x: z3.If(x >= 0, x, -x), a[:1])
    if name == "relu":
        return _map(ctx, lambda x: z3.If(x > 0, x, 0), a[:1])
    if name in ("clamp", "clip"):
        return _clamp(ctx, a[0], kw("min", 1, None), kw("max", 2, None))
    if name == "clamp_min":
        return _clamp(ctx, a[0], a[1], None)
    if name == "clamp_max":
        return _clamp(ctx, a[0], None, a[1])
    if name == "hardtanh":
        return _clamp(ctx, a[0], kw("min_val", 1, -1.0), kw("max_val", 2, 1.0))
    if name == "relu6":
        return _clamp(ctx, a[0], 0.0, 6.0)
    if name == "hardsigmoid":
        return _map(ctx, lambda x: z3.If(x + 3 < 0, 0, z3.If(x + 3 > 6, 6, x + 3)) / 6, a[:1])
    if name == "hardswish":
        return _map(ctx, lambda x: x * z3.If(x + 3 < 0, 0, z3.If(x + 3 > 6, 6, x + 3)) / 6, a[:1])
    if name == "leaky_relu":
        slope = ctx.real(kw("negative_slope", 1, 0.01))
        return _map(ctx, lambda x: z3.If(x > 0, x, x * slope), a[:1])
    if name in ("maximum", "fmax"):
        return _map(ctx, lambda x, y: z3.If(x >= y, x, y), a[:2])
    if name in ("minimum", "fmin"):
        return _map(ctx, lambda x, y: z3.If(x <= y, x, y), a[:2])
    if name == "where":
        cond, x, y = (_tensor(ctx, v) for v in a[:3])
        return _map(ctx, lambda c, u, v: z3.If(_as_bool(ctx, c), _as_real(ctx, u), _as_real(ctx, v)),
                    [cond, x, y], reals=False)
    if name in _COMPARE:
        cmp = _COMPARE[name]
        return _map(ctx, lambda x, y: cmp(x, y), a[:2], boolean=True)
    if name == "logical_not":
        return _map(ctx, lambda x: z3.Not(_as_bool(ctx, x)), a[:1], boolean=True, reals=False)
    if name in ("logical_and", "logical_or", "logical_xor"):
        fn = {"logical_and": z3.And, "logical_or": z3.Or, "logical_xor": z3.Xor}[name]
        return _map(ctx, lambda x, y: fn(_as_bool(ctx, x), _as_bool(ctx, y)), a[:2], boolean=True,
                    reals=False)
    if name == "silu":  # silu(x) := x * sigmoid(x), torch's definition
        sig = _uf(ctx, "sigmoid")
        return _map(ctx, lambda x: x * sig(x), a[:1])
    if name == "rsqrt":  # rsqrt(x) := 1 / sqrt(x)
        sq = _uf(ctx, "sqrt")
        return _map(ctx, lambda x: 1 / sq(x), a[:1])
    if name == "gelu":
        f = _uf(ctx, f"gelu_{kw('approximate', 1, 'none')}")
        return _map(ctx, lambda x: f(x), a[:1])
    if name == "pow" and not isinstance(a[1], _T):
        e = a[1]
        if e == 1:
            return _map(ctx, lambda x: x, a[:1])
        if e == 2:
            return _map(ctx, lambda x: x * x, a[:1])
        if e == 0.5:
            sq = _uf(ctx, "sqrt")
            return _map(ctx, lambda x: sq(x), a[:1])
        f = _uf(ctx, f"pow_{e!r}")
        return _map(ctx, lambda x: f(x), a[:1])
    if name == "pow":  # a tensor exponent: one uninterpreted function of two reals
        f2 = ctx.func("pow", 2)
        return _map(ctx, lambda x, y: f2(x, y), a[:2])
    if name in _OPAQUE_UNARY:
        f = _uf(ctx, name)
        return _map(ctx, lambda x: f(x), a[:1])
    return None


def _copy(ctx: _Ctx, name: str, args: list[Any], kwargs: dict[str, Any]) -> _T | None:
    """An op that copies its operand (clone, a cast), or None."""
    if name in _COPIES:
        if name == "dropout" and (kwargs.get("train", args[2] if len(args) > 2 else False)):
            raise NotInFragment("dropout in training mode")
        return _tensor(ctx, args[0])
    if name == "copy":  # copy(self, src): src broadcast into self's shape and dtype
        dst, src = _tensor(ctx, args[0]), _tensor(ctx, args[1])
        if not dst.floating and src.floating:
            raise NotInFragment("copy of a float into an integer tensor (rounding is not modelled)")
        if len(src.shape) > len(dst.shape):
            raise NotInFragment("copy of a tensor of a higher rank")
        _broadcast(ctx, [dst, src])  # (what it needs: sizes that broadcast)
        return _T(dst.shape, lambda i: _read(src, dst.shape, i), dst.boolean, dst.floating)
    if name in ("_to_copy", "to", "_to_dim_order_copy"):
        x = _tensor(ctx, args[0])
        dtype = kwargs.get("dtype")
        if dtype is None:
            return x
        if dtype == torch.bool:
            if x.boolean:
                return x
            raise NotInFragment(f"{name} to bool")
        if dtype.is_floating_point:
            return _T(x.shape, lambda i: _as_real(ctx, x.at(i)), False, True)
        if not x.floating:  # an integer or a bool to an integer: exact
            return _T(x.shape, lambda i: _as_real(ctx, x.at(i)), False, False)
        raise NotInFragment(f"{name} from a float to {dtype} (rounding is not modelled)")
    return None


def _layout(ctx: _Ctx, name: str, args: list[Any], kwargs: dict[str, Any]) -> _T | None:
    """A layout op: the element at an output index is the input's at a mapped index."""
    z3 = ctx.z3
    base = name.removesuffix("_copy")
    if base not in ("permute", "transpose", "t", "unsqueeze", "squeeze", "expand", "slice", "select",
                    "cat", "view", "reshape", "_unsafe_view", "flatten", "unflatten"):
        return None
    if base == "cat":
        return _cat(ctx, [_tensor(ctx, t) for t in args[0]], kwargs.get("dim", args[1] if len(args) > 1 else 0))
    x = _tensor(ctx, args[0])
    r = len(x.shape)

    def same(shape: tuple[Any, ...], at: Callable[[tuple[Any, ...]], Any]) -> _T:
        return _T(tuple(shape), at, x.boolean, x.floating)

    if base in ("permute", "transpose", "t"):
        if base == "permute":
            dims = [_norm(d, r) for d in args[1]]
        elif base == "t":
            dims = [1, 0] if r == 2 else list(range(r))
        else:
            d0, d1 = _norm(args[1], r), _norm(args[2], r)
            dims = list(range(r))
            dims[d0], dims[d1] = dims[d1], dims[d0]
        if sorted(dims) != list(range(r)):
            raise NotInFragment(f"permute by {dims}")

        def permuted(i: tuple[Any, ...]) -> Any:
            j: list[Any] = [0] * r
            for k, d in enumerate(dims):
                j[d] = i[k]
            return x.at(tuple(j))

        return same(tuple(x.shape[d] for d in dims), permuted)
    if base == "unsqueeze":
        d = _norm(args[1], r + 1)
        return same((*x.shape[:d], 1, *x.shape[d:]), lambda i: x.at(i[:d] + i[d + 1:]))
    if base == "squeeze":
        dims_arg = args[1] if len(args) > 1 else kwargs.get("dim")
        if dims_arg is None:
            dims = list(range(r))
        elif isinstance(dims_arg, (list, tuple)):
            dims = [_norm(d, r) for d in dims_arg]
        else:
            dims = [_norm(dims_arg, r)]
        gone = {d for d in dims if _is(x.shape[d], 1)}
        for d in dims:
            if d not in gone and not isinstance(x.shape[d], int) and _low(ctx, x.shape[d]) < 2:
                raise NotInFragment("squeeze of a dim that may be 1")
        kept = [k for k in range(r) if k not in gone]

        def squeezed(i: tuple[Any, ...]) -> Any:
            j: list[Any] = [0] * r
            for pos, k in enumerate(kept):
                j[k] = i[pos]
            return x.at(tuple(j))

        return same(tuple(x.shape[k] for k in kept), squeezed)
    if base == "expand":
        sizes = [ctx.size(s) for s in args[1]]
        lead = len(sizes) - r
        if lead < 0:
            raise NotInFragment("expand to fewer dims")
        shape: list[Any] = []
        for k, s in enumerate(sizes):
            if k < lead:
                shape.append(s)
                continue
            d = x.shape[k - lead]
            if _is(s, -1) or _same(z3, s, d):
                shape.append(d)
            elif _is(d, 1):
                shape.append(s)
            else:
                ctx.requires.append(_int(z3, s) == _int(z3, d))
                shape.append(d)
        out_shape = tuple(shape)
        return same(out_shape, lambda i: _read(x, out_shape, i))
    if base == "slice":
        dim = _norm(kwargs.get("dim", args[1] if len(args) > 1 else 0), r)
        start = kwargs.get("start", args[2] if len(args) > 2 else None)
        end = kwargs.get("end", args[3] if len(args) > 3 else None)
        step = kwargs.get("step", args[4] if len(args) > 4 else 1)
        if not isinstance(step, int) or step < 1:
            raise NotInFragment(f"slice with step {step!r}")
        n = x.shape[dim]
        s, e = _bound(ctx, start, n, 0), _bound(ctx, end, n, n)
        length = _max(z3, 0, (e - s + step - 1) / step) if not (isinstance(e, int) and isinstance(s, int)) \
            else max(0, (e - s + step - 1) // step)

        def sliced(i: tuple[Any, ...]) -> Any:
            return x.at((*i[:dim], s + i[dim] * step, *i[dim + 1:]))

        return same((*x.shape[:dim], length, *x.shape[dim + 1:]), sliced)
    if base == "select":
        dim = _norm(args[1], r)
        idx = ctx.size(args[2])
        n = x.shape[dim]
        if isinstance(idx, int) and idx < 0:
            idx = idx + n
        ctx.requires.append(z3.And(_int(z3, idx) >= 0, _int(z3, idx) < _int(z3, n)))
        return same(x.shape[:dim] + x.shape[dim + 1:], lambda i: x.at((*i[:dim], idx, *i[dim:])))
    if base == "flatten":
        s_dim = _norm(args[1] if len(args) > 1 else 0, r)
        e_dim = _norm(args[2] if len(args) > 2 else -1, r)
        sizes = [*x.shape[:s_dim], _numel(x.shape[s_dim:e_dim + 1]), *x.shape[e_dim + 1:]]
        return _view(ctx, x, sizes)
    if base == "unflatten":
        d = _norm(args[1], r)
        return _view(ctx, x, [*x.shape[:d], *[ctx.size(s) for s in args[2]], *x.shape[d + 1:]])
    return _view(ctx, x, [ctx.size(s) for s in args[1]])


def _low(ctx: _Ctx, d: Any) -> int:
    """The least value a symbolic size may take (its range's lower bound)."""
    name = str(d)
    lo = ctx.ranges.get(name, (0, None))[0]
    return lo


def _bound(ctx: _Ctx, v: Any, n: Any, default: Any) -> Any:
    """A slice bound clamped to [0, n] the way torch does (a negative one counts from n)."""
    z3 = ctx.z3
    if v is None:
        return default
    v = ctx.size(v)
    if isinstance(v, int):
        if v < 0:
            v = v + n
            return _max(z3, 0, v) if not isinstance(v, int) else max(0, v)
        return _min(z3, v, n)
    return z3.If(v < 0, _max(z3, 0, v + n), _min(z3, v, n))


def _cat(ctx: _Ctx, ts: list[_T], dim: int) -> _T:
    z3 = ctx.z3
    ts = [t for t in ts if not (len(t.shape) == 1 and _is(t.shape[0], 0))]  # legacy empty operand
    if not ts:
        raise NotInFragment("cat of nothing")
    r = len(ts[0].shape)
    dim = _norm(dim, r)
    for t in ts[1:]:
        if len(t.shape) != r:
            raise NotInFragment("cat of different ranks")
        for k in range(r):
            if k != dim and not _same(z3, t.shape[k], ts[0].shape[k]):
                ctx.requires.append(_int(z3, t.shape[k]) == _int(z3, ts[0].shape[k]))
    offsets: list[Any] = []
    total: Any = 0
    for t in ts:
        offsets.append(total)
        total = total + t.shape[dim]
    boolean = all(t.boolean for t in ts)

    def at(i: tuple[Any, ...]) -> Any:
        def elem(t: _T, off: Any) -> Any:
            v = t.at((*i[:dim], i[dim] - off, *i[dim + 1:]))
            return v if boolean else _as_real(ctx, v)

        out = elem(ts[-1], offsets[-1])
        for t, off in reversed(list(zip(ts[:-1], offsets[1:], strict=True))):
            out = z3.If(i[dim] < off, elem(t, off - t.shape[dim]), out)
        return out

    return _T((*ts[0].shape[:dim], total, *ts[0].shape[dim + 1:]), at, boolean,
              any(t.floating for t in ts))


def _view(ctx: _Ctx, x: _T, sizes: list[Any]) -> _T:
    """A view/reshape: the element at an output index is the input's at the same flat
    (row-major) position. A view that only adds or drops dims of size 1 maps indices
    directly; any other divides and takes remainders (integer arithmetic the solver may
    not decide for symbolic sizes: then not proved)."""
    z3 = ctx.z3
    if any(_is(s, -1) for s in sizes):
        rest = _numel([s for s in sizes if not _is(s, -1)])
        sizes = [(_numel(x.shape) / rest if not (isinstance(rest, int) and isinstance(_numel(x.shape), int))
                  else _numel(x.shape) // rest) if _is(s, -1) else s for s in sizes]
    if not _same(z3, _numel(sizes), _numel(x.shape)):
        ctx.requires.append(_int(z3, _numel(sizes)) == _int(z3, _numel(x.shape)))
    shape = tuple(sizes)
    big_in = [k for k, d in enumerate(x.shape) if not _is(d, 1)]
    big_out = [k for k, d in enumerate(shape) if not _is(d, 1)]
    if len(big_in) == len(big_out) and all(_same(z3, x.shape[a], shape[b])
                                           for a, b in zip(big_in, big_out, strict=True)):
        def direct(i: tuple[Any, ...]) -> Any:
            j: list[Any] = [0] * len(x.shape)
            for a, b in zip(big_in, big_out, strict=True):
                j[a] = i[b]
            return x.at(tuple(j))

        return _T(shape, direct, x.boolean, x.floating)

    def flat(i: tuple[Any, ...]) -> Any:
        f: Any = 0
        for k, d in enumerate(shape):
            f = f * d + i[k]
        j: list[Any] = []
        for d in reversed(x.shape):
            j.append(f % d if not _is(d, 1) else 0)
            f = f / d if not _is(d, 1) else f
        return x.at(tuple(reversed(j)))

    return _T(shape, flat, x.boolean, x.floating)


def _call(ctx: _Ctx, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> Any:
    z3 = ctx.z3
    t = n.target
    if t is operator.getitem:
        return args[0][args[1]]
    ints = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
            operator.floordiv: lambda a, b: a / b if not (isinstance(a, int) and isinstance(b, int)) else a // b,
            operator.mod: operator.mod, operator.neg: operator.neg}
    if t in ints:
        return ints[t](*[ctx.size(a) for a in args])  # type: ignore[operator]
    key = op_key(t)
    if key is None:
        raise NotInFragment(f"{getattr(t, '__name__', t)} has no symbolic form")
    parts = key.split(".")
    name = parts[1] if len(parts) >= 2 else key
    if key == "aten.sym_size.int":
        x = args[0]
        return x.shape[_norm(args[1], len(x.shape))]
    if key in ("aten.sym_numel.default",):
        return _numel(args[0].shape)
    if key in ("aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
               "aten._assert_tensor_metadata.default"):
        return None
    if parts[0] not in ("aten", "dim_order_ops"):
        raise NotInFragment(f"{key} has no symbolic form")
    for family in (_elementwise, _copy, _layout):
        out = family(ctx, name, list(args), dict(kwargs))
        if out is not None:
            return out
    if name in ("full", "scalar_tensor", "zeros", "ones", "full_like", "zeros_like", "ones_like"):
        value = {"zeros": 0, "ones": 1, "zeros_like": 0, "ones_like": 1}.get(name)
        if value is None:
            value = args[1] if name in ("full", "full_like") else args[0]
        shape = (tuple(args[0].shape) if name.endswith("_like")
                 else () if name == "scalar_tensor" else tuple(ctx.size(s) for s in args[0]))
        c = ctx.real(value)
        del z3
        return _T(shape, lambda i: c, False, isinstance(value, float))
    raise NotInFragment(f"{key} has no symbolic form")


def _run(ctx: _Ctx, gm: torch.fx.GraphModule, inputs: Sequence[_T]) -> list[Any]:
    """The program's outputs as symbolic values (its user inputs given)."""
    env: dict[torch.fx.Node, Any] = {}
    it = iter(inputs)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(it)
        elif n.op == "get_attr":
            v = getattr(gm, n.target)  # type: ignore[arg-type]
            if not isinstance(v, torch.Tensor):
                raise NotInFragment(f"the attribute {n.target}")
            env[n] = ctx.constant(n.target, v)
        elif n.op == "call_module":
            if str(n.target).startswith("_guards"):
                continue
            raise NotInFragment(f"the module call {n.target}")
        elif n.op == "call_function":
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
            env[n] = _call(ctx, n, list(args), dict(kwargs))
        elif n.op == "output":
            out = torch.fx.node.map_arg(n.args[0], lambda a: env[a])
            return list(out) if isinstance(out, (list, tuple)) else [out]
    raise NotInFragment("a graph without an output")


def ranges_of(ep: Any) -> dict[str, tuple[int, int | None]]:
    """An exported program's size ranges (``range_constraints``) by symbol name: (least,
    greatest or None for unbounded)."""
    out: dict[str, tuple[int, int | None]] = {}
    for sym, vr in getattr(ep, "range_constraints", {}).items():
        try:
            lo = int(vr.lower)
        except (TypeError, ValueError, OverflowError, AttributeError):
            lo = 0
        try:
            hi: int | None = int(vr.upper) if vr.upper.is_integer and vr.upper.is_finite else None
        except (TypeError, ValueError, OverflowError, AttributeError):
            hi = None
        out[str(sym)] = (lo, hi)
    return out


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


# ------------------------------------------------------------------ the question


def prove_equal(before: torch.fx.GraphModule, after: torch.fx.GraphModule, *,
                ranges: Mapping[str, tuple[int, int | None]] | None = None,
                timeout_ms: int = 5000) -> Outcome:
    """Whether ``after`` computes what ``before`` does for every value of their user inputs
    (the same placeholders, in order) and every size of their symbolic dims (each within
    ``ranges``: symbol name -> (least, greatest or None)). Sizes come from the placeholders'
    ``meta["val"]`` (export's fake tensors: ints, or SymInts over export's symbols).

    :data:`PROVED` when the solver shows no sizes, in-bounds index and values where shapes or
    elements differ (or where ``after`` cannot run though ``before`` can); :data:`REFUTED`
    with such a model; :data:`NOT_PROVED` (with the reason) when an op has no symbolic form
    or the solver gave up within ``timeout_ms``."""
    missing = available()
    if missing is not None:
        return Outcome(NOT_PROVED, missing)
    import z3

    ctx = _Ctx(z3, ranges or {})
    try:
        inputs: list[_T] = []
        for k, p in enumerate(_placeholders(before)):
            val = p.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise NotInFragment(f"the input {p.name} (not a tensor)")
            shape = tuple(ctx.size(d) for d in val.shape)
            inputs.append(ctx.tensor_input(f"x{k}", shape, val.dtype == torch.bool,
                                           val.dtype.is_floating_point))
        if len(_placeholders(after)) != len(inputs):
            return Outcome(NOT_PROVED, "the two programs take different inputs")
        want = _run(ctx, before, inputs)
        assumed = list(ctx.requires)
        ctx.requires.clear()
        got = _run(ctx, after, inputs)
        owed = list(ctx.requires)
        differs: list[Any] = [z3.Not(z3.And(*owed))] if owed else []
        same_shape: list[Any] = []
        index: tuple[Any, ...] = ()
        if len(want) != len(got):
            return Outcome(NOT_PROVED, f"{len(want)} outputs before, {len(got)} after")
        for o, (w, g) in enumerate(zip(want, got, strict=True)):
            if not isinstance(w, _T) or not isinstance(g, _T):
                raise NotInFragment("an output that is not a tensor")
            if len(w.shape) != len(g.shape):
                same_shape.append(z3.BoolVal(False))
                continue
            same_shape.extend(_int(z3, a) == _int(z3, b) for a, b in zip(w.shape, g.shape, strict=True))
            i = tuple(z3.Int(f"i{o}_{k}") for k in range(len(w.shape)))
            if o == 0:
                index = i
            inside = [z3.And(v >= 0, v < _int(z3, d)) for v, d in zip(i, w.shape, strict=True)]
            a, b = w.at(i), g.at(i)
            if z3.is_bool(a) != z3.is_bool(b):
                a, b = _as_real(ctx, a), _as_real(ctx, b)
            differs.append(z3.And(*inside, a != b))
    except NotInFragment as e:
        return Outcome(NOT_PROVED, str(e), outside=True)
    except z3.Z3Exception as e:
        return Outcome(NOT_PROVED, f"the solver refused the question: {e}")
    except (TypeError, ValueError, IndexError, KeyError, AttributeError) as e:
        # an argument this reading does not expect (an op's rarer form): not the rule's fault
        return Outcome(NOT_PROVED, f"the symbolic reading failed: {type(e).__name__}: {e}", outside=True)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    for name, s in ctx.syms.items():
        lo, hi = ctx.ranges.get(name, (1, None))
        solver.add(s >= max(lo, 1))
        if hi is not None:
            solver.add(s <= hi)
    solver.add(*assumed)
    # first where the shapes agree (elsewhere fusionkit declines a rewrite whose value has
    # another shape): elements that differ, or a condition the replacement needs that fails
    solver.push()
    solver.add(*same_shape, z3.Or(*differs) if differs else z3.BoolVal(False))
    verdict = solver.check()
    shapes_differ = False
    if verdict == z3.unsat:
        solver.pop()
        solver.push()
        solver.add(z3.Not(z3.And(*same_shape)) if same_shape else z3.BoolVal(False))
        verdict = solver.check()
        shapes_differ = True
    if verdict == z3.unsat:
        return Outcome(PROVED)
    if verdict != z3.sat:
        return Outcome(NOT_PROVED, f"the solver gave up ({solver.reason_unknown()})")
    solver.push()  # small sizes, when there are any: a counterexample to read and run
    solver.add(*[s <= 6 for s in ctx.syms.values()])
    small = solver.check() == z3.sat
    model = solver.model() if small else None
    solver.pop()
    if model is None:
        solver.check()
        model = solver.model()
    return _refuted(z3, ctx, model, before, () if shapes_differ else index, shapes_differ)


def _refuted(z3: Any, ctx: _Ctx, model: Any, before: torch.fx.GraphModule, index: tuple[Any, ...],
             shapes_differ: bool) -> Outcome:
    """The solver's model as sizes, input shapes, input values and the differing index."""
    def num(v: Any) -> Any:
        v = model.eval(v, model_completion=True)
        if z3.is_true(v) or z3.is_false(v):
            return z3.is_true(v)
        if z3.is_int_value(v):
            return v.as_long()
        return float(Fraction(v.as_fraction())) if z3.is_rational_value(v) else 0.0

    sizes = {name: num(s) for name, s in ctx.syms.items()}
    shapes: list[tuple[int, ...]] = []
    values: list[Any] = []
    for k, p in enumerate(_placeholders(before)):
        val = p.meta["val"]
        shape = tuple(int(num(_int(z3, ctx.size(d)))) for d in val.shape)
        shapes.append(shape)
        sort = z3.BoolSort() if val.dtype == torch.bool else z3.RealSort()
        numel = 1
        for d in shape:
            numel *= d
        if numel > 4096:
            values.append(None)
            continue
        if not shape:
            values.append(num(z3.Const(f"x{k}", sort)))
            continue
        f = z3.Function(f"x{k}", *([z3.IntSort()] * len(shape)), sort)
        flat = [num(f(*[z3.IntVal(i) for i in idx])) for idx in _indices(shape)]
        values.append(torch.tensor(flat).reshape(shape).tolist() if flat else [])
    return Outcome(REFUTED, "", sizes, tuple(shapes), tuple(values), tuple(int(num(i)) for i in index),
                   shapes_differ=shapes_differ)


def _indices(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for d in shape:
        out = [(*i, k) for i in out for k in range(d)]
    return out
