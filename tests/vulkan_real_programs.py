"""Programs for the real Vulkan runtime: lowered both ways, judged by the runtime and by
the static tools (``check()``, the simulator), so tests and the fidelity table
(docs/vulkan-runtime-fidelity.md, ``python3 tests/vulkan_real_programs.py``) share them.

A :class:`Program` carries what the static tools predicted; :func:`run_all` runs every
program on the real runtime in one child process (a child per abort) and
:func:`outcome` names what happened: ``ok`` (equal to eager), ``wrong`` (ran, differs),
``refused`` (the runtime stopped). The simulator agrees when its outcome is the
runtime's; ``check()`` agrees when it reports problems exactly for programs that are not ok.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fusionkit.backends.vulkan_adapter import runtime as rt

TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-2),
             torch.bfloat16: (6e-2, 6e-2)}


@dataclass
class Program:
    name: str
    family: str
    path: str  # "fusionkit" | "stock"
    inputs: tuple[Any, ...]
    eager: list[Any]
    pte: bytes | None = None
    lower_error: str | None = None
    check_problems: list[str] = field(default_factory=list)
    #: "ok" | "wrong" | "stopped: <reason>"
    simulator: str = ""
    #: the same, the simulator given the probed runtime's inventory (missing ops, shaders)
    simulator_probed: str = ""
    #: check(program, runtime=probed inventory)
    check_probed: list[str] = field(default_factory=list)
    real: rt.RunResult | None = None
    atol: float = 1e-4
    rtol: float = 1e-4
    seconds: float = 0.0
    #: where ``seconds`` went: lower (to_edge_transform_and_lower + to_executorch),
    #: check (both), simulate (both)
    phases: dict[str, float] = field(default_factory=dict)

    def close(self, got: Sequence[Any] | None) -> bool:
        if got is None or len(got) != len(self.eager):
            return False
        for g, w in zip(got, self.eager, strict=True):
            if not isinstance(w, torch.Tensor):
                continue
            if not isinstance(g, torch.Tensor) or g.shape != w.shape:
                return False
            if not torch.allclose(g.double(), w.double(), atol=self.atol, rtol=self.rtol):
                return False
        return True

    @property
    def outcome(self) -> str:
        """What the real runtime did: ok / wrong / refused."""
        assert self.real is not None, f"{self.name} ({self.path}) was not run"
        if not self.real.ok:
            return "refused"
        return "ok" if self.close(self.real.outputs) else "wrong"

    @property
    def simulator_outcome(self) -> str:
        return _sim_outcome(self.simulator)

    @property
    def simulator_agrees(self) -> bool:
        return self.simulator_outcome == self.outcome

    @property
    def simulator_probed_agrees(self) -> bool:
        return _sim_outcome(self.simulator_probed) == self.outcome

    @property
    def check_probed_agrees(self) -> bool:
        return bool(self.check_probed) == (self.outcome != "ok")

    @property
    def check_agrees(self) -> bool:
        return bool(self.check_problems) == (self.outcome != "ok")

    def describe(self) -> str:
        real = self.real
        msg = "" if real is None or real.ok else f": {real.message}"
        return (f"{self.name} [{self.path}] real={self.outcome if real else '-'}{msg}; "
                f"simulator={self.simulator}; check={len(self.check_problems)} problem(s)")


def _sim_outcome(said: str) -> str:
    """ok / wrong / refused from what the simulator said ("wrong: garbage ..." when it
    stopped on a condition under which the runtime computes garbage)."""
    return "refused" if said.startswith("stopped") else said.split(":", 1)[0]


def _simulated(e: BaseException) -> str:
    """What a SimulationError predicts: a refusal, or garbage (a wrong result)."""
    text = str(e).splitlines()[0][:300]
    if getattr(getattr(e, "condition", None), "effect", None) == "garbage":
        return "wrong: garbage: " + text
    return "stopped: " + text


def _one_line(e: BaseException) -> str:
    text = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


@functools.cache
def _pattern_graphs() -> list[Any]:
    import executorch.backends.vulkan.patterns as vk_patterns

    return list(vk_patterns.all_fusable_graph_patterns())


@contextlib.contextmanager
def pattern_graphs_once() -> Any:
    """Stock's Vulkan partitioner re-exports its constant pattern graphs (rope, hf_rope,
    sdpa, the quantized ones) on every lowering: most of a small stock lowering's CPU.
    Built once per process here and handed back while this is active (restored after)."""
    import executorch.backends.vulkan.patterns as vk_patterns

    graphs = _pattern_graphs()
    saved = vk_patterns.all_fusable_graph_patterns
    vk_patterns.all_fusable_graph_patterns = lambda: graphs
    try:
        yield
    finally:
        vk_patterns.all_fusable_graph_patterns = saved


def stock_partitioner(**kwargs: Any) -> Any:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    return VulkanPartitioner(**kwargs)


def lower(name: str, family: str, path: str, exported: Any, inputs: tuple[Any, ...],
          eager: Any, *, dtype: torch.dtype = torch.float32,
          partitioner: Callable[[], Any] | None = None,
          tolerance: tuple[float, float] | None = None) -> Program:
    """Lower ``exported`` along ``path``, serialize it, record check() and the simulator.

    A stock lowering runs with the adapter uninstalled, as ExecuTorch alone would;
    ``partitioner`` overrides the partitioner (e.g. with ExecuTorch's arguments).
    """
    atol, rtol = tolerance or TOLERANCE.get(dtype, (1e-4, 1e-4))
    prog = Program(name, family, path, inputs, pytree.tree_leaves(eager), atol=atol, rtol=rtol)
    t0 = time.perf_counter()
    try:
        with pattern_graphs_once():
            et = _lower_to_executorch(path, exported, partitioner)
        prog.phases["lower"] = time.perf_counter() - t0
    except Exception as e:  # a lowering failure is data for stock; ours fails its test
        prog.lower_error = _one_line(e)
        return prog
    return _judge(prog, et, inputs, t0)


def _lower_to_executorch(path: str, exported: Any, partitioner: Callable[[], Any] | None) -> Any:
    from executorch.exir import to_edge_transform_and_lower

    import fusionkit.backends.vulkan_adapter as va

    if path == "stock":
        va.uninstall()
        part = partitioner() if partitioner else stock_partitioner()
        edge = to_edge_transform_and_lower(copy.deepcopy(exported), partitioner=[part])
    elif path == "installed":  # ExecuTorch's own calls under install(), as `fusionkit exec`
        part = partitioner() if partitioner else stock_partitioner()
        va.install()
        try:
            edge = to_edge_transform_and_lower(copy.deepcopy(exported), partitioner=[part])
            return edge.to_executorch()
        finally:
            va.uninstall()
    else:
        part = partitioner() if partitioner else va.VulkanPartitioner()
        edge = to_edge_transform_and_lower(
            copy.deepcopy(exported), transform_passes=va.transform_passes(partitioner=part),
            partitioner=[part])
    return edge.to_executorch()


def _judge(prog: Program, et: Any, inputs: tuple[Any, ...], t0: float) -> Program:
    """check() and the simulator (each plain and given the probe) on a lowered program."""
    import fusionkit.backends.vulkan_adapter as va
    from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, unload

    prog.pte = bytes(et.buffer)
    t1 = time.perf_counter()
    prog.check_problems = [str(p) for p in va.check(et)]
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    inv = cached_inventory()
    prog.check_probed = [str(p) for p in va.check(et, runtime=inv)] if inv else []
    prog.phases["check"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    for attr, given in (("simulator", None), ("simulator_probed", inv)):
        try:
            sim = pytree.tree_leaves(va.simulate(et, *inputs, runtime=given))
            setattr(prog, attr, "ok" if prog.close(sim) else "wrong")
        except SimulationError as e:
            setattr(prog, attr, _simulated(e))
        finally:
            unload(et)
    prog.phases["simulate"] = time.perf_counter() - t1
    prog.seconds = time.perf_counter() - t0
    return prog


def run_all(programs: Sequence[Program], timeout: float = 300.0) -> None:
    """Run every lowered program on the real runtime (one child, a new one per abort)."""
    todo = [p for p in programs if p.pte is not None]
    results = rt.run_many_in_child([rt.Job(p.pte, list(p.inputs)) for p in todo  # type: ignore[arg-type]
                                    ], timeout=timeout)
    for p, r in zip(todo, results, strict=True):
        p.real = r


# --------------------------------------------------------------- the fidelity table


def fidelity_markdown(programs: Sequence[Program]) -> str:
    """Per program and per family: real runtime vs simulator vs check()."""
    ran = [p for p in programs if p.real is not None]
    lines = ["| family | program | path | real runtime | simulator | simulator + probe | check() "
             "| check() + probe |", "|---|---|---|---|---|---|---|---|"]
    for p in ran:
        real = p.outcome
        if real == "refused":
            real = f"refused: `{_short(p.real.message if p.real else '', 90)}`"
        sim = p.simulator_outcome + ("" if p.simulator_agrees else " **(disagrees)**")
        probed = _sim_outcome(p.simulator_probed) + (
            "" if p.simulator_probed_agrees else " **(disagrees)**")
        chk = (f"{len(p.check_problems)} problem(s)" if p.check_problems else "no problems") + (
            "" if p.check_agrees else " **(disagrees)**")
        chk2 = (f"{len(p.check_probed)} problem(s)" if p.check_probed else "no problems") + (
            "" if p.check_probed_agrees else " **(disagrees)**")
        lines.append(f"| {p.family} | {p.name} | {p.path} | {real} | {sim} | {probed} | {chk} "
                     f"| {chk2} |")
    fams = sorted({p.family for p in ran})
    summary = ["| family | programs | fusionkit's equal to eager | stock's not ok on the runtime "
               "| simulator agrees | simulator + probe agrees | check() agrees "
               "| check() + probe agrees |", "|---|---|---|---|---|---|---|---|"]
    for f in [*fams, "all"]:
        ps = [p for p in ran if f in ("all", p.family)]
        ours = [p for p in ps if p.path == "fusionkit"]
        stock = [p for p in ps if p.path == "stock"]
        summary.append(
            f"| {f} | {len(ps)} | {sum(p.outcome == 'ok' for p in ours)}/{len(ours)} | "
            f"{sum(p.outcome != 'ok' for p in stock)}/{len(stock)} | "
            f"{sum(p.simulator_agrees for p in ps)}/{len(ps)} | "
            f"{sum(p.simulator_probed_agrees for p in ps)}/{len(ps)} | "
            f"{sum(p.check_agrees for p in ps)}/{len(ps)} | "
            f"{sum(p.check_probed_agrees for p in ps)}/{len(ps)} |")
    return "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"


def _short(text: str, n: int) -> str:
    text = text.replace("|", "/").replace("`", "'")
    return text if len(text) <= n else text[: n - 1] + "…"


# ------------------------------------------------------------------- program sets

#: zoo models run on the real runtime by the tests (a handful: each lowering costs seconds)
ZOO_REAL = ("llama", "gemma", "resnet", "flux_single_block")


def zoo_programs(names: Sequence[str] = ZOO_REAL) -> list[Program]:
    """The zoo models lowered by fusionkit (runtime-aware partitioner) and by stock 1.5.1."""
    from zoo_models import build

    out = []
    for name in names:
        case = build(name)
        for path in ("fusionkit", "stock"):
            out.append(lower(name, "zoo", path, case.exported, case.inputs, case.eager))
    return out


def rmsnorm_programs() -> list[Program]:
    """The seed table: six multiplier rows x fp32/fp16, both paths."""
    from rmsnorm_models import ROWS, row_case

    out = []
    for row in ROWS:
        for dtype in (torch.float32, torch.float16):
            model, args = row_case(row, dtype)
            with torch.no_grad():
                eager = model(*args)
            ep = torch.export.export(model, args)
            name = f"{row.name}/{str(dtype).removeprefix('torch.')}"
            for path in ("fusionkit", "stock"):
                out.append(lower(name, "rmsnorm", path, ep, args, eager, dtype=dtype))
    return out


def extra_programs() -> list[Program]:
    """The probe's mask program (both ways) and the binary shader cases (stock)."""
    from test_vulkan_real_runtime_probe import MaskedFill
    from test_vulkan_real_runtime_shaders import CASES, Binary

    out = []
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    ep = torch.export.export(MaskedFill(), (x,))
    for path in ("fusionkit", "stock"):
        out.append(lower("masked_fill", "runtime ops", path, ep, (x,), MaskedFill()(x)))
    g = torch.Generator().manual_seed(0)
    for fn, dtype in CASES:
        if dtype.is_floating_point:
            a, b = (torch.randn(2, 8, generator=g).to(dtype) for _ in range(2))
        else:
            a, b = (torch.randint(0, 3, (2, 8), generator=g).to(dtype) for _ in range(2))
        ep = torch.export.export(Binary(fn), (a, b))
        out.append(lower(f"{fn.__name__}/{str(dtype).removeprefix('torch.')}", "binary shaders",
                         "stock", ep, (a, b), Binary(fn)(a, b), dtype=dtype))
    return out


def held_out_programs() -> list[Program]:
    """Programs the table's first run did not have, each a runtime fact found since, both
    ways (family ``held out (ops)``): issue 24's OpMix, a clamp before a conv (groups serialized next to a 1.0), a
    clamp before an avg_pool2d with divisor_override, a grouped conv of 2 input channels
    per group (4->8 g2), a conv with a channels_last input, an int8 weight-only linear.
    Then the normalization ranks (family ``held out (norm rank)``,
    test_vulkan_real_runtime_norm_rank): a
    2-D batch norm (LeViT), GroupNorm over conv1d features with 16 and 4 groups (wav2vec2),
    a weight-normed conv1d (wav2vec2's positional conv).
    The models are ``held_out_models``' (their test files make them from there too)."""
    from held_out_models import (
        NORM_RANK,
        Conv,
        K,
        clamp_conv,
        clamp_pool,
        dim_order_case,
        grouped_conv,
        norm_rank_case,
        opmix,
        same,
        w8_linear,
    )
    from torchao.quantization.granularity import PerAxis

    made: list[tuple[str, torch.nn.Module, tuple[Any, ...]]] = []
    for name, make in (("opmix", opmix), ("clamp_conv", clamp_conv),
                       ("clamp_pool", clamp_pool)):
        model, args = make()
        made.append((name, model, args))
    # test_vulkan_real_runtime_grouped_conv's g2_icg2
    model, args = grouped_conv(4, 8, 2)
    made.append(("conv 4->8 g2", model, args))
    # test_vulkan_real_runtime_dim_order's conv_cl_input-fp32
    model, x, _ = dim_order_case(lambda: Conv(False, same), cl_input=True)
    made.append(("conv channels_last input", model, (x,)))
    made.append(("w8 linear", w8_linear(False, granularity=PerAxis(0)),
                 (torch.randn(1, K, generator=torch.Generator().manual_seed(24)),)))
    norm_rank = [(name, *norm_rank_case(name)) for name in NORM_RANK]
    out = []
    for family, cases in (("held out (ops)", made), ("held out (norm rank)", norm_rank)):
        for name, model, args in cases:
            with torch.no_grad():
                eager = model(*args)
            ep = torch.export.export(model, args)
            for path in ("fusionkit", "stock"):
                out.append(lower(name, family, path, ep, args, eager))
    return out


def write_fidelity(path: str, programs: Sequence[Program], seconds: float) -> None:
    """docs/vulkan-runtime-fidelity.md from a run of ``programs``."""
    device = next((p.real.device for p in programs if p.real and p.real.device), "unknown")
    text = (
        "# The simulator and `check()` against ExecuTorch's real Vulkan runtime\n\n"
        "Written by `python3 tests/vulkan_real_programs.py docs/vulkan-runtime-fidelity.md` "
        f"(programs of tests/test_vulkan_real_runtime_*.py; device: {device}; "
        f"{seconds:.0f} s). Each program is lowered by fusionkit (runtime-aware "
        "`VulkanPartitioner`) and by stock ExecuTorch 1.5.1, run on the real runtime in a "
        "child process, and judged: **ok** equal to eager, **wrong** ran but differs, "
        "**refused** the runtime stopped (its own message). The simulator *agrees* when it "
        "predicts the same outcome; `check()` agrees when it reports problems exactly for "
        "the programs that are not ok.\n\n" + fidelity_markdown(programs))
    import re

    try:  # the delegate suite's section (tests/vulkan_delegate_stock.py) and what follows it
        with open(path) as f:
            kept = re.search(r"<!-- delegate-suite:begin -->.*", f.read(), re.S)
    except OSError:
        kept = None
    with open(path, "w") as f:
        f.write(text + ("\n" + kept.group(0) if kept else ""))


def main(argv: list[str]) -> int:
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    t0 = time.perf_counter()
    from test_vulkan_real_runtime_gqa import gqa_programs

    programs = (rmsnorm_programs() + zoo_programs() + extra_programs() + gqa_programs()
                + held_out_programs())
    run_all(programs)
    write_fidelity(argv[0] if argv else "docs/vulkan-runtime-fidelity.md", programs,
                   time.perf_counter() - t0)
    for p in programs:
        print(p.describe())
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
