"""``fusionkit run``: a program on ExecuTorch's real Vulkan runtime, beside the simulator.

Given a ``.pte`` it runs the program's method on the real runtime (in a child
process: a program the runtime aborts on is reported with the runtime's own
message) and runs ``check()`` on it. Given a model (``.pt2`` or
``package.module:factory``) it lowers it (fusionkit's adapter, or stock ExecuTorch
with ``stock=True``), then runs the same random inputs through the real runtime,
the payload simulator and eager PyTorch, so that the simulator's verdict is seen
beside the runtime's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["OutputSummary", "RunReport", "run_file", "run_model", "simulator_verdict"]


@dataclass
class OutputSummary:
    index: int
    shape: list[int]
    dtype: str
    #: largest |real runtime - eager| (None: no eager reference)
    max_abs_error_eager: float | None = None
    #: largest |real runtime - simulator| (None: the simulator did not run)
    max_abs_error_simulator: float | None = None


@dataclass
class RunReport:
    """What the real runtime did with one program, and what the static tools said."""

    source: str
    method: str
    device: str
    #: the real runtime: "ok", "error" (refused), "abort" (the child died), "timeout"
    status: str
    message: str | None = None
    outputs: list[OutputSummary] = field(default_factory=list)
    #: ``check()``'s problems (what it predicts the runtime aborts on)
    check_problems: list[str] = field(default_factory=list)
    #: "ran" or the simulator's reason to stop; None when not simulated
    simulator: str | None = None
    #: outputs within the per-dtype tolerance of eager (None: no eager reference)
    matches_eager: bool | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.matches_eager is not False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _flat(x: Any) -> list[Any]:
    return [t for t in pytree.tree_leaves(x)]


def _max_err(a: Any, b: Any) -> float:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return 0.0 if a == b else float("inf")
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def simulator_verdict(program: Any, inputs: Sequence[Any]) -> tuple[str, list[Any] | None]:
    """("ran", outputs) or (the simulator's one-line reason to stop, None); with the probed
    runtime's inventory when there is one."""
    from fusionkit.backends.vulkan_adapter.inspect.simulator import SimulationError, simulate
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    try:  # given the probed runtime, the simulator also stops where it lacks an op or shader
        return "ran", _flat(simulate(program, *inputs, runtime=cached_inventory()))
    except SimulationError as e:
        return str(e).splitlines()[0], None


def run_file(pte: bytes, source: str, *, method: str = "forward",
             inputs: Sequence[Any] | None = None, timeout: float = 300.0) -> RunReport:
    """Run ``method`` of a serialized program on the real runtime; ``check()`` it."""
    return _run_file(pte, source, method, inputs, timeout)[0]


def _run_file(pte: bytes, source: str, method: str, inputs: Sequence[Any] | None,
              timeout: float) -> tuple[RunReport, list[Any]]:
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import check
    from fusionkit.backends.vulkan_adapter.runtime import device_name, run_in_child

    t0 = time.perf_counter()
    res = run_in_child(pte, inputs, method, timeout=timeout)
    if not res.device:  # the child died before saying: ask the loader (vulkaninfo)
        res.device = device_name()
    report = RunReport(source, method, res.device, res.status, res.message)
    report.seconds["real runtime"] = time.perf_counter() - t0
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    try:  # with the probed inventory: an operator or shader the runtime lacks is a problem
        report.check_problems = [str(p) for p in check(pte, runtime=cached_inventory())]
    except Exception as e:  # a file check() cannot read is still reported, not raised
        report.check_problems = [f"check() could not read it: {type(e).__name__}: {e}"]
    outputs = list(res.outputs or [])
    for i, out in enumerate(outputs):
        if isinstance(out, torch.Tensor):
            report.outputs.append(OutputSummary(i, list(out.shape),
                                                str(out.dtype).removeprefix("torch.")))
        else:
            report.outputs.append(OutputSummary(i, [], type(out).__name__))
    return report, outputs


def run_model(exported: Any, module: Any, example_inputs: Sequence[Any], *,
              rules: Sequence[Any] = (), stock: bool = False, seed: int = 0,
              timeout: float = 300.0,
              progress: Callable[[str], None] | None = None) -> RunReport:
    """Lower for Vulkan, then real runtime vs simulator vs eager on the same random inputs."""
    from fusionkit.app.simulate_job import TOLERANCES, _lower, random_inputs

    say = progress or (lambda _msg: None)
    say("lowering to vulkan" + (" with stock ExecuTorch (adapter uninstalled)" if stock else ""))
    t0 = time.perf_counter()
    program = _lower(exported, rules, stock)
    lower_s = time.perf_counter() - t0
    inputs = random_inputs(example_inputs, seed)
    say("running on the real Vulkan runtime (in a child process)")
    report, real = _run_file(bytes(program.buffer), "stock ExecuTorch" if stock else "fusionkit",
                             "forward", _flat(inputs), timeout)
    report.seconds["lower"] = lower_s
    say("simulating the payloads on the CPU")
    t0 = time.perf_counter()
    report.simulator, simulated = simulator_verdict(program, inputs)
    report.seconds["simulate"] = time.perf_counter() - t0
    if report.status != "ok":
        return report
    eager = module if module is not None else exported.module()
    with torch.no_grad():
        want = _flat(eager(*inputs))
    matches = len(real) == len(want)
    for s, r, w in zip(report.outputs, real, want, strict=False):
        s.max_abs_error_eager = _max_err(r, w)
        if simulated is not None and s.index < len(simulated):
            s.max_abs_error_simulator = _max_err(r, simulated[s.index])
        if isinstance(w, torch.Tensor) and isinstance(r, torch.Tensor):
            atol, rtol = TOLERANCES.get(w.dtype, (0.0, 0.0))
            matches &= r.shape == w.shape and r.dtype == w.dtype and bool(
                ((r.double() - w.double()).abs() <= atol + rtol * w.double().abs()).all())
        else:
            matches &= r == w
    report.matches_eager = matches
    return report


def print_report(report: RunReport) -> None:
    """The report as ``fusionkit run`` prints it."""
    from fusionkit.app.term import Style, table

    st = Style()
    print(f"{report.source}: {report.method} on the real Vulkan runtime, device "
          f"{report.device or 'unknown'}")
    if report.status != "ok":
        what = {"error": "refused it", "abort": "aborted", "timeout": "did not finish"}
        print(st.red(f"  ✗ the runtime {what.get(report.status, report.status)}: "
                     f"{report.message}"))
    else:
        rows = [(o.index, "x".join(map(str, o.shape)) or "-", o.dtype,
                 "-" if o.max_abs_error_eager is None else f"{o.max_abs_error_eager:.3g}",
                 "-" if o.max_abs_error_simulator is None else f"{o.max_abs_error_simulator:.3g}")
                for o in report.outputs]
        print(table(["output", "shape", "dtype", "max |real - eager|", "max |real - simulated|"],
                    rows))
    print(f"  check(): {len(report.check_problems)} problem(s)"
          + "".join(f"\n    {p}" for p in report.check_problems))
    if report.simulator is not None:
        print(f"  simulator: {report.simulator}")
    agree = _agreement(report)
    if agree is not None:
        print(f"  simulator/check() vs the real runtime: {agree}")
    if report.matches_eager is not None:
        print(st.green("  ✓ equal to eager") if report.matches_eager
              else st.red("  ✗ outputs differ from eager"))


def _agreement(report: RunReport) -> str | None:
    """Whether the static tools predicted what the real runtime did."""
    real_ok = report.status == "ok"
    parts = []
    if report.simulator is not None:
        sim_ok = report.simulator == "ran"
        parts.append("simulator " + ("agrees" if sim_ok == real_ok else
                                     "DISAGREES (" + ("ran" if sim_ok else "stopped") + ")"))
    chk_ok = not report.check_problems
    parts.append("check() " + ("agrees" if chk_ok == real_ok else
                               "DISAGREES (" + ("no problems" if chk_ok else "problems") + ")"))
    return ", ".join(parts)
