"""The models of the held-out programs: runtime facts the fidelity table's first run did not
have, each studied by one test file, all lowered both ways by
``vulkan_real_programs.held_out_programs()`` for the table.

Each model and its inputs are made here once; the test files take them from here
(``test_vulkan_real_runtime_scalar_types``: OpMix, a clamp before a conv, a clamp before an
``avg_pool2d``; ``_grouped_conv``: the grouped conv; ``_dim_order``: the conv of a
channels_last input; ``_w8``: the int8 weight-only linear; ``_norm_rank``: the
2-D batch norm, 3-D group norms and weight-normed conv), so no module imports another
test file's helpers. Which cases a test runs and what it expects of them stay in the test.
Only the w8 linear needs torchao (imported when it is made).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CL",
    "NORM_RANK",
    "ClampConv",
    "ClampPool",
    "Conv",
    "ConvGroupNorm",
    "GroupedConv",
    "K",
    "LinearBatchNorm",
    "N",
    "OpMix",
    "WeightNormConv",
    "clamp_conv",
    "clamp_pool",
    "dim_order_case",
    "grouped_conv",
    "norm_rank_case",
    "norm_statistics",
    "opmix",
    "same",
    "w8_linear",
]

# ------------------------------------------------------- scalar types (issue 24's OpMix)


class OpMix(nn.Module):
    """The other ops the repository's Vulkan tests lower: conv2d, cross-attention
    (nn.MultiheadAttention), clamp with an infinite bound, ``masked_fill(-inf)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor, img: torch.Tensor, kv: torch.Tensor) -> Any:
        y = torch.clamp(x, min=float("-inf"), max=0.5) + torch.softmax(
            x.masked_fill(x > 1.0, float("-inf")), -1)
        a = self.mha(x.unsqueeze(0), kv, kv, need_weights=False)[0]
        return y, F.relu(self.conv(img)), a


class ClampConv(nn.Module):
    """A clamp to [-1.0, 1.0] before a conv of groups=1 (+ relu: conv_with_clamp)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(torch.clamp(x, -1.0, 1.0)))


class ClampPool(nn.Module):
    """A clamp to 3.0 before an avg_pool2d whose divisor_override is 3."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(torch.clamp(x, max=3.0), (2, 2), (2, 2), divisor_override=3)


def clamp_conv() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(1)
    return ClampConv().eval(), (torch.randn(1, 3, 6, 5) * 2,)


def clamp_pool() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(2)
    return ClampPool().eval(), (torch.randn(1, 4, 6, 8) * 3,)


def opmix() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(3)
    return OpMix().eval(), (torch.randn(2, 8), torch.randn(1, 4, 6, 6), torch.randn(1, 5, 8))


# ------------------------------------------------------------------------ grouped conv


class GroupedConv(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int, kernel: int = 3, dim: int = 2,
                 stride: int = 1) -> None:
        super().__init__()
        conv = nn.Conv2d if dim == 2 else nn.Conv1d
        self.conv = conv(cin, cout, kernel, stride=stride, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x * 0.5)) + 1.0


def grouped_conv(cin: int, cout: int, groups: int, kernel: int = 3, dim: int = 2,
                 stride: int = 1, dtype: torch.dtype = torch.float32
                 ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A :class:`GroupedConv` (seeded by its channels and groups) and its input."""
    torch.manual_seed(cin * 100 + cout * 10 + groups)
    m = GroupedConv(cin, cout, groups, kernel, dim, stride)
    shape = (1, cin, 7, 6) if dim == 2 else (1, cin, 9)
    return m.eval().to(dtype), (torch.randn(shape).to(dtype),)


# -------------------------------------------------------------------------- dim order

CL = torch.channels_last


class Conv(torch.nn.Module):
    def __init__(self, weight_cl: bool, after: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(3, 4, 3, padding=1)
        if weight_cl:
            self.c.weight.data = self.c.weight.data.contiguous(memory_format=CL)
        self.after = after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.c(x))


def same(y: torch.Tensor) -> torch.Tensor:
    return y


def dim_order_case(make: Callable[[], torch.nn.Module], cl_input: bool,
                   dtype: torch.dtype = torch.float32
                   ) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """``make()`` in ``dtype``, its (1, 3, 5, 6) input (channels_last if ``cl_input``) and
    its eager output. Not seeded: the weights are the global generator's."""
    model = make().to(dtype).eval()
    x = torch.randn(1, 3, 5, 6, dtype=dtype)
    if cl_input:
        x = x.contiguous(memory_format=CL)
    with torch.no_grad():
        eager = model(x)
    return model, x, eager


# ------------------------------------------------------------ int8 weight-only linear

K, N = 64, 16


def w8_linear(bias: bool, shift: float = 0.0, **config: Any) -> nn.Module:
    """Linear(K, K) -> ReLU -> Linear(K, N), weights shifted by ``shift``, quantized by
    torchao's ``IntxWeightOnlyConfig(weight_dtype=torch.int8, **config)``."""
    from torchao.quantization import IntxWeightOnlyConfig, quantize_

    torch.manual_seed(8 + bias)
    m = nn.Sequential(nn.Linear(K, K, bias=bias), nn.ReLU(), nn.Linear(K, N, bias=bias)).eval()
    with torch.no_grad():
        for linear in (m[0], m[2]):
            assert isinstance(linear, nn.Linear)
            linear.weight.add_(shift)  # off-centre weights: asymmetric zero points far from 0
    quantize_(m, IntxWeightOnlyConfig(weight_dtype=torch.int8, **config))
    return m


# ---------------------------------------------- norm rank (LeViT's and wav2vec2's norms)


class LinearBatchNorm(nn.Module):
    """LeViT's MLPLayerWithBN: Linear, BatchNorm1d over (tokens, channels), hardswish."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 24, bias=False)
        self.bn = nn.BatchNorm1d(24)
        self.out = nn.Linear(24, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        h = self.bn(h.flatten(0, 1)).reshape_as(h)
        return self.out(nn.functional.hardswish(h))


class ConvGroupNorm(nn.Module):
    """wav2vec2's first feature-encoder layer: conv1d, GroupNorm(C, C) over (N, C, L)."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 16, 10, 5, bias=False)
        self.norm = nn.GroupNorm(groups, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.norm(self.conv(x)))


class WeightNormConv(nn.Module):
    """wav2vec2's positional conv: a grouped conv1d under ``weight_norm`` (dim 2)."""

    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv1d(16, 16, 8, padding=4, groups=4)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.conv(x)[:, :, :-1])


def norm_statistics(m: nn.Module) -> nn.Module:
    """``m`` in eval mode, its norms given seeded running statistics and affine parameters
    (not the identity defaults)."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm1d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
            if isinstance(mod, (nn.BatchNorm1d, nn.GroupNorm)):
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
    return m.eval()


#: name -> (model maker, input shape)
NORM_RANK: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "linear_bn1d": (LinearBatchNorm, (1, 6, 16)),
    "groupnorm_3d_16": (lambda: ConvGroupNorm(16), (1, 1, 400)),
    "groupnorm_3d_4": (lambda: ConvGroupNorm(4), (1, 1, 400)),
    "weight_norm_conv": (WeightNormConv, (1, 16, 39)),
}


def norm_rank_case(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The :data:`NORM_RANK` model ``name`` (seed 0, :func:`norm_statistics`) and its input
    (seed 1)."""
    make, shape = NORM_RANK[name]
    torch.manual_seed(0)
    m = norm_statistics(make())
    return m, (torch.randn(*shape, generator=torch.Generator().manual_seed(1)),)
