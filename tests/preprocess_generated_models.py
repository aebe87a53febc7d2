"""Random small models made of what the backends' preprocess passes rewrite (issue 25).

A :class:`Spec` is a stack of :class:`Block` pieces applied in turn to an NCHW input:
convolutions with a batch norm and activations after them, a residual add + activation,
a concatenation of many inputs, 1-D convolutions (on the flattened rows; one applied
twice shares its weight), PReLU, a lone batch norm, clones, a zero pad before a conv,
a comparison with an int32 buffer (a dtype mix), and an optional linear head. The
specs are plain data, so a failing example prints as a model one can rebuild
(:meth:`Spec.describe`); :func:`specs` is the hypothesis strategy drawing them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

#: activations a rule may fuse into the op before (clamp: one that none fuses on XNNPACK)
ACTIVATIONS = ("relu", "relu6", "hardtanh", "clamp")
#: block kinds
KINDS = ("conv", "conv1d", "residual", "cat", "prelu", "batch_norm", "clone", "pad_conv",
         "compare")


@dataclasses.dataclass(frozen=True)
class Block:
    kind: str
    out: int = 0  # conv / conv1d output channels
    kernel: int = 1
    bias: bool = True
    bn: bool = False  # a batch norm after the conv / linear
    acts: tuple[str, ...] = ()  # activations after it, in order
    n: int = 0  # cat: number of inputs; prelu: 1 or the channels
    twice: bool = False  # conv1d applied twice (one shared weight); batch norm: affine=False

    def describe(self) -> str:
        bits = [self.kind]
        if self.kind in ("conv", "conv1d", "pad_conv"):
            bits.append(f"->{self.out or 'same'} k{self.kernel}" + ("" if self.bias else " nobias"))
        if self.bn:
            bits.append("+bn")
        if self.n:
            bits.append(f"n={self.n}")
        if self.twice:
            bits.append("twice" if self.kind == "conv1d" else "affine=False")
        if self.acts:
            bits.append("+" + "+".join(self.acts))
        return " ".join(bits)


@dataclasses.dataclass(frozen=True)
class Spec:
    channels: int
    height: int
    width: int
    blocks: tuple[Block, ...]
    head: Block | None  # kind "linear"
    quantized: bool
    seed: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (1, self.channels, self.height, self.width)

    def describe(self) -> str:
        head = f" | linear {self.head.out}" + (" +bn" if self.head.bn else "") + (
            " +" + "+".join(self.head.acts) if self.head.acts else "") if self.head else ""
        q = "quantized " if self.quantized else ""
        return (f"{q}x{list(self.shape)} seed {self.seed}: "
                + " | ".join(b.describe() for b in self.blocks) + head)

    def kinds(self) -> set[str]:
        out = {b.kind for b in self.blocks}
        if self.head is not None:
            out.add("linear")
        if any(b.bn for b in self.blocks) or (self.head is not None and self.head.bn):
            out.add("conv_or_linear+bn")
        if any(b.acts for b in (*self.blocks, *([self.head] if self.head else []))):
            out.add("activation")
        return out


def _act(name: str, h: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return torch.relu(h)
    if name == "relu6":
        return F.relu6(h)
    if name == "hardtanh":
        return F.hardtanh(h, -0.5, 0.5)
    return torch.clamp(h, -1.0, 1.0)


def _trained(bn: nn.Module, g: torch.Generator) -> None:
    """Statistics a trained model would have (not the identity)."""
    with torch.no_grad():
        n = bn.running_mean.numel()  # type: ignore[union-attr]
        bn.running_mean.copy_(torch.rand(n, generator=g) - 0.5)  # type: ignore[union-attr]
        bn.running_var.copy_(torch.rand(n, generator=g) + 0.5)  # type: ignore[union-attr]
        if bn.weight is not None:  # type: ignore[union-attr]
            bn.weight.copy_(torch.rand(n, generator=g) + 0.5)  # type: ignore[union-attr]
            bn.bias.copy_(torch.rand(n, generator=g) - 0.5)  # type: ignore[union-attr]


class Generated(nn.Module):
    """The model of one :class:`Spec` (parameters sized as each block meets its input)."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.spec = spec
        torch.manual_seed(spec.seed)
        g = torch.Generator().manual_seed(spec.seed)
        self.mods = nn.ModuleDict()
        c = spec.channels
        for i, b in enumerate(spec.blocks):
            k = str(i)
            if b.kind in ("conv", "pad_conv"):
                pad = b.kernel // 2 if b.kind == "conv" else 0
                self.mods[k] = nn.Conv2d(c, b.out, b.kernel, padding=pad, bias=b.bias)
                c = b.out
            elif b.kind == "conv1d":
                out = c if b.twice else b.out
                self.mods[k] = nn.Conv1d(c, out, b.kernel, padding=b.kernel // 2, bias=b.bias)
                c = out
            elif b.kind == "residual":
                self.mods[k] = nn.Conv2d(c, c, 1)
            elif b.kind == "cat":
                self.mods[k] = nn.Conv2d(c * b.n, c, 1)
            elif b.kind == "prelu":
                self.mods[k] = nn.PReLU(c if b.n != 1 else 1)
                with torch.no_grad():
                    self.mods[k].weight.copy_(  # type: ignore[operator]
                        torch.rand(self.mods[k].weight.shape, generator=g) * 0.5)
            elif b.kind == "batch_norm":
                self.mods[k] = nn.BatchNorm2d(c, affine=not b.twice)
                _trained(self.mods[k], g)
            elif b.kind == "compare":
                self.register_buffer(f"ints{k}", torch.randint(-1, 2, (c, 1, 1), generator=g,
                                                               dtype=torch.int32))
            if b.bn:
                bn = nn.BatchNorm1d(c) if b.kind == "conv1d" else nn.BatchNorm2d(c)
                _trained(bn, g)
                self.mods[f"bn{k}"] = bn
        if spec.head is not None:
            self.mods["head"] = nn.Linear(c * spec.height * spec.width, spec.head.out)
            if spec.head.bn:
                self.mods["head_bn"] = nn.BatchNorm1d(spec.head.out)
                _trained(self.mods["head_bn"], g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        _, _, hh, ww = x.shape
        for i, b in enumerate(self.spec.blocks):
            k = str(i)
            m: Any = self.mods[k] if k in self.mods else None
            if b.kind == "conv":
                h = m(h)
            elif b.kind == "pad_conv":  # a zero pad keeping the size for a k x k conv
                p = b.kernel // 2
                h = m(F.pad(h, (p, b.kernel - 1 - p, p, b.kernel - 1 - p)))
            elif b.kind == "conv1d":  # on the flattened rows; batch norm, activations 1-D
                s = m(h.flatten(2))
                if b.bn:
                    s = self.mods[f"bn{k}"](s)
                for a in b.acts:
                    s = _act(a, s)
                if b.twice:  # the same weight again
                    s = m(torch.relu(s))
                h = s.reshape(1, s.shape[1], hh, ww)
                continue
            elif b.kind == "residual":
                h = h + m(h)
            elif b.kind == "cat":
                pieces = [h, torch.relu(h), h * 0.5, h - 1.0, torch.sigmoid(h), -h, h + 2.0]
                h = m(torch.cat(pieces[: b.n], 1))
            elif b.kind == "prelu":
                h = m(h)
            elif b.kind == "batch_norm":  # after a mul: no conv to fold it into
                h = m(h * 1.5)
            elif b.kind == "clone":
                h = h.clone() if b.n == 0 else h.clone(memory_format=torch.contiguous_format)
                h = h + 0.25
            elif b.kind == "compare":  # float32 > int32: a dtype mix
                h = h * (h > getattr(self, f"ints{k}"))
            if b.bn:
                h = self.mods[f"bn{k}"](h)
            for a in b.acts:
                h = _act(a, h)
        if self.spec.head is not None:
            h = self.mods["head"](h.flatten(1))
            if self.spec.head.bn:
                h = self.mods["head_bn"](h)
            for a in self.spec.head.acts:
                h = _act(a, h)
        return h


def inputs(spec: Spec) -> tuple[torch.Tensor]:
    return (torch.randn(spec.shape, generator=torch.Generator().manual_seed(spec.seed + 1)),)


def quantize(model: nn.Module, spec: Spec) -> Any:
    """pt2e with ExecuTorch's XNNPACKQuantizer (per-channel, symmetric), calibrated."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True))
    x = inputs(spec)
    prepared = prepare_pt2e(torch.export.export(model.eval(), x).module(), quantizer)
    g = torch.Generator().manual_seed(spec.seed + 2)
    for _ in range(3):
        prepared(torch.randn(spec.shape, generator=g))
    prepared(*x)
    return convert_pt2e(prepared)


# ----------------------------------------------------------------------------- strategy

#: activations XNNPACK fuses into the op before them (relu6 is hardtanh(0, 6))
FUSIBLE = ("relu", "relu6", "hardtanh")


@st.composite
def _activations(draw: Any) -> tuple[str, ...]:
    """None, one, or now and then two in a row (what stock FuseActivationPass gets wrong)."""
    first = draw(st.sampled_from((None, *ACTIVATIONS)))
    if first is None:
        return ()
    if draw(st.integers(0, 3)) == 3:
        return (first, draw(st.sampled_from(ACTIVATIONS)))
    return (first,)


_acts = _activations()
_channels = st.integers(2, 8)


@st.composite
def blocks(draw: Any, kind: str, quantized: bool = False) -> Block:
    if kind in ("conv", "pad_conv"):
        return Block(kind, out=draw(_channels), kernel=draw(st.sampled_from([1, 2, 3])
                                                           if kind == "pad_conv" else
                                                           st.sampled_from([1, 3])),
                     bias=draw(st.booleans()), bn=draw(st.booleans()), acts=draw(_acts))
    if kind == "conv1d":
        # (twice: out is the input's channels.) Quantized too: pt2e annotates one use of a
        # shared module only, and the adapter's partitioner keeps the float use on the CPU
        # (test_preprocess_rules_generated.test_a_quantized_conv1d_applied_twice_...)
        twice = draw(st.integers(0, 3)) == 3
        return Block(kind, out=0 if twice else draw(_channels),
                     kernel=draw(st.sampled_from([1, 3, 5])), bias=draw(st.booleans()),
                     bn=draw(st.booleans()), acts=draw(_acts), twice=twice)
    if kind == "residual":
        return Block(kind, acts=draw(_acts))
    if kind == "cat":  # XNNPACK concatenates up to 5 inputs natively: more are decomposed
        return Block(kind, n=draw(st.sampled_from([2, 3, 6, 7])), acts=draw(_acts))
    if kind == "prelu":
        return Block(kind, n=draw(st.sampled_from([0, 1])))
    if kind == "batch_norm":
        return Block(kind, acts=draw(_acts), twice=draw(st.integers(0, 2)) == 2)
    if kind == "clone":
        return Block(kind, n=draw(st.sampled_from([0, 1])))
    return Block(kind)  # compare


@st.composite
def specs(draw: Any, quantized: bool | None = None) -> Spec:
    q = draw(st.integers(0, 2)) == 2 if quantized is None else quantized
    # a few distinct pieces each (few examples must cover them all), in a random order;
    # quantized, no comparison (an int32 comparison in the middle leaves little to delegate)
    kinds = [k for k in draw(st.permutations(KINDS)) if not (q and k == "compare")]
    kinds = kinds[: draw(st.integers(3, 6))]
    head = None
    if draw(st.booleans()):
        head = Block("linear", out=draw(_channels), bn=draw(st.booleans()), acts=draw(_acts))
    return Spec(draw(_channels), draw(st.integers(4, 12)), draw(st.integers(4, 12)),
                tuple(draw(blocks(k, q)) for k in kinds), head, q, draw(st.integers(0, 999)))


#: one fixed block per piece: what :func:`completed` adds when the draws miss a piece
FIXED = {
    "conv": Block("conv", out=4, kernel=3, bn=True, acts=("relu",)),
    "conv1d": Block("conv1d", out=4, kernel=3, bn=True, acts=("relu",)),
    "residual": Block("residual", acts=("relu",)),
    "cat": Block("cat", n=6),
    "prelu": Block("prelu"),
    "batch_norm": Block("batch_norm", acts=("relu6",)),
    "clone": Block("clone"),
    "pad_conv": Block("pad_conv", out=4, kernel=2),
    "compare": Block("compare"),
}


def _float_kinds(drawn: list[Spec]) -> set[str]:
    out: set[str] = set()
    for spec in drawn:
        if not spec.quantized:
            out |= spec.kinds()
            if any(b.kind == "conv" and b.bn and b.acts for b in spec.blocks):
                out.add("conv+bn+act")
    return out


def completed(drawn: list[Spec]) -> list[Spec]:
    """``drawn``, plus one float32 model of the pieces no float32 draw has (and a conv +
    batch norm + activation and a linear head, which every backend's rules act on) and a
    quantized one if none was drawn. Hypothesis' derandomized draws are not the same in
    every environment; with this the pieces are covered whatever was drawn."""
    out = list(drawn)
    have = _float_kinds(drawn)
    missing = [k for k in KINDS if k not in have]
    if "conv+bn+act" not in have and "conv" not in missing:
        missing.insert(0, "conv")
    if missing or "linear" not in have:
        out.append(Spec(4, 6, 6, tuple(FIXED[k] for k in missing),
                        Block("linear", out=4, bn=True, acts=("relu",)), False, 7))
    if not any(s.quantized for s in drawn):
        out.append(Spec(4, 6, 6, (FIXED["conv"], FIXED["conv1d"], FIXED["cat"]), None, True, 8))
    return out
