"""Two programs run one after the other in one process of the real Vulkan runtime.

The runtime's fused KV-cache op (``sdpa_with_kv_cache.default``, which the causal_sdpa
fusion makes in preprocess) makes its k/v caches with ``graph.add_tensor_like`` from the
cache constants (``SDPA.cpp``, ``sdpa_with_kv_cache_impl``): their sizes, never their
bytes. The caches start as whatever device memory the allocator hands out: zeros in a
process that has freed no graph, a freed graph's data after one. A program that reads
cache positions it has not written (here: the first call at position 3 reads rows 0..2,
zeros in eager) is right alone and wrong after another program in the same process.
``RuntimeSession`` and ``run_many_in_child`` run such a program in a child that has run
nothing else (``runtime.uninitialized_state``); ``isolate=False`` shows the runtime's
own behaviour, pinned here so that a runtime that initialises its caches is noticed.
A cache buffer that starts non-zero would be lost by the fused op even in a fresh
process: the causal_sdpa fusion declines it, and the unfused ops, which prepack the
buffers, run equal to eager whatever ran before them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")

from kv_cache_models import KVAttention

from fusionkit.backends.vulkan_adapter import runtime as rt


def _inputs(pos: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (*(torch.randn(1, 4, 2, 8, generator=g) for _ in range(3)), torch.tensor([pos]))


#: A writes cache rows 0..3 (and reads only those); B, a fresh load of the same program,
#: writes rows 3..6 and reads rows 0..6: rows 0..2 are the initial zeros in eager
A, B = _inputs(0, 1), _inputs(3, 2)


def _filled() -> KVAttention:
    """Caches that start non-zero (a model's own initial state)."""
    m = KVAttention()
    m.get_buffer("kc").fill_(0.5)
    m.get_buffer("vc").fill_(1.0)
    return m


def _eager(inputs: tuple[torch.Tensor, ...], caches_from: tuple[torch.Tensor, ...] | None = None,
           m: KVAttention | None = None) -> torch.Tensor:
    """A freshly loaded model's output (zero caches), or one whose caches hold what a run
    on ``caches_from`` wrote."""
    m = KVAttention() if m is None else m
    with torch.no_grad():
        if caches_from is not None:
            m(*caches_from)
        return m(*inputs)


def _lower(m: KVAttention, inputs: tuple[torch.Tensor, ...] = B) -> bytes:
    """``m`` lowered by the adapter's drop-in for inputs like ``inputs`` (the position is an
    input: A and B run the same program)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama.* ops)
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

    part = VulkanPartitioner()
    prog = to_edge_transform_and_lower(torch.export.export(m, inputs),
                                       transform_passes=transform_passes(partitioner=part),
                                       partitioner=[part])
    return bytes(prog.to_executorch().buffer)


@pytest.fixture(scope="module")
def kv_pte() -> bytes:
    """Zero caches: one Vulkan delegate with the fused op."""
    return _lower(KVAttention())


def _payload_ops(pte: bytes) -> list[str]:
    from fusionkit.backends.vulkan_adapter.inspect.payload import decode_payload
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates

    return [c.name for d in vulkan_delegates(pte) for c in decode_payload(d.payload).graph.chain]


def test_the_fused_kv_cache_op_is_found_in_the_program(kv_pte: bytes) -> None:
    assert rt.uninitialized_state(kv_pte) == ["sdpa_with_kv_cache.default"]
    assert rt.uninitialized_state(b"not a program") == []


def test_caches_that_start_non_zero_are_not_fused() -> None:
    from torch.export._remove_auto_functionalized_pass import (
        unsafe_remove_auto_functionalized_pass,
    )
    from vulkan_pattern_helpers import edge

    from fusionkit.backends.vulkan_adapter.delegation import preprocess_fusions

    for m, fused in ((KVAttention(), True), (_filled(), False)):
        ms = preprocess_fusions(unsafe_remove_auto_functionalized_pass(edge(m, B)), None)
        assert ("causal_sdpa" in [x.rule.name for x in ms.accepted]) is fused
    (d,) = [d for d in ms.declined if d.rule == "causal_sdpa"]
    assert "k_cache `" in d.reason and "starts non-zero (256 of 256 values)" in d.reason, d.reason
    assert "add_tensor_like" in d.reason


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.allclose(got, want, atol=1e-4, rtol=1e-4))


def test_a_kv_cache_program_after_another_program_equals_eager(
        vulkan_runtime: Any, kv_pte: bytes) -> None:
    want_a, want_b = _eager(A), _eager(B)
    assert not _close(want_b, _eager(B, caches_from=A))  # B's rows 0..2 matter
    with rt.RuntimeSession() as session:
        a = session.run(kv_pte, list(A))
        b = session.run(kv_pte, list(B))
        children = session.children
    assert a.ok and b.ok, (a.message, b.message)
    torch.testing.assert_close(a.outputs[0], want_a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b.outputs[0], want_b, atol=1e-4, rtol=1e-4)
    assert children == 2  # B ran in a child of its own

    a, b = rt.run_many_in_child([rt.Job(kv_pte, A), rt.Job(kv_pte, B)])
    assert a.ok and b.ok, (a.message, b.message)
    torch.testing.assert_close(b.outputs[0], want_b, atol=1e-4, rtol=1e-4)


def test_the_runtime_starts_the_caches_with_a_freed_programs_data(
        vulkan_runtime: Any, kv_pte: bytes) -> None:
    """What the isolation is for: in one child, B's caches start with what A wrote into
    its own caches (A's module is freed after its run, B's allocations reuse its memory)."""
    with rt.RuntimeSession(isolate=False) as session:
        a = session.run(kv_pte, list(A))
        b = session.run(kv_pte, list(B))
        assert session.children == 1
    assert a.ok and b.ok, (a.message, b.message)
    got = b.outputs[0]
    assert not _close(got, _eager(B)), "the runtime initialised its caches: drop the isolation"
    torch.testing.assert_close(got, _eager(B, caches_from=A), atol=1e-4, rtol=1e-4)


def test_unfused_caches_that_start_non_zero_equal_eager_after_another_program(
        vulkan_runtime: Any, kv_pte: bytes) -> None:
    """The unfused ops prepack the buffers (``et_vk.prepack``): right even in a child
    whose previous program left its caches' data in the memory they get."""
    pte = _lower(_filled())
    ops = _payload_ops(pte)
    assert ops.count("update_cache.default") == 2 and "llama.custom_sdpa.default" in ops, ops
    assert rt.uninitialized_state(pte) == []
    a, b = rt.run_many_in_child([rt.Job(kv_pte, A), rt.Job(pte, B)])  # one child
    assert a.ok and b.ok, (a.message, b.message)
    want = _eager(B, m=_filled())
    assert not _close(want, _eager(B))  # the initial values matter
    torch.testing.assert_close(b.outputs[0], want, atol=1e-4, rtol=1e-4)


def test_the_simulator_says_a_first_call_that_reads_unwritten_rows_is_garbage() -> None:
    """B right in a fresh child is the allocator's zeros, not a promise: the simulator
    (which keeps a loaded program's caches between calls) names the condition for a first
    call at position 3, and runs A, which reads only what it writes, equal to eager."""
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes
    from fusionkit.backends.vulkan_adapter.inspect import simulator as S

    part = VulkanPartitioner()
    et = to_edge_transform_and_lower(torch.export.export(KVAttention(), B),
                                     transform_passes=transform_passes(partitioner=part),
                                     partitioner=[part]).to_executorch()
    assert rt.uninitialized_state(bytes(et.buffer)) == ["sdpa_with_kv_cache.default"]
    with pytest.raises(S.RuntimeConditionError) as e:
        S.simulate(et, *B)
    assert e.value.condition.name == "cache_rows_written", e.value
    S.unload(et)
    torch.testing.assert_close(S.simulate(et, *A), _eager(A), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(S.simulate(et, *B), _eager(B, caches_from=A), atol=1e-4, rtol=1e-4)
