"""A tiny model zoo and ExportedProgram helpers shared by the test suite.

Every model is small (dims <= 16) so that exporting and lowering stay fast.
Helpers never mutate their argument: take a :func:`fresh` copy of a shared
program before running a pass on it.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from fusionkit.targets import op_key

__all__ = [
    "AddMM",
    "D",
    "MulSigmoidOther",
    "Pow",
    "RMSNorm",
    "ReluChain",
    "SiluLike",
    "SiluLikeEscape",
    "addmm_rule",
    "calls",
    "count_op",
    "edge_config",
    "export_aten",
    "export_edge",
    "fresh",
    "node_named",
    "nodes_of",
    "op_counts",
    "outputs_close",
    "rand_inputs",
    "relu_relu_rule",
    "run_program",
    "silu_rule",
]

#: the default feature size of every model here
D = 8


# --------------------------------------------------------------------------- models


class SiluLike(nn.Module):
    """``x * sigmoid(x)`` (or ``sigmoid(x) * x`` with ``swapped``): fusable into silu."""

    def __init__(self, swapped: bool = False) -> None:
        super().__init__()
        self.swapped = swapped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x) * x if self.swapped else x * torch.sigmoid(x)


class SiluLikeEscape(nn.Module):
    """``x * sigmoid(x)`` whose ``sigmoid(x)`` is also returned (an escaping intermediate)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.sigmoid(x)
        return x * s, s + 1.0


class MulSigmoidOther(nn.Module):
    """``x * sigmoid(y)``: looks like silu but is not."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(y)


class ReluChain(nn.Module):
    """``depth`` nested relus."""

    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            x = torch.relu(x)
        return x


class Pow(nn.Module):
    def __init__(self, exponent: float = 2) -> None:
        super().__init__()
        self.exponent = exponent

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x ** self.exponent


class AddMM(nn.Module):
    """``a @ w + bias`` where the bias is chosen by ``bias``.

    ``"param"``: a parameter; ``"buffer"``: a buffer; ``"const"``: a plain tensor
    attribute (lifted constant); ``"input"``: the second user input;
    ``"computed"``: ``2 * a.sum(0)``, depends on the input; ``"cast"``: a float16
    parameter cast to float32; ``"plus_one"``: ``1.0 + param`` (Gemma style).
    ``swapped`` writes ``bias + mm`` instead of ``mm + bias``.
    """

    def __init__(self, bias: str = "param", d: int = D, swapped: bool = False) -> None:
        super().__init__()
        self.kind = bias
        self.swapped = swapped
        self.w = nn.Parameter(torch.randn(d, d))
        if bias in ("param", "plus_one"):
            self.b = nn.Parameter(torch.randn(d))
        elif bias == "cast":
            self.b = nn.Parameter(torch.randn(d).to(torch.float16))
        elif bias == "buffer":
            self.register_buffer("b", torch.randn(d))
        elif bias == "const":
            self.b = torch.randn(d)

    def _bias(self, a: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
        if self.kind == "input":
            assert extra is not None
            return extra
        if self.kind == "computed":
            return a.sum(0) * 2.0
        if self.kind == "cast":
            return self.b.to(torch.float32)
        if self.kind == "plus_one":
            return 1.0 + self.b
        return self.b

    def forward(self, a: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        mm = torch.mm(a, self.w)
        bias = self._bias(a, extra)
        return bias + mm if self.swapped else mm + bias


class RMSNorm(nn.Module):
    """Decomposed RMSNorm times a weight, written the way model code writes it.

    ``weight``: ``"param"``, ``"input"`` (the second user input), ``"plus_one"``
    (``1.0 + param``), ``"cast"`` (a float16 parameter cast to float32).
    ``square``: ``"mul"`` (``x * x``) or ``"pow"`` (``x.pow(2)``).
    ``casts``: upcast to float32 around the norm, as HF models do.
    """

    def __init__(self, d: int = D, weight: str = "param", square: str = "mul",
                 eps: float = 1e-6, casts: bool = False) -> None:
        super().__init__()
        self.kind, self.square, self.eps, self.casts = weight, square, eps, casts
        if weight == "cast":
            self.weight = nn.Parameter(torch.rand(d).to(torch.float16) + 0.5)
        elif weight != "input":
            self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        h = x.to(torch.float32) if self.casts else x
        sq = h * h if self.square == "mul" else h.pow(2)
        normed = h * torch.rsqrt(sq.mean(-1, keepdim=True) + self.eps)
        if self.casts:
            normed = normed.to(x.dtype)
        if self.kind == "input":
            assert w is not None
            weight = w
        elif self.kind == "plus_one":
            weight = 1.0 + self.weight
        elif self.kind == "cast":
            weight = self.weight.to(torch.float32)
        else:
            weight = self.weight
        return normed * weight


# ------------------------------------------------------------------------- programs


def rand_inputs(*shapes: tuple[int, ...], seed: int = 0,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).to(dtype) for s in shapes)


def export_aten(model: nn.Module, inputs: tuple[Any, ...], **kwargs: Any) -> ExportedProgram:
    """``torch.export.export`` of ``model`` in eval mode (ATen dialect)."""
    return torch.export.export(model.eval(), inputs, **kwargs)


def export_edge(model: nn.Module, inputs: tuple[Any, ...], compile_config: Any = None,
                **kwargs: Any) -> ExportedProgram:
    """The edge-dialect program ``to_edge`` makes of ``model``."""
    from executorch.exir import to_edge

    ep = export_aten(model, inputs, **kwargs)
    return to_edge(ep, compile_config=compile_config).exported_program()


def edge_config(*extra_ops: Any) -> Any:
    """An ``EdgeCompileConfig`` whose verifier also allows ``extra_ops`` (non-core ATen)."""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_core_aten_ops_exception_list=list(extra_ops))


def fresh(ep: ExportedProgram) -> ExportedProgram:
    """An independent copy of a (shared) program that a pass may mutate."""
    return copy.deepcopy(ep)


def run_program(ep: ExportedProgram, *inputs: torch.Tensor) -> Any:
    """Run the program through ``ep.module()`` (re-validates it as a module)."""
    with torch.no_grad():
        return ep.module()(*inputs)


def outputs_close(a: Any, b: Any, atol: float = 1e-5, rtol: float = 1e-5) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(outputs_close(x, y, atol, rtol)
                                        for x, y in zip(a, b, strict=True))
    return bool(torch.allclose(a, b, atol=atol, rtol=rtol))


def calls(ep: ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in ep.graph_module.graph.nodes if n.op == "call_function"]


def op_counts(ep: ExportedProgram) -> Counter[str]:
    """How many calls of each op (canonical ``ns.op.overload`` key) the graph holds."""
    return Counter(op_key(n.target) or str(n.target) for n in calls(ep))


def count_op(ep: ExportedProgram, key: str) -> int:
    return op_counts(ep)[key]


def node_named(ep: ExportedProgram, name: str) -> torch.fx.Node:
    for n in ep.graph_module.graph.nodes:
        if n.name == name:
            return n
    raise KeyError(name)


def nodes_of(ep: ExportedProgram, key: str) -> list[torch.fx.Node]:
    return [n for n in calls(ep) if op_key(n.target) == key]



# ----------------------------------------------------------------- reference rules
# Small ATen-level fusions whose reference semantics are exact, for testing the
# machinery independently of any backend op.


def silu_rule(name: str = "silu", **kw: Any) -> Any:
    """``x * sigmoid(x)`` (either operand order) -> ``aten.silu``."""
    from fusionkit import Rule, capture, op, ref, replace_with

    x = capture("x")
    return Rule(name, op("aten.mul.Tensor", x, op("aten.sigmoid.default", x)),
                replace_with("aten.silu.default", ref("x")), **kw)


def addmm_rule(name: str = "addmm", fold: bool = False, **kw: Any) -> Any:
    """``mm(a, b) + bias`` (either order) with a prepackable bias -> ``aten.addmm``."""
    from fusionkit import PrepackableConstant, Rule, capture, op, ref, replace_with

    pattern = op("aten.add.Tensor",
                 op("aten.mm.default", capture("a"), capture("b")), capture("bias"))
    return Rule(name, pattern,
                replace_with("aten.addmm.default", ref("bias"), ref("a"), ref("b")),
                constraints=[PrepackableConstant("bias", fold=fold)], **kw)


def relu_relu_rule(name: str = "relu_relu", **kw: Any) -> Any:
    """``relu(relu(x))`` -> ``relu(x)``."""
    from fusionkit import Rule, capture, op, ref, replace_with

    return Rule(name, op("aten.relu.default", op("aten.relu.default", capture("x"))),
                replace_with("aten.relu.default", ref("x")), **kw)
