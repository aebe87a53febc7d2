"""Regenerate a changed GraphModule's Python code when it is first needed, not at once.

``GraphModule.recompile`` generates and compiles Python source for the whole
graph (tens of µs per node): after a fusion pass that changed 64 nodes of a
2,000-node graph it costs more than the fusions themselves, and ExecuTorch's
pass manager recompiles again right after every pass that reports a change.
:func:`mark_stale` does what ``torch.fx``'s own ``_LazyGraphModule`` does, on
the graph module the program already has (each GraphModule instance has its
own class, so nothing else is touched): its ``forward``, ``code``, ``str()``
and ``recompile()`` regenerate the code first, once, and then behave exactly
as before. Copies (``deepcopy``, pickling, ``ExportedProgram.module()``) build
their code from the graph as always.
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

try:
    from torch.fx._lazy_graph_module import _LazyGraphModule
except ImportError:  # pragma: no cover - older torch
    _LazyGraphModule = None  # type: ignore[assignment,misc]

__all__ = ["is_stale", "mark_stale"]

_FLAG = "_fusionkit_code_stale"
_NAMES = ("forward", "code", "__str__", "recompile")


def _regenerate(self: GraphModule) -> Any:
    cls = type(self)
    if cls.__dict__.get(_FLAG):
        for name in (*_NAMES, _FLAG):
            if name in cls.__dict__:
                delattr(cls, name)
    return self.recompile()  # the real one now


def _lazy_forward(self: GraphModule, *args: Any, **kwargs: Any) -> Any:
    _regenerate(self)
    return self(*args, **kwargs)


def _lazy_code(self: GraphModule) -> str:
    _regenerate(self)
    return self.code


def _lazy_str(self: GraphModule) -> str:
    _regenerate(self)
    return str(self)


def is_stale(gm: GraphModule) -> bool:
    """True while ``gm``'s code waits for regeneration."""
    return bool(type(gm).__dict__.get(_FLAG))


def mark_stale(gm: GraphModule) -> None:
    """Make ``gm`` regenerate its code on first use (``recompile()`` if that is impossible)."""
    cls = type(gm)
    if _LazyGraphModule is not None and isinstance(gm, _LazyGraphModule):
        gm.recompile()  # already lazy
        return
    if cls.__qualname__.rsplit(".", 1)[-1] != "GraphModuleImpl" or cls is GraphModule:
        gm.recompile()  # a class shared with other instances: regenerate now
        return
    if cls.__dict__.get(_FLAG):
        return
    saved = {name: cls.__dict__[name] for name in _NAMES if name in cls.__dict__}
    try:
        cls.forward = _lazy_forward  # type: ignore[method-assign]
        cls.code = property(_lazy_code)  # type: ignore[method-assign,assignment]
        cls.__str__ = _lazy_str  # type: ignore[method-assign,assignment]
        cls.recompile = _regenerate  # type: ignore[method-assign]
        setattr(cls, _FLAG, True)
    except BaseException:
        for name in (*_NAMES, _FLAG):
            if name in cls.__dict__:
                delattr(cls, name)
        for name, value in saved.items():
            setattr(cls, name, value)
        raise
