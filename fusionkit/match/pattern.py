"""The pattern DSL: what subgraph to look for, written as data.

A pattern is a tree of immutable objects:

* :func:`op` — a call of one of several operators, with argument patterns;
  commutative ops (``mul``, ``add``) match either operand order without the
  rule being written twice;
* :func:`capture` — a named hole; a name used twice must bind the same value;
* ``a | b`` — alternatives, tried in order;
* :func:`through` — any number (possibly zero) of pass-through ops such as dtype
  casts in front of an operand;
* value matchers (:func:`lit`, :func:`where`, :func:`scalar`, ...) for literal
  arguments: exact values or predicates, optionally accepting a 0-d constant
  tensor where the graph lifted a scalar into one.

Patterns hold no graph state and are compiled once (their op names resolved to
keys) when built, so nothing is traced or resolved at match time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fusionkit.targets import OpTarget, op_key, resolve_op
from fusionkit.vocabulary import value_matcher

__all__ = [
    "CASTS",
    "Also",
    "Alt",
    "ArgPattern",
    "Capture",
    "Named",
    "Op",
    "Outputs",
    "Pattern",
    "PatternVisitor",
    "Seq",
    "Through",
    "Value",
    "also",
    "any_float",
    "any_value",
    "capture",
    "int_list",
    "integer",
    "lit",
    "one_of",
    "op",
    "optional_dtype",
    "output_names",
    "outputs",
    "per_row_block",
    "positive",
    "scalar",
    "seq",
    "through",
    "where",
    "widens",
]

T = TypeVar("T")

#: ops that ExecuTorch graphs use for dtype casts (ATen and edge dialect)
CASTS: tuple[str, ...] = (
    "aten._to_copy.default",
    "aten.to.dtype",
    "dim_order_ops._to_dim_order_copy.default",
)

_FLOAT_BITS: dict[Any, tuple[int, int]] = {}  # dtype -> (exponent bits, mantissa bits)
_INT_RANGE: dict[Any, tuple[int, int]] = {}  # dtype -> (min, max)


def _dtype_tables() -> None:
    import torch

    _FLOAT_BITS.update({torch.float16: (5, 10), torch.bfloat16: (8, 7),
                        torch.float32: (8, 23), torch.float64: (11, 52)})
    _INT_RANGE.update({torch.bool: (0, 1), torch.uint8: (0, 2**8 - 1),
                       torch.int8: (-(2**7), 2**7 - 1), torch.int16: (-(2**15), 2**15 - 1),
                       torch.int32: (-(2**31), 2**31 - 1), torch.int64: (-(2**63), 2**63 - 1)})


def widens(src: Any, dst: Any) -> bool:
    """Whether converting ``src`` dtype to ``dst`` keeps every value exactly.

    True for the same dtype and for widening conversions (fp16 -> fp32, bf16 ->
    fp32, fp32 -> fp64, int8 -> int32, uint8 -> int16, bool -> anything numeric,
    an integer type into a float whose mantissa holds all its values, e.g.
    int8 -> fp16); False for every conversion that can round, overflow or
    truncate (fp32 -> fp16, fp16 <-> bf16, float -> int, int32 -> fp32) and for
    dtypes it does not know.
    """
    if src == dst:
        return True
    if not _FLOAT_BITS:
        _dtype_tables()
    if src in _FLOAT_BITS and dst in _FLOAT_BITS:
        (se, sm), (de, dm) = _FLOAT_BITS[src], _FLOAT_BITS[dst]
        return de >= se and dm >= sm
    if src in _INT_RANGE and dst in _INT_RANGE:
        (slo, shi), (dlo, dhi) = _INT_RANGE[src], _INT_RANGE[dst]
        return dlo <= slo and shi <= dhi
    if src in _INT_RANGE and dst in _FLOAT_BITS:
        lo, hi = _INT_RANGE[src]
        exact = 2 ** (_FLOAT_BITS[dst][1] + 1)  # every integer up to this is representable
        return -exact <= lo and hi <= exact
    return False


#: ops whose first two operands may be swapped without changing the result
COMMUTATIVE: frozenset[str] = frozenset(
    {
        "aten.mul.Tensor",
        "aten.add.Tensor",
        "aten.maximum.default",
        "aten.minimum.default",
        "aten.eq.Tensor",
        "aten.ne.Tensor",
        "aten.logical_and.default",
        "aten.logical_or.default",
        "aten.bitwise_and.Tensor",
        "aten.bitwise_or.Tensor",
    }
)


class PatternVisitor(Generic[T]):
    """One method per pattern node kind: ``p.accept(visitor)`` calls the one for ``p``.

    The code that walks patterns (printing them as Python, dumping them as YAML)
    subclasses this instead of testing node classes one by one, so a new node
    kind is one new method here and one ``accept`` on its class. A kind a
    visitor does not handle goes to :meth:`generic`.
    """

    def generic(self, p: Pattern) -> T:
        raise NotImplementedError(f"{type(self).__name__} has no case for {type(p).__name__}")

    def visit_capture(self, p: Capture) -> T:
        return self.generic(p)

    def visit_value(self, p: Value) -> T:
        return self.generic(p)

    def visit_named(self, p: Named) -> T:
        return self.generic(p)

    def visit_alt(self, p: Alt) -> T:
        return self.generic(p)

    def visit_through(self, p: Through) -> T:
        return self.generic(p)

    def visit_seq(self, p: Seq) -> T:
        return self.generic(p)

    def visit_also(self, p: Also) -> T:
        return self.generic(p)

    def visit_outputs(self, p: Outputs) -> T:
        return self.generic(p)

    def visit_op(self, p: Op) -> T:
        return self.generic(p)


class Pattern:
    """Base of every pattern node. Supports ``|`` for alternatives."""

    def __or__(self, other: Pattern) -> Alt:
        left = self.options if isinstance(self, Alt) else (self,)
        right = other.options if isinstance(other, Alt) else (other,)
        return Alt(left + right)

    def bind(self, name: str) -> Named:
        """Also capture the value this pattern matched under ``name``."""
        return Named(name, self)

    def captures(self) -> set[str]:
        """Every capture name this pattern can bind."""
        return set()

    def always_captures(self) -> set[str]:
        """The capture names every match of this pattern binds (not only some alternatives)."""
        return self.captures()

    def children(self) -> tuple[Pattern, ...]:
        """The sub-patterns of this node (none for a leaf: a capture, a value matcher)."""
        return ()

    def capture_name(self) -> str | None:
        """The name of a plain :func:`capture` (None for every other node)."""
        return None

    def accept(self, visitor: PatternVisitor[T]) -> T:
        """``visitor``'s method for this node's kind."""
        return visitor.generic(self)

    def root_keys(self) -> frozenset[str] | None:
        """Op keys the matched value's node can have, or None for 'any value'."""
        return None

    def min_ops(self) -> int:
        """The fewest op nodes any match of this pattern covers."""
        return 0


@dataclass(frozen=True)
class Capture(Pattern):
    """A named hole that binds whatever value stands in its place."""

    name: str

    def captures(self) -> set[str]:
        return {self.name}

    def capture_name(self) -> str | None:
        return self.name

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_capture(self)

    def __repr__(self) -> str:
        return f"capture({self.name!r})"


@dataclass(frozen=True)
class Named(Pattern):
    """Binds the value matched by ``inner`` under ``name``."""

    name: str
    inner: Pattern

    def captures(self) -> set[str]:
        return {self.name} | self.inner.captures()

    def always_captures(self) -> set[str]:
        return {self.name} | self.inner.always_captures()

    def children(self) -> tuple[Pattern, ...]:
        return (self.inner,)

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_named(self)

    def root_keys(self) -> frozenset[str] | None:
        return self.inner.root_keys()

    def min_ops(self) -> int:
        return self.inner.min_ops()

    def __repr__(self) -> str:
        return f"{self.inner!r}.bind({self.name!r})"


@dataclass(frozen=True, eq=False)
class Value(Pattern):
    """A literal argument: a predicate on a Python value.

    ``tensor_ok`` also accepts a 0-d tensor that is a constant of the program
    (ExecuTorch's edge dialect lifts ``x + 1e-6`` into such a constant), or dtype
    casts of one (in an fp16 or bf16 program ``to_edge`` casts that float32
    constant to the activations' dtype); the constant's ``.item()`` in the cast
    dtype is what the predicate sees and what ``name`` binds.

    ``in_dtype`` (set by :func:`lit` and :func:`one_of` for numbers) compares in
    the dtype of the constant met instead: ``in_dtype(value, dtype)``, with
    ``dtype`` None for a Python value in the graph. A Value with it accepts a
    0-d constant whatever ``tensor_ok`` says: a number literal matches what
    ``to_edge`` makes of it.
    """

    predicate: Callable[[Any], bool]
    description: str
    tensor_ok: bool = False
    name: str | None = None
    #: the named matcher and the arguments it was built with, e.g.
    #: ("scalar", (("lo", 0.0), ("hi", None))) (set by :func:`~fusionkit.vocabulary.value_matcher`);
    #: None for an arbitrary Python predicate (such a pattern cannot be written as YAML)
    spec: tuple[Any, ...] | None = None
    in_dtype: Callable[[Any, Any], bool] | None = None

    @property
    def constants_ok(self) -> bool:
        """Whether a 0-d constant tensor node (or a cast of one) may stand for the value."""
        return self.tensor_ok or self.in_dtype is not None

    def accepts(self, value: Any, dtype: Any = None) -> bool:
        """Whether ``value`` (met as a constant of ``dtype``; None: a Python value) matches."""
        if self.in_dtype is not None:
            return self.in_dtype(value, dtype)
        return bool(self.predicate(value))

    def captures(self) -> set[str]:
        return {self.name} if self.name else set()

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_value(self)

    def _key(self) -> tuple[Any, ...]:
        # a named matcher is its arguments; a predicate is only equal to itself
        what = _typed(self.spec) if self.spec is not None else (id(self.predicate), self.description)
        return (what, self.tensor_ok, self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Value) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return self.description


def _typed(v: Any) -> Any:
    """``v`` with bools told apart from ints (``lit(True)`` is not ``lit(1)``)."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, tuple):
        return tuple(_typed(x) for x in v)
    if isinstance(v, frozenset):
        return frozenset(_typed(x) for x in v)
    return v


@dataclass(frozen=True)
class Alt(Pattern):
    """Alternatives, tried in order; the first that leads to a match wins."""

    options: tuple[Pattern, ...]

    def captures(self) -> set[str]:
        out: set[str] = set()
        for o in self.options:
            out |= o.captures()
        return out

    def always_captures(self) -> set[str]:
        return set.intersection(*(o.always_captures() for o in self.options))

    def children(self) -> tuple[Pattern, ...]:
        return self.options

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_alt(self)

    def root_keys(self) -> frozenset[str] | None:
        keys: set[str] = set()
        for o in self.options:
            k = o.root_keys()
            if k is None:
                return None
            keys |= k
        return frozenset(keys)

    def min_ops(self) -> int:
        return min(o.min_ops() for o in self.options)

    def __repr__(self) -> str:
        return " | ".join(repr(o) for o in self.options)


@dataclass(frozen=True)
class Through(Pattern):
    """Zero or more pass-through ops (matched on their first argument), then ``inner``.

    The pass-through nodes belong to the match (they are claimed and replaced);
    the longest chain is tried first. A pass-through is skipped only if it keeps
    every value (its output dtype :func:`widens` its input's): skipping a
    narrowing cast (fp32 -> fp16) would make the fused op compute something the
    model does not. ``narrowing=True`` skips narrowing casts too — a rule's
    explicit statement that the approximation is intended.
    """

    ops: frozenset[str]
    inner: Pattern
    max_depth: int = 8
    narrowing: bool = False

    def captures(self) -> set[str]:
        return self.inner.captures()

    def always_captures(self) -> set[str]:
        return self.inner.always_captures()

    def children(self) -> tuple[Pattern, ...]:
        return (self.inner,)

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_through(self)

    def root_keys(self) -> frozenset[str] | None:
        inner = self.inner.root_keys()
        return None if inner is None else inner | self.ops

    def min_ops(self) -> int:
        return self.inner.min_ops()

    def __repr__(self) -> str:
        more = ", narrowing=True" if self.narrowing else ""
        return f"through({sorted(self.ops)}, {self.inner!r}{more})"


@dataclass(frozen=True)
class Seq(Pattern):
    """A list argument (``cat``'s tensors, a shape) matched element by element.

    ``items`` must match the list's elements in order and the list must have
    exactly that many elements; a variadic operand such as ``cat([a, b], dim)``
    is written ``op("aten.cat.default", seq(a, b), dim)`` (or with a plain
    Python list holding patterns, which :func:`op` converts).
    """

    items: tuple[Pattern, ...]

    def captures(self) -> set[str]:
        out: set[str] = set()
        for i in self.items:
            out |= i.captures()
        return out

    def always_captures(self) -> set[str]:
        return set().union(*(i.always_captures() for i in self.items))

    def children(self) -> tuple[Pattern, ...]:
        return self.items

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_seq(self)

    def min_ops(self) -> int:
        return sum(i.min_ops() for i in self.items)

    def __repr__(self) -> str:
        return f"[{', '.join(repr(i) for i in self.items)}]"


@dataclass(frozen=True)
class Also(Pattern):
    """A further output of a multi-output match (see :func:`outputs`).

    ``pattern`` is matched at a node reachable forwards (through users, at
    most ``max_depth`` steps) from the node bound to capture ``near``, with
    the captures bound so far; that node is bound as ``name`` and becomes an
    output of the match: the replacement returns a node for it too.
    """

    name: str
    pattern: Pattern
    near: str
    max_depth: int = 12

    def captures(self) -> set[str]:
        return {self.name} | self.pattern.captures()

    def always_captures(self) -> set[str]:
        return {self.name} | self.pattern.always_captures()

    def children(self) -> tuple[Pattern, ...]:
        return (self.pattern,)

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_also(self)

    def min_ops(self) -> int:
        return self.pattern.min_ops()

    def __repr__(self) -> str:
        return f"also({self.name!r}, {self.pattern!r}, near={self.near!r})"


@dataclass(frozen=True)
class Outputs(Pattern):
    """A multi-output pattern: ``primary`` at the root, then each :class:`Also`.

    The root is the first output; each ``Also`` adds one more. All outputs may
    be used outside the match; the replacement returns one node per output,
    in order (e.g. ``getitem`` nodes of one tuple-returning fused op).
    """

    primary: Pattern
    others: tuple[Also, ...]

    def captures(self) -> set[str]:
        out = self.primary.captures()
        for o in self.others:
            out |= o.captures()
        return out

    def always_captures(self) -> set[str]:
        return self.primary.always_captures().union(*(o.always_captures() for o in self.others))

    def children(self) -> tuple[Pattern, ...]:
        return (self.primary, *self.others)

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_outputs(self)

    def root_keys(self) -> frozenset[str] | None:
        return self.primary.root_keys()

    def min_ops(self) -> int:
        return self.primary.min_ops() + sum(o.min_ops() for o in self.others)

    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.others)

    def __repr__(self) -> str:
        return f"outputs({self.primary!r}, {', '.join(repr(o) for o in self.others)})"


def output_names(p: Pattern) -> tuple[str, ...]:
    """Capture names of a pattern's further outputs (empty for one-output patterns)."""
    while isinstance(p, Named):
        p = p.inner
    return p.output_names() if isinstance(p, Outputs) else ()


ArgPattern = Pattern | Any


@dataclass(frozen=True)
class Op(Pattern):
    """A call of one of ``targets`` whose arguments match ``args``/``kwargs``.

    ``args`` are matched by position and ``kwargs`` by schema name, whichever
    way the graph passes them. Arguments the pattern does not mention must
    hold their schema default when ``strict_defaults`` (``add(a, b)`` does not
    match ``add(a, b, alpha=2)``).
    """

    targets: frozenset[str]
    args: tuple[Pattern, ...]
    kwargs: Mapping[str, Pattern] = field(default_factory=dict)
    commutative: bool = False
    strict_defaults: bool = True

    def captures(self) -> set[str]:
        out: set[str] = set()
        for a in (*self.args, *self.kwargs.values()):
            out |= a.captures()
        return out

    def always_captures(self) -> set[str]:
        return set().union(*(a.always_captures() for a in (*self.args, *self.kwargs.values())))

    def children(self) -> tuple[Pattern, ...]:
        return (*self.args, *self.kwargs.values())

    def accept(self, visitor: PatternVisitor[T]) -> T:
        return visitor.visit_op(self)

    def root_keys(self) -> frozenset[str] | None:
        return self.targets

    def __hash__(self) -> int:
        return hash((self.targets, self.args, tuple(sorted(self.kwargs.items())),
                     self.commutative, self.strict_defaults))

    def min_ops(self) -> int:
        return 1 + sum(a.min_ops() for a in (*self.args, *self.kwargs.values()))

    def __repr__(self) -> str:
        name = "|".join(sorted(self.targets))
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{name}({', '.join(parts)})"


# --------------------------------------------------------------------------- builders


def _key_of(target: OpTarget) -> str:
    key = op_key(resolve_op(target))
    assert key is not None
    return key


def _as_pattern(value: ArgPattern) -> Pattern:
    if isinstance(value, Pattern):
        return value
    if isinstance(value, (list, tuple)) and any(isinstance(v, Pattern) for v in value):
        return Seq(tuple(_as_pattern(v) for v in value))
    return lit(value)


def op(
    targets: OpTarget | Iterable[OpTarget],
    *args: ArgPattern,
    commutative: bool | None = None,
    strict_defaults: bool = True,
    **kwargs: ArgPattern,
) -> Op:
    """A call of ``targets`` (one op or several, by object or qualified name).

    ``commutative=None`` means: commutative exactly when every target is a
    known commutative op (``aten.mul.Tensor``, ``aten.add.Tensor``, ...).
    Plain Python values among the arguments are exact literals.
    """
    raw = [targets] if isinstance(targets, str) or not isinstance(targets, Iterable) else list(targets)
    keys = frozenset(_key_of(t) for t in raw)
    if not keys:
        raise ValueError("op() needs at least one target")
    if commutative is None:
        commutative = keys <= COMMUTATIVE
    if commutative and len(args) < 2:
        raise ValueError(f"commutative op pattern {sorted(keys)} needs two positional operands")
    return Op(
        keys,
        tuple(_as_pattern(a) for a in args),
        {k: _as_pattern(v) for k, v in kwargs.items()},
        commutative,
        strict_defaults,
    )


def capture(name: str) -> Capture:
    if not name.isidentifier():
        raise ValueError(f"capture name {name!r} must be an identifier")
    return Capture(name)


def through(ops: OpTarget | Iterable[OpTarget], inner: ArgPattern, max_depth: int = 8,
            *, narrowing: bool = False) -> Through:
    """Any number of value-preserving ``ops`` (e.g. :data:`CASTS`) in front of ``inner``.

    By default a cast that can change a value (fp32 -> fp16, float -> int) is
    not passed through; ``narrowing=True`` passes it through as well.
    """
    raw = [ops] if isinstance(ops, str) or not isinstance(ops, Iterable) else list(ops)
    return Through(frozenset(_key_of(t) for t in raw), _as_pattern(inner), max_depth, narrowing)


def _norm(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    return v


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rounded_to(value: int | float, dtype: Any) -> set[float]:
    """What a Python number becomes as a constant of floating ``dtype``: rounded to it
    directly, and through float32 first (``to_edge`` lifts a scalar into a float32
    constant, then casts it to an fp16/bf16 program's dtype; the two can differ by
    one rounding at a tie)."""
    import torch

    exact = torch.tensor(value, dtype=torch.float64)
    return {float(exact.to(dtype).item()), float(exact.to(torch.float32).to(dtype).item())}


def _same_number_in(want: int | float) -> Callable[[Any, Any], bool]:
    """``== want`` compared in the dtype of the constant met (see :func:`lit`)."""
    memo: dict[Any, set[float]] = {}
    want_nan = isinstance(want, float) and math.isnan(want)

    def same(v: Any, dtype: Any) -> bool:
        if not _is_number(v):
            return False
        if want_nan or (isinstance(v, float) and math.isnan(v)):
            return want_nan and isinstance(v, float) and math.isnan(v)
        if dtype is None or not getattr(dtype, "is_floating_point", False):
            return bool(v == want)  # a Python number, or an integer constant: exactly
        accepted = memo.get(dtype)
        if accepted is None:
            accepted = memo[dtype] = _rounded_to(want, dtype)
        return v in accepted
    return same


@value_matcher
def lit(value: Any, name: str | None = None, tensor_ok: bool = False) -> Value:
    """Exactly ``value`` (lists and tuples compare equal; ``True`` is not ``1``).

    A number (an int or a float, not a bool) matches what ``to_edge`` makes of
    it, whatever ``tensor_ok`` says: met as a Python number (an ATen program) it
    compares exactly; met as a 0-d constant tensor of dtype D (the float32
    constant ``to_edge`` lifts ``x * 0.044715`` into, or its cast to an fp16/bf16
    program's dtype) it matches when the literal rounded to D is that constant
    (``lit(0.044715)`` matches the float32 ``0.044714998453855515``, and the
    float16 ``0.044708251953125``): the tolerance of D, no more. An integer
    constant compares exactly; NaN matches NaN.
    """
    want = _norm(value)

    def same(v: Any) -> bool:
        got = _norm(v)
        if isinstance(want, bool) or isinstance(got, bool):
            return type(got) is type(want) and got == want
        if isinstance(want, float) and math.isnan(want):
            return isinstance(got, float) and math.isnan(got)
        return bool(got == want)

    in_dtype = _same_number_in(want) if _is_number(want) else None
    return Value(same, f"== {value!r}", tensor_ok, name, in_dtype=in_dtype)


def where(predicate: Callable[[Any], bool], description: str, name: str | None = None,
          tensor_ok: bool = False) -> Value:
    """A literal satisfying ``predicate``; ``description`` appears in declines."""
    return Value(predicate, description, tensor_ok, name)


@value_matcher
def any_value(name: str | None = None) -> Value:
    """Any argument (a wildcard)."""
    return Value(lambda v: True, "any value", False, name)


@value_matcher
def any_float(name: str | None = None, tensor_ok: bool = True) -> Value:
    """Any real number (an int counts; a bool does not)."""
    return Value(
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "any finite number",
        tensor_ok,
        name,
    )


@value_matcher
def scalar(
    name: str | None = None,
    lo: float | None = None,
    hi: float | None = None,
    tensor_ok: bool = True,
) -> Value:
    """A number in ``[lo, hi]``; by default a 0-d constant tensor counts too."""

    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return (lo is None or v >= lo) and (hi is None or v <= hi)

    desc = "a number" + (f" >= {lo}" if lo is not None else "") + (f" <= {hi}" if hi is not None else "")
    return Value(ok, desc, tensor_ok, name)


@value_matcher
def one_of(values: Iterable[Any], name: str | None = None, tensor_ok: bool = False) -> Value:
    """Any of ``values`` (each compared as :func:`lit` compares, numbers in the dtype met)."""
    wanted = tuple(_norm(v) for v in values)
    options = tuple(lit(v) for v in wanted)
    numbers = tuple(o for o in options if o.in_dtype is not None)

    def in_dtype(v: Any, dtype: Any) -> bool:
        return any(o.accepts(v, dtype) for o in options)

    return Value(lambda v: any(o.predicate(v) for o in options),
                 "one of " + ", ".join(repr(v) for v in wanted), tensor_ok, name,
                 in_dtype=in_dtype if numbers else None)


@value_matcher
def int_list(length: int | None = None, name: str | None = None) -> Value:
    """A list of ints (e.g. reduction dims), optionally of a given length."""

    def ok(v: Any) -> bool:
        return (isinstance(v, (list, tuple))
                and all(isinstance(d, int) and not isinstance(d, bool) for d in v)
                and (length is None or len(v) == length))

    desc = "a list of ints" + (f" of length {length}" if length is not None else "")
    return Value(ok, desc, False, name)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@value_matcher
def integer(name: str | None = None, lo: int | None = None, hi: int | None = None) -> Value:
    """An int literal (not a bool) in ``[lo, hi]``: a zero point, a dim, an upscale factor."""
    desc = "an int literal" + (f" >= {lo}" if lo is not None else "") + \
        (f" <= {hi}" if hi is not None else "")
    return Value(lambda v: _is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi),
                 desc, False, name)


@value_matcher
def positive(name: str | None = None, tensor_ok: bool = False) -> Value:
    """A number literal > 0 (not a bool): a quantization scale, an eps."""
    return Value(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
                 "a positive number literal", tensor_ok, name)


@value_matcher
def per_row_block(name: str | None = None, rank: int = 2) -> Value:
    """A block size ``[1, ..., 1, G]`` of ``rank`` ints, G > 0: one quantization group per row."""

    def ok(v: Any) -> bool:
        return (isinstance(v, (list, tuple)) and len(v) == rank and all(_is_int(d) for d in v)
                and all(d == 1 for d in v[:-1]) and v[-1] > 0)

    return Value(ok, f"a per-row block size [{', '.join(['1'] * (rank - 1))}, G]", False, name)


def optional_dtype(*dtypes: Any, name: str | None = None) -> Value:
    """``None`` or one of ``dtypes`` (an optional ``dtype=`` argument): ``one_of`` spelled out."""
    return one_of([None, *dtypes], name=name)


def seq(*items: ArgPattern) -> Seq:
    """A list argument of exactly these element patterns (literals allowed)."""
    return Seq(tuple(_as_pattern(i) for i in items))


def also(name: str, pattern: ArgPattern, near: str, max_depth: int = 12) -> Also:
    """A further output ``name`` matching ``pattern``, found downstream of capture ``near``."""
    if not name.isidentifier():
        raise ValueError(f"output name {name!r} must be an identifier")
    return Also(name, _as_pattern(pattern), near, max_depth)


def outputs(primary: Pattern, *others: Also) -> Outputs:
    """A multi-output pattern: the root matches ``primary``; ``others`` are more outputs."""
    if not others:
        raise ValueError("outputs() needs at least one also(...) besides the primary pattern")
    for o in others:
        if o.near not in primary.captures() and not any(o.near in x.captures() for x in others):
            raise ValueError(f"also({o.name!r}): capture {o.near!r} is never bound")
    return Outputs(primary, tuple(others))
