"""Operator identity: one canonical name for ATen, edge-dialect and custom ops.

Rules are written against qualified names (``"aten.mul.Tensor"``) or op objects;
graphs hold ``OpOverload`` (ATen dialect) or ``EdgeOpOverload`` (edge dialect).
Both normalise to the same key, so one rule serves both dialects and the
matcher can index rules by the key of their root op.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.fx import Node

if TYPE_CHECKING:
    from torch.fx import Graph

__all__ = [
    "ASSERTION_OPS",
    "DELEGATE_ENTRY_POINTS",
    "OpTarget",
    "UnknownOpError",
    "delegate_entry_points",
    "dialect_like",
    "dialect_target",
    "graph_op_keys",
    "import_op_libraries",
    "impurity",
    "is_assertion",
    "is_edge_target",
    "is_python_operator",
    "load_delegate_descriptions",
    "memo_per_target",
    "op_key",
    "overload_of",
    "register_op_library",
    "resolve_op",
    "schema_of",
    "target_name",
    "writes_to",
]

OpTarget = Any  # an OpOverload, an EdgeOpOverload, or a qualified name string


class UnknownOpError(ValueError):
    """A qualified op name that does not resolve to a registered operator."""


def overload_of(target: Any) -> torch._ops.OpOverload | None:
    """The ``OpOverload`` behind a target, or None for every other kind of target.

    Node targets are not only operators: ``operator.getitem`` and other Python
    functions, higher-order operators (``cond``, ``auto_functionalized``,
    ``executorch_call_delegate``), ``torch.sym_*`` functions, attribute names of
    ``get_attr`` nodes. Those are None here, never an exception.
    """
    if isinstance(target, torch._ops.OpOverload):
        return target
    try:
        inner = getattr(target, "_op", None)  # EdgeOpOverload wraps an OpOverload
    except Exception:  # a target object whose attribute lookup itself fails
        return None
    if isinstance(inner, torch._ops.OpOverload):
        return inner
    return None


_T = TypeVar("_T")


def memo_per_target(memo: dict[Any, _T], target: Any, compute: Callable[[Any], _T]) -> _T:
    """``compute(target)``, remembered in ``memo``: a graph repeats few targets many times.

    An unhashable target (some Python callables) is computed every time.
    """
    try:
        return memo[target]
    except KeyError:
        value = memo[target] = compute(target)
        return value
    except TypeError:
        return compute(target)


#: :func:`op_key`'s memo by target object; the matcher reads it directly in its hot path
OP_KEY_MEMO: dict[Any, str | None] = {}


def op_key(target: Any) -> str | None:
    """Canonical ``namespace.name.overload`` of a node target, or None.

    Cached per target object: this runs once per graph node at match time.
    """
    try:
        return OP_KEY_MEMO[target]
    except KeyError:
        pass
    except TypeError:  # unhashable target
        return None
    overload = overload_of(target)
    key: str | None = None
    if overload is not None:
        ns, name = overload._schema.name.split("::", 1)
        key = f"{ns}.{name}.{overload._overloadname}"
    OP_KEY_MEMO[target] = key
    return key


#: modules whose import registers an op namespace ExecuTorch graphs use; a backend adds its
#: own with :func:`register_op_library` (the core names no backend)
_OP_LIBRARIES: dict[str, tuple[str, ...]] = {
    "dim_order_ops": ("executorch.exir.passes.dim_order_ops_registry",),
    "quantized_decomposed": ("torch.ao.quantization.fx._decomposed",),
    "torchao": ("torchao",),
    "llama": ("executorch.extension.llm.custom_ops.custom_ops",),
}


def register_op_library(namespace: str, *modules: str) -> None:
    """Op namespace ``namespace`` registers when ``modules`` are imported: resolving a
    name in it (``"ns.op.overload"``) imports them first if need be."""
    known = _OP_LIBRARIES.get(namespace, ())
    _OP_LIBRARIES[namespace] = (*known, *(m for m in modules if m not in known))


#: the entry-point group of modules that describe a backend's delegate to the core when
#: imported (they call ``fusionkit.register_delegate``); how a rule naming a backend's ops is
#: judged right when nothing but fusionkit was imported
DELEGATE_ENTRY_POINTS = "fusionkit.delegates"
_DESCRIBED: list[bool] = []


def load_delegate_descriptions() -> None:
    """Import every module of :data:`DELEGATE_ENTRY_POINTS`, once: the first time the core
    needs what backends know (an op namespace it cannot resolve, an op no CPU kernel runs).
    A module that fails to import is logged and skipped: it never stops a lowering."""
    if _DESCRIBED:
        return
    _DESCRIBED.append(True)
    import logging

    for point in delegate_entry_points():
        try:
            point.load()
        except Exception as e:
            logging.getLogger(__name__).warning("delegate description %s (%s) failed to "
                                                "load: %s", point.name, point.value, e)


def delegate_entry_points() -> list[Any]:
    """The entry points of :data:`DELEGATE_ENTRY_POINTS`, of every distribution found.

    Not ``importlib.metadata.entry_points(group=...)``: that reads only the first copy of a
    distribution's metadata on ``sys.path``, and a stale ``*.egg-info`` in a source checkout
    (the working directory) would hide the installed one."""
    from importlib.metadata import distributions

    points: dict[str, Any] = {}
    for dist in distributions():
        for point in dist.entry_points:
            if point.group == DELEGATE_ENTRY_POINTS:
                points.setdefault(point.value, point)
    return sorted(points.values(), key=lambda p: (p.name, p.value))


def import_op_libraries(namespace: str) -> None:
    """Custom op namespaces register on import; import the ones we know of."""
    import importlib

    if namespace not in _OP_LIBRARIES:
        load_delegate_descriptions()
    for module in (*_OP_LIBRARIES.get(namespace, ()), "executorch.exir"):
        try:
            importlib.import_module(module)
        except Exception:  # an optional library that is not installed or fails to load
            pass


@cache
def _resolve_name(name: str) -> torch._ops.OpOverload:
    parts = name.replace("::", ".").split(".")
    if len(parts) == 2:
        parts.append("default")
    if len(parts) != 3 or not all(parts):
        raise UnknownOpError(
            f"op name {name!r} is not of the form 'namespace.op.overload' "
            "(e.g. 'aten.mul.Tensor')"
        )
    ns, op, overload = parts
    for attempt in range(2):
        try:
            packet = getattr(getattr(torch.ops, ns), op)
            return getattr(packet, overload)  # type: ignore[no-any-return]
        except (AttributeError, RuntimeError):
            if attempt == 0:
                import_op_libraries(ns)
    raise UnknownOpError(f"op {name!r} does not resolve to a registered operator"
                         + _closest_ops(ns, op, overload))


def _closest_ops(ns: str, op: str, overload: str) -> str:
    """``; did you mean ...?`` with the registered ops nearest to ``ns.op.overload``
    (the overloads of ``op`` when it exists; else the names in ``ns`` closest to it)."""
    import difflib

    registered: list[str] = []
    for qualified in torch._C._dispatch_get_all_op_names():
        space, _, rest = qualified.partition("::")
        if space == ns:
            name, _, ov = rest.partition(".")
            registered.append(f"{ns}.{name}.{ov or 'default'}")
    if not registered:
        return f" (no operator is registered in namespace {ns!r})"
    same_op = sorted(r for r in registered if r.split(".")[1] == op)
    pool = same_op or registered
    close = difflib.get_close_matches(f"{ns}.{op}.{overload}", pool, n=3, cutoff=0.6)
    if not close and same_op:
        close = same_op[:5]
    return f"; did you mean {' or '.join(close)}?" if close else ""


def resolve_op(target: OpTarget) -> torch._ops.OpOverload:
    """The ATen-level ``OpOverload`` for a name, OpOverload or EdgeOpOverload."""
    if isinstance(target, str):
        return _resolve_name(target)
    overload = overload_of(target)
    if overload is None:
        raise UnknownOpError(f"{target!r} is not an operator overload")
    return overload


def target_name(target: Any) -> str:
    """A readable name for any node target (messages only; never raises).

    ``aten.mul.Tensor`` for operators, ``operator.getitem`` for Python functions,
    ``cond`` for a higher-order operator, the attribute path for ``get_attr``.
    """
    key = op_key(target)
    if key is not None:
        return key
    if isinstance(target, str):
        return target
    try:
        module = getattr(target, "__module__", None) or ""
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
        if isinstance(name, str):
            module = module.lstrip("_")  # operator.getitem lives in _operator
            return f"{module}.{name}" if module in ("operator", "math", "builtins") else name
        return str(target)
    except Exception:
        return f"<{type(target).__name__}>"


def schema_of(target: Any) -> torch._C.FunctionSchema | None:
    return _schema_of_overload(overload_of(target))


def _schema_of_overload(overload: Any) -> torch._C.FunctionSchema | None:
    return overload._schema if overload is not None else None


def is_python_operator(target: Any) -> bool:
    """Whether ``target`` is a function of Python's ``operator`` module (``getitem``,
    ``add`` on SymInts, ...): no schema, but pure, and it writes to nothing."""
    return getattr(target, "__module__", None) in ("_operator", "operator")


#: op names whose value is not a function of their operands: a random draw, or memory
#: left as it was found
_NONDETERMINISTIC = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "empty")


def impurity(target: Any) -> str | None:
    """Why a call of ``target`` is not a pure, deterministic operator, or None when it is:
    two calls of it with the same operands hold the same value and write nothing.

    The one verdict behind folding a constant expression at lowering time and treating two
    nodes as one value. The reason reads after the op's name: "(aten.x.y), which ..."."""
    name = target_name(target)
    overload = overload_of(target)
    schema = _schema_of_overload(overload)
    if schema is None:
        return f"({name}), which is not an operator with a schema"
    if schema.is_mutable:
        return f"({name}), which mutates its inputs"
    op_name = name.split(".")[1] if name.count(".") >= 2 else name
    if (torch.Tag.nondeterministic_seeded in getattr(overload, "tags", ())
            or any(word in op_name for word in _NONDETERMINISTIC)):
        return f"({name}), which is not deterministic"
    return None


def writes_to(node: Node, values: Container[Node]) -> bool:
    """Whether ``node`` writes in place to one of ``values``: an argument its schema marks
    written (``Tensor(a!)``). A call without a schema writes nothing here; callers that
    must assume the worst of it check :func:`schema_of` themselves."""
    schema = schema_of(node.target) if node.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return False
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
        if isinstance(v, Node) and v in values:
            return True
    return False


#: ops that only check a value at run time (torch.export inserts them, e.g. before
#: every ``.to()`` cast): they produce nothing, so they never keep a value alive
ASSERTION_OPS: frozenset[str] = frozenset({
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten._assert_async.msg",
    "aten._assert_async.default",
    "aten.sym_constrain_range.default",
    "aten.sym_constrain_range_for_size.default",
})


def is_assertion(node: Any) -> bool:
    """A call that only asserts something about its inputs and has no users."""
    return (getattr(node, "op", None) == "call_function" and not node.users
            and op_key(node.target) in ASSERTION_OPS)


def is_edge_target(target: Any) -> bool:
    return type(target).__name__ == "EdgeOpOverload"


def dialect_like(node: Node) -> Any:
    """The op whose dialect a replacement of ``node`` takes: ``node``'s own, or, for an op
    that keeps its ATen form in an edge program (``_local_scalar_dense``, ``operator.*``),
    that of a neighbouring edge op. ExecuTorch serializes ops by name, and the edge op
    ``et_vk.select_as_symint`` is ``et_vk.select_as_symint.default`` to the Vulkan runtime
    while its ATen form is ``select_as_symint.default``, which the runtime lacks."""
    if is_edge_target(node.target):
        return node.target
    for other in (*node.all_input_nodes, *node.users):
        if other.op == "call_function" and is_edge_target(other.target):
            return other.target
    return node.target


def dialect_target(key_or_target: OpTarget, like: Any) -> Any:
    """``key_or_target`` as an op object of the same dialect as ``like``.

    New nodes must use edge-dialect ops in an edge program (the verifier and
    partitioners expect ``EdgeOpOverload``) and ATen ops in an ATen program.
    """
    overload = resolve_op(key_or_target)
    if not is_edge_target(like):
        return overload
    from executorch.exir.dialects._ops import ops as exir_ops

    ns, name = overload._schema.name.split("::", 1)
    return getattr(getattr(getattr(exir_ops.edge, ns), name), overload._overloadname)


def graph_op_keys(graph: Graph) -> frozenset[str]:
    """The op keys of every ``call_function`` node in ``graph``.

    Read from the graph's find-nodes side table (one entry per distinct target,
    kept up to date by FX as nodes are created, erased or retargeted) when this
    torch has it, else from a scan of the nodes.
    """
    table = getattr(getattr(graph, "_find_nodes_lookup_table", None), "table", None)
    if isinstance(table, dict):
        targets = [t for (op, t), nodes in list(table.items()) if op == "call_function" and nodes]
    else:
        targets = [n.target for n in graph.nodes if n.op == "call_function"]
    return frozenset(k for k in map(op_key, targets) if k is not None)
