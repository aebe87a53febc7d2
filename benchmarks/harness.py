"""Timing, call counting and the stock/fusionkit entry points the benchmark compares."""

from __future__ import annotations

import contextlib
import gc
import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

#: sections 1-2 (single-threaded Python on fake tensors) use this process's CPU
#: time, which other processes' load on a shared machine does not inflate;
#: end-to-end lowering uses wall time
CPU_CLOCK = time.process_time
WALL_CLOCK = time.perf_counter

#: the stages a timed lowering is split into, in order
STAGES = ("export", "edge", "fusion", "verify", "partition", "preprocess", "serialize")


def median_time(fn: Callable[[Any], Any], runs: int,
                setup: Callable[[], Any] | None = None,
                clock: Callable[[], float] = CPU_CLOCK) -> tuple[float, list[float]]:
    """Median time (s) of ``fn(setup())`` over ``runs``; ``setup`` is not timed."""
    times = []
    for _ in range(runs):
        arg = setup() if setup is not None else None
        gc.collect()
        t0 = clock()
        fn(arg)
        times.append(clock() - t0)
    return statistics.median(times), times


# ------------------------------------------------------------------ recompile / retrace


@dataclass
class CallCounts:
    recompile: int = 0
    retrace: int = 0  # ExportPass.call: re-runs every node on fake tensors
    graphs: list[str] = field(default_factory=list)


@contextlib.contextmanager
def count_recompiles_and_retraces() -> Iterator[CallCounts]:
    """Counts ``GraphModule.recompile`` and ``ExportPass.call`` while the block runs.

    ``FusePatternsPass.call`` retraces with ``super().call(graph_module)``, which
    resolves to ``_ExportPassBase.call``; patching the class attribute sees it.
    """
    from executorch.exir import pass_base

    counts = CallCounts()
    real_recompile = torch.fx.GraphModule.recompile
    real_call = pass_base._ExportPassBase.call

    def recompile(self: torch.fx.GraphModule) -> Any:
        counts.recompile += 1
        return real_recompile(self)

    def call(self: Any, graph_module: torch.fx.GraphModule) -> Any:
        counts.retrace += 1
        counts.graphs.append(type(self).__name__)
        return real_call(self, graph_module)

    torch.fx.GraphModule.recompile = recompile  # type: ignore[method-assign]
    pass_base._ExportPassBase.call = call  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        torch.fx.GraphModule.recompile = real_recompile  # type: ignore[method-assign]
        pass_base._ExportPassBase.call = real_call  # type: ignore[method-assign]


# ------------------------------------------------------------------------- fusionkit


def builtin_rules() -> tuple[list[Any], str]:
    """Every rule fusionkit ships (fresh objects), and where the list came from."""
    from fusionkit.passes import rule_set

    return rule_set("builtin"), 'fusionkit.passes.rule_set("builtin")'


# ----------------------------------------------------------------------------- stock


class StockVulkan:
    """Stock ExecuTorch Vulkan detection/fusion, as shipped or with cached pattern graphs.

    As shipped, every ``get_all_fusable_subgraphs`` / ``FusePatternsPass`` call
    re-exports the RoPE pattern graphs (``get_rope_graphs``/``get_hf_rope_graphs``
    call ``torch.export`` + ``to_edge``). ``cached()`` swaps in the graphs
    built once, so only SubgraphMatcher and the per-node detectors remain: the
    strictest comparison for fusionkit.
    """

    def __init__(self, graph_patterns: bool = True) -> None:
        import executorch.backends.vulkan.patterns as vk

        self.vk = vk
        #: False (--quick): leave the SubgraphMatcher (RoPE) patterns out of the
        #: cached runs, so the smoke run does not pay seconds to export them
        self.graph_patterns = graph_patterns
        self._graphs: dict[str, list[torch.fx.GraphModule]] | None = None

    def pattern_graphs(self) -> dict[str, list[torch.fx.GraphModule]]:
        if self._graphs is None:
            self._graphs = {name: list(e.get_graphs_fn()) if self.graph_patterns else []
                            for name, e in self.vk.fusable_patterns.items()
                            if e.get_graphs_fn is not None}
        return self._graphs

    def build_pattern_graphs(self) -> None:
        """What every as-shipped call pays before matching starts."""
        self.vk.all_fusable_graph_patterns()

    @contextlib.contextmanager
    def cached(self) -> Iterator[None]:
        graphs = self.pattern_graphs()
        entries = self.vk.fusable_patterns
        saved = {name: entries[name].get_graphs_fn for name in graphs}
        saved_all = self.vk.all_fusable_graph_patterns
        for name, gs in graphs.items():
            entries[name].get_graphs_fn = (lambda gs=gs: gs)
        self.vk.all_fusable_graph_patterns = lambda: [g for gs in graphs.values() for g in gs]
        try:
            yield
        finally:
            for name, fn in saved.items():
                entries[name].get_graphs_fn = fn
            self.vk.all_fusable_graph_patterns = saved_all

    def detect(self, gm: torch.fx.GraphModule) -> list[Any]:
        return list(self.vk.get_all_fusable_subgraphs(gm))

    def fuse(self, ep: Any) -> Any:
        from executorch.backends.vulkan._passes.fuse_patterns import FusePatternsPass

        p = FusePatternsPass()
        p._exported_program = ep
        return p(ep.graph_module)


# -------------------------------------------------------------------------- adapters


@dataclass
class Adapter:
    backend: str
    partitioner: Callable[[], Any]
    passes: Callable[[], list[Any]]
    module: Any = None

    def uninstall(self) -> None:
        """Remove any global hook the adapter installed, so stock runs are stock."""
        un = getattr(self.module, "uninstall", None)
        if callable(un):
            un()


def load_adapter(backend: str) -> tuple[Adapter | None, str]:
    """``fusionkit.backends.<backend>_adapter`` if it provides the adapter API."""
    mod_name = f"fusionkit.backends.{backend}_adapter"
    part_name = {"vulkan": "VulkanPartitioner", "xnnpack": "XnnpackPartitioner"}[backend]
    try:
        mod = importlib.import_module(mod_name)
        part = getattr(mod, part_name)
        tp = mod.transform_passes
    except (ImportError, AttributeError) as e:
        return None, f"adapter not available ({mod_name}: {e})"

    def passes() -> list[Any]:
        got = tp() if callable(tp) else tp
        return list(got)

    return Adapter(backend, part, passes, mod), mod_name


def stock_partitioner(backend: str) -> Any:
    if backend == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

        return VulkanPartitioner()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return XnnpackPartitioner()


# ------------------------------------------------------------------ lowering stages


@contextlib.contextmanager
def stage_timer(passes: list[Any], partitioner: Any) -> Iterator[dict[str, float]]:
    """CPU time spent, while the block runs, in ``passes`` (fusion), ExecuTorch's checks
    around them (verify), ``partitioner.partition`` and backend preprocessing
    (``BackendDetails.preprocess`` / ``preprocess_multimethod``).

    ``verify`` is what ``to_edge_transform_and_lower`` does only because transform
    passes were given, outside the passes themselves: ``EdgeProgramManager.transform``
    (its pass manager's check before and after the passes -- recompile, lint,
    ``ExportedProgram.validate`` --, the edge-dialect verifier, the new manager's
    verifier) and ``lift_constant_tensor_pass``. It is the same for any pass list,
    even one that changes nothing; stock lowers without transform passes and pays none.

    Preprocess is timed at the base class, outermost call only, so a backend or an
    adapter that wraps its own ``preprocess`` is still counted once.
    """
    from executorch.exir.backend.backend_details import BackendDetails
    from executorch.exir.program import _program

    acc = {"fusion": 0.0, "verify": 0.0, "partition": 0.0, "preprocess": 0.0}
    depth = [0]

    def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            if depth[0]:
                return fn(*a, **k)
            depth[0] += 1
            t0 = CPU_CLOCK()
            try:
                return fn(*a, **k)
            finally:
                acc[key] += CPU_CLOCK() - t0
                depth[0] -= 1
        return run

    # lift_constant_tensor_pass also runs inside to_edge for every lowering: only the
    # calls between the transform and to_backend are the transform passes' cost
    after_transform = [False]

    def verifying(fn: Callable[..., Any], arms: bool) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            if not (arms or after_transform[0]):
                return fn(*a, **k)
            t0, f0 = CPU_CLOCK(), acc["fusion"]
            try:
                return fn(*a, **k)
            finally:  # the passes' own time is fusion, counted by their timer
                acc["verify"] += CPU_CLOCK() - t0 - (acc["fusion"] - f0)
                after_transform[0] = after_transform[0] or arms
        return run

    def disarming(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            after_transform[0] = False
            return fn(*a, **k)
        return run

    for p in passes:
        p.call = timed("fusion", p.call)
    partitioner.partition = timed("partition", partitioner.partition)
    real_multi = BackendDetails.__dict__["preprocess_multimethod"]
    real_transform = _program.EdgeProgramManager.__dict__["transform"]
    real_lift = _program.lift_constant_tensor_pass
    real_to_backend = _program.EdgeProgramManager.__dict__["to_backend"]

    def multi(cls: Any, *a: Any, **k: Any) -> Any:
        return timed("preprocess", lambda: real_multi.__func__(cls, *a, **k))()

    BackendDetails.preprocess_multimethod = classmethod(multi)  # type: ignore[assignment,method-assign]
    _program.EdgeProgramManager.transform = verifying(real_transform, True)  # type: ignore[method-assign]
    _program.EdgeProgramManager.to_backend = disarming(real_to_backend)  # type: ignore[method-assign]
    _program.lift_constant_tensor_pass = verifying(real_lift, False)
    try:
        yield acc
    finally:
        BackendDetails.preprocess_multimethod = real_multi  # type: ignore[method-assign]
        _program.EdgeProgramManager.transform = real_transform  # type: ignore[method-assign]
        _program.EdgeProgramManager.to_backend = real_to_backend  # type: ignore[method-assign]
        _program.lift_constant_tensor_pass = real_lift


def timed_lowering(ep: Any, passes: list[Any], partitioner: Any,
                   export_s: float) -> dict[str, float]:
    """``to_edge_transform_and_lower`` of ``ep`` and its ``.pte``, CPU time per stage
    (:data:`STAGES`; ``export_s`` is the caller's export), plus ``lower``
    (edge .. preprocess), ``wall_lower`` and ``total``. Sections 3 and 6 time lowerings
    this way."""
    from executorch.exir import to_edge_transform_and_lower

    t: dict[str, float] = {"export": export_s}
    gc.collect()
    w0, c0 = WALL_CLOCK(), CPU_CLOCK()
    with stage_timer(passes, partitioner) as acc:
        edge = to_edge_transform_and_lower(ep, transform_passes=passes or None,
                                           partitioner=[partitioner])
    lower = CPU_CLOCK() - c0
    t["wall_lower"] = WALL_CLOCK() - w0
    t.update(acc)
    t["edge"] = lower - sum(acc.values())
    t["lower"] = lower
    c0 = CPU_CLOCK()
    _ = edge.to_executorch().buffer
    t["serialize"] = CPU_CLOCK() - c0
    t["total"] = sum(t[k] for k in STAGES)
    return t
