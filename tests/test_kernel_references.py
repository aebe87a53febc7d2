"""The kernel references the Vulkan rules carry for ``fusionkit verify``
(``Rule.semantics``, an ``OpSemantics``), each against the kernel it states: the real Vulkan runtime
(lavapipe, one child process) where present, ExecuTorch's own CPU reference or C++ kernel on
the operands where those compute the same.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from test_vulkan_preprocess_rules import lower
from torch import nn

from fusionkit.backends.vulkan_adapter import decode_payload, runtime
from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates
from fusionkit.passes.vulkan import conv_clamp, sdpa_reference, select_as_symint, weight_only_linear

#: the kernel references the Vulkan rule modules hand their rules, by op
KERNEL_REFERENCES = {**conv_clamp.SEMANTICS.kernel_references,
                     **weight_only_linear.SEMANTICS.kernel_references,
                     **select_as_symint.SEMANTICS.kernel_references,
                     **sdpa_reference.SEMANTICS.kernel_references}

pytestmark = pytest.mark.usefixtures("vulkan_ops")

CONV_CLAMP = "et_vk.conv_with_clamp.default"


class ConvClamp(nn.Module):
    """A convolution and the activation FuseClampPass's rules fold into conv_with_clamp."""

    def __init__(self, act: nn.Module, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv, self.act = nn.Conv2d(3, 4, 3, padding=1), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))  # type: ignore[no-any-return]


#: the activation -> the bounds the rules give conv_with_clamp
CONV_CASES: dict[str, tuple[nn.Module, float, float]] = {
    "relu": (nn.ReLU(), 0.0, sys.float_info.max),
    "hardtanh": (nn.Hardtanh(-0.25, 0.5), -0.25, 0.5),
}


def _conv_reference(m: ConvClamp, x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    c = m.conv
    return KERNEL_REFERENCES[CONV_CLAMP](x, c.weight.detach(), c.bias.detach(), [1, 1], [1, 1],
                                        [1, 1], False, [0, 0], 1, lo, hi)


def test_the_conv_with_clamp_reference_is_stocks_where_stocks_runs() -> None:
    """With bounds float32 holds, the reference is ExecuTorch's CPU one; with the relu's
    ``sys.float_info.max`` that one raises, and the reference clamps at +inf (no upper bound)."""
    m, x = ConvClamp(nn.Identity(), 0), torch.randn(1, 3, 5, 5)
    c = m.conv
    args = (x, c.weight.detach(), c.bias.detach(), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    ours = KERNEL_REFERENCES[CONV_CLAMP]
    stock = torch.ops.et_vk.conv_with_clamp.default
    torch.testing.assert_close(ours(*args, -0.25, 0.5), stock(*args, -0.25, 0.5))
    torch.testing.assert_close(ours(*args, 0.0, sys.float_info.max), stock(*args, 0.0, None))
    with pytest.raises(RuntimeError, match="overflow"):
        stock(*args, 0.0, sys.float_info.max)
    assert bool((ours(*args, -0.25, 0.5) < 0).any())  # the lower bound was reached


def test_the_conv_with_clamp_reference_is_what_the_runtime_computes(vulkan_runtime: Any) -> None:
    """Conv2d + relu / hardtanh lowered through the adapter (the rules fuse them into
    conv_with_clamp in preprocess): the real runtime's outputs equal the reference's."""
    lowered = []
    for i, (name, (act, lo, hi)) in enumerate(CONV_CASES.items()):
        m, x = ConvClamp(act, 10 + i).eval(), torch.randn(1, 3, 6, 6)
        low = lower(m, (x,), True)
        ops = {o for d in vulkan_delegates(low.program)
               for o in decode_payload(d.payload).graph.op_names()}
        assert CONV_CLAMP in ops, (name, sorted(ops))
        lowered.append((name, m, x, lo, hi, low))
    results = runtime.run_many_in_child([runtime.Job(low.pte, [x])
                                         for _, _, x, _, _, low in lowered])
    for (name, m, x, lo, hi, _), res in zip(lowered, results, strict=True):
        assert res.status == "ok" and res.outputs, (name, res.status, res.message)
        want = _conv_reference(m, x, lo, hi)
        assert bool((want == lo).any()) and bool((want > lo).any()), name  # it clamps
        torch.testing.assert_close(res.outputs[0], want, atol=1e-4, rtol=1e-4,
                                   msg=lambda s, name=name: f"{name}: {s}")


QCS4W = "et_vk.linear_qcs4w.default"


@pytest.mark.parametrize("shape", [(3, 10), (2, 3, 10)])
def test_the_linear_qcs4w_reference_undoes_the_packers_offset(shape: tuple[int, ...]) -> None:
    """On the bytes ExecuTorch's own packer writes, the reference is the dequantized linear,
    and ExecuTorch's CPU reference is off by exactly ``sum(x) * 8 * s``. The simulator runs
    the same function, and ``test_vulkan_simulator_qcs4w`` holds the simulator to the real
    runtime on lowered int4 programs."""
    from executorch.backends.vulkan._passes.fuse_quantized_ops import pack_4bit_weight_tensor

    g = torch.Generator().manual_seed(7)
    n, k = 6, shape[-1]
    w = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, generator=g) * 0.1 + 0.01
    x = torch.randn(*shape, generator=g)
    packed = pack_4bit_weight_tensor(w)
    want = x.double() @ (w.double() * s.double()[:, None]).t()
    got = KERNEL_REFERENCES[QCS4W](x, packed, s)
    assert got.dtype == x.dtype and got.shape == (*shape[:-1], n)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    stock = torch.ops.et_vk.linear_qcs4w(x, packed, s).double()
    torch.testing.assert_close(stock - want, x.double().sum(-1, keepdim=True) * 8 * s.double(),
                               atol=1e-4, rtol=1e-4)


SELECT = "et_vk.select_as_symint.default"


@pytest.mark.parametrize(("shape", "dim", "index", "dtype"),
                         [((5,), 0, 3, torch.int64), ((1, 4), 1, -1, torch.int32),
                          ((3, 1), 0, 2, torch.int64)])
def test_the_select_as_symint_reference_is_the_int_the_graph_read(
        shape: tuple[int, ...], dim: int, index: int, dtype: torch.dtype) -> None:
    """The int the runtime's ``select_as_symint_impl`` reads is the one eager
    ``_local_scalar_dense(select_copy(x, dim, index))`` gives (the op's only torch kernel is
    a Meta one; ExecuTorch 1.5.1's partitioner has no registry entry for it, so no program
    of that version delegates it to the real runtime)."""
    x = torch.randint(-50, 50, shape, dtype=dtype, generator=torch.Generator().manual_seed(3))
    want = torch.ops.aten._local_scalar_dense(torch.ops.aten.select_copy.int(x, dim, index))
    got = KERNEL_REFERENCES[SELECT](x, dim, index)
    assert type(got) is int and got == want


def test_verify_compares_the_int_select_as_symint_gives(monkeypatch: Any) -> None:
    """The rule is judged on the int: a kernel off by one is different."""
    import dataclasses

    from fusionkit.authoring.verify import DIFFERENT, EQUAL, verify
    from fusionkit.passes.vulkan.select_as_symint import select_as_symint_rule
    from fusionkit.rule import OpSemantics

    rule = select_as_symint_rule()
    assert verify(rule, cases=2, max_examples=40).status == EQUAL
    off_by_one = OpSemantics(kernel_references={
        SELECT: lambda x, dim, index: int(x.select(dim, index).item()) + 1})
    assert verify(dataclasses.replace(rule, semantics=off_by_one), cases=2, max_examples=40).status == DIFFERENT


UPDATE, SDPA, SDPA_KV = ("llama.update_cache.default", "llama.custom_sdpa.default",
                         "llama.sdpa_with_kv_cache.default")

#: (B, S, H, H_kv, D, max_S): one token, a prefill, grouped-query heads, a batch of two
KV_SHAPES = [(1, 1, 4, 4, 8, 8), (1, 3, 4, 2, 8, 8), (2, 4, 6, 2, 4, 10), (1, 5, 8, 1, 16, 12)]


def _llama_ops() -> None:
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    import fusionkit.passes.vulkan.sdpa  # noqa: F401  (registers the references)


def _kv_operands(b: int, s: int, h: int, h_kv: int, d: int, max_s: int, dtype: torch.dtype,
                 seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v and caches that already hold values (a later step's caches)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g).to(dtype)
                 for shape in ((b, s, h, d), (b, s, h_kv, d), (b, s, h_kv, d),
                               (b, max_s, h_kv, d), (b, max_s, h_kv, d)))


def _positions(s: int, max_s: int) -> list[int]:
    return sorted({0, 1, (max_s - s) // 2, max_s - s} & set(range(max_s - s + 1)))


@pytest.mark.parametrize("shape", KV_SHAPES)
def test_the_update_cache_reference_writes_what_the_kernel_writes(shape: tuple[int, ...]) -> None:
    """``llama.update_cache`` (``op_update_cache.cpp``): the same cache after the write, at
    every start position; the result is one element (the kernel never writes it)."""
    _llama_ops()
    s, max_s = shape[1], shape[5]
    for pos in _positions(s, max_s):
        _, _, v, cache, _ = _kv_operands(*shape, torch.float32, seed=pos)
        ours, theirs = cache.clone(), cache.clone()
        got = KERNEL_REFERENCES[UPDATE](v, ours, pos)
        want = torch.ops.llama.update_cache(v, theirs, pos)
        assert torch.equal(ours, theirs), (shape, pos)
        assert got.shape == want.shape == (1,) and got.dtype == want.dtype
        assert torch.equal(ours[:, pos:pos + s], v) and torch.equal(ours[:, :pos], cache[:, :pos])


@pytest.mark.parametrize("shape", KV_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_sdpa_references_compute_what_the_kernels_compute(shape: tuple[int, ...],
                                                               dtype: torch.dtype) -> None:
    """``llama.custom_sdpa`` and ``llama.sdpa_with_kv_cache`` (``op_sdpa.cpp``): causal or
    not, the default scale and another, at every start position, on caches that hold values
    beyond the window (which neither may read): the same result and the same caches."""
    _llama_ops()
    s, max_s = shape[1], shape[5]
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for pos in _positions(s, max_s):
        for causal in (True, False):
            for scale in (None, 0.3):
                q, k, v, kc, vc = _kv_operands(*shape, dtype, seed=pos + 10 * causal)
                ours, theirs = (kc.clone(), vc.clone()), (kc.clone(), vc.clone())
                got = KERNEL_REFERENCES[SDPA_KV](q, k, v, *ours, pos, 1, None, 0.0, causal, scale)
                want = torch.ops.llama.sdpa_with_kv_cache(q, k, v, *theirs, pos, 1, None, 0.0,
                                                          causal, scale)
                at = (shape, pos, causal, scale)
                torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m, at=at: f"{at}: {m}")
                assert all(torch.equal(a, c) for a, c in zip(ours, theirs, strict=True)), at
                got = KERNEL_REFERENCES[SDPA](q, *ours, pos, None, 0.0, causal, scale)
                want = torch.ops.llama.custom_sdpa(q, *theirs, pos, None, 0.0, causal, scale)
                torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m, at=at: f"{at}: {m}")


def test_the_custom_sdpa_reference_adds_a_mask_over_the_whole_cache() -> None:
    """With a 2-D mask the kernel reads every cache position and adds the mask; a dropout
    probability changes nothing (the kernel applies none)."""
    _llama_ops()
    q, _, _, kc, vc = _kv_operands(1, 3, 4, 2, 8, 8, torch.float32, seed=5)
    mask = torch.randn(3, 8, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(KERNEL_REFERENCES[SDPA](q, kc, vc, 2, mask, 0.0, False, None),
                               torch.ops.llama.custom_sdpa(q, kc, vc, 2, mask, 0.0, False, None),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(KERNEL_REFERENCES[SDPA](q, kc, vc, 2, None, 0.5, True, None),
                               torch.ops.llama.custom_sdpa(q, kc, vc, 2, None, 0.5, True, None),
                               atol=1e-5, rtol=1e-5)


def test_the_sdpa_with_kv_cache_reference_is_what_the_runtime_computes(vulkan_runtime: Any) -> None:
    """The KV-cache attention lowered through the adapter (causal_sdpa fuses it into the
    runtime's ``sdpa_with_kv_cache``), 4 query heads over 2 kv heads, at positions 0 and 3,
    each run in a fresh child (zero caches): the real runtime's output is the reference's on
    zero caches."""
    _llama_ops()
    from kv_cache_models import KVAttention
    from test_vulkan_real_runtime_state import _lower, _payload_ops

    g = torch.Generator().manual_seed(11)
    runs = [(torch.randn(1, 4, 4, 8, generator=g), torch.randn(1, 4, 2, 8, generator=g),
             torch.randn(1, 4, 2, 8, generator=g), torch.tensor([pos])) for pos in (0, 3)]
    pte = _lower(KVAttention(), runs[1])
    assert "sdpa_with_kv_cache.default" in _payload_ops(pte), _payload_ops(pte)
    results = runtime.run_many_in_child([runtime.Job(pte, list(r)) for r in runs])
    for (q, k, v, pos), res in zip(runs, results, strict=True):
        assert res.ok and res.outputs, (int(pos), res.status, res.message)
        caches = torch.zeros(1, 16, 2, 8), torch.zeros(1, 16, 2, 8)
        want = KERNEL_REFERENCES[SDPA_KV](q, k, v, *caches, int(pos), 1, None, 0.0, True, None)
        torch.testing.assert_close(res.outputs[0], want, atol=1e-4, rtol=1e-4,
                                   msg=lambda m, pos=pos: f"start_pos {int(pos)}: {m}")
