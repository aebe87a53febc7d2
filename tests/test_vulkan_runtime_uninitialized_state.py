"""The ops whose runtime state starts uninitialised are known in one place.

``runtime_conditions`` marks a condition ``uninitialized_state`` (the fused KV-cache ops'
``cache_rows_written``: ``SDPA.cpp`` makes their caches with ``add_tensor_like``, sizes
and never values); the real runtime's runners isolate a program with one of those ops
(``runtime.UNINITIALIZED_STATE_OPS``, derived from the table) and find them with
``runtime.uninitialized_state``, which searches the program's bytes for the op names and
decodes the payloads only when one is there. No runtime needed.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.backends.vulkan.custom_ops_lib")
pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")

from kv_cache_models import KVAttention

from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect import runtime_conditions as RC


def test_the_runners_set_is_the_ops_with_a_state_condition() -> None:
    state = [c for c in RC.CONDITIONS if c.uninitialized_state]
    assert rt.UNINITIALIZED_STATE_OPS == {RC.serialized_name(c.op) for c in state}
    assert rt.UNINITIALIZED_STATE_OPS is RC.UNINITIALIZED_STATE_OPS
    # SDPA.cpp at cff6f4dd: both impls make the caches with add_tensor_like
    assert rt.UNINITIALIZED_STATE_OPS == {"sdpa_with_kv_cache.default",
                                          "testing.compute_attn_weight_with_kv_cache.default"}
    assert {(c.op, c.name) for c in state} == {
        (RC.SDPA_WITH_KV_CACHE, "cache_rows_written"),
        (RC.COMPUTE_ATTN_WEIGHT_WITH_KV_CACHE, "cache_rows_written")}
    # the payload name of the llama op is the bare one (node.target.__name__); others keep theirs
    assert RC.serialized_name("llama.custom_sdpa.default") == "custom_sdpa.default"
    assert RC.serialized_name("et_vk.linear_q4gsw.default") == "et_vk.linear_q4gsw.default"
    assert RC.conditions_for("sdpa_with_kv_cache.default") == RC.conditions_for(
        RC.SDPA_WITH_KV_CACHE)


def test_the_op_the_simulator_cannot_run_is_only_in_the_table() -> None:
    from fusionkit.backends.vulkan_adapter.inspect import simulator as S

    S._load_op_libraries()
    assert RC.NOT_SIMULATED == {RC.COMPUTE_ATTN_WEIGHT_WITH_KV_CACHE}
    assert S._torch_op(RC.COMPUTE_ATTN_WEIGHT_WITH_KV_CACHE) is None
    assert RC.COMPUTE_ATTN_WEIGHT_WITH_KV_CACHE not in S.SUPPORTED_OPS
    assert RC.SDPA_WITH_KV_CACHE in S.SUPPORTED_OPS


def _lower(m: KVAttention) -> bytes:
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama.* ops)
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

    g = torch.Generator().manual_seed(0)
    example = (*(torch.randn(1, 4, 2, 8, generator=g) for _ in range(3)), torch.tensor([3]))
    part = VulkanPartitioner()
    prog = to_edge_transform_and_lower(torch.export.export(m, example),
                                       transform_passes=transform_passes(partitioner=part),
                                       partitioner=[part])
    return bytes(prog.to_executorch().buffer)


def test_the_byte_search_gives_the_decodes_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    fused = _lower(KVAttention())
    filled = KVAttention()
    filled.get_buffer("kc").fill_(0.5)  # not fused: update_cache x2 + llama.custom_sdpa
    unfused = _lower(filled)
    cases = {
        fused: ["sdpa_with_kv_cache.default"],
        unfused: [],
        # the name in the bytes, but in no payload's chain: the decode says no
        unfused + b"sdpa_with_kv_cache.default": [],
        b"not a program": [],
        b"not a program sdpa_with_kv_cache.default": [],
    }
    for pte, want in cases.items():
        assert rt.uninitialized_state(pte) == rt._uninitialized_state_decoded(pte) == want
        assert rt.uninitialized_state(bytearray(pte)) == want
        assert rt.uninitialized_state(memoryview(pte)) == want

    # a program without the names is answered without decoding
    def no_decode(pte: bytes) -> list[str]:
        raise AssertionError("decoded")

    monkeypatch.setattr(rt, "_uninitialized_state_decoded", no_decode)
    assert rt.uninitialized_state(unfused) == []
    with pytest.raises(AssertionError, match="decoded"):
        rt.uninitialized_state(fused)
