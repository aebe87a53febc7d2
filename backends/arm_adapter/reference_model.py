"""The Arm oracle: a lowered program run on the TOSA reference model beside eager PyTorch.

One oracle for every Arm test and for ``fusionkit run MODEL --backend arm``:
:func:`lower` takes an ``nn.Module`` (or an ``ExportedProgram``) through ExecuTorch's
``TOSAPartitioner`` -- stock, or the adapter's (``fusionkit=True``) -- in float
(``TOSA-1.0+FP``) or integer (``TOSA-1.0+INT``: pt2e with the Arm quantizer first);
:func:`tosa_flatbuffers` gives each delegate's TOSA flatbuffer (what byte-identity is
judged on); :func:`run_on_reference_model` runs the lowered program with every TOSA
delegate executed by the reference model (``tosa-tools``, ``tosa_reference_model``) and
the rest (the q/dq at an integer program's boundary) by PyTorch; :func:`evaluate` does
all three and the error against the reference output: eager for float, the
fake-quantized (pt2e-converted) model for integer.

The delegate dispatch is ExecuTorch's own (``executorch.backends.arm.test.runner_utils.
TosaReferenceModelDispatch``, what its Arm tests run with), so a TOSA program is run here
exactly as ExecuTorch's suite runs it. The reference model prints a harmless warning
(``Different TOSA spec in flatbuffer and serializer versions``) on every run.

The Arm quantizer needs ``ExportedProgram.module(check_guards=False)`` in torch 2.13 (the
guards call ``module()`` inserts breaks its annotation).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["FP", "INT", "ArmRun", "dyt_folds_inserted", "evaluate", "fake_quantized", "lower",
           "max_error", "run_on_reference_model", "tosa_flatbuffers"]

#: the TOSA profiles this oracle lowers to
FP = "TOSA-1.0+FP"
INT = "TOSA-1.0+INT"


def _compile_spec(spec: str) -> Any:
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

    return TosaCompileSpec(spec)


def _partitioner(spec: str, fusionkit: bool) -> Any:
    if fusionkit:
        from fusionkit.backends.arm_adapter.partitioner import TOSAPartitioner

        return TOSAPartitioner(_compile_spec(spec))
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner as Stock

    return Stock(_compile_spec(spec))


@contextlib.contextmanager
def dyt_folds_inserted(affine: bool = False) -> Iterator[None]:
    """Arm's DyT folds inserted where their own tests and docs put them, before
    ``InsertTableOpsPass`` (``FoldDyTAlphaIntoLUTPass``, then with ``affine``
    ``FoldDyTAffineIntoConvPass``, which starts from the alpha fold's TABLE), for the block
    only: Arm's registry of insertions is process-wide and is restored afterwards."""
    from executorch.backends.arm._passes import (
        FoldDyTAffineIntoConvPass,
        FoldDyTAlphaIntoLUTPass,
        InsertTableOpsPass,
        arm_pass_manager,
    )

    folds: list[Any] = [FoldDyTAlphaIntoLUTPass(None)]  # (the manager gives each its program)
    if affine:
        folds.append(FoldDyTAffineIntoConvPass(None))  # type: ignore[arg-type]
    saved = dict(arm_pass_manager._registered_pass_insertions)
    arm_pass_manager.register_pass_insertions_before(InsertTableOpsPass, folds)
    try:
        yield
    finally:
        arm_pass_manager._registered_pass_insertions.clear()
        arm_pass_manager._registered_pass_insertions.update(saved)


def fake_quantized(module: torch.nn.Module, inputs: tuple[Any, ...], spec: str = INT,
                   calibration: Sequence[tuple[Any, ...]] | None = None) -> torch.fx.GraphModule:
    """``module`` quantized with the Arm quantizer (symmetric int8, pt2e), converted: the
    fake-quantized model an integer lowering is judged against. ``module`` is not changed
    (a deep copy is exported)."""
    from executorch.backends.arm.quantizer import (
        TOSAQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = TOSAQuantizer(_compile_spec(spec))
    quantizer.set_global(get_symmetric_quantization_config())
    graph = torch.export.export(copy.deepcopy(module).eval(), inputs).module(check_guards=False)
    prepared = prepare_pt2e(graph, quantizer)  # type: ignore[arg-type]
    for sample in calibration or [inputs]:
        prepared(*sample)
    return convert_pt2e(prepared)


def lower(model: torch.nn.Module | torch.export.ExportedProgram, inputs: tuple[Any, ...], *,
          fusionkit: bool, spec: str = FP, transform_passes: Sequence[Any] = (),
          partitioner: Callable[[Any], Any] | None = None) -> Any:
    """``to_edge_transform_and_lower`` through the TOSA partitioner; the EdgeProgramManager.

    An integer ``spec`` expects an already quantized model (:func:`fake_quantized`);
    ``partitioner`` (given the compile spec) overrides the stock / adapter choice.
    """
    from executorch.exir import to_edge_transform_and_lower

    ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(
        model, inputs)
    part = partitioner(_compile_spec(spec)) if partitioner else _partitioner(spec, fusionkit)
    return to_edge_transform_and_lower(ep, transform_passes=list(transform_passes),
                                       partitioner=[part])


def _lowered_modules(edge: Any) -> list[Any]:
    gm = edge.exported_program().graph_module
    return [getattr(gm, n.target) for n in gm.graph.nodes
            if n.op == "get_attr" and n.target.startswith("lowered_module")]


def tosa_flatbuffers(edge: Any) -> list[bytes]:
    """Each TOSA delegate's payload (the TOSA flatbuffer), in graph order."""
    return [bytes(m.processed_bytes) for m in _lowered_modules(edge)
            if m.backend_id == "TOSABackend"]


def _as_list(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def run_on_reference_model(edge: Any, inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    """The lowered program's outputs, every TOSA delegate run by the TOSA reference model."""
    from executorch.backends.arm.test.runner_utils import TosaReferenceModelDispatch

    program = edge.exported_program()
    with torch.no_grad(), TosaReferenceModelDispatch():
        if program.graph_signature.buffers_to_mutate:  # (as ExecuTorch's ArmTester runs it)
            out = program.graph_module(*program.buffers(), *inputs)
        else:
            out = program.module()(*inputs)
    return [t.detach() for t in _as_list(out)]


def max_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """Largest absolute difference over every output (inf when the outputs do not pair)."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want, strict=True)):
        return float("inf")
    return max((float((g.double() - w.double()).abs().max()) if g.numel() else 0.0
                for g, w in zip(got, want, strict=True)), default=0.0)


@dataclass
class ArmRun:
    """One lowering judged on the reference model."""

    edge: Any
    #: each TOSA delegate's flatbuffer
    tosa: list[bytes]
    #: the reference model's outputs
    outputs: list[torch.Tensor]
    #: what they are judged against: eager (float) or the fake-quantized model (integer)
    reference: list[torch.Tensor]
    #: the outputs of the float eager model (the same as ``reference`` for float)
    eager: list[torch.Tensor] = field(default_factory=list)

    @property
    def error(self) -> float:
        """Max absolute error of the reference model's outputs against :attr:`reference`."""
        return max_error(self.outputs, self.reference)

    @property
    def delegated(self) -> int:
        return len(self.tosa)


def evaluate(module: torch.nn.Module, inputs: tuple[Any, ...], *, fusionkit: bool,
             spec: str = FP, calibration: Sequence[tuple[Any, ...]] | None = None,
             transform_passes: Sequence[Any] = ()) -> ArmRun:
    """Lower ``module`` (stock or adapter, ``spec``), run it on the reference model and
    pair it with what it is judged against. ``module`` itself is never changed: both the
    eager outputs and the lowering use their own copies."""
    module = copy.deepcopy(module).eval()
    with torch.no_grad():
        eager = _as_list(copy.deepcopy(module)(*inputs))
    if "INT" in spec:
        quantized = fake_quantized(module, inputs, spec, calibration)
        with torch.no_grad():
            reference = _as_list(quantized(*inputs))
        model: Any = torch.export.export(quantized, inputs)
    else:
        reference, model = eager, torch.export.export(module, inputs)
    edge = lower(model, inputs, fusionkit=fusionkit, spec=spec,
                 transform_passes=transform_passes)
    return ArmRun(edge, tosa_flatbuffers(edge), run_on_reference_model(edge, inputs),
                  [t.detach() for t in reference], [t.detach() for t in eager])
