"""torchao's 8-bit weight-only linear and the kept-off int4 linear on the real runtime (issue 24).

* ``IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))``: stock ExecuTorch
  delegates ``linear(x, torchao.dequantize_affine(w))``, which the runtime refuses at load
  (``Missing operator: torchao.dequantize_affine.default``) and the CPU runtime has no kernel
  for. The preprocess rule ``linear_weight_int8_affine`` makes it ``_weight_int8pack_mm``:
  ours runs equal to eager (2-D and 3-D inputs, with and without bias), stock's is refused.
* Asymmetric per-channel int8 (``mapping_type=MappingType.ASYMMETRIC``): the zero points are
  folded, ``_weight_int8pack_mm(x, w, s) - x.sum(-1, keepdim) * (zp * s)`` (a constant
  ``[N]``), equal to eager on the runtime to fp32 rounding (relative 4e-7 with zero points
  of -128), stock's refused alike.
* Where that rule declines (group-wise int8, asymmetric with a float16 input) nothing can
  run the dequantize: the adapter's partitioner raises :class:`UnrunnableOpError` naming the node,
  the op, both runtimes and the decline, and the user's program is unchanged.
* The int4 weight-only linear the partitioner keeps off (its ``dequantize_per_channel`` and
  ``mm``) left a delegate of one ``permute_copy`` between them: not delegated now (one
  delegate), equal to eager on the runtime.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from held_out_models import K, w8_linear
from torch import nn

from fusionkit.backends.vulkan_adapter import runtime as rt

pytest.importorskip("torchao")

from torchao.quantization.granularity import PerAxis, PerGroup
from torchao.quantization.quant_primitives import MappingType


def _delegates(edge: Any) -> list[list[str]]:
    from fusionkit.backends.vulkan_adapter import decode_payload

    return [decode_payload(lm.processed_bytes).graph.op_names()
            for _, lm in edge.exported_program().graph_module.named_children()
            if hasattr(lm, "processed_bytes")]


def _lower(model: nn.Module, x: torch.Tensor, inv: Any, stock: bool = False) -> Any:
    from executorch.exir import to_edge_transform_and_lower
    from vulkan_real_programs import pattern_graphs_once, stock_partitioner

    import fusionkit.backends.vulkan_adapter as va

    ep = torch.export.export(model, (x,))
    with pattern_graphs_once():
        if stock:
            va.uninstall()
            return None, to_edge_transform_and_lower(copy.deepcopy(ep),
                                                     partitioner=[stock_partitioner()])
        part = va.VulkanPartitioner(runtime=inv)
        edge = to_edge_transform_and_lower(
            copy.deepcopy(ep), transform_passes=va.transform_passes(partitioner=part),
            partitioner=[part])
    return part, edge


W8_RUNS = [(False, (1, K)), (True, (3, K)), (True, (2, 3, K))]
#: asymmetric: bias, input shape, weight shift
W8_ASYM_RUNS = [(True, (3, K), 0.0), (True, (2, 3, K), 0.3), (False, (5, K), 2.0)]


@pytest.fixture(scope="module")
def inv(vulkan_runtime: Any) -> Any:
    from fusionkit.backends.vulkan_adapter.runtime_probe import inventory

    found = inventory(vulkan_runtime)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def programs(inv: Any) -> dict[str, Any]:
    """name -> what ours made of it (partitioner, lowering, check(), simulator), and what the
    runtime did with ours and with stock's (w8 only), all run in one child."""
    from test_vulkan_real_runtime_partitioner import Int4Linear, _int4

    import fusionkit.backends.vulkan_adapter as va

    g = torch.Generator().manual_seed(24)
    cases: dict[str, tuple[nn.Module, torch.Tensor, bool]] = {}
    for bias, shape in W8_RUNS:
        cases[f"w8 bias={bias} {list(shape)}"] = (w8_linear(bias, granularity=PerAxis(0)),
                                                   torch.randn(*shape, generator=g), True)
    for bias, shape, shift in W8_ASYM_RUNS:
        cases[f"w8 asymmetric bias={bias} {list(shape)} shift={shift}"] = (
            w8_linear(bias, shift, granularity=PerAxis(0), mapping_type=MappingType.ASYMMETRIC),
            torch.randn(*shape, generator=g), True)
    for rows, n in ((6, 12), (1, 8)):
        x = torch.randn(rows, 16, generator=g)
        cases[f"int4 kept off M={rows} N={n}"] = (_int4(Int4Linear(16, n), (x,)), x, False)
    out: dict[str, Any] = {}
    jobs = []
    for name, (m, x, with_stock) in cases.items():
        part, edge = _lower(m, x, inv)
        et = edge.to_executorch()
        low: dict[str, Any] = {"model": m, "x": x, "part": part, "edge": edge,
                               "check": [str(p) for p in va.check(et, runtime=inv)],
                               "sim": va.simulate(et, x, runtime=inv)}
        jobs.append(rt.Job(bytes(et.buffer), [x]))
        if with_stock:
            _, stock = _lower(m, x, inv, stock=True)
            jobs.append(rt.Job(bytes(stock.to_executorch().buffer), [x]))
        out[name] = low
    results = iter(rt.run_many_in_child(jobs, timeout=300))
    for name, (_, _, with_stock) in cases.items():
        out[name]["real"] = next(results)
        out[name]["stock_real"] = next(results) if with_stock else None
    return out


def _eager(low: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return low["model"](low["x"])  # type: ignore[no-any-return]


def test_w8_runs_on_the_runtime_equal_to_eager_and_stocks_is_refused(
        programs: dict[str, Any]) -> None:
    bad = []
    for name, low in programs.items():
        if not name.startswith("w8"):
            continue
        ops = [o for d in _delegates(low["edge"]) for o in d]
        # asymmetric: the zero points folded into a correction per linear
        folds = 2 if "asymmetric" in name else 0
        if ops.count("aten._weight_int8pack_mm.default") != 2 or \
                "torchao.dequantize_affine.default" in ops or \
                [ops.count(f"aten.{o}") for o in ("sum.dim_IntList", "sub.Tensor")] != [folds] * 2:
            bad.append(f"{name}: delegated {ops}")
        real, want = low["real"], _eager(low)
        if not real.ok:
            bad.append(f"{name}: refused: {real.message}")
        elif not torch.allclose(real.outputs[0], want, atol=1e-4, rtol=1e-4):
            bad.append(f"{name}: {(real.outputs[0] - want).abs().max()} off eager")
        if low["check"]:
            bad.append(f"{name}: check() {low['check']}")
        torch.testing.assert_close(low["sim"], want, atol=1e-4, rtol=1e-4)
        stock = low["stock_real"]
        if stock.ok or "Missing operator: torchao.dequantize_affine.default" not in (
                stock.message or ""):
            bad.append(f"{name} [stock]: {stock.status} {stock.message}")
    assert not bad, bad


@pytest.mark.parametrize(("config", "decline"), [
    ({"granularity": PerGroup(32)}, "blocks of [1, 32], not one block [1, 64]"),
    ({"granularity": PerGroup(32), "mapping_type": "asymmetric"},
     "blocks of [1, 32], not one block [1, 64]"),
], ids=["group 32", "asymmetric group 32"])
def test_an_unrunnable_dequantize_is_refused_before_load_naming_node_op_and_reason(
        inv: Any, config: dict[str, Any], decline: str) -> None:
    import fusionkit.backends.vulkan_adapter as va

    if config.get("mapping_type") == "asymmetric":
        config = {**config, "mapping_type": MappingType.ASYMMETRIC}
    m = w8_linear(True, **config)
    x = torch.randn(3, K)
    ep = torch.export.export(m, (x,))
    before = str(ep.graph_module.code)
    from executorch.exir import to_edge_transform_and_lower

    part = va.VulkanPartitioner(runtime=inv)
    with pytest.raises(va.UnrunnableOpError) as err:
        to_edge_transform_and_lower(ep, transform_passes=va.transform_passes(partitioner=part),
                                    partitioner=[part])
    nodes = err.value.nodes
    assert [u.op for u in nodes] == ["torchao.dequantize_affine.default"] * 2, nodes
    assert {u.node for u in nodes} == {"torchao_dequantize_affine_default",
                                       "torchao_dequantize_affine_default_1"}
    text = str(err.value)
    for want in ("`torchao_dequantize_affine_default` (torchao.dequantize_affine.default)",
                 "probed, library sha256", "Missing operator: torchao.dequantize_affine.default",
                 "CPU runtime", "has no kernel", "linear_weight_int8_affine", decline,
                 "To run it: "):
        assert want in text, (want, text)
    assert str(ep.graph_module.code) == before  # the user's program is as it was
    torch.testing.assert_close(ep.module()(x), m(x))


def test_the_kept_off_int4_linear_leaves_no_data_movement_delegate(
        programs: dict[str, Any]) -> None:
    bad = []
    for name, low in programs.items():
        if not name.startswith("int4"):
            continue
        delegates = _delegates(low["edge"])
        if len(delegates) != 1 or any("aten.permute_copy.default" in d for d in delegates):
            bad.append(f"{name}: delegates {delegates}")
        kept = [k for k in low["part"].kept_off_nodes if k.fact == "data_movement_only"]
        if [k.op for k in kept] != ["aten.permute_copy.default"]:
            bad.append(f"{name}: {[str(k) for k in low['part'].kept_off_nodes]}")
        real, want = low["real"], _eager(low)
        if not real.ok or not torch.allclose(real.outputs[0], want, atol=1e-4, rtol=1e-4):
            bad.append(f"{name}: {real.status} {real.message}")
        if low["check"]:
            bad.append(f"{name}: check() {low['check']}")
    assert not bad, bad
