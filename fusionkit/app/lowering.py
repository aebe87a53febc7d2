"""Lowering through a fusionkit adapter, as the CLI and the demo do it.

One function per job — :func:`explain` (find and decide matches, change
nothing) and :func:`lower` (``to_edge_transform_and_lower`` with the adapter's
passes and partitioner, then ``to_executorch``) — over a small table of
backends, each adapter imported only when asked for.
"""

from __future__ import annotations

import copy
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from torch.export import ExportedProgram

from fusionkit.find.finder import MatchSet, find_matches
from fusionkit.fusion_pass import FusionPass
from fusionkit.program import ProgramLike, as_exported_program, is_edge_dialect
from fusionkit.report import FusionReport
from fusionkit.rule import Rule

__all__ = ["BACKENDS", "LoweringResult", "adapter", "adapter_rules", "edge_program", "explain",
           "lower"]

#: backend name -> adapter module and its partitioner class name
BACKENDS: dict[str, tuple[str, str]] = {
    "vulkan": ("fusionkit.backends.vulkan_adapter", "VulkanPartitioner"),
    "xnnpack": ("fusionkit.backends.xnnpack_adapter", "XnnpackPartitioner"),
}

Progress = Callable[[str], None]


def adapter(backend: str) -> ModuleType:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(BACKENDS)}")
    return importlib.import_module(BACKENDS[backend][0])


def _fusion_passes(passes: Sequence[Any]) -> list[FusionPass]:
    return [p for p in passes if isinstance(p, FusionPass)]


def adapter_rules(backend: str) -> list[Rule]:
    """The fusion rules the backend's adapter applies by default."""
    rules: list[Rule] = []
    for p in _fusion_passes(adapter(backend).transform_passes()):
        rules.extend(p.rules)
    return rules


def edge_program(program: ProgramLike, *, who: str = "explain()") -> ExportedProgram:
    """The edge-dialect program of ``program``: ``to_edge`` of an ATen ``ExportedProgram``
    (the original is not changed); the program itself when it is edge dialect already
    (an ``EdgeProgramManager``'s, an ``ExecutorchProgramManager``'s)."""
    ep = as_exported_program(program, who=who)
    if is_edge_dialect(ep):
        return ep
    from executorch.exir import to_edge

    return to_edge(ep).exported_program()


def explain(program: ProgramLike, backend: str, extra_rules: Sequence[Rule] = ()) -> MatchSet:
    """Every accepted and declined match on the edge program; nothing is changed.

    ``program``: an ``ExportedProgram`` (ATen or edge dialect), an
    ``EdgeProgramManager`` or an ``ExecutorchProgramManager``.
    """
    return find_matches(edge_program(program), [*adapter_rules(backend), *extra_rules])


@dataclass
class LoweringResult:
    backend: str
    edge: Any  # EdgeProgramManager
    program: Any  # ExecutorchProgramManager, or None when not serialized
    report: FusionReport
    seconds: dict[str, float] = field(default_factory=dict)
    #: what the backend's preprocess rewrites (stock passes run as fusionkit rules) did in
    #: this lowering: stock pass name -> {"runs", "fused", ("declined")}; those with a count
    preprocess: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the ETRecord (``lower(..., etrecord=True)``): the ATen program, the edge program
    #: before and after fusionkit's rules, the ``.pte``'s handle maps naming what was fused
    etrecord: Any = None

    @property
    def pte(self) -> bytes:
        assert self.program is not None
        return bytes(self.program.buffer)


def _preprocess_counts(backend: str) -> dict[str, dict[str, int]]:
    """The adapter's tally of its preprocess rule passes (process-wide, since its last reset)."""
    try:
        mod = importlib.import_module(f"{BACKENDS[backend][0]}.preprocess_rules")
    except ImportError:
        return {}
    counts = getattr(mod, "counts", None)
    return dict(counts()) if callable(counts) else {}


def _counts_since(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
                  ) -> dict[str, dict[str, int]]:
    """What changed between two tallies: the passes that rewrote or declined something."""
    out: dict[str, dict[str, int]] = {}
    for name, now in after.items():
        was = before.get(name, {})
        diff = {k: v - was.get(k, 0) for k, v in now.items()}
        if diff.get("fused", 0) or diff.get("declined", 0):
            out[name] = diff
    return out


def lower(program: ProgramLike, backend: str, extra_rules: Sequence[Rule] = (), *,
          to_executorch: bool = True, progress: Progress | None = None,
          etrecord: bool = False) -> LoweringResult:
    """Lower ``program`` through the adapter of ``backend`` (plus ``extra_rules``).

    ``program``: an ATen ``ExportedProgram`` (``to_edge_transform_and_lower``), or an
    ``EdgeProgramManager`` / edge-dialect ``ExportedProgram`` (the adapter's passes
    and partitioner are applied to it: ``transform``, then ``to_backend``). An
    ``ExecutorchProgramManager`` is lowered already: ``TypeError``.
    ``etrecord``: also make an ETRecord (:attr:`LoweringResult.etrecord`, with the
    example inputs as representative inputs): the graphs before and after the rules,
    its handle maps naming every fused op's replaced nodes
    (:func:`fusionkit.integration.devtools.attribute_fusions`).
    """
    from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower

    ep = as_exported_program(program, who="lower()", rewrite=True)

    say = progress or (lambda _msg: None)
    mod = adapter(backend)
    passes = list(mod.transform_passes())
    if extra_rules:
        passes.insert(0, FusionPass(extra_rules, name="specs"))
    partitioner = getattr(mod, BACKENDS[backend][1])()
    seconds: dict[str, float] = {}
    before = _preprocess_counts(backend)
    say(f"lowering to {backend} (export → edge → fusion → partition → preprocess)")
    t0 = time.perf_counter()
    record = None
    if isinstance(program, EdgeProgramManager) or is_edge_dialect(ep):
        manager = program if isinstance(program, EdgeProgramManager) else EdgeProgramManager(ep)
        if etrecord:
            record = _record_before(manager)
        transformed = manager.transform(passes)
        if record is not None:
            record.add_extra_export_modules({"edge_after_transform": copy.deepcopy(transformed)})
        edge = transformed.to_backend(partitioner)
    else:
        edge = to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[partitioner],
                                           generate_etrecord=etrecord)
    seconds["lower"] = time.perf_counter() - t0
    preprocess = _counts_since(before, _preprocess_counts(backend))
    program = None
    if to_executorch or etrecord:
        say(f"serializing the {backend} program")
        t0 = time.perf_counter()
        program = edge.to_executorch()
        seconds["to_executorch"] = time.perf_counter() - t0
    if etrecord:
        record = _finish_record(record, program, ep,
                                getattr(mod, "POSITIONAL_DELEGATE_MAPS", frozenset()))
    report = FusionReport()
    for p in _fusion_passes(passes):
        report.merge(p.report)
    return LoweringResult(backend, edge, program, report, seconds, preprocess, record)


def _record_before(manager: Any) -> Any:
    """An ETRecord holding the edge program before the transform passes."""
    from executorch.devtools.etrecord import ETRecord

    record = ETRecord()
    record.add_edge_dialect_program(copy.deepcopy(manager))
    return record


def _finish_record(record: Any, program: Any, ep: ExportedProgram,
                   positional_delegates: frozenset[str]) -> Any:
    """The lowering's ETRecord with the ``.pte``'s maps, naming what the rules fused, and
    the example inputs as representative inputs (``calculate_numeric_gap`` runs on them)."""
    from fusionkit.integration.devtools import attribute_fusions

    if record is None:  # generate_etrecord=True recorded the programs
        record = program.get_etrecord()
    else:
        record.add_executorch_program(program)
    attribute_fusions(record, positional_delegates=positional_delegates)
    example = getattr(ep, "example_inputs", None)
    if example is not None and example[0] is not None and not example[1]:
        record.update_representative_inputs([tuple(example[0])])
    return record
