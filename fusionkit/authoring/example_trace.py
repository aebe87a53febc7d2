"""Tracing one example: the code a rule is made from, exported and its inputs named.

:func:`rule_from_functions <fusionkit.authoring.from_example.rule_from_functions>`
starts from eager code, not a graph. This module runs that code through
``torch.export`` (and ``to_edge`` for the edge dialect) and records what each
placeholder of the traced graph stands for — a user input (named after the
function's parameter), a module parameter or buffer (named after its attribute
path), or a constant the trace lifted — so the later steps (wildcards, graph to
pattern, the replacement's replay) read one :class:`ExampleTrace`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node

from fusionkit.targets import is_assertion, schema_of

__all__ = ["Dialect", "ExampleError", "ExampleModule", "ExampleTrace", "TraceDialect",
           "bind_inputs", "calls", "capture_name", "get_attr_path", "has_attr",
           "is_tensor_arg", "output_nodes", "set_attr_path", "signature_of", "trace"]

Dialect = Literal["edge", "aten"]
#: what a trace is lowered to: a rule's dialect, or core ATen (``aten`` plus
#: ``to_edge``'s decompositions, still an ATen program)
TraceDialect = Literal["edge", "aten", "core"]


class ExampleError(ValueError):
    """Example code that cannot become a rule as asked (says what to change)."""


@dataclass
class ExampleTrace:
    """One traced example: the program and what each placeholder stands for."""

    ep: ExportedProgram
    #: placeholder node name -> capture name (user inputs, module tensors)
    names: dict[str, str]
    #: placeholder node name -> value of a lifted constant that is not a module tensor
    lifted: dict[str, torch.Tensor]
    #: capture name -> example value (tensors, and the example literal of a wildcard)
    examples: dict[str, Any]
    #: capture names of module parameters/buffers
    module_tensors: list[str]


class ExampleModule(nn.Module):
    """``fn(**tensors, **fixed)`` as a module, so export sees only the tensors."""

    def __init__(self, fn: Callable[..., Any], tensor_names: Sequence[str],
                 fixed: Mapping[str, Any]) -> None:
        super().__init__()
        if isinstance(fn, nn.Module):
            self.inner = fn  # its parameters and buffers are named inner.*
        else:
            self.fn = fn
        self.tensor_names = tuple(tensor_names)
        self.fixed = dict(fixed)

    def forward(self, *tensors: torch.Tensor) -> Any:
        fn = self.inner if hasattr(self, "inner") else self.fn
        return fn(**dict(zip(self.tensor_names, tensors, strict=True)), **self.fixed)


def signature_of(fn: Callable[..., Any]) -> inspect.Signature:
    """The parameters of a function, or of a module's ``forward``."""
    target = fn.forward if isinstance(fn, nn.Module) else fn
    return inspect.signature(target)


def bind_inputs(fn: Callable[..., Any], inputs: Sequence[Any] | Mapping[str, Any]
                ) -> dict[str, Any]:
    """The example inputs by parameter name (defaults filled in)."""
    sig = signature_of(fn)
    try:
        bound = (sig.bind(**inputs) if isinstance(inputs, Mapping) else sig.bind(*inputs))
    except TypeError as e:
        raise ExampleError(f"example inputs do not fit {getattr(fn, '__name__', fn)}{sig}: {e}"
                           ) from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _export(fn: Callable[..., Any], values: Mapping[str, Any], dialect: TraceDialect
            ) -> tuple[ExportedProgram, list[str]]:
    tensor_names = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    fixed = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
    module = ExampleModule(fn, tensor_names, fixed).eval()
    args = tuple(values[k] for k in tensor_names)
    try:
        ep = torch.export.export(module, args, strict=False)
        if dialect == "edge":
            from executorch.exir import EdgeCompileConfig, to_edge

            cfg = EdgeCompileConfig(_check_ir_validity=False)
            ep = to_edge(ep, compile_config=cfg).exported_program()
        elif dialect == "core":
            from executorch.exir.tracer import _default_decomposition_table

            ep = ep.run_decompositions(_default_decomposition_table())
    except Exception as e:  # export's own error, with the example named
        raise ExampleError(f"cannot trace {getattr(fn, '__name__', type(fn).__name__)} "
                           f"({dialect} dialect): {type(e).__name__}: {e}") from e
    return ep, tensor_names


def capture_name(fqn: str) -> str:
    """``inner.layers.0.weight`` -> ``layers_0_weight`` (a capture name is an identifier)."""
    name = re.sub(r"\W", "_", fqn.removeprefix("inner."))
    return name if name.isidentifier() else f"t_{name}"


def trace(fn: Callable[..., Any], values: Mapping[str, Any], dialect: TraceDialect
          ) -> ExampleTrace:
    """``fn`` traced at ``values`` (inputs by parameter name) in ``dialect``."""
    ep, tensor_names = _export(fn, values, dialect)
    module_fqns = set()
    if isinstance(fn, nn.Module):
        module_fqns = {f"inner.{k}" for k, _ in fn.named_parameters()}
        module_fqns |= {f"inner.{k}" for k, _ in fn.named_buffers()}
    names: dict[str, str] = {}
    lifted: dict[str, torch.Tensor] = {}
    examples: dict[str, Any] = {k: v for k, v in values.items()}
    module_tensors: list[str] = []
    user_i = 0
    state = {**ep.state_dict, **ep.constants}
    for spec in ep.graph_signature.input_specs:
        pname = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            names[pname] = tensor_names[user_i]
            user_i += 1
        elif spec.target in module_fqns:
            cname = capture_name(spec.target)
            names[pname] = cname
            module_tensors.append(cname)
            examples[cname] = state[spec.target]
        elif spec.target is not None and spec.target in state:
            lifted[pname] = state[spec.target]
        else:
            names[pname] = capture_name(pname)
    return ExampleTrace(ep, names, lifted, examples, module_tensors)


def calls(ep: ExportedProgram) -> list[Node]:
    """The op calls of a traced graph, in order (shape assertions left out)."""
    return [n for n in ep.graph.nodes if n.op == "call_function" and not is_assertion(n)]


def output_nodes(ep: ExportedProgram) -> list[Any]:
    """What the traced graph returns, in order."""
    out = next(n for n in ep.graph.nodes if n.op == "output")
    return list(out.args[0])


def is_tensor_arg(target: Any, key: Any) -> bool:
    """Whether argument ``key`` (a position or a name) of op ``target`` is a Tensor."""
    schema = schema_of(target)
    if schema is None:
        return False
    args = schema.arguments
    arg = (args[key] if isinstance(key, int) and key < len(args)
           else next((a for a in args if a.name == key), None))
    return arg is not None and isinstance(arg.type, torch.TensorType)


def set_attr_path(m: nn.Module, path: str, v: Any) -> None:
    """``m.a.b = v`` for ``path`` ``"a.b"``."""
    *parents, last = path.split(".")
    for p in parents:
        m = getattr(m, p)
    setattr(m, last, v)


def get_attr_path(m: Any, path: str) -> Any:
    """``m.a.b`` for ``path`` ``"a.b"``."""
    for p in path.split("."):
        m = getattr(m, p)
    return m


def has_attr(m: Any, path: str) -> bool:
    """Whether ``m`` has the (dotted) attribute ``path``."""
    try:
        get_attr_path(m, path)
        return True
    except AttributeError:
        return False
