"""Shader variants by dtype: the simulator, given the probed runtime, predicts which
binary ops the real runtime refuses for a missing shader (an int32 ``eq`` on texture
storage: ``binary_eq_texture3d_int32``), and runs the others like the runtime."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vulkan_real_programs import Program, lower, run_all

from fusionkit.backends.vulkan_adapter.inspect.shaders import missing_shader
from fusionkit.backends.vulkan_adapter.runtime_probe import RuntimeInventory

#: (torch function, dtype): a comparison, an arithmetic op, in the dtypes models use
CASES = [(torch.eq, torch.int32), (torch.lt, torch.int32), (torch.add, torch.int32),
         (torch.eq, torch.float32), (torch.mul, torch.float16)]


class Binary(torch.nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fn(a, b)


@pytest.fixture(scope="module")
def programs(probed: RuntimeInventory) -> list[Program]:
    g = torch.Generator().manual_seed(0)
    out = []
    for fn, dtype in CASES:
        if dtype.is_floating_point:
            a, b = torch.randn(2, 8, generator=g).to(dtype), torch.randn(2, 8, generator=g).to(dtype)
        else:
            a = torch.randint(0, 3, (2, 8), generator=g).to(dtype)
            b = torch.randint(0, 3, (2, 8), generator=g).to(dtype)
        model = Binary(fn)
        ep = torch.export.export(model, (a, b))
        out.append(lower(f"{fn.__name__}/{str(dtype).removeprefix('torch.')}", "binary shaders",
                         "stock", ep, (a, b), model(a, b), dtype=dtype))
    run_all(out)
    return out


def test_missing_shader_composes_the_runtimes_name(probed: RuntimeInventory) -> None:
    from fusionkit.backends.vulkan_adapter.inspect.payload import VkTensor

    int_tex = VkTensor(datatype=3, dims=(2, 8), constant_id=-1, mem_obj_id=-1, storage_type=1)
    int_buf = VkTensor(datatype=3, dims=(2, 8), constant_id=-1, mem_obj_id=-1, storage_type=0)
    float_buf = VkTensor(datatype=5, dims=(2, 8), constant_id=-1, mem_obj_id=-1, storage_type=0)
    unset = VkTensor(datatype=3, dims=(2, 8), constant_id=-1, mem_obj_id=-1)
    assert missing_shader("aten.eq.Tensor", int_tex, int_tex, probed.shaders) == \
        "binary_eq_texture3d_int32"
    # the yaml names the int32 variants binary_eq_int32_<storage>: buffer is broken too
    assert missing_shader("aten.eq.Tensor", int_buf, int_buf, probed.shaders) == \
        "binary_eq_buffer_int32"
    assert missing_shader("aten.eq.Tensor", unset, unset, probed.shaders, 0) == \
        "binary_eq_buffer_int32"  # an unset storage is the graph's override
    assert missing_shader("aten.eq.Tensor", float_buf, float_buf, probed.shaders) is None
    assert missing_shader("aten.add.Tensor", int_tex, int_tex, probed.shaders) is None
    assert missing_shader("aten.relu.default", int_tex, int_tex, probed.shaders) is None


def test_simulator_with_the_probe_predicts_the_runtime(programs: list[Program]) -> None:
    assert all(p.lower_error is None and p.real is not None for p in programs), \
        [p.describe() for p in programs]
    wrong = [p.describe() + f"; simulator+probe={p.simulator_probed}; check+probe="
             f"{p.check_probed}" for p in programs
             if not (p.simulator_probed_agrees and p.check_probed_agrees)]
    assert not wrong, wrong
    eq_int = next(p for p in programs if p.name == "eq/int32")
    if eq_int.outcome == "refused":  # the shader gap, for real
        assert "ShaderInfo" in (eq_int.real.message or "") or "listings_" in (
            eq_int.real.message or ""), eq_int.describe()
