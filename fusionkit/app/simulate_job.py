"""Lower a model for Vulkan, simulate it on random inputs and compare with eager.

What ``fusionkit simulate MODEL`` runs: :func:`simulate_model` lowers through the
adapter (or, with ``stock=True``, through ExecuTorch's own ``VulkanPartitioner``
with the adapter uninstalled for the duration), serializes the program
(``to_executorch()``), draws random inputs of the example inputs' shapes and
dtypes, runs :func:`~fusionkit.backends.vulkan_adapter.simulate` on the serialized program and eager
PyTorch, and reports the maximum error per output against a per-dtype tolerance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fusionkit.backends.vulkan_adapter.inspect.simulator import (
    NotConstantError,
    SimulationError,
    simulate,
)

__all__ = ["TOLERANCES", "OutputError", "SimulationReport", "random_inputs", "simulate_model"]

#: dtype -> (atol, rtol): |simulated - eager| <= atol + rtol * |eager|
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 6e-2),
}


@dataclass
class OutputError:
    index: int
    shape: list[int]
    dtype: str
    max_abs_error: float
    atol: float
    rtol: float
    ok: bool


@dataclass
class SimulationReport:
    stock: bool
    outputs: list[OutputError] = field(default_factory=list)
    #: the condition the simulated runtime stopped on (None: it ran)
    error: str | None = None
    error_kind: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and all(o.ok for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def random_inputs(example: Sequence[Any], seed: int = 0) -> tuple[Any, ...]:
    """Random inputs shaped like ``example``: normal floats, integers within the example's
    range (token ids stay in the vocabulary), random bools; anything else as given."""
    g = torch.Generator().manual_seed(seed)

    def draw(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if x.dtype.is_floating_point:
            return torch.randn(x.shape, generator=g).to(x.dtype)
        if x.dtype == torch.bool:
            return torch.randint(0, 2, x.shape, generator=g).bool()
        if x.numel() == 0:
            return x.clone()
        lo, hi = int(x.min()), int(x.max())
        return torch.randint(lo, hi + 1, x.shape, generator=g).to(x.dtype)

    return tuple(pytree.tree_map(draw, tuple(example)))


def _lower(exported: Any, rules: Sequence[Any], stock: bool) -> Any:
    from executorch.exir import to_edge_transform_and_lower

    if not stock:
        from fusionkit.app.lowering import lower

        return lower(exported, "vulkan", rules).program
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    from fusionkit.backends.vulkan_adapter import constant_serializer as cs
    from fusionkit.backends.vulkan_adapter.install import install, is_installed, uninstall

    was, cs_was = is_installed(), cs.is_installed()
    uninstall()
    cs.uninstall()
    try:
        edge = to_edge_transform_and_lower(exported, partitioner=[VulkanPartitioner()])
        return edge.to_executorch()
    finally:
        if cs_was:
            cs.install()
        if was:
            install()


def simulate_model(exported: Any, module: Any, example_inputs: Sequence[Any], *,
                   rules: Sequence[Any] = (), stock: bool = False, seed: int = 0,
                   progress: Callable[[str], None] | None = None) -> SimulationReport:
    """Lower ``exported`` for Vulkan, simulate the .pte on random inputs, compare with
    ``module`` (eager; ``exported.module()`` when None)."""
    say = progress or (lambda _msg: None)
    report = SimulationReport(stock=stock)
    say("lowering to vulkan" + (" with stock ExecuTorch (adapter uninstalled)" if stock else ""))
    t0 = time.perf_counter()
    program = _lower(exported, rules, stock)
    report.seconds["lower"] = time.perf_counter() - t0
    inputs = random_inputs(example_inputs, seed)
    eager = module if module is not None else exported.module()
    with torch.no_grad():
        want = pytree.tree_leaves(eager(*inputs))
    say("simulating the Vulkan program on the CPU")
    t0 = time.perf_counter()
    try:
        got = pytree.tree_leaves(simulate(program, *inputs))
    except SimulationError as e:
        report.error = str(e)
        report.error_kind = "not_constant" if isinstance(e, NotConstantError) else type(e).__name__
        return report
    finally:
        report.seconds["simulate"] = time.perf_counter() - t0
    if len(got) != len(want):
        report.error = f"the program returned {len(got)} outputs, eager {len(want)}"
        report.error_kind = "output_count"
        return report
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(w, torch.Tensor):
            ok = g == w
            report.outputs.append(OutputError(i, [], type(w).__name__, 0.0 if ok else float("inf"),
                                              0.0, 0.0, bool(ok)))
            continue
        atol, rtol = TOLERANCES.get(w.dtype, (0.0, 0.0))
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            err, ok = float("inf"), False
        else:
            diff = (g.double() - w.double()).abs()
            err = float(diff.max()) if diff.numel() else 0.0
            ok = g.dtype == w.dtype and bool((diff <= atol + rtol * w.double().abs()).all())
        report.outputs.append(OutputError(i, list(w.shape), str(w.dtype).removeprefix("torch."),
                                          err, atol, rtol, ok))
    return report
