"""Reading a program never specializes its symbolic shapes.

A constraint that compares sizes (``c[0] != q[1]``) on a program exported with a dynamic
dimension evaluates a ``SymInt`` to a bool, and torch's ``ShapeEnv`` answers from the
example size *and records the answer*: a guard, and often a replacement ``s0 -> 3`` that
rewrites every fake tensor of the program (a KV-cache LLM's sequence length became the
example's 3, and the Vulkan serializer then refused its ``sym_size`` node). fusionkit's
search and replacement run with the program's guards suppressed, so what they read is
answered without being written into the program.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from torch.fx import Graph

__all__ = ["guards_suppressed", "guards_suppressed_for", "shape_env_of"]


def shape_env_of(graph: Graph) -> Any:
    """The ``ShapeEnv`` of the graph's fake values (its placeholders'), or None."""
    for node in graph.find_nodes(op="placeholder"):
        envs: dict[int, Any] = {}
        _shape_envs(node.meta.get("val"), envs)
        if envs:
            return next(iter(envs.values()))
    return None


@contextlib.contextmanager
def guards_suppressed(graph: Graph) -> Iterator[None]:
    """In this block, no guard or replacement is added to ``graph``'s shape environment."""
    env = shape_env_of(graph)
    if env is None:
        yield
        return
    with env.suppress_guards():
        yield


def _shape_envs(v: Any, out: dict[int, Any]) -> None:
    """Add the shape environments of ``v`` (a fake tensor's mode's; a symbolic scalar's;
    those of a list's items) to ``out``, by id: the one walk both entry points share."""
    import torch

    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        out.setdefault(id(v.node.shape_env), v.node.shape_env)
    elif isinstance(v, torch.Tensor):
        env = getattr(getattr(v, "fake_mode", None), "shape_env", None)
        if env is not None:
            out.setdefault(id(env), env)
            return
        for d in (*v.shape, *(v.stride() if v.layout == torch.strided else ())):
            _shape_envs(d, out)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _shape_envs(x, out)


def guards_suppressed_for(values: Iterable[Any]) -> contextlib.ExitStack[Any]:
    """:func:`guards_suppressed` for the shape environments of ``values`` (symbolic
    scalars, fake tensors, lists of them: a node's arguments), where no graph is at hand."""
    envs: dict[int, Any] = {}
    for v in values:
        _shape_envs(v, envs)
    stack = contextlib.ExitStack()
    for env in envs.values():
        stack.enter_context(env.suppress_guards())
    return stack
