"""The preprocess rules (stock passes taken over) blame a declined match on the operand at fault.

Their checks take the captures they read as parameters and say ``ctx.fail(reason, at=...)``
when the culprit is not their first parameter, so a decline names the node to look at:
the batch norm's non-constant operand (whichever it is), a hardtanh's bad bounds (the
hardtanh, which holds them, not the op before it), the op whose own clamp range leaves
nothing, the concatenated input quantized unlike the first, the pad that is no zero pad.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from models import export_edge, nodes_of
from torch import nn

from fusionkit import find_matches
from fusionkit.passes.vulkan.batch_norm import batch_norm_rules
from fusionkit.passes.xnnpack.decompose_cat import decompose_cat_rule
from fusionkit.passes.xnnpack.fuse_activation import fuse_activation_rules
from fusionkit.passes.xnnpack.insert_pad_qdq import insert_pad_qdq_rule

# ------------------------------------------------------------------- batch norm

#: the operands a conv -> batch norm fold reads, each of which must be a constant
BN_OPERANDS = ("w", "b", "bn_w", "bn_b", "mean", "var")


class ConvBatchNorm(nn.Module):
    """conv2d -> inference batch norm; the operands named in ``from_user`` are user inputs."""

    def __init__(self, from_user: tuple[str, ...], linear: bool = False) -> None:
        super().__init__()
        self.from_user, self.linear = from_user, linear
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(4, 6, generator=gen) if linear else torch.randn(4, 3, 3, 3, generator=gen)
        values = {"w": w, "b": torch.randn(4, generator=gen),
                  "bn_w": torch.rand(4, generator=gen) + 0.5,
                  "bn_b": torch.randn(4, generator=gen), "mean": torch.randn(4, generator=gen),
                  "var": torch.rand(4, generator=gen) + 0.5}
        for n, v in values.items():
            if n not in from_user:
                self.register_buffer(n, v)
        self.values = values

    def example(self) -> tuple[torch.Tensor, ...]:
        x = torch.randn(2, 6) if self.linear else torch.randn(1, 3, 8, 8)
        return (x, *(self.values[n] for n in self.from_user))

    def forward(self, x: torch.Tensor, *given: torch.Tensor) -> torch.Tensor:
        t = dict(zip(self.from_user, given, strict=True))
        get = {n: t[n] if n in t else getattr(self, n) for n in BN_OPERANDS}
        y = (F.linear(x, get["w"], get["b"]) if self.linear
             else F.conv2d(x, get["w"], get["b"], padding=1))
        return F.batch_norm(y, get["mean"], get["var"], get["bn_w"], get["bn_b"], training=False)


def _find(ep: Any, rules: list[Any]) -> Any:
    """The rules' matches as the preprocess takeover finds them (inside a delegated partition:
    no folding, replacements not judged for the CPU runtime)."""
    return find_matches(ep, rules, structural_declines=False, allow_folding=False,
                        check_replacements=False)


def _declines(ep: Any, rules: list[Any]) -> list[Any]:
    return _find(ep, rules).declined


def _bn_program(m: ConvBatchNorm) -> Any:
    """The edge program of ``m``, its linear (which ``to_edge`` decomposes into
    ``addmm(b, x, permute(w))``) made a linear again, as Vulkan preprocess does first."""
    from fusionkit.apply.rewrite import apply_matches
    from fusionkit.passes.vulkan.addmm_to_linear import addmm_to_linear_rules

    ep = export_edge(m, m.example())
    if m.linear:
        assert len(apply_matches(ep, _find(ep, addmm_to_linear_rules()).accepted).applied) == 1
    return ep


@pytest.mark.parametrize("linear", [False, True], ids=["conv", "linear"])
@pytest.mark.parametrize("bad", BN_OPERANDS)
def test_a_batch_norm_fold_is_blamed_on_its_non_constant_operand(bad: str, linear: bool) -> None:
    ep = _bn_program(ConvBatchNorm((bad,), linear=linear).eval())
    ms = _find(ep, batch_norm_rules())
    assert not ms.accepted
    (d,) = ms.declined
    assert d.rule == ("linear_batch_norm" if linear else "conv_batch_norm")
    # the user input standing for `bad` (the one user input besides x)
    (given,) = (n for n in ep.graph_module.graph.nodes if n.op == "placeholder"
                and n.name in ep.graph_signature.user_inputs and n.name != "x")
    assert d.node is given, (d.step, d.reason)
    assert "not a constant" in d.reason, d.reason
    # with every operand a constant, the same model folds
    ok = _bn_program(ConvBatchNorm((), linear=linear).eval())
    assert [m.rule.name for m in _find(ok, batch_norm_rules()).accepted] == [d.rule]


def test_a_batch_norm_whose_statistics_are_read_is_blamed_on_the_batch_norm() -> None:
    ep = _bn_program(ConvBatchNorm(()).eval())
    (bn,) = nodes_of(ep, "aten._native_batch_norm_legit_no_training.default")
    with ep.graph_module.graph.inserting_after(bn):  # a reader of the saved mean
        stats = ep.graph_module.graph.call_function(operator.getitem, (bn, 1))
    (d,) = _declines(ep, batch_norm_rules())
    assert d.step == "custom:batch_norm_output_only"
    assert d.node is bn and f"`{stats.name}` reads more" in d.reason


# ----------------------------------------------------------------- fuse activation


class ConvHardtanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(self.conv(x), -0.5, 0.5)


def _conv_hardtanh() -> tuple[Any, Any, Any]:
    ep = export_edge(ConvHardtanh().eval(), (torch.randn(1, 3, 6, 6),))
    (conv,) = nodes_of(ep, "aten.convolution.default")
    (act,) = nodes_of(ep, "aten.hardtanh.default")
    return ep, conv, act


def test_hardtanh_bounds_that_are_no_range_are_blamed_on_the_hardtanh() -> None:
    ep, conv, act = _conv_hardtanh()
    act.args = (conv, 0.5, -0.5)  # min_val > max_val
    (d,) = _declines(ep, fuse_activation_rules())
    assert d.rule == "xnnpack_fuse_hardtanh" and d.step == "custom:fusable_range"
    assert "min_val 0.5 > max_val -0.5" in d.reason
    assert d.node is act  # the bounds are the hardtanh's arguments, not the conv's fault


def test_an_op_already_clamped_elsewhere_is_blamed_on_that_op() -> None:
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import OutputMinMax

    from fusionkit.passes.xnnpack._common import FUSED_ACTIVATION_TAG

    ep, conv, _ = _conv_hardtanh()
    conv.meta[FUSED_ACTIVATION_TAG] = OutputMinMax(1.0, 2.0)  # disjoint from [-0.5, 0.5]
    (d,) = _declines(ep, fuse_activation_rules())
    assert d.node is conv and "already clamps to [1.0, 2.0]" in d.reason
    conv.meta[FUSED_ACTIVATION_TAG] = OutputMinMax(0.0, 2.0)  # overlapping: fused to [0, 0.5]
    (m,) = _find(ep, fuse_activation_rules()).accepted
    assert m.rule.name == "xnnpack_fuse_hardtanh"


# ----------------------------------------------------------- quantized cat and pad


def _dq(q: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.ops.quantized_decomposed.dequantize_per_tensor(q, scale, 0, -128, 127,
                                                                 torch.int8)


class QuantizedCat(nn.Module):
    """Six dequantized inputs, concatenated and re-quantized; input ``odd`` has its own scale."""

    def __init__(self, odd: int | None) -> None:
        super().__init__()
        self.odd = odd

    def forward(self, *qs: torch.Tensor) -> torch.Tensor:
        ts = [_dq(q, 0.2 if i == self.odd else 0.1) for i, q in enumerate(qs)]
        return torch.ops.quantized_decomposed.quantize_per_tensor(
            torch.cat(ts, 1), 0.1, 0, -128, 127, torch.int8)


@pytest.mark.parametrize("odd", [3, 5])
def test_a_cat_input_quantized_unlike_the_first_is_blamed_on_that_input(odd: int) -> None:
    import torch.ao.quantization.fx._decomposed  # registers the ops

    qs = tuple(torch.randint(-128, 128, (1, 2), dtype=torch.int8) for _ in range(6))
    ep = export_edge(QuantizedCat(odd), qs)
    dqs = nodes_of(ep, "quantized_decomposed.dequantize_per_tensor.default")
    (d,) = _declines(ep, [decompose_cat_rule()])
    assert d.step == "custom:shared_quantization"
    assert d.node is dqs[odd] and f"input `{dqs[odd].name}`" in d.reason
    assert _find(export_edge(QuantizedCat(None), qs), [decompose_cat_rule()]).accepted


class QuantizedPad(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.pad(_dq(q, 0.1), (1, 1), value=self.value)


def test_a_pad_that_is_no_zero_pad_is_blamed_on_the_pad() -> None:
    import torch.ao.quantization.fx._decomposed

    q = (torch.randint(-128, 128, (1, 2, 4), dtype=torch.int8),)
    ep = export_edge(QuantizedPad(1.0), q)
    (pad,) = nodes_of(ep, "aten.constant_pad_nd.default")
    (d,) = _declines(ep, [insert_pad_qdq_rule()])
    assert d.node is pad and "pad value 1.0 is not 0" in d.reason
    assert _find(export_edge(QuantizedPad(0.0), q), [insert_pad_qdq_rule()]).accepted
