"""Lower a model for Vulkan, simulate it on random inputs and compare with eager.

What ``fusionkit simulate MODEL`` runs: :func:`simulate_model` lowers through the
adapter (or, with ``stock=True``, through ExecuTorch's own ``VulkanPartitioner``
with the adapter uninstalled for the duration), serializes the program
(``to_executorch()``), draws random inputs of the example inputs' shapes and
dtypes, runs :func:`~fusionkit.backends.vulkan_adapter.simulate` on the serialized program and eager
PyTorch, and reports the maximum error per output against a per-dtype tolerance,
widened to the loosest :data:`OP_FAMILIES` tolerance among the ops that ran.

Per delegate it reports which ops ran (in chain order, with counts) and, when
the partition's eager reference is available (the lowered module's
``original_module``: the partition as the partitioner cut it, before
``vulkan_preprocess`` fused and serialized it), the largest error of the
delegate's outputs against that reference on the same inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fusionkit.backends.vulkan_adapter.inspect.simulator import (
    DelegateRun,
    NotConstantError,
    RuntimeConditionError,
    SimulationError,
    simulate,
)
from fusionkit.program import ProgramLike, as_exported_program

__all__ = ["OP_FAMILIES", "TOLERANCES", "DelegateReport", "OutputError", "SimulationReport",
           "family_of", "random_inputs", "simulate_model"]

#: dtype -> (atol, rtol): |simulated - eager| <= atol + rtol * |eager|
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 6e-2),
}


#: op family -> (atol, rtol, what the error is) for float32 outputs compared with the
#: *quantized* eager model (torchao / pt2e quantized module, not the float one)
OP_FAMILIES: dict[str, tuple[float, float, str]] = {
    "float": (1e-5, 1e-5, "float ops: summation order only"),
    "q4_weight_only": (1e-4, 1e-4, "4-bit group weight-only linear / embedding: the same "
                       "dequantized weight, float accumulation in another order"),
    "dynamic_int8_activation": (1e-3, 1e-3, "8-bit per-token dynamic activation x 4-bit weight: "
                                "integer accumulation; an input on a rounding tie may land one "
                                "quantum off"),
    "static_int8": (1e-2, 1e-2, "int8 static activations (q8ta_*, linear_q8ta_q8csw): "
                    "re-quantized outputs may differ by one quantum"),
    "kv_cache": (1e-4, 1e-4, "KV-cache update + causal SDPA: softmax in float32"),
}

_FAMILY_OPS: dict[str, tuple[str, ...]] = {
    "q4_weight_only": ("et_vk.linear_q4gsw.", "et_vk.embedding_q4gsw.", "et_vk.linear_qcs4w.",
                       "aten._weight_int8pack_mm.", "quantized_decomposed.embedding_4bit."),
    "dynamic_int8_activation": ("et_vk.linear_dq8ca_q4gsw.", "torchao.choose_qparams_affine.",
                                "quantized_decomposed.choose_qparams"),
    "static_int8": ("et_vk.q8ta_", "et_vk.linear_q8ta_q8csw.", "quantized_decomposed.quantize",
                    "quantized_decomposed.dequantize", "torchao.quantize_affine.",
                    "torchao.dequantize_affine."),
    "kv_cache": ("llama.", "update_cache.", "custom_sdpa.", "sdpa_with_kv_cache."),
}


def family_of(op: str) -> str:
    """The :data:`OP_FAMILIES` key of a serialized op name."""
    for fam, prefixes in _FAMILY_OPS.items():
        if op.startswith(prefixes):
            return fam
    return "float"


@dataclass
class DelegateReport:
    index: int
    label: str
    #: op name -> how many times it ran, in first-run order
    ops: dict[str, int]
    families: list[str]
    #: largest |delegate output - eager partition output| (None: no reference ran)
    max_abs_error: float | None = None
    #: why there is no reference error
    reference_note: str | None = None


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
    delegates: list[DelegateReport] = field(default_factory=list)
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


def _max_error(got: Sequence[Any], want: Sequence[Any]) -> float:
    err = 0.0
    for g, w in zip(got, want, strict=True):
        if not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)):
            continue
        if g.shape != w.shape:
            return float("inf")
        if g.numel():
            err = max(err, float((g.double() - w.double()).abs().max()))
    return err


def _delegate_report(run: DelegateRun) -> DelegateReport:
    ops: dict[str, int] = {}
    for name in run.ops:
        ops[name] = ops.get(name, 0) + 1
    fams = sorted({family_of(n) for n in ops})
    rep = DelegateReport(run.index, run.label, ops, fams)
    ref = getattr(run.lowered, "original_module", None)
    if ref is None:
        rep.reference_note = "the lowered module keeps no original_module"
        return rep
    try:
        with torch.no_grad():
            want = pytree.tree_leaves(ref.module()(*run.inputs))
    except Exception as e:  # an op without an eager kernel, a mutated buffer, ...
        rep.reference_note = f"the eager partition did not run: {type(e).__name__}: {e}"[:200]
        return rep
    if len(want) != len(run.outputs):
        rep.reference_note = (f"the eager partition returns {len(want)} outputs, the delegate "
                              f"{len(run.outputs)}")
        return rep
    rep.max_abs_error = _max_error(run.outputs, want)
    return rep


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


def _lowered_already(program: Any) -> bool:
    """An ``ExecutorchProgramManager``, or a program with delegate calls (lowered)."""
    from executorch.exir import ExecutorchProgramManager
    from executorch.exir.delegate import executorch_call_delegate

    if isinstance(program, ExecutorchProgramManager):
        return True
    ep = as_exported_program(program, who="simulate_model()")
    return any(n.target is executorch_call_delegate for n in ep.graph_module.graph.nodes)


def simulate_model(exported: ProgramLike, module: Any, example_inputs: Sequence[Any], *,
                   rules: Sequence[Any] = (), stock: bool = False, seed: int = 0,
                   progress: Callable[[str], None] | None = None) -> SimulationReport:
    """Lower ``exported`` for Vulkan, simulate the .pte on random inputs, compare with
    ``module`` (eager; ``exported.module()`` when None).

    ``exported``: an ATen ``ExportedProgram`` or an ``EdgeProgramManager`` from
    ``to_edge`` (lowered here), or a program lowered already (the
    ``EdgeProgramManager`` of ``to_edge_transform_and_lower``, an
    ``ExecutorchProgramManager``), simulated as it is; then ``rules`` and ``stock``
    do not apply and ``module`` is required.
    """
    say = progress or (lambda _msg: None)
    report = SimulationReport(stock=stock)
    # the eager reference first: ExecuTorch's lowering drops constants from the dicts it
    # shares with ``exported`` (a non-persistent buffer such as a rotary inv_freq), after
    # which ``exported.module()`` raises KeyError
    lowered = _lowered_already(exported)
    eager = module if module is not None or lowered else as_exported_program(exported).module()
    t0 = time.perf_counter()
    if lowered:
        if rules or stock:
            raise ValueError("simulate_model(): the program is lowered already; rules and "
                             "stock apply when lowering (pass the ExportedProgram)")
        if module is None:
            raise ValueError("simulate_model(): a lowered program needs the eager module to "
                             "compare with (module=...)")
        program: Any = exported
    else:
        say("lowering to vulkan" + (" with stock ExecuTorch (adapter uninstalled)"
                                    if stock else ""))
        program = _lower(exported, rules, stock)
    report.seconds["lower"] = time.perf_counter() - t0
    inputs = random_inputs(example_inputs, seed)
    with torch.no_grad():
        want = pytree.tree_leaves(eager(*inputs))
    say("simulating the Vulkan program on the CPU")
    t0 = time.perf_counter()
    trace: list[DelegateRun] = []
    try:
        got = pytree.tree_leaves(simulate(program, *inputs, trace=trace))
    except SimulationError as e:
        report.error = str(e)
        report.error_kind = ("not_constant" if isinstance(e, NotConstantError) else
                             "runtime_condition" if isinstance(e, RuntimeConditionError) else
                             type(e).__name__)
        return report
    finally:
        report.seconds["simulate"] = time.perf_counter() - t0
    report.delegates = [_delegate_report(r) for r in trace]
    fams = {f for d in report.delegates for f in d.families}
    widen = max((OP_FAMILIES[f][:2] for f in fams), default=(0.0, 0.0))
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
        if w.dtype.is_floating_point:
            atol, rtol = max(atol, widen[0]), max(rtol, widen[1])
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            err, ok = float("inf"), False
        else:
            diff = (g.double() - w.double()).abs()
            err = float(diff.max()) if diff.numel() else 0.0
            ok = g.dtype == w.dtype and bool((diff <= atol + rtol * w.double().abs()).all())
        report.outputs.append(OutputError(i, list(w.shape), str(w.dtype).removeprefix("torch."),
                                          err, atol, rtol, ok))
    return report
