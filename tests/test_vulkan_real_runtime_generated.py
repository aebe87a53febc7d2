"""Generated programs: the simulator and ``check()`` against ExecuTorch's real Vulkan runtime.

Hypothesis draws small programs over what the simulator models — binary ops
(arithmetic and comparisons), unary ops, ``linear``, ``layer_norm``, an RMSNorm and
view ops — in float32 / float16 / int32, on texture or buffer storage (tiny texture
limits: the tensors go to buffers), at small shapes, lowered by fusionkit or by stock
ExecuTorch 1.5.1. Every drawn program is lowered and judged by the static tools
inside the hypothesis loop; then all of them run on the real runtime in one child
process. Every program where the simulator or ``check()`` (both given the probed
runtime, as ``fusionkit run`` uses them) predicts another outcome than the runtime's
is a failure, described op by op; so is a fusionkit program not equal to eager, but
for one known gap: a shader variant the runtime lacks (an int32 ``eq``, refused with
``Could not find ShaderInfo``) is predicted by the probed tools, yet the runtime-aware
partitioner keeps only missing *operators* off the delegate. The tools without the
probe may differ only where the probe explains it. Programs whose eager output is not
finite (a float16 overflow) are not drawn. Derandomized: the same programs every run.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vulkan_real_programs import Program, lower, run_all  # noqa: E402

#: a fixed, small number: every example is a lowering (~2 s) plus a run on the runtime
EXAMPLES = int(os.environ.get("FUSIONKIT_GENERATED_EXAMPLES", "28"))

BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "maximum": torch.maximum, "minimum": torch.minimum}
COMPARE = {"eq": torch.eq, "lt": torch.lt, "gt": torch.gt, "le": torch.le}
UNARY = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
         "neg": torch.neg, "abs": torch.abs}
FLOAT_ONLY = {"div", "sigmoid", "tanh", "exp", "linear", "layer_norm", "rms_norm"}
VIEWS = ("permute", "unsqueeze", "flatten", "slice", "transpose")
#: how a program gets its storage: 1.5.1's memory tagging ignores ``storage_type_override``
#: (TagMemoryMetaPass stores it and never reads it); a tensor beyond the texture limits is
#: put in a buffer, so tiny limits make a buffer program
STORAGE: dict[str, dict[str, Any]] = {"texture3d": {}, "buffer": {"texture_limits": (1, 1, 1)}}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One generated program: ``ops`` applied in turn to input ``x`` (binary ops take
    input ``y``, of x's shape or broadcast along the last dim); a comparison ends it."""

    path: str
    dtype: str
    storage: str
    shape: tuple[int, ...]
    ops: tuple[str, ...]
    broadcast: bool

    def describe(self) -> str:
        y = "y[..., :1]" if self.broadcast else "y"
        return (f"{self.path} lowering, {self.dtype} on {self.storage}: x{list(self.shape)}, "
                f"{y}; " + " -> ".join(self.ops))


@st.composite
def specs(draw: Any) -> Spec:
    dtype = draw(st.sampled_from(["float32", "float16", "int32"]))
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    pool = [*BINARY, *UNARY, "linear", "layer_norm", "rms_norm", *VIEWS]
    if dtype == "int32":
        pool = [o for o in pool if o not in FLOAT_ONLY]
    ops = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    if draw(st.booleans()):
        ops.append(draw(st.sampled_from(sorted(COMPARE))))
    return Spec(draw(st.sampled_from(["fusionkit", "stock"])), dtype,
                draw(st.sampled_from(sorted(STORAGE))), shape, tuple(ops), draw(st.booleans()))


class Generated(torch.nn.Module):
    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.spec = spec
        dtype = getattr(torch, spec.dtype)
        g = torch.Generator().manual_seed(3)
        self.layers = torch.nn.ModuleDict()
        self.weights = torch.nn.ParameterDict()
        width = spec.shape[-1]
        shape = list(spec.shape)
        for i, op in enumerate(spec.ops):  # parameters sized as the op meets its input
            if op == "linear":
                lin = torch.nn.Linear(width, 5).to(dtype)
                with torch.no_grad():
                    lin.weight.copy_(torch.randn(5, width, generator=g) / width ** 0.5)
                self.layers[str(i)] = lin
                width = shape[-1] = 5
            elif op in ("layer_norm", "rms_norm"):
                self.weights[str(i)] = torch.nn.Parameter(
                    (1 + 0.1 * torch.randn(width, generator=g)).to(dtype))
            elif op in VIEWS:
                shape = _view_shape(op, shape)
                width = shape[-1]
            elif op in BINARY and shape != list(spec.shape):
                self.weights[str(i)] = torch.nn.Parameter(
                    (torch.rand(width, generator=g) + 0.5).to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = x
        for i, op in enumerate(self.spec.ops):
            if op in BINARY:
                other = y if h.shape == x.shape else self.weights[str(i)]
                h = BINARY[op](h, other)
            elif op in COMPARE:
                h = COMPARE[op](h, y if h.shape == x.shape else h.flip(-1))
            elif op in UNARY:
                h = UNARY[op](h)
            elif op == "linear":
                h = self.layers[str(i)](h)
            elif op == "layer_norm":
                h = torch.nn.functional.layer_norm(h, (h.shape[-1],), self.weights[str(i)])
            elif op == "rms_norm":
                var = h.pow(2).mean(-1, keepdim=True)
                h = h * torch.rsqrt(var + 1e-6) * self.weights[str(i)]
            else:
                h = _view(op, h)
        return h


def _view_shape(op: str, shape: list[int]) -> list[int]:
    return list(_view(op, torch.empty(shape)).shape)


def _view(op: str, h: torch.Tensor) -> torch.Tensor:
    if op == "permute":
        return h.permute(*reversed(range(h.dim())))
    if op == "unsqueeze":
        return h.unsqueeze(0) if h.dim() < 4 else h
    if op == "flatten":
        return h.flatten(-2) if h.dim() > 1 else h
    if op == "transpose":
        return h.transpose(-1, -2) if h.dim() > 1 else h
    return h[..., : max(1, h.shape[-1] - 1)]  # slice


def _inputs(spec: Spec, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    yshape = (*spec.shape[:-1], 1) if spec.broadcast else spec.shape
    if dtype.is_floating_point:  # y > 0: div stays finite
        return (torch.randn(spec.shape, generator=g).to(dtype),
                (torch.rand(yshape, generator=g) + 0.5).to(dtype))
    return (torch.randint(-3, 4, spec.shape, generator=g).to(dtype),
            torch.randint(1, 4, yshape, generator=g).to(dtype))


def build(spec: Spec, seed: int) -> Program | None:
    """Lower one spec (None when eager PyTorch or export itself rejects it)."""
    from vulkan_real_programs import stock_partitioner

    import fusionkit.backends.vulkan_adapter as va

    model = Generated(spec).eval()
    x, y = _inputs(spec, seed)
    try:
        with torch.no_grad():
            eager = model(x, y)
        ep = torch.export.export(model, (x, y))
    except Exception:
        return None
    if eager.is_floating_point() and not bool(eager.isfinite().all()):
        # e.g. exp(exp(x)) in float16: what a GPU makes of an overflow is not modelled
        return None
    options = dict(STORAGE[spec.storage])
    make = ((lambda: stock_partitioner(compile_options=options)) if spec.path == "stock" else
            (lambda: va.VulkanPartitioner(compile_options=options)))
    tol = {"float32": (1e-4, 1e-4), "float16": (3e-2, 3e-2), "int32": (0.0, 0.0)}[spec.dtype]
    return lower(spec.describe(), "generated", spec.path, ep, (x, y), eager,
                 partitioner=make, tolerance=tol)


@pytest.fixture(scope="module")
def programs(vulkan_runtime: Any) -> list[tuple[Spec, Program]]:
    from fusionkit.backends.vulkan_adapter.runtime_probe import cached_inventory

    assert cached_inventory() is not None, "the runtime's probe: bash scripts/vulkan-runtime"
    drawn: list[tuple[Spec, Program]] = []

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(spec=specs())
    def collect(spec: Spec) -> None:
        prog = build(spec, len(drawn))
        if prog is not None:
            drawn.append((spec, prog))

    collect()
    run_all([p for _, p in drawn])
    return drawn


def _disagreements(drawn: list[tuple[Spec, Program]]) -> list[str]:
    bad = []
    for spec, p in drawn:
        if p.lower_error is not None:
            if spec.path == "fusionkit":
                bad.append(f"{spec.describe()}: fusionkit's lowering failed: {p.lower_error}")
            continue
        real = p.outcome + (f" ({p.real.message})" if p.real and p.real.message else "")
        why = (f"{spec.describe()}: real runtime {real}; simulator+probe {p.simulator_probed}; "
               f"check+probe {p.check_probed}")
        if not (p.simulator_probed_agrees and p.check_probed_agrees):
            bad.append(why)
        elif not p.simulator_agrees and "probed" not in p.simulator_probed:
            bad.append(why + f"; the simulator without the probe: {p.simulator}")
        elif p.check_agrees != p.check_probed_agrees and not any(
                "probed" in c for c in p.check_probed):
            bad.append(why + f"; check() without the probe: {p.check_problems}")
        elif spec.path == "fusionkit" and p.outcome != "ok" and not _shader_gap(p):
            bad.append(f"{spec.describe()}: fusionkit's program not equal to eager: {real}")
    return bad


def _shader_gap(p: Program) -> bool:
    """Refused for a shader variant the probed runtime lacks, as check() and the simulator
    (given the probe) said: the runtime-aware partitioner keeps missing *operators* off
    the delegate, not missing shader variants (an int32 ``eq``) — a known gap."""
    return (p.outcome == "refused" and "ShaderInfo" in (p.real.message or "" if p.real else "")
            and any("missing_shader" in c or "no shader" in c for c in p.check_probed))


def test_generated_programs_cover_the_space(programs: list[tuple[Spec, Program]]) -> None:
    specs_ = [s for s, _ in programs]
    assert len(specs_) >= EXAMPLES // 2, len(specs_)
    assert {s.dtype for s in specs_} == {"float32", "float16", "int32"}
    assert {s.storage for s in specs_} == set(STORAGE)
    assert {s.path for s in specs_} == {"fusionkit", "stock"}
    assert all(p.real is not None for _, p in programs if p.pte is not None)


def test_static_tools_agree_with_the_real_runtime(programs: list[tuple[Spec, Program]]) -> None:
    bad = _disagreements(programs)
    assert not bad, "\n".join(bad)
