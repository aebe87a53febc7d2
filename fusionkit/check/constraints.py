"""Operand constraints, all checked in one phase that has the ExportedProgram.

A constraint looks at the captures of a structural match and either accepts it
or refuses it with a :class:`~fusionkit.result.MatchResult` that says, in a sentence,
why the fused op would be wrong (status ``declined``, step the constraint's kind,
``capture`` the capture at fault). Constraints never modify the program; the one that may *fold* a
constant expression only records a plan (:meth:`CheckContext.plan_fold`) that
the rewrite carries out after every match has been decided.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit.check.capture_parameters import CaptureParameters, DeclaredCaptures
from fusionkit.check.folding import FoldError, constant_fold_sources, evaluate_constant
from fusionkit.check.operand_hints import Hints, OperandHint
from fusionkit.program_inputs import ProgramInputs
from fusionkit.result import MatchResult, Status
from fusionkit.vocabulary import constraint_term

__all__ = [
    "SHAPE_RELATIONS",
    "CheckContext",
    "Constraint",
    "Custom",
    "DtypeIn",
    "GraphLeaf",
    "Hints",
    "OperandHint",
    "PrepackableConstant",
    "Rank",
    "ReducesLastDim",
    "SameDtype",
    "ScalarRange",
    "ShapeRelation",
    "StaticShape",
    "UserInput",
    "broadcasts_over_last_dim",
    "constant_fold_sources",
    "named_shape_relation",
]


@dataclass
class CheckContext:
    """What a constraint may look at: the program, the root, the captures."""

    ep: ExportedProgram
    inputs: ProgramInputs
    root: Node
    captures: Mapping[str, Any]
    folds: dict[str, Node] = field(default_factory=dict)
    #: whether the caller can add folded constants to the program
    allow_folding: bool = True
    #: the name of the rule whose match this is (what its failures are reported under)
    rule: str = ""

    def node(self, name: str) -> Node | None:
        v = self.captures.get(name)
        return v if isinstance(v, Node) else None

    def val(self, name: str) -> Any:
        """The example value (``meta['val']``) of a captured node, else the literal."""
        v = self.captures.get(name)
        if isinstance(v, Node):
            return v.meta.get("val")
        return v

    def plan_fold(self, name: str, node: Node) -> None:
        self.folds[name] = node

    def fail(self, reason: str, at: str | Node) -> MatchResult:
        """A check's reason together with what it is about: a capture or a node of the graph.

        ``return ctx.fail("bias must be constant", at="bias")``. ``at`` is a capture
        name or a node — a capture parameter's value names that capture. A bare
        sentence is about the check's first capture parameter; say ``at=`` when
        the culprit is another one. Its step is ``custom`` until the :class:`Custom`
        running the check names it ``custom:NAME``.
        """
        if isinstance(at, str):
            return self.refusal("custom", at, self.node(at), reason)
        for name, v in self.captures.items():
            if v is at:
                return self.refusal("custom", name, at, reason)
        return self.refusal("custom", None, at, reason)

    def refusal(self, kind: str, capture: str | None, node: Any, reason: str) -> MatchResult:
        """A refusal of this context's match by a constraint of ``kind``, blaming ``capture``
        (and ``node``, when it is a node of the graph)."""
        return MatchResult(self.rule, self.root, Status.DECLINED, kind,
                           node if isinstance(node, Node) else None, reason,
                           capture=capture)


def _label(name: str, v: Any) -> str:
    return f"{name} `{v.name}`" if isinstance(v, Node) else f"{name} ({v!r})"


class Constraint(ABC):
    """One requirement on the captures of a match.

    A registered constraint (:func:`~fusionkit.vocabulary.constraint_term`)
    gets its ``kind`` (its YAML key) and the fields naming the captures it reads
    (``capture_fields``) from its registration: each is stated once.
    """

    #: stable identifier used in reports and YAML specs (set by ``constraint_term``)
    kind: str = "constraint"
    #: the fields holding capture names (a name or a sequence of names; set by ``constraint_term``)
    capture_fields: tuple[str, ...] = ()

    def captures(self) -> set[str]:
        """Capture names this constraint reads (validated against the pattern)."""
        out: set[str] = set()
        for f in self.capture_fields:
            v = getattr(self, f)
            out |= {v} if isinstance(v, str) else set(v)
        return out

    @abstractmethod
    def check(self, ctx: CheckContext) -> MatchResult | None:
        """None when satisfied, else the reasoned refusal."""

    def operand_hints(self) -> Hints:
        """How to make the operands this constraint asks for (``fusionkit.verify`` draws them
        so): capture -> :class:`~fusionkit.check.operand_hints.OperandHint`, or a function
        drawing them jointly per case. None by default: any operand may do."""
        return {}

    def refuse(self, ctx: CheckContext, capture: str | None, node: Any, reason: str
               ) -> MatchResult:
        """This constraint's refusal of ``ctx``'s match, blaming ``capture`` (and ``node``,
        when it is a node of the graph)."""
        return ctx.refusal(self.kind, capture, node, reason)


# ------------------------------------------------------------------------ the built-ins


@constraint_term("prepackable_constant", reads=("capture",))
@dataclass(frozen=True)
class PrepackableConstant(Constraint):
    """The capture must be a constant the backend can prepack.

    That is a placeholder the graph signature lists as parameter, buffer (not
    mutated) or lifted tensor constant — never a user input. With ``fold=True``
    a value computed only from constants (a dtype cast of a parameter, Gemma's
    ``1.0 + weight``) is accepted too: it is evaluated once at lowering time
    into a new lifted constant.
    """

    capture: str
    fold: bool = False
    role: str = "the fused op prepacks it"

    def operand_hints(self) -> Hints:
        return {self.capture: OperandHint(constant=True)}

    def check(self, ctx: CheckContext) -> MatchResult | None:
        v = ctx.captures.get(self.capture)
        if not isinstance(v, Node):
            return self.refuse(ctx, self.capture, None,
                              f"{self.capture} is the literal {v!r}, not a constant tensor: {self.role}")
        if v.op == "placeholder":
            if ctx.inputs.constant(v) is not None:
                return None
            return self.refuse(ctx, self.capture, v,
                              f"{_label(self.capture, v)} is {ctx.inputs.describe(v)}, not a "
                              f"constant: {self.role}")
        what = f"{_label(self.capture, v)} is {ctx.inputs.describe(v)}, not a constant"
        if not self.fold:
            return self.refuse(ctx, self.capture, v, f"{what}: {self.role}")
        sources, why = constant_fold_sources(v, ctx.inputs)
        if sources is None:
            return self.refuse(ctx, self.capture, v, f"{what}, and cannot be folded because {why}: {self.role}")
        if not ctx.allow_folding:
            return self.refuse(ctx, self.capture, v, f"{what}; it depends only on constants, but folding "
                              f"is not available in this pass: {self.role}")

        try:  # evaluated here, in the deciding phase, so that apply cannot fail on it
            evaluate_constant(v, ctx.inputs)
        except FoldError as e:
            return self.refuse(ctx, self.capture, v, f"{what}, and folding it failed ({e}): {self.role}")
        ctx.plan_fold(self.capture, v)
        return None


@constraint_term("graph_leaf", reads=("capture",))
@dataclass(frozen=True)
class GraphLeaf(Constraint):
    """The capture must be a placeholder (a graph input of any kind)."""

    capture: str

    def operand_hints(self) -> Hints:
        return {self.capture: OperandHint(constant=False)}

    def check(self, ctx: CheckContext) -> MatchResult | None:
        v = ctx.captures.get(self.capture)
        if isinstance(v, Node) and v.op == "placeholder":
            return None
        what = ctx.inputs.describe(v) if isinstance(v, Node) else "a literal"
        return self.refuse(ctx, self.capture, v, f"{_label(self.capture, v)} is {what}, not a graph leaf")


@constraint_term("user_input", reads=("capture",))
@dataclass(frozen=True)
class UserInput(Constraint):
    """The capture must be one of the program's user inputs."""

    capture: str

    def operand_hints(self) -> Hints:
        return {self.capture: OperandHint(constant=False)}

    def check(self, ctx: CheckContext) -> MatchResult | None:
        v = ctx.captures.get(self.capture)
        if isinstance(v, Node) and ctx.inputs.is_user_input(v):
            return None
        what = ctx.inputs.describe(v) if isinstance(v, Node) else "a literal"
        return self.refuse(ctx, self.capture, v, f"{_label(self.capture, v)} is {what}, not a user input")


def _tensor_val(ctx: CheckContext, name: str) -> torch.Tensor | None:
    val = ctx.val(name)
    return val if isinstance(val, torch.Tensor) else None


@constraint_term("dtype", reads=("capture",))
@dataclass(frozen=True)
class DtypeIn(Constraint):
    """The capture is a tensor of one of ``dtypes`` (any iterable of dtypes)."""

    capture: str
    dtypes: frozenset[torch.dtype]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtypes", frozenset(self.dtypes))

    def operand_hints(self) -> Hints:
        first = sorted(self.dtypes, key=lambda d: (d != torch.float32, str(d)))  # float32 first
        return {self.capture: OperandHint(dtypes=tuple(first))}

    def check(self, ctx: CheckContext) -> MatchResult | None:
        t = _tensor_val(ctx, self.capture)
        if t is not None and t.dtype in self.dtypes:
            return None
        want = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
        got = str(t.dtype).removeprefix("torch.") if t is not None else "not a tensor"
        return self.refuse(ctx, self.capture, ctx.captures.get(self.capture),
                          f"{_label(self.capture, ctx.captures.get(self.capture))} has dtype {got}, "
                          f"expected one of {want}")


@constraint_term("rank", reads=("capture",))
@dataclass(frozen=True)
class Rank(Constraint):
    """The capture is a tensor of one of ``ranks`` (any iterable of ints)."""

    capture: str
    ranks: frozenset[int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", frozenset(self.ranks))

    def operand_hints(self) -> Hints:
        return {self.capture: OperandHint(ranks=tuple(sorted(self.ranks)))}

    def check(self, ctx: CheckContext) -> MatchResult | None:
        t = _tensor_val(ctx, self.capture)
        if t is not None and t.dim() in self.ranks:
            return None
        got = t.dim() if t is not None else "no tensor"
        return self.refuse(ctx, self.capture, ctx.captures.get(self.capture),
                          f"{_label(self.capture, ctx.captures.get(self.capture))} has rank {got}, "
                          f"expected {sorted(self.ranks)}")


@constraint_term("static_shape", reads=("capture",))
@dataclass(frozen=True)
class StaticShape(Constraint):
    """The capture is a tensor whose shape has no symbolic dims."""

    capture: str


    def check(self, ctx: CheckContext) -> MatchResult | None:
        t = _tensor_val(ctx, self.capture)
        if t is not None and all(isinstance(d, int) for d in t.shape):
            return None
        return self.refuse(ctx, self.capture, ctx.captures.get(self.capture),
                          f"{_label(self.capture, ctx.captures.get(self.capture))} has a dynamic "
                          f"shape {tuple(t.shape) if t is not None else '?'}")


@constraint_term("same_dtype", reads=("a", "b"))
@dataclass(frozen=True)
class SameDtype(Constraint):
    """Two captures have the same dtype (e.g. the fused op's output keeps the root's)."""

    a: str
    b: str


    def check(self, ctx: CheckContext) -> MatchResult | None:
        ta, tb = _tensor_val(ctx, self.a), _tensor_val(ctx, self.b)
        if ta is not None and tb is not None and ta.dtype == tb.dtype:
            return None
        da = ta.dtype if ta is not None else None
        db = tb.dtype if tb is not None else None
        return self.refuse(ctx, self.a, ctx.captures.get(self.a),
                          f"{_label(self.a, ctx.captures.get(self.a))} is {da} but "
                          f"{_label(self.b, ctx.captures.get(self.b))} is {db}")


@dataclass(frozen=True)
class ShapeRelation(Constraint):
    """A relation between the shapes of two captures, e.g. broadcastability."""

    a: str
    b: str
    relation: Callable[[tuple[Any, ...], tuple[Any, ...]], bool]
    description: str
    #: key in :data:`SHAPE_RELATIONS` when the relation is a named built-in
    relation_name: str | None = None


    def check(self, ctx: CheckContext) -> MatchResult | None:
        ta, tb = _tensor_val(ctx, self.a), _tensor_val(ctx, self.b)
        if ta is not None and tb is not None and self.relation(tuple(ta.shape), tuple(tb.shape)):
            return None
        sa = tuple(ta.shape) if ta is not None else None
        sb = tuple(tb.shape) if tb is not None else None
        return self.refuse(ctx, self.a, ctx.captures.get(self.a),
                          f"{_label(self.a, ctx.captures.get(self.a))} of shape {sa} and "
                          f"{_label(self.b, ctx.captures.get(self.b))} of shape {sb}: "
                          f"expected {self.description}")


def _last_dim_vector(w: tuple[Any, ...], x: tuple[Any, ...]) -> bool:
    return len(w) >= 1 and len(x) >= 1 and all(d == 1 for d in w[:-1]) and w[-1] == x[-1]


def _same_shape(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a == b


def _same_last_dim(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) >= 1 and len(b) >= 1 and a[-1] == b[-1]


#: named shape relations (usable from YAML specs): name -> (relation, "expected ...")
SHAPE_RELATIONS: dict[str, tuple[Callable[[tuple[Any, ...], tuple[Any, ...]], bool], str]] = {
    "broadcasts_over_last_dim": (_last_dim_vector, "{a} to be a vector over the last dim of {b}"),
    "same_shape": (_same_shape, "{a} and {b} to have the same shape"),
    "same_last_dim": (_same_last_dim, "{a} and {b} to have the same last dim"),
}


def _relation_arguments(c: ShapeRelation) -> dict[str, Any]:
    if c.relation_name is None:
        raise LookupError(f"shape relation {c.description!r} is an arbitrary Python function")
    return {"relation": c.relation_name, "a": c.a, "b": c.b}


@constraint_term("shape_relation", reads=("a", "b"), cls=ShapeRelation, dump=_relation_arguments)
def named_shape_relation(relation: str, a: str, b: str) -> ShapeRelation:
    """A named relation (:data:`SHAPE_RELATIONS`) between the shapes of captures ``a`` and ``b``."""
    try:
        fn, text = SHAPE_RELATIONS[relation]
    except KeyError:
        raise ValueError(f"unknown shape relation {relation!r}; known: {sorted(SHAPE_RELATIONS)}") from None
    return ShapeRelation(a, b, fn, text.format(a=a, b=b), relation)


def broadcasts_over_last_dim(weight: str, x: str) -> ShapeRelation:
    """``weight`` is a vector over the last dim of ``x`` (leading 1s allowed)."""
    return named_shape_relation("broadcasts_over_last_dim", weight, x)


@constraint_term("reduces_last_dim", reads=("dim", "x"))
@dataclass(frozen=True)
class ReducesLastDim(Constraint):
    """A captured ``dim`` list names exactly the last dim of tensor capture ``x``.

    Model code writes ``mean(-1)`` or ``mean(rank - 1)``; both mean the same.
    """

    dim: str
    x: str


    def check(self, ctx: CheckContext) -> MatchResult | None:
        t = _tensor_val(ctx, self.x)
        dims = ctx.captures.get(self.dim)
        if isinstance(dims, int) and not isinstance(dims, bool):
            dims = [dims]
        rank = t.dim() if t is not None else 0
        if (t is not None and isinstance(dims, (list, tuple)) and len(dims) == 1
                and isinstance(dims[0], int) and rank > 0 and dims[0] % rank == rank - 1):
            return None
        return self.refuse(ctx, self.dim, None,
                          f"the reduction is over dims {dims} of the rank-{rank} "
                          f"{_label(self.x, ctx.captures.get(self.x))}, not over its last dim")


@constraint_term("scalar_range", reads=("capture",))
@dataclass(frozen=True)
class ScalarRange(Constraint):
    """The capture is a number literal in ``[lo, hi]``."""

    capture: str
    lo: float | None = None
    hi: float | None = None

    def operand_hints(self) -> Hints:
        return {self.capture: OperandHint(bounds=tuple(b for b in (self.lo, self.hi) if b is not None))}

    def check(self, ctx: CheckContext) -> MatchResult | None:
        v = ctx.captures.get(self.capture)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi):
                return None
        lo = "-inf" if self.lo is None else self.lo
        hi = "inf" if self.hi is None else self.hi
        return self.refuse(ctx, self.capture, v, f"{_label(self.capture, v)} is not a number in [{lo}, {hi}]")


def _custom_arguments(c: Custom) -> dict[str, Any]:
    # a check that declares its captures as parameters dumps without them: the signature is the list
    if c.parameters is not None:
        return {"fn": c.fn, "name": c.name, "reads": ()}
    return {"fn": c.fn, "name": c.name, "reads": c.reads}


@dataclass(frozen=True)
class Custom(Constraint):
    """A user-defined check: ``fn(ctx, *captures)`` returns None, or why not.

    The captures it reads are its parameters after the :class:`CheckContext`
    (``def fn(ctx, x, weight, bias=None)``; a default makes one optional) and it
    sees no other. It returns None, a sentence (about its first capture), or
    ``ctx.fail(reason, at=...)`` naming the capture at fault. ``reads`` is
    derived from the signature; an older check ``fn(ctx)`` that reads
    ``ctx.captures`` lists its captures in ``reads`` by hand.

    ``hints``: how to make the operands it asks for (:meth:`Constraint.operand_hints`):
    capture -> :class:`~fusionkit.check.operand_hints.OperandHint` for captures it reads, or
    ``draw(pick) -> {capture: hint}`` drawing them jointly. They belong to this object, not
    to its name (a spec's ``custom`` entry names the function only, and has none).
    """

    fn: Callable[..., str | MatchResult | None]
    name: str
    reads: tuple[str, ...] = ()
    hints: Hints | None = field(default=None, compare=False)
    #: the capture parameters of ``fn`` (None: an ``fn(ctx)`` with hand-listed ``reads``)
    parameters: CaptureParameters | None = field(init=False, repr=False, compare=False,
                                                 default=None)

    def __post_init__(self) -> None:
        params = CaptureParameters.of(self.fn, "the CheckContext")
        listed = tuple(self.reads)
        if params.names:
            if listed and set(listed) != set(params.names):
                raise ValueError(f"check {self.name!r}: reads {sorted(listed)} differ from the "
                                 f"parameters of {params.owner} {list(params.names)}; the "
                                 "signature is the list (leave reads out)")
            object.__setattr__(self, "parameters", params)
            listed = params.names
        object.__setattr__(self, "reads", listed)
        if isinstance(self.hints, Mapping):
            stray = sorted(set(self.hints) - set(listed))
            if stray:
                raise ValueError(f"check {self.name!r}: hints for {stray}, which it does not "
                                 f"read (it reads {list(listed)})")

    def operand_hints(self) -> Hints:
        return self.hints if self.hints is not None else {}

    def check(self, ctx: CheckContext) -> MatchResult | None:
        params = self.parameters
        if params is None:
            reason = self.fn(ctx)
        else:
            view = DeclaredCaptures(ctx.captures, params.names, f"check {self.name!r}")
            seen = dataclasses.replace(ctx, captures=view)  # the same folds dict: plans are kept
            reason = self.fn(seen, **params.arguments(ctx.captures))
        if reason is None:
            return None
        if isinstance(reason, MatchResult):
            if reason.step != "custom":  # a refusal of its own kind
                return reason
            # ctx.fail: the check named its capture at fault; its kind is ours
            return ctx.refusal(f"custom:{self.name}", reason.capture, reason.node, reason.reason)
        first = self.reads[0] if self.reads else None
        node = ctx.captures.get(first) if first is not None else None
        return ctx.refusal(f"custom:{self.name}", first, node, reason)


@constraint_term("custom", reads=("reads",), cls=Custom, dump=_custom_arguments)
def custom(fn: Callable[..., str | MatchResult | None], name: str, reads: tuple[str, ...] = ()) -> Custom:
    """A user-defined check: ``fn(ctx, *captures)`` returns None, or why not.

    (:class:`Custom` as a spec writes it: its ``hints`` are Python objects, not data.)
    """
    return Custom(fn, name, reads)
