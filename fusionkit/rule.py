"""A fusion rule: pattern + constraints + replacement, validated when built.

The replacement receives only matches that passed every constraint, so it has
no way (and no reason) to decline: a counted replacement is a real one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fusionkit.check.capture_parameters import CaptureParameters
from fusionkit.check.constraints import Constraint
from fusionkit.match.pattern import Pattern
from fusionkit.targets import OpTarget, op_key, resolve_op

if TYPE_CHECKING:
    from torch.fx import Node

    from fusionkit.edit.builder import Rewriter

__all__ = ["CallOp", "OpSemantics", "ProgramForm", "PythonReplacement", "Ref", "Replacement", "Rule",
           "RuleError", "ref"]


class RuleError(ValueError):
    """A rule that cannot be correct as written (caught when it is built)."""


@dataclass(frozen=True)
class Ref:
    """A reference to a capture inside a replacement's arguments."""

    name: str


def ref(name: str) -> Ref:
    return Ref(name)


class Replacement(ABC):
    """Builds the node that takes the root's place."""

    @abstractmethod
    def captures(self) -> set[str]:
        """Capture names the replacement reads."""

    @abstractmethod
    def build(self, rw: Rewriter, captures: Mapping[str, Any]) -> Node | tuple[Node | None, ...]:
        """Create the new node(s) through ``rw`` and return the one replacing the root.

        A multi-output pattern (:func:`~fusionkit.match.pattern.outputs`) returns a
        tuple: one node per output, the root's first; ``None`` for a further
        output that nothing uses (a side-effecting op the fused op subsumes).
        """


def _as_ref(a: Any) -> Any:
    name = a.capture_name() if isinstance(a, Pattern) else None
    if name is not None:
        return Ref(name)
    if isinstance(a, list):
        return [_as_ref(x) for x in a]
    if isinstance(a, tuple):
        return tuple(_as_ref(x) for x in a)
    return a


def _refs_in(a: Any) -> set[str]:
    if isinstance(a, Ref):
        return {a.name}
    if isinstance(a, (list, tuple)):
        out: set[str] = set()
        for x in a:
            out |= _refs_in(x)
        return out
    return set()


def _resolve(a: Any, captures: Mapping[str, Any]) -> Any:
    if isinstance(a, Ref):
        return captures[a.name]
    if isinstance(a, list):
        return [_resolve(x, captures) for x in a]
    if isinstance(a, tuple):
        return tuple(_resolve(x, captures) for x in a)
    return a


@dataclass(frozen=True)
class CallOp(Replacement):
    """Replace the root by one call of ``target`` with captures and literals as arguments."""

    target: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        key = op_key(resolve_op(self.target))  # raises UnknownOpError early
        object.__setattr__(self, "target", key)
        # a capture object stands for its value: capture("x") is ref("x")
        object.__setattr__(self, "args", tuple(_as_ref(a) for a in self.args))
        object.__setattr__(self, "kwargs", {k: _as_ref(v) for k, v in self.kwargs.items()})

    def captures(self) -> set[str]:
        out: set[str] = set()
        for a in (*self.args, *self.kwargs.values()):
            out |= _refs_in(a)
        return out

    def build(self, rw: Rewriter, captures: Mapping[str, Any]) -> Node:
        return rw.call(
            self.target,
            *(_resolve(a, captures) for a in self.args),
            **{k: _resolve(v, captures) for k, v in self.kwargs.items()},
        )


@dataclass(frozen=True)
class PythonReplacement(Replacement):
    """A replacement that cannot be data: ``fn(rw, x, weight, bias=None) -> Node``.

    ``PythonReplacement(fn)``: the captures it reads are ``fn``'s parameters
    after the :class:`~fusionkit.edit.builder.Rewriter` (a default makes one
    optional), and ``reads`` is derived from them. ``PythonReplacement(fn, reads)``
    is the older form: ``fn(rw, captures)`` gets the mapping, ``reads`` listed by hand.
    """

    fn: Callable[..., Node | tuple[Node | None, ...]]
    #: None: derived from the parameters of ``fn``
    reads: frozenset[str] | None = None
    #: the capture parameters of ``fn`` (None for the ``fn(rw, captures)`` form)
    parameters: CaptureParameters | None = field(init=False, repr=False, compare=False,
                                                 default=None)

    def __post_init__(self) -> None:
        if self.reads is None:
            params = CaptureParameters.of(self.fn, "the Rewriter")
            object.__setattr__(self, "parameters", params)
            object.__setattr__(self, "reads", frozenset(params.names))
        else:
            object.__setattr__(self, "reads", frozenset(self.reads))

    def captures(self) -> set[str]:
        return set(self.reads or ())

    def build(self, rw: Rewriter, captures: Mapping[str, Any]) -> Node | tuple[Node | None, ...]:
        if self.parameters is None:
            return self.fn(rw, captures)
        return self.fn(rw, **self.parameters.arguments(captures))


def _parameters_of(part: Any) -> CaptureParameters | None:
    params = getattr(part, "parameters", None)
    return params if isinstance(params, CaptureParameters) else None


def _frozen(m: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class OpSemantics:
    """What a backend states about the ops its rules create or match, for ``fusionkit.verify``
    (which runs both programs of a rule on the CPU). Handed over by the backend on its rules
    (:attr:`Rule.semantics`), never looked up by a name.

    ``kernel_references``: op key (``ns.name.overload``) -> a function computing what the
    backend's kernel computes, ``fn(*args, **kwargs)`` (tested against the kernel by the
    backend), run in place of torch's registered CPU implementation; ``reference_caveats``:
    op key -> why its registered CPU reference is not what the kernel computes (a rule is
    never judged through it); ``metadata``: node metadata key -> ``apply(recorded value,
    result)``, what that metadata does to a node's result; ``op_contexts``: op namespace ->
    a factory of the context its ops run in (the TOSA dialect's ops read the active
    specification); ``operands_like``: op key -> the op (``aten.convolution.default``) whose
    operands it takes, leading arguments alike (the verifier draws them as that op's);
    ``unsafe_kernels``: op namespace -> why its CPU kernels are never run on drawn operands
    (they abort the process on operands they refuse), only its kernel references.
    """

    kernel_references: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    reference_caveats: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    op_contexts: Mapping[str, Callable[[], AbstractContextManager[Any]]] = field(default_factory=dict)
    operands_like: Mapping[str, str] = field(default_factory=dict)
    unsafe_kernels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in ("kernel_references", "reference_caveats", "metadata", "op_contexts", "operands_like",
                  "unsafe_kernels"):
            object.__setattr__(self, f, _frozen(getattr(self, f)))

    def __or__(self, other: OpSemantics) -> OpSemantics:
        """Both backends' statements (``other`` wins where both state one op)."""
        return OpSemantics({**self.kernel_references, **other.kernel_references},
                           {**self.reference_caveats, **other.reference_caveats},
                           {**self.metadata, **other.metadata},
                           {**self.op_contexts, **other.op_contexts},
                           {**self.operands_like, **other.operands_like},
                           {**self.unsafe_kernels, **other.unsafe_kernels})


@dataclass(frozen=True)
class ProgramForm:
    """Where a rule runs when its program is not the one ``torch.export`` gives: a backend's
    pass pipeline before it (in-place ops where export writes functional ones, edge-dialect
    op objects, metadata earlier passes wrote).

    ``form(ep)`` puts an exported program in that form (in place, returning None, or
    returning the program in that form); ``namespaces``: op namespaces the site holds beyond
    the pattern's own (their contexts, :attr:`OpSemantics.op_contexts`, are opened);
    ``node_semantics``: op key -> ``fn(node, args, kwargs)``, what a node of that op computes
    at this pipeline position from the metadata an earlier pass wrote (``NotImplemented``
    where the node carries nothing it reads: the op then runs as usual).
    """

    form: Callable[[Any], Any]
    namespaces: Collection[str] = frozenset()
    node_semantics: Mapping[str, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = \
        field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespaces", frozenset(self.namespaces))
        object.__setattr__(self, "node_semantics", _frozen(self.node_semantics))


@dataclass(frozen=True, eq=False)
class Rule:
    """A named fusion: find ``pattern``, require ``constraints``, emit ``replacement``.

    ``priority``: at the same root, higher-priority rules are tried first.
    ``allow_escape``: by default a match whose inner nodes are used outside it
    is declined (fusing would compute them twice); set to keep such matches.
    ``shipped``: a rule fusionkit ships (its rule sets mark theirs,
    :func:`fusionkit.passes.registry.register_rules`). A rule of your own (your code, a
    spec, ``rule_from_functions``) has its structural near misses reported once its
    pattern matched its root op and one more op — below the threshold that keeps the
    shipped rules' reports short.

    What ``fusionkit.verify`` needs to know to run the rule, stated on the rule:
    ``program_form`` (:class:`ProgramForm`: where a backend's pipeline runs it);
    ``module_scope``: the module type its checks ask the pattern's ops to run inside (a
    check reading the source partition, ``nn.Linear``); ``semantics``
    (:class:`OpSemantics`: what the backend states its ops compute).
    """

    name: str
    pattern: Pattern
    replacement: Replacement
    constraints: Sequence[Constraint] = ()
    priority: int = 0
    allow_escape: bool = False
    description: str = ""
    shipped: bool = False
    program_form: ProgramForm | None = None
    module_scope: type | None = None
    semantics: OpSemantics = field(default_factory=OpSemantics)

    def __post_init__(self) -> None:
        if not self.name:
            raise RuleError("a rule needs a name")
        object.__setattr__(self, "constraints", tuple(self.constraints))
        if self.pattern.root_keys() is None:
            raise RuleError(f"rule {self.name!r}: the pattern's root must be an op, "
                            f"not {self.pattern!r}")
        bound = self.pattern.captures()
        always = self.pattern.always_captures()
        for c in self.constraints:
            label = getattr(c, "name", None)
            what = f"check {label!r}" if isinstance(label, str) else f"constraint {c.kind}"
            self._validate_reads(what, c.captures(), _parameters_of(c), bound, always)
        self._validate_reads("the replacement", self.replacement.captures(),
                             _parameters_of(self.replacement), bound, always)

    def _validate_reads(self, what: str, reads: set[str], params: CaptureParameters | None,
                        bound: set[str], always: set[str]) -> None:
        """Every capture a part reads is bound; a required parameter is bound on every match."""
        if params is not None:
            for n in params.names:
                if n not in bound:
                    raise RuleError(f"rule {self.name!r}: {what} ({params.owner}) has the "
                                    f"parameter {n!r}, a capture the pattern never binds")
            for n in params.required:
                if n not in always:
                    raise RuleError(f"rule {self.name!r}: {what} ({params.owner}) requires the "
                                    f"parameter {n!r}, a capture only some alternatives of the "
                                    "pattern bind; give it a default")
            return
        missing = reads - bound
        if missing:
            uses = "uses" if what == "the replacement" else "reads"
            raise RuleError(f"rule {self.name!r}: {what} {uses} {sorted(missing)}, which the "
                            "pattern never binds")

    @property
    def root_keys(self) -> frozenset[str]:
        keys = self.pattern.root_keys()
        assert keys is not None
        return keys


def replace_with(target: OpTarget, *args: Any, **kwargs: Any) -> CallOp:
    """``replace_with("et_vk.rms_norm.default", ref("x"), ref("weight"), ref("eps"))``."""
    key = op_key(resolve_op(target))
    assert key is not None
    return CallOp(key, tuple(args), dict(kwargs))
