"""Will the rewritten program still run? Every op a replacement creates, judged before any change.

ExecuTorch runs an op on the CPU only when three things hold: ``to_edge``'s
verifier admits it (the core ATen opset, a ``view_copy``, ExecuTorch's own
ops), it has an out variant (``to_executorch`` rewrites every call into its
``out=`` form to plan memory: "Missing out variants" otherwise), and the
runtime has a kernel registered for that out variant ("Missing operator:
aten::silu.out" when the program is loaded otherwise). An op a backend
delegates needs none of this: the backend's partitioner takes it.

:class:`ExecutionTarget` says whether one node will run where the program runs
(the CPU runtime's kernel libraries, plus the delegates that take ops off it).
:class:`ReplacementCheck` builds a match's replacement in a scratch graph
(:mod:`fusionkit.edit.probe`) and asks that about every op it made; having
built it, it also knows when the replacement raises or returns the wrong thing
(step ``error``). The finder runs it after a match's constraints, so a match
whose replacement could not run or could not be built is declined with the
reason, before the program changes — never accepted and then dropped.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch.fx import Node

from fusionkit.check.operand_dtypes import operand_dtype_refusal, register_operand_dtypes
from fusionkit.edit.builder import FusionError
from fusionkit.edit.meta_cache import metadata_key
from fusionkit.edit.probe import build_in_scratch
from fusionkit.result import MatchResult, Status, Step
from fusionkit.targets import (
    dialect_like,
    is_assertion,
    is_edge_target,
    load_delegate_descriptions,
    op_key,
    register_op_library,
    resolve_op,
)

if TYPE_CHECKING:
    from fusionkit.check.constraints import CheckContext
    from fusionkit.rule import Rule

__all__ = ["DELEGATE_ONLY_NAMESPACES", "Delegate", "ExecutionTarget", "NotRunnable",
           "ReplacementCheck", "cpu_refusal", "dtype_refusal", "program_exceptions",
           "register_delegate", "registered_kernels"]

_DELEGATE_ONLY: dict[str, str] = {}
#: op namespace -> the delegate it exists only inside (no CPU kernel by design): assumed
#: delegated unless the target names that delegate's real check (its adapter does). Filled
#: by :func:`register_delegate`; the core names no backend.
DELEGATE_ONLY_NAMESPACES: Mapping[str, str] = MappingProxyType(_DELEGATE_ONLY)

#: namespaces whose ops ``to_executorch`` handles itself (symbolic ints, prims)
_RUNTIME_NAMESPACES = frozenset({"executorch_prim"})


# ------------------------------------------------------------------- one op, on the CPU


_KERNELS: list[frozenset[str]] = []


def registered_kernels(refresh: bool = False) -> frozenset[str] | None:
    """``ns::op.overload`` of every kernel the ExecuTorch runtime in this process has
    (portable, and any kernel library loaded since); None without the runtime."""
    if refresh or not _KERNELS:
        try:
            from executorch.extension.pybindings import portable_lib
        except Exception:  # pragma: no cover - a wheel without the runtime
            return None
        _KERNELS[:] = [frozenset(portable_lib._get_operator_names())]
    return _KERNELS[0]


def _has_kernel(name: str) -> bool | None:
    kernels = registered_kernels()
    if kernels is None:
        return None
    if name in kernels:
        return True
    kernels = registered_kernels(refresh=True)  # a kernel library may have been loaded since
    return kernels is not None and name in kernels


_VERIFIER: list[Any] = []


def _edge_verifier_refusal(op: Any) -> str | None:
    """What ``to_edge``'s own verifier says of an edge op (None: admitted)."""
    if not _VERIFIER:
        from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

        _VERIFIER.append(EXIREdgeDialectVerifier())
    try:
        _VERIFIER[0].check_valid_edge_op(op)
    except Exception as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        return first
    return None


def _decomposed_by_to_edge(overload: Any) -> bool:
    if not _DECOMPOSITIONS:
        from executorch.exir.tracer import _default_decomposition_table

        _DECOMPOSITIONS.append(frozenset(_default_decomposition_table()))
    return overload in _DECOMPOSITIONS[0]


_DECOMPOSITIONS: list[frozenset[Any]] = []

#: (target, edge program?) -> the verdict that does not depend on loaded kernel libraries
_STATIC: dict[tuple[Any, bool], tuple[str | None, str | None]] = {}


def _static_verdict(target: Any, edge: bool) -> tuple[str | None, str | None]:
    """(why the op cannot be serialized or None, the out-variant kernel name it needs or None)."""
    key = op_key(target) or str(target)
    overload = resolve_op(target)
    ns = key.split(".", 1)[0]
    if ns in _RUNTIME_NAMESPACES:
        return None, None
    schema = getattr(overload, "_schema", None)
    if schema is None:
        return None, None
    if edge and ns == "aten":
        why = _edge_verifier_refusal(target if is_edge_target(target) else _edge_op(overload))
        if why is not None:
            from executorch.exir.verification.verifier import _EXECUTORCH_SYM_OPS

            if overload not in _EXECUTORCH_SYM_OPS:
                if _out_variant(overload) is None:
                    return (f"{key} has no out variant; the program could not be serialized "
                            f"(it is not in the core ATen opset either)"), None
                return (f"{key} is not in the core ATen opset; to_edge's verifier rejects it "
                        "and the program could not be serialized"), None
    elif ns == "aten":
        # an ATen program: to_edge decomposes what it can and judges the rest
        if torch.Tag.core in overload.tags or torch.Tag.view_copy in overload.tags \
                or _decomposed_by_to_edge(overload):
            return None, None
        return (f"{key} is not in the core ATen opset and to_edge has no decomposition for "
                "it; the program could not be lowered"), None
    from executorch.exir.verification.verifier import _EXECUTORCH_SYM_OPS

    if overload in _EXECUTORCH_SYM_OPS:
        return None, None
    out = _out_variant(overload)
    if out is None:
        return f"{key} has no out variant; the program could not be serialized", None
    return None, out


def _edge_op(overload: Any) -> Any:
    from executorch.exir.dialects._ops import ops as exir_ops

    ns, name = overload._schema.name.split("::", 1)
    return getattr(getattr(getattr(exir_ops.edge, ns), name), overload._overloadname)


def _out_variant(overload: Any) -> str | None:
    """``ns::op.out`` of the op's out variant, None when it has none."""
    from executorch.exir.operator.convert import to_out_variant

    try:
        out, _ = to_out_variant(overload)
    except Exception:
        return None
    return f"{out._schema.name}.{out._overloadname}"


def cpu_refusal(target: Any, edge: bool = True) -> str | None:
    """Why ExecuTorch's CPU runtime could not run a call of ``target`` (None: it can).

    ``edge``: the call sits in an edge program (else an ATen program, which
    ``to_edge`` decomposes first: a decomposable op is fine there, and kernels
    are judged after lowering).
    """
    k = (target, edge)
    try:
        static = _STATIC[k]
    except KeyError:
        static = _STATIC[k] = _static_verdict(target, edge)
    except TypeError:  # an unhashable target
        static = _static_verdict(target, edge)
    why, kernel = static
    if why is not None or kernel is None:
        return why
    if edge or (op_key(target) or "").split(".", 1)[0] != "aten":
        found = _has_kernel(kernel)
        if found is False:
            return (f"{op_key(target)} has no kernel in the ExecuTorch runtime ({kernel} is not "
                    "registered by its kernel libraries); the program would fail to load")
    return None


def dtype_refusal(node: Node) -> str | None:
    """What ``to_edge``'s verifier says of the tensor dtypes an edge-op node takes and returns
    (its per-op dtype table; a Python number where the schema wants a tensor is refused).

    The check of ExecuTorch's ``EdgeOpArgValidator``, made on one node's metadata.
    """
    target = node.target
    schema: Any = getattr(target, "_schema", None)
    constraint = getattr(schema, "dtype_constraint", None)
    if not is_edge_target(target) or constraint is None:
        return None
    try:
        types: dict[str, Any] = {}
        for i, arg in enumerate(schema.arguments):
            v = (node.kwargs[arg.name] if arg.name in node.kwargs
                 else node.args[i] if not arg.kwarg_only and i < len(node.args)
                 else arg.default_value)
            v = v.meta.get("val") if isinstance(v, Node) else v
            if isinstance(arg.type, torch.TensorType) or arg.type == torch.OptionalType.ofTensor():
                if isinstance(v, torch.Tensor):
                    types[arg.name] = v.dtype
            elif arg.type == torch.ListType.ofTensors() and isinstance(v, (list, tuple)):
                vals: list[Any] = [x.meta.get("val") if isinstance(x, Node) else x for x in v]
                if all(isinstance(x, torch.Tensor) for x in vals):
                    types[arg.name] = vals[0].dtype if vals else None
        rets = node.meta.get("val")
        rets = list(rets) if isinstance(rets, (list, tuple)) else [rets]
        k = 0
        for r, val in zip(schema.returns, rets, strict=False):
            name = r.name or f"__ret_{k}"
            if isinstance(r.type, torch.TensorType) and isinstance(val, torch.Tensor):
                types[name] = val.dtype
                k += 1
        if constraint.validate(types):
            return None
    except Exception:  # the validator's own trouble is not the replacement's
        return None
    got = ", ".join(f"{k}: {str(v).removeprefix('torch.')}" for k, v in types.items())
    return (f"{op_key(target)} does not take these dtypes ({got}; a tensor argument missing "
            "here is a Python number); to_edge's verifier rejects the program")


# ------------------------------------------------------------- delegates and the target


@dataclass(frozen=True)
class Delegate:
    """A backend that takes ops off the CPU runtime.

    ``refusal(node)``: None when the backend will take ``node``, else why not.
    ``namespaces``: the op namespaces it is asked about (None: every op).
    """

    name: str
    refusal: Callable[[Node], str | None]
    namespaces: frozenset[str] | None = None

    def asked_about(self, node: Node) -> bool:
        return self.namespaces is None or (op_key(node.target) or "").split(".", 1)[0] \
            in self.namespaces


#: delegate name -> what lists the targets of its operator registry (register_delegate)
_SUPPORTED_OPS: dict[str, Callable[[], Iterable[Any]]] = {}


def register_delegate(name: str, *, namespaces: Mapping[str, Sequence[str]] | None = None,
                      supported_ops: Callable[[], Iterable[Any]] | None = None,
                      operand_dtypes: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Describe a backend's delegate to the default :class:`ExecutionTarget`, which judges a
    replacement's ops without the backend's partitioner at hand (a backend's own code calls
    this, so the core names no backend; the ``fusionkit.delegates`` entry point finds it).

    ``namespaces``: op namespaces that exist only inside this delegate (no CPU kernel by
    design), each with the modules whose import registers its ops; their ops are assumed
    delegated. ``supported_ops``: returns the targets of the delegate's operator registry
    (op overloads or ``"ns::op"`` names), called once when first needed; an op outside ATen
    it lists is assumed delegated. If it raises (the backend is not installed) it lists none.
    ``operand_dtypes``: ``{"ns.op.overload": {"arg": (dtypes, why)}}``, the dtypes the
    delegate's kernel of an op takes per tensor argument
    (:func:`~fusionkit.check.operand_dtypes.register_operand_dtypes`); a replacement that
    would feed it another dtype is declined (step ``executable``).
    """
    if operand_dtypes:
        register_operand_dtypes(name, operand_dtypes)
    for namespace, modules in (namespaces or {}).items():
        _DELEGATE_ONLY[namespace] = name
        register_op_library(namespace, *modules)
    if supported_ops is not None:
        _SUPPORTED_OPS[name] = supported_ops
        _REGISTRY.clear()


def _registry_keys() -> frozenset[str]:
    """``ns.op`` (and ``ns.op.overload``) of every op a registered delegate's registry lists."""
    if not _REGISTRY:
        keys: set[str] = set()
        for list_ops in _SUPPORTED_OPS.values():
            try:
                listed = list(list_ops())
            except Exception:  # the backend is not installed, or its registry fails to load
                listed = []
            for k in listed:
                if isinstance(k, str):
                    keys.add(k.replace("::", "."))
                else:
                    key = op_key(k)
                    if key:
                        keys.add(key)
                        keys.add(key.rsplit(".", 1)[0])
        _REGISTRY.append(frozenset(keys))
    return _REGISTRY[0]


_REGISTRY: list[frozenset[str]] = []


def _known_backend_op(node: Node) -> str | None:
    key = op_key(node.target) or ""
    ns = key.split(".", 1)[0]
    if ns in DELEGATE_ONLY_NAMESPACES:  # described already: no entry points read
        return None
    load_delegate_descriptions()
    if ns in DELEGATE_ONLY_NAMESPACES:
        return None
    keys = _registry_keys()
    if key in keys or key.rsplit(".", 1)[0] in keys:
        return None
    return "no backend's operator registry lists it"


class ExecutionTarget:
    """Where the rewritten program will run: the CPU runtime, and ``delegates`` that take ops off it.

    A node is runnable when the CPU runtime can run it (:func:`cpu_refusal`) or a
    delegate asked about it takes it. The default (no delegates named) also
    accepts an op outside ATen that a registered delegate's operator registry lists
    or whose namespace exists only inside a delegate (:func:`register_delegate`): without a
    partitioner at hand nothing better is known, and the backend adapters check
    those for real. An ATen op is never assumed delegated: it must run on the CPU
    unless a named delegate takes it.
    """

    def __init__(self, delegates: Iterable[Delegate] = (), *,
                 assume_registered_backend_ops: bool = True) -> None:
        self.delegates: tuple[Delegate, ...] = tuple(delegates)
        self.assume_registered_backend_ops = assume_registered_backend_ops

    def refusal(self, node: Node, edge: bool, trusted: frozenset[Any] = frozenset()
                ) -> str | None:
        """None when ``node`` will run, else why not (a sentence).

        ``trusted``: ATen ops the program's author listed in ``to_edge``'s
        ``_core_aten_ops_exception_list`` (:func:`program_exceptions`), vouching
        that their runtime has kernels for them.
        """
        if node.op != "call_function" or node.target is operator.getitem or is_assertion(node):
            return None
        key = op_key(node.target)
        if key is None:  # a Python callable (symbolic-int arithmetic)
            return None
        if trusted and resolve_op(node.target) in trusted:
            return None
        why = cpu_refusal(node.target, edge)
        if why is None:
            return None
        refusals = []
        for d in self.delegates:
            if d.asked_about(node):
                no = d.refusal(node)
                if no is None:
                    return None
                refusals.append(f"{d.name}: {no}")
        if (not refusals and self.assume_registered_backend_ops
                and key.split(".", 1)[0] != "aten" and _known_backend_op(node) is None):
            return None
        if refusals:
            return f"{why}, and no delegate takes it ({'; '.join(refusals)})"
        return why


DEFAULT_TARGET = ExecutionTarget()


def program_exceptions(ep: Any) -> frozenset[Any]:
    """The ATen ops an edge program's verifier was told to admit although not core
    (``EdgeCompileConfig._core_aten_ops_exception_list``): the author vouches for them."""
    try:
        verifier = ep.verifiers[0]
    except Exception:
        return frozenset()
    try:
        return _EXCEPTIONS[verifier]
    except (KeyError, TypeError):
        pass
    try:
        found = frozenset(getattr(verifier(), "_core_aten_ops_exception_list", None) or ())
    except Exception:
        found = frozenset()
    try:
        _EXCEPTIONS[verifier] = found  # one verifier class per to_edge config
    except TypeError:
        pass
    return found


_EXCEPTIONS: dict[Any, frozenset[Any]] = {}


# ----------------------------------------------------------------- one match's replacement


@dataclass(frozen=True)
class NotRunnable:
    """Why a rule's replacement must not be applied to matches whose captures have given
    metadata: ``step`` is ``executable`` (an op it creates could not run) or ``error``
    (building it raised, or it returned the wrong thing).

    Not a :class:`~fusionkit.result.MatchResult` on purpose: it is the value
    :class:`ReplacementCheck` memoises by the captures' metadata, shared by every match
    with that metadata (a transformer's layers), so it names no rule, root or node — a
    node stored here would be the first match's. :meth:`result` makes it one match's
    result, which is what the finder reports.
    """

    step: str
    reason: str
    error_type: str | None = None
    error: BaseException | None = None

    def result(self, rule: str, root: Node, matched: tuple[Node, ...] = ()) -> MatchResult:
        """This verdict as rule ``rule``'s result at ``root``, the node at fault: the
        replacement goes there (the op that could not run is one it would create)."""
        status = Status.ERROR if self.step == Step.ERROR else Status.DECLINED
        return MatchResult(rule, root, status, self.step, root, self.reason, tuple(matched),
                           error_type=self.error_type)


def _same_signature(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
    return type(a) is type(b)


def _describe(v: Any) -> str:
    return f"{getattr(v, 'dtype', type(v).__name__)}{tuple(getattr(v, 'shape', ()))}"


def replacement_outputs(rule_name: str, root: Node, outputs: Sequence[Node], built: Any
                        ) -> list[Node | None]:
    """What a replacement returned, one entry per match output (``None``: an output the
    fused op subsumes; whether that is allowed is the caller's to decide).

    Raises :class:`FusionError` when it cannot stand in for the outputs: another number
    of nodes, something that is not a graph node, or a node of another dtype or shape than
    the output it replaces. One function because :mod:`fusionkit.apply.rewrite` applies
    exactly what :class:`ReplacementCheck` judged at find time.
    """
    news = list(built) if isinstance(built, (tuple, list)) else [built]
    if len(news) != len(outputs) or not isinstance(news[0], Node):
        raise FusionError(f"rule {rule_name!r} at `{root.name}` returned {len(news)} node(s) "
                          f"for a match with {len(outputs)} output(s)")
    for old, new in zip(outputs, news, strict=True):
        if new is None:
            continue
        if not isinstance(new, Node):
            raise FusionError(f"rule {rule_name!r} returned {type(new).__name__} for output "
                              f"`{old.name}`, not a graph node")
        old_val, new_val = old.meta.get("val"), new.meta.get("val")
        if old_val is not None and not _same_signature(new_val, old_val):
            raise FusionError(
                f"rule {rule_name!r} at `{old.name}` built `{new.name}` with "
                f"{_describe(new_val)}, but the output is {_describe(old_val)}: "
                "add a constraint so such matches are declined")
    return news


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


class ReplacementCheck:
    """One rule's replacement, built for each match in a scratch graph and judged there.

    Verdicts are memoised by the metadata of the match's captures, folds and
    outputs: a transformer asks the same question for every layer, and a
    replacement's ops and their metadata are functions of that metadata (never
    of weight values), as for the Vulkan delegation check.
    """

    def __init__(self, rule: Rule, target: ExecutionTarget | None = None) -> None:
        self.rule = rule
        self.target = target if target is not None else DEFAULT_TARGET
        self.memo: dict[Any, NotRunnable | None] = {}

    def _memo_key(self, ctx: CheckContext, outputs: tuple[Node, ...]) -> Any:
        names = sorted(ctx.captures)
        key = metadata_key((tuple(ctx.captures[n] for n in names),
                            tuple(ctx.folds[n] for n in sorted(ctx.folds)), outputs))
        if key is None:
            return None
        return (tuple(names), tuple(sorted(ctx.folds)), key, program_exceptions(ctx.ep))

    def verdict(self, ctx: CheckContext, outputs: tuple[Node, ...], strict: bool = False
                ) -> NotRunnable | None:
        """None when the replacement builds and everything it creates will run."""
        key = self._memo_key(ctx, outputs)
        if key is not None and key in self.memo:
            return self.memo[key]
        found = self._verdict(ctx, outputs, strict)
        if key is not None and (found is None or found.error is None):
            self.memo[key] = found
        return found

    def _verdict(self, ctx: CheckContext, outputs: tuple[Node, ...], strict: bool
                 ) -> NotRunnable | None:
        try:
            rw, built = build_in_scratch(self.rule.replacement, ctx, self.rule.name)
            self._check_outputs(built, outputs, ctx.root)
        except Exception as e:
            if strict:
                e.add_note(f"fusionkit: building the replacement of rule {self.rule.name!r} at "
                           f"`{ctx.root.name}` (strict mode)")
                raise
            return NotRunnable(Step.ERROR, f"the replacement raised {type(e).__name__}: "
                               f"{_first_line(e)}", type(e).__name__, e)
        edge = is_edge_target(dialect_like(ctx.root))
        trusted = program_exceptions(ctx.ep) if edge else frozenset()
        for n in rw.ops():
            why = self.target.refusal(n, edge, trusted)
            if why is None and edge:
                why = dtype_refusal(n)
            if why is None:  # the dtypes its backend declares it takes, operand by operand
                why = operand_dtype_refusal(n)
            if why is not None:
                return NotRunnable(Step.EXECUTABLE, why)
        return None

    def _check_outputs(self, built: Any, outputs: tuple[Node, ...], root: Node) -> None:
        """Raise the :class:`FusionError` :mod:`fusionkit.apply.rewrite` would raise on
        what the replacement returned (the same checks, before anything changed; an
        output the fused op subsumes is judged when applied)."""
        replacement_outputs(self.rule.name, root, outputs, built)
