"""``fusionkit run --backend arm``: a program's TOSA delegates on the TOSA reference model.

Given a model (``.pt2`` or ``package.module:factory``) it lowers it through Arm's
``TOSAPartitioner`` (fusionkit's adapter, or stock ExecuTorch with ``stock=True``), float
(``TOSA-1.0+FP``) or integer (``TOSA-1.0+INT``, pt2e int8 with Arm's quantizer, calibrated
on the inputs), runs it on random inputs with every TOSA delegate executed by the TOSA
reference model (``tosa-tools``) and compares with eager PyTorch: float against the model,
integer against the fake-quantized model (within one output quantization step), with the
error against the float model shown beside. Given a ``.pte``, each TOSA delegate in it is
run alone on the reference model with random inputs of its declared shapes and types
(nothing to compare with: the status and the outputs' shapes are reported).

The oracle is :mod:`fusionkit.backends.arm_adapter.reference_model`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fusionkit.app.run_job import OutputSummary, RunReport

__all__ = ["DEVICE", "print_arm_report", "run_arm_file", "run_arm_model"]

#: what runs the TOSA program (the RunReport's device)
DEVICE = "TOSA reference model (tosa-tools)"

#: float outputs: |reference model - eager| <= atol + rtol * |eager|
FP_TOLERANCE = (1e-4, 1e-4)


def _output_steps(edge: Any) -> list[float | None]:
    """The quantization step of each program output (None: a float output)."""
    graph = edge.exported_program().graph
    out = next(n for n in graph.nodes if n.op == "output")
    steps: list[float | None] = []
    for arg in torch.utils._pytree.tree_leaves(out.args[0]):
        target = str(getattr(arg, "target", ""))
        steps.append(float(arg.args[1]) if "dequantize_per_tensor" in target else None)
    return steps


def run_arm_model(exported: Any, module: Any, example_inputs: Sequence[Any], *,
                  stock: bool = False, integer: bool = False, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> RunReport:
    """Lower for TOSA (stock or adapter, float or int8), run on the reference model beside
    eager on the same random inputs."""
    from fusionkit.app.simulate_job import random_inputs
    from fusionkit.backends.arm_adapter import reference_model as rm

    say = progress or (lambda _msg: None)
    spec = rm.INT if integer else rm.FP
    source = f"{'stock ExecuTorch' if stock else 'fusionkit'} ({spec})"
    inputs = tuple(random_inputs(example_inputs, seed))
    eager = module if module is not None else exported.module(check_guards=False)
    say(f"lowering to {spec}" + (" with stock ExecuTorch's TOSAPartitioner" if stock else ""))
    t0 = time.perf_counter()
    try:
        run = rm.evaluate(eager, inputs, fusionkit=not stock, spec=spec)
    except Exception as e:  # the lowering or the reference model refused it
        return RunReport(source, "forward", DEVICE, "error", f"{type(e).__name__}: {e}",
                         seconds={"total": time.perf_counter() - t0})
    report = RunReport(source, "forward", DEVICE, "ok",
                       seconds={"total": time.perf_counter() - t0})
    steps = _output_steps(run.edge) if integer else [None] * len(run.outputs)
    matches = len(run.outputs) == len(run.reference)
    for i, (got, want) in enumerate(zip(run.outputs, run.reference, strict=False)):
        err = rm.max_error([got], [want])
        summary = OutputSummary(i, list(got.shape), str(got.dtype).replace("torch.", ""),
                                max_abs_error_eager=err)
        report.outputs.append(summary)
        step = steps[i] if i < len(steps) else None
        if got.shape != want.shape:
            matches = False
        elif step is not None:  # integer: within one output quantization step
            matches &= err <= step * 1.01
        else:
            atol, rtol = FP_TOLERANCE
            matches &= bool(((got.double() - want.double()).abs()
                             <= atol + rtol * want.double().abs()).all())
    if integer:  # the int8 program against the float model, for scale
        report.message = (f"{run.delegated} TOSA delegate(s); max |reference model - float "
                          f"eager| {rm.max_error(run.outputs, run.eager):.3g}")
    else:
        report.message = f"{run.delegated} TOSA delegate(s)"
    report.matches_eager = matches and run.delegated > 0
    return report


def _tosa_delegates(pte: bytes) -> list[bytes]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte)
    program = getattr(program, "program", program)
    out = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            if d.id == "TOSABackend":
                out.append(bytes(program.backend_delegate_data[d.processed.index].data))
    return out


def _random_for(tosa: bytes, seed: int) -> list[Any]:
    """Random numpy inputs of the TOSA program's declared input tensors."""
    import numpy as np
    from tosa.DType import DType
    from tosa.TosaGraph import TosaGraph

    graph = TosaGraph.GetRootAsTosaGraph(tosa, 0)
    block = graph.Regions(0).Blocks(0)
    tensors = {block.Tensors(i).Name(): block.Tensors(i) for i in range(block.TensorsLength())}
    rng = np.random.default_rng(seed)
    kinds: dict[int, Any] = {DType.FP32: np.float32, DType.FP16: np.float16, DType.INT8: np.int8,
             DType.INT16: np.int16, DType.INT32: np.int32, DType.BOOL: np.bool_}
    arrays = []
    for i in range(block.InputsLength()):
        t = tensors[block.Inputs(i)]
        shape = [t.Shape(j) for j in range(t.ShapeLength())]
        kind = kinds.get(t.Type())
        if kind is None:
            raise ValueError(f"input {block.Inputs(i)!r} has a TOSA type this runner does "
                             f"not draw ({t.Type()})")
        if kind in (np.float32, np.float16):
            arrays.append(rng.standard_normal(shape).astype(kind))
        elif kind is np.bool_:
            arrays.append(rng.integers(0, 2, shape).astype(kind))
        else:
            info = np.iinfo(kind)
            arrays.append(rng.integers(max(info.min, -128), min(info.max, 127) + 1,
                                       shape).astype(kind))
    return arrays


def run_arm_file(pte: bytes, source: str, *, seed: int = 0) -> RunReport:
    """Each TOSA delegate of a ``.pte`` run alone on the reference model."""
    import tosa_reference_model as reference_model

    t0 = time.perf_counter()
    delegates = _tosa_delegates(pte)
    if not delegates:
        return RunReport(source, "forward", DEVICE, "error", "the program has no TOSA delegate")
    report = RunReport(source, "forward", DEVICE, "ok")
    for k, tosa in enumerate(delegates):
        outputs, status = reference_model.run(tosa, _random_for(tosa, seed + k))
        if status != reference_model.GraphStatus.TOSA_VALID:
            report.status = "error"
            report.message = f"delegate {k}: the reference model says {status}"
            break
        for o in outputs:
            report.outputs.append(OutputSummary(len(report.outputs), list(o.shape),
                                                str(o.dtype)))
    report.message = report.message or f"{len(delegates)} TOSA delegate(s) ran (random inputs)"
    report.seconds["total"] = time.perf_counter() - t0
    return report


def print_arm_report(report: RunReport) -> None:
    """The report as ``fusionkit run --backend arm`` prints it."""
    from fusionkit.app.term import Style, table

    st = Style()
    print(f"{report.source}: {report.method} on the {report.device}")
    if report.status != "ok":
        print(st.red(f"  ✗ {report.message}"))
        return
    rows = [(o.index, "x".join(map(str, o.shape)) or "-", o.dtype,
             "-" if o.max_abs_error_eager is None else f"{o.max_abs_error_eager:.3g}")
            for o in report.outputs]
    print(table(["output", "shape", "dtype", "max |reference model - eager|"], rows))
    if report.message:
        print(f"  {report.message}")
    if report.matches_eager is not None:
        print(st.green("  ✓ equal to eager") if report.matches_eager
              else st.red("  ✗ outputs differ from eager"))
