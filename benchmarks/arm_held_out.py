"""The held-out check of the Arm adapter: architectures no test uses, lowered through stock
Arm and through the adapter, float and int8, judged on the TOSA reference model.

Nine tiny blocks written from their papers' structure (fixed seeds, non-trivial
batch-norm statistics and affine parameters): a MobileNetV2 inverted residual (expand /
depthwise / project, BN, ReLU6), a ResNet basic block with its 1x1 downsample, a ConvNeXt
block (7x7 depthwise conv, channels-last LayerNorm, 4x MLP with GELU, layer scale), an
EfficientNet MBConv with squeeze-excite (SiLU, sigmoid gate), a ViT/DeiT encoder block
(manual softmax attention, GELU MLP), a DyT block (``gamma * tanh(alpha * x) + beta``
between two 1x1 convs), a UNet stage (conv-BN-ReLU, max-pool, transposed-conv up, concat
skip), an NF-ResNet block (no norm; a conv times 0.2, which Arm's quantizer folds) and an
MLP with clamps (hardtanh, clamp chains, ReLU6).

Each is lowered with ``to_edge_transform_and_lower`` through ExecuTorch's
``TOSAPartitioner`` and through ``fusionkit.backends.arm_adapter.TOSAPartitioner``, to
``TOSA-1.0+FP`` and ``TOSA-1.0+INT``. Integer: the user's module is quantized with the
path's own quantizer (stock: ExecuTorch's ``TOSAQuantizer``; ours: the adapter's, whose
conv-scale fold binds new tensors), ``export(module).module(check_guards=False)``,
``prepare_pt2e``, one calibration batch, ``convert_pt2e``. Every path starts from a fresh
copy of the user's module built from the same seed and exports *that module* (so a write
into its tensors is seen), then:

* runs the lowered program on the reference model (``reference_model.run_on_reference_model``)
  and takes the max abs error against eager (float) or against that path's fake-quantized
  model (integer; also in output quantization steps);
* records what each taken-over stock pass's rules fused and every decline with its
  reason (the rule passes' reports);
* compares the TOSA flatbuffers with stock's byte for byte;
* records a crash of the lowering (the stage and its root cause);
* compares the module's ``state_dict`` before and after, bit for bit.

A model passes when the adapter's program is equal to its reference (float: max abs error
<= 1e-5 * max(1, max |eager|); integer: bit-identical, 0 steps; within one step is
reported apart), nothing crashed in fusionkit and our path left the module unchanged.

``bash scripts/arm-held-out [--quick] [--models a,b] [--out DIR]``
(``python -m benchmarks.arm_held_out``): prints the table; with ``--out`` (the full run's
default: ``benchmarks/results``) writes ``<date>-<HHMM>-arm-held-out.{json,md}``
(HHMM: UTC start of the run). ``--quick``: two models, nothing written unless ``--out``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import math
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FP = "TOSA-1.0+FP"
INT = "TOSA-1.0+INT"
#: float: max abs error <= FP_RTOL * max(1, max |eager|)
FP_RTOL = 1e-5
ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the models

def _bn_stats(module: nn.Module, seed: int) -> nn.Module:
    """Non-trivial running statistics and affine parameters for every batch norm."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.copy_(torch.rand(m.num_features, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) - 0.5)
    return module


class InvertedResidual(nn.Module):
    """MobileNetV2 (Sandler et al. 2018): 1x1 expand (t=4) -> BN -> ReLU6, 3x3 depthwise ->
    BN -> ReLU6, 1x1 linear project -> BN, identity shortcut (stride 1, same width)."""

    def __init__(self, c: int = 8, t: int = 4) -> None:
        super().__init__()
        h = c * t
        self.block = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class BasicBlock(nn.Module):
    """ResNet (He et al. 2016) basic block, stride 2 with the 1x1-conv + BN downsample."""

    def __init__(self, cin: int = 8, cout: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=2, bias=False),
                                  nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.down(x))


class ConvNeXtBlock(nn.Module):
    """ConvNeXt (Liu et al. 2022): 7x7 depthwise conv, permute to NHWC, LayerNorm(eps 1e-6),
    Linear 4x, GELU, Linear, layer scale gamma (random here, not the 1e-6 init, so the
    branch counts), permute back, residual."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class MBConv(nn.Module):
    """EfficientNet (Tan & Le 2019) MBConv6: 1x1 expand -> BN -> SiLU, 3x3 depthwise -> BN ->
    SiLU, squeeze-excite (mean, 1x1 reduce, SiLU, 1x1 expand, sigmoid, mul), 1x1 project ->
    BN, identity shortcut."""

    def __init__(self, c: int = 8, t: int = 6, se_ratio: float = 0.25) -> None:
        super().__init__()
        h, s = c * t, max(1, int(c * se_ratio))
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False),
                                nn.BatchNorm2d(h), nn.SiLU())
        self.se_reduce = nn.Conv2d(h, s, 1)
        self.se_expand = nn.Conv2d(s, h, 1)
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(self.expand(x))
        s = y.mean((2, 3), keepdim=True)
        s = torch.sigmoid(self.se_expand(F.silu(self.se_reduce(s))))
        return x + self.project(y * s)


class ViTBlock(nn.Module):
    """ViT / DeiT (Dosovitskiy et al. 2021, Touvron et al. 2021) encoder block, pre-norm:
    LN -> qkv -> (q k^T) * d^-0.5 -> softmax -> @ v -> proj, residual; LN -> MLP 4x GELU,
    residual. 2 heads of 8, 9 tokens (8 patches + class token)."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class DyTBlock(nn.Module):
    """Dynamic tanh (Zhu et al. 2025, "Transformers without Normalization"): a 1x1 conv,
    DyT in place of the norm (``gamma * tanh(alpha * x) + beta``, scalar alpha init 0.5,
    per-channel gamma / beta, channels last), a 1x1 conv."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 1)
        self.alpha = nn.Parameter(torch.full((1,), 0.5))
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)
        self.beta = nn.Parameter(torch.rand(c) - 0.5)
        self.conv2 = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x).permute(0, 2, 3, 1)
        y = self.gamma * torch.tanh(self.alpha * y) + self.beta
        return self.conv2(y.permute(0, 3, 1, 2))


class UNetStage(nn.Module):
    """One UNet (Ronneberger et al. 2015) level: double conv-BN-ReLU, 2x2 max-pool,
    bottleneck conv-BN-ReLU, 2x2 stride-2 transposed conv up, concat with the skip, double
    conv-BN-ReLU, 1x1 head."""

    def __init__(self, cin: int = 3, c: int = 8) -> None:
        super().__init__()

        def double(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o),
                                 nn.ReLU(), nn.Conv2d(o, o, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(o), nn.ReLU())

        self.enc = double(cin, c)
        self.mid = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(2 * c), nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec = double(2 * c, c)
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.enc(x)
        y = self.up(self.mid(F.max_pool2d(skip, 2)))
        return self.head(self.dec(torch.cat([skip, y], dim=1)))


class NFBlock(nn.Module):
    """NF-ResNet (Brock et al. 2021, normalizer-free): ``relu(x) / beta -> conv -> relu *
    1.7139 (the scaled-ReLU gain) -> conv -> * alpha (0.2)``, added to ``x`` -- a conv
    times a number, the pattern of Arm's ``FoldScalarMulIntoConvPass`` (float: a rule;
    integer: run by the quantizer)."""

    def __init__(self, c: int = 8, alpha: float = 0.2, beta: float = 1.0) -> None:
        super().__init__()
        self.alpha, self.beta = alpha, beta
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(F.relu(x) * (1.0 / self.beta))
        y = self.conv2(F.relu(y) * 1.7139)
        return x + y * self.alpha


class ClampMLP(nn.Module):
    """An MLP with the clamp family: Linear -> Hardtanh(-2, 2) -> ReLU (a clamp chain),
    Linear -> clamp(min=-1) -> clamp(max=1.5), Linear -> ReLU6 -> clamp(0.1, 4), Linear."""

    def __init__(self, d: int = 12, h: int = 24) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(d, h), nn.Linear(h, h), nn.Linear(h, h)
        self.l4 = nn.Linear(h, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.hardtanh(self.l1(x), -2.0, 2.0))
        x = torch.clamp(torch.clamp(self.l2(x), min=-1.0), max=1.5)
        x = torch.clamp(F.relu6(self.l3(x)), 0.1, 4.0)
        return self.l4(x)


@dataclass(frozen=True)
class HeldOut:
    """A held-out model: how to make it (fresh, seeded) and its input."""

    make: Callable[[], nn.Module]
    shape: tuple[int, ...]
    #: the DyT alpha fold inserted before the table pass for the integer lowering (as
    #: ExecuTorch's docs tell a user to)
    dyt_fold: bool = False


MODELS: dict[str, HeldOut] = {
    "mbv2_inverted_residual": HeldOut(InvertedResidual, (1, 8, 8, 8)),
    "resnet_basic_block": HeldOut(BasicBlock, (1, 8, 8, 8)),
    "convnext_block": HeldOut(ConvNeXtBlock, (1, 16, 8, 8)),
    "efficientnet_mbconv_se": HeldOut(MBConv, (1, 8, 8, 8)),
    "vit_block": HeldOut(ViTBlock, (1, 9, 16)),
    "dyt_block": HeldOut(DyTBlock, (1, 8, 6, 6), dyt_fold=True),
    "unet_stage": HeldOut(UNetStage, (1, 3, 8, 8)),
    "nf_resnet_block": HeldOut(NFBlock, (1, 8, 8, 8)),
    "mlp_clamps": HeldOut(ClampMLP, (4, 12)),
}
#: ``--quick``: the cheapest two (a conv+BN block, the clamp MLP)
QUICK = ("mbv2_inverted_residual", "mlp_clamps")


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A fresh copy of ``name`` (same weights for the same seed) and its input."""
    torch.manual_seed(seed)
    spec = MODELS[name]
    module = _bn_stats(spec.make(), seed + 1).eval()
    g = torch.Generator().manual_seed(seed + 2)
    return module, (torch.randn(*spec.shape, generator=g),)


# ----------------------------------------------------------------------------- one lowering

@dataclass
class PathResult:
    """One model, one profile, one path (stock or fusionkit)."""

    error: float | None = None
    #: integer: the error in output quantization steps
    steps: float | None = None
    delegates: int = 0
    tosa: list[bytes] = field(default_factory=list, repr=False)
    #: stock pass -> nodes its rules fused (fusionkit path)
    fused: dict[str, int] = field(default_factory=dict)
    #: every decline: stock pass, rule, node, reason
    declined: list[dict[str, str]] = field(default_factory=list)
    crash: str | None = None
    crash_stage: str | None = None
    #: a frame of the crash's exception chain in fusionkit's own code (rules, matcher,
    #: rewriter, the adapter's rule pass)
    crash_in_fusionkit: bool | None = None
    module_unchanged: bool | None = None
    changed_tensors: list[str] = field(default_factory=list)
    #: integer: the fake-quantized model's output (what the program is judged against)
    reference: list[torch.Tensor] = field(default_factory=list, repr=False)
    seconds: float = 0.0


def _root(e: BaseException) -> BaseException:
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return e


#: fusionkit's own code, where a crash is fusionkit's (not the adapter's thin wrappers
#: around stock calls, nor this script or the oracle)
_OURS = ("passes/", "fusionkit/match/", "fusionkit/apply/", "fusionkit/check/",
         "fusionkit/core/", "backends/arm_adapter/preprocess_rules.py",
         "backends/arm_adapter/quantizer.py")


def _in_fusionkit(e: BaseException) -> bool:
    """Whether the exception was raised in fusionkit's code: the frames of the innermost
    exception of the chain (where it was raised, not the wrappers it passed through)."""
    root = _root(e)
    return any(any(f"{ROOT}/{part}" in frame.filename or f"/fusionkit/{part}" in frame.filename
                   for part in _OURS)
               for frame in traceback.extract_tb(root.__traceback__))


def _crash_text(e: BaseException) -> str:
    root = _root(e)
    frames = traceback.extract_tb(root.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    text = f"{type(root).__name__}: {root}".replace("\n", " ")
    return (text[:300] + "...") if len(text) > 300 else text + where


@contextlib.contextmanager
def _rule_reports() -> Iterator[list[tuple[str, Any]]]:
    """Collects every Arm rule pass's reports (stock pass name, FusionReport) while open."""
    from fusionkit.backends.arm_adapter.preprocess_rules import ArmRulePass

    seen: list[tuple[str, Any]] = []
    original = ArmRulePass.__call__

    def call(self: ArmRulePass, graph_module: Any) -> Any:
        start = len(self.history)
        try:
            return original(self, graph_module)
        finally:
            seen.extend((self.stock_pass, r) for r in self.history[start:])

    ArmRulePass.__call__ = call  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        ArmRulePass.__call__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _dyt_fold_inserted(enabled: bool) -> Iterator[None]:
    """``FoldDyTAlphaIntoLUTPass`` inserted before ``InsertTableOpsPass`` (Arm's registry is
    process-wide: restored afterwards)."""
    if not enabled:
        yield
        return
    from executorch.backends.arm._passes import (
        FoldDyTAlphaIntoLUTPass,
        InsertTableOpsPass,
        arm_pass_manager,
    )

    saved = dict(arm_pass_manager._registered_pass_insertions)
    arm_pass_manager.register_pass_insertions_before(
        InsertTableOpsPass, [FoldDyTAlphaIntoLUTPass(None)])  # type: ignore[arg-type]
    try:
        yield
    finally:
        arm_pass_manager._registered_pass_insertions.clear()
        arm_pass_manager._registered_pass_insertions.update(saved)


def _quantize(module: nn.Module, inputs: tuple[torch.Tensor, ...], fusionkit: bool) -> Any:
    """``module`` itself (not a copy) quantized with the path's Arm quantizer."""
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from fusionkit.backends.arm_adapter import reference_model as rm

    if fusionkit:
        from fusionkit.backends.arm_adapter.quantizer import TOSAQuantizer
    else:
        from executorch.backends.arm.quantizer import TOSAQuantizer
    quantizer = TOSAQuantizer(rm._compile_spec(INT))
    quantizer.set_global(get_symmetric_quantization_config())
    graph = torch.export.export(module, inputs).module(check_guards=False)
    prepared = prepare_pt2e(graph, quantizer)  # type: ignore[arg-type]
    prepared(*inputs)
    return convert_pt2e(prepared)


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def lower_one(name: str, spec: str, fusionkit: bool, seed: int = 0) -> PathResult:
    """Lower a fresh copy of ``name`` along one path; never raises."""
    from fusionkit.app.arm_run_job import _output_steps
    from fusionkit.backends.arm_adapter import preprocess_rules
    from fusionkit.backends.arm_adapter import reference_model as rm

    res = PathResult()
    module, inputs = build(name, seed)
    before = _state(module)
    with torch.no_grad():
        eager = [copy.deepcopy(module)(*inputs)]
    stage = "quantize"
    t0 = time.perf_counter()
    try:
        with _rule_reports() as reports, _dyt_fold_inserted(MODELS[name].dyt_fold and "INT" in spec):
            preprocess_rules.reset_counts()
            if "INT" in spec:
                quantized = _quantize(module, inputs, fusionkit)
                with torch.no_grad():
                    reference = [quantized(*inputs)]
                stage = "export"
                ep = torch.export.export(quantized, inputs)
            else:
                reference = eager
                stage = "export"
                ep = torch.export.export(module, inputs)  # shares the module's tensors
            res.reference = [t.detach() for t in reference]
            stage = "lower"
            edge = rm.lower(ep, inputs, fusionkit=fusionkit, spec=spec)
            counts = preprocess_rules.counts()
        res.tosa = rm.tosa_flatbuffers(edge)
        res.delegates = len(res.tosa)
        res.fused = {p: c.get("fused", 0) for p, c in sorted(counts.items())}
        for stock_pass, report in reports:
            for d in report.declined:
                res.declined.append({"pass": stock_pass, "rule": d.rule,
                                     "node": d.root.name, "status": str(d.status.value),
                                     "step": str(d.step), "reason": d.reason})
        stage = "reference model"
        outputs = rm.run_on_reference_model(edge, inputs)
        res.error = rm.max_error(outputs, res.reference)
        if "INT" in spec:
            steps = [s for s in _output_steps(edge) if s]
            res.steps = res.error / steps[0] if steps else None
    except Exception as e:  # a crash anywhere is the finding
        res.crash, res.crash_stage = _crash_text(e), stage
        res.crash_in_fusionkit = _in_fusionkit(e)
    res.seconds = time.perf_counter() - t0
    after = module.state_dict()
    res.changed_tensors = [k for k in before if k not in after or not torch.equal(before[k], after[k])]
    res.changed_tensors += [k for k in after if k not in before]
    res.module_unchanged = not res.changed_tensors
    return res


# ----------------------------------------------------------------------------- the check

def _limit(eager_max: float) -> float:
    return FP_RTOL * max(1.0, eager_max)


def check_model(name: str, specs: Sequence[str] = (FP, INT), seed: int = 0,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both paths, every profile, and the verdicts."""
    module, inputs = build(name, seed)
    with torch.no_grad():
        eager_max = float(module(*inputs).abs().max())
    doc = " ".join((MODELS[name].make.__doc__ or "").split())
    row: dict[str, Any] = {"model": name, "doc": doc,
                           "input": list(MODELS[name].shape),
                           "params": sum(p.numel() for p in module.parameters()),
                           "eager_max_abs": eager_max, "specs": {}}
    for spec in specs:
        paths = {way: lower_one(name, spec, way == "fusionkit", seed)
                 for way in ("stock", "fusionkit")}
        st, fk = paths["stock"], paths["fusionkit"]
        out: dict[str, Any] = {}
        for way, r in paths.items():
            d = asdict(r)
            d.pop("tosa")
            d.pop("reference")
            d["tosa_bytes"] = sum(map(len, r.tosa))
            out[way] = d
        out["byte_identical"] = bool(st.tosa) and st.tosa == fk.tosa
        if "INT" in spec:
            out["fake_quantized_equal"] = (bool(st.reference) and bool(fk.reference)
                                           and rm_equal(st.reference, fk.reference))
            ok_err = fk.error is not None and fk.error == 0.0
            out["within_one_step"] = (fk.steps is not None and fk.steps <= 1.0 + 1e-6)
        else:
            out["limit"] = _limit(eager_max)
            ok_err = fk.error is not None and fk.error <= out["limit"]
        out["ours_equal"] = ok_err
        #: both paths crash alike outside fusionkit's code: a stock failure, not ours
        out["stock_crash_shared"] = bool(fk.crash and st.crash == fk.crash
                                         and not fk.crash_in_fusionkit)
        out["ours_ok"] = bool(ok_err and fk.crash is None and fk.module_unchanged
                              and fk.delegates > 0)
        if "INT" in spec:
            st_ok = st.error is not None and st.error == 0.0
        else:
            st_ok = st.error is not None and st.error <= out["limit"]
        out["stock_ok"] = bool(st_ok and st.crash is None and st.module_unchanged
                               and st.delegates > 0)
        row["specs"][spec] = out
        if log:
            log(f"  ... {name} {spec}: stock {_err(st)} ours {_err(fk)}")
    row["ok"] = all(s["ours_ok"] for s in row["specs"].values())
    #: every failure of ours is stock's own crash, shared (a stock pass not taken over)
    row["ok_but_stock_crash"] = not row["ok"] and all(
        s["ours_ok"] or s["stock_crash_shared"] for s in row["specs"].values())
    row["stock_ok"] = all(s["stock_ok"] for s in row["specs"].values())
    return row


def rm_equal(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _err(r: dict[str, Any] | PathResult) -> str:
    d = r if isinstance(r, dict) else asdict(r)
    if d["crash"]:
        return f"CRASH ({d['crash_stage']})"
    e = d["error"]
    if e is None or math.isinf(e):
        return "mismatch"
    text = f"{e:.1e}"
    if d.get("steps") is not None:
        text += f" ({d['steps']:.2g} st)"
    return text


def _fusions(fk: dict[str, Any]) -> str:
    fused = ", ".join(f"{p.removesuffix('Pass')} {n}" for p, n in fk["fused"].items() if n)
    n_dec = len(fk["declined"])
    return (fused or "none") + (f"; {n_dec} declined" if n_dec else "")


def table_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        fp, i8 = r["specs"].get(FP), r["specs"].get(INT)

        def cells(s: dict[str, Any] | None) -> list[str]:
            if s is None:
                return ["-", "-"]
            return [_err(s["stock"]), _err(s["fusionkit"])]

        def ident(s: dict[str, Any] | None) -> str:
            if s is None or not (s["stock"]["delegates"] or s["fusionkit"]["delegates"]):
                return "-"
            return "yes" if s["byte_identical"] else "no"

        def unchanged(s: dict[str, Any] | None) -> str:
            if s is None:
                return "-"
            return "/".join("yes" if s[w]["module_unchanged"] else "NO"
                            for w in ("stock", "fusionkit"))

        fus = " | ".join(f"{tag}: {_fusions(s['fusionkit'])}"
                         for tag, s in (("FP", fp), ("INT", i8)) if s is not None)
        verdict = ("ok" if r["ok"] else "stock crash" if r["ok_but_stock_crash"] else "FAIL")
        out.append([r["model"], *cells(fp), *cells(i8), f"{ident(fp)}/{ident(i8)}",
                    f"{unchanged(fp)} {unchanged(i8)}", verdict,
                    "ok" if r["stock_ok"] else "FAIL", fus])
    return out


HEAD = ["model", "FP stock", "FP ours", "INT stock", "INT ours", "identical FP/INT",
        "unchanged st/fk FP INT", "ours", "stock", "fusions (ours)"]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except Exception:  # no git: the record just lacks it
        return ""


def _decline_groups(declined: Sequence[dict[str, str]]
                    ) -> dict[tuple[str, str], tuple[int, str]]:
    """(rule, deciding step) -> (how many, the first one's node and reason)."""
    groups: dict[tuple[str, str], tuple[int, str]] = {}
    for d in declined:
        key = (d["rule"], d["step"])
        n, example = groups.get(key, (0, f"`{d['node']}`: {d['reason']}"))
        groups[key] = (n + 1, example)
    return groups


def markdown(data: dict[str, Any]) -> str:
    lines = [f"# Arm held-out check ({data['started_utc']})", "",
             "Held-out architectures (no test uses them; `benchmarks/arm_held_out.py`) lowered "
             "through stock ExecuTorch Arm and through `fusionkit.backends.arm_adapter`, "
             f"`{FP}` and `{INT}`, each run on the TOSA reference model (`tosa-tools`). "
             "Float errors: max |reference model - eager|; integer: max |reference model - "
             "that path's fake-quantized model| (its own quantizer; `st`: output quantization "
             "steps). Pass: float <= 1e-5 x max(1, max|eager|); integer bit-identical (0); "
             "no crash in our path; the user's module bit-identical after our lowering.",
             "",
             f"Tree: `{data['git_head']}`" + (" + uncommitted changes of others in "
                                              f"{', '.join(data['git_dirty'])}"
                                              if data["git_dirty"] else "")
             + f"; ExecuTorch {data['versions']['executorch']}, torch "
               f"{data['versions']['torch']}; {data['seconds']:.0f} s. Command: "
               f"`{data['command']}`.", ""]
    lines.append("| " + " | ".join(HEAD) + " |")
    lines.append("|" + "|".join("---" for _ in HEAD) + "|")
    for r in table_rows(data["models"]):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in r) + " |")
    lines.append("")
    lines.append("## Details")
    for r in data["models"]:
        lines.append("")
        lines.append(f"### {r['model']}")
        lines.append(f"{r['doc']} Input {r['input']}, {r['params']} parameters, "
                     f"max |eager| {r['eager_max_abs']:.3g}.")
        for spec, s in r["specs"].items():
            st, fk = s["stock"], s["fusionkit"]
            lines.append(f"- `{spec}`: delegates {st['delegates']}/{fk['delegates']} "
                         f"(stock/ours), TOSA bytes {st['tosa_bytes']}/{fk['tosa_bytes']}, "
                         f"byte-identical: {s['byte_identical']}"
                         + (f", fake-quantized models equal: {s['fake_quantized_equal']}"
                            if "fake_quantized_equal" in s else ""))
            lines.append(f"  - errors: stock {_err(st)}, ours {_err(fk)}")
            fused = ", ".join(f"{p} {n}" for p, n in fk["fused"].items() if n)
            lines.append(f"  - ours fused: {fused or 'nothing'}")
            for (rule, step), (n, example) in _decline_groups(fk["declined"]).items():
                lines.append(f"  - ours declined {n}x `{rule}` at `{step}`, e.g. {example}")
            for way, p in (("stock", st), ("ours", fk)):
                if p["crash"]:
                    where = ("in fusionkit's code" if p["crash_in_fusionkit"]
                             else "outside fusionkit's code")
                    lines.append(f"  - {way} crashed in {p['crash_stage']} ({where}): "
                                 f"{p['crash']}")
                if not p["module_unchanged"]:
                    lines.append(f"  - {way} changed the user's module: "
                                 f"{', '.join(p['changed_tensors'])}")
    return "\n".join(lines) + "\n"


def run(models: Sequence[str], log: Callable[[str], None] | None = None) -> dict[str, Any]:
    from importlib.metadata import version

    start = datetime.datetime.now(datetime.UTC)
    t0 = time.perf_counter()
    rows = [check_model(m, log=log) for m in models]
    dirty = sorted({line[3:] for line in _git("status", "--porcelain", "--untracked-files=no")
                    .splitlines() if line[3:].split("/")[0] in {"fusionkit", "passes",
                                                               "backends", "benchmarks"}})
    return {"started_utc": start.strftime("%Y-%m-%d %H:%M UTC"),
            "stamp": start.strftime("%Y-%m-%d-%H%M"),
            "git_head": _git("rev-parse", "--short", "HEAD"), "git_dirty": dirty,
            "versions": {"torch": torch.__version__,
                         "executorch": version("executorch")},
            "seconds": time.perf_counter() - t0, "command": "", "models": rows,
            "all_ok": all(r["ok"] for r in rows),
            "fusionkit_ok": all(r["ok"] or r["ok_but_stock_crash"] for r in rows)}


def main(argv: Sequence[str]) -> int:
    import argparse
    import logging
    import os
    import warnings

    from benchmarks.output import fmt_table

    ap = argparse.ArgumentParser(prog="scripts/arm-held-out", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"two models: {', '.join(QUICK)}")
    ap.add_argument("--models", help=f"comma-separated, of: {', '.join(MODELS)}")
    ap.add_argument("--out", metavar="DIR",
                    help="write <date>-<HHMM>-arm-held-out.{json,md} there (default for a "
                         "full run: benchmarks/results; --quick/--models: nothing)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    models = (args.models.split(",") if args.models else list(QUICK) if args.quick
              else list(MODELS))
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    out_dir = args.out or (None if args.quick or args.models else str(ROOT / "benchmarks/results"))
    data = run(models, log=lambda s: print(s, file=sys.stderr, flush=True))
    data["command"] = "bash scripts/arm-held-out" + ("".join(f" {a}" for a in argv))
    print(fmt_table(table_rows(data["models"]), HEAD))
    print("errors: max abs against eager (FP) / that path's fake-quantized model (INT, 'st': "
          "output quantization steps); identical: TOSA flatbuffers byte-identical to stock's; "
          "unchanged: the user's module's state_dict bit-identical after lowering.")
    print("all ours ok" if data["all_ok"] else
          "NOT ok: " + ", ".join(r["model"] + (" (stock's crash, shared)"
                                               if r["ok_but_stock_crash"] else "")
                                 for r in data["models"] if not r["ok"]))
    if out_dir:
        base = Path(out_dir) / f"{data['stamp']}-arm-held-out"
        base.with_suffix(".json").write_text(json.dumps(data, indent=2, default=str) + "\n")
        base.with_suffix(".md").write_text(markdown(data))
        print(f"wrote {base}.json, {base}.md")
    return 0 if data["fusionkit_ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
