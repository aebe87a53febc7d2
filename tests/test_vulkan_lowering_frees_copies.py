"""A Vulkan lowering frees the copies it makes when it is done, without the cyclic collector.

``VulkanBackend.preprocess`` works on a copy of each partition's program, every delegated
weight copied. Reference cycles that reached that copy kept it alive until Python's
cyclic collector happened to run: through ``export_llm`` on Vulkan (Qwen3 dims, 6 layers)
595 MiB of such copies were still alive when the exporter began ``to_executorch``. The
cycles were fusionkit's search record of returned values (``ProgramInputs`` ->
``Returned`` -> ``_Accepted`` -> ``CheckContext`` -> ``ProgramInputs``), a list pattern's
matcher (a closure per call that called itself, holding the search), and the preprocess
passes' own (an ``ExportPass`` and its tracer refer to each other, and the pass held the
program). With the cyclic collector off, nothing of a dropped search or lowering may be
left for it to free.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from executorch.exir import to_edge_transform_and_lower

from fusionkit import Rule, capture, find_matches, op, ref, replace_with
from fusionkit.backends import vulkan_adapter

#: a weight shape nothing else in the process has
_WEIGHT = (37, 53)


@contextmanager
def _collector_off() -> Iterator[None]:
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _unreachable() -> list[object]:
    """What only the cyclic collector would free now (collected, then handed back)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


class _CatMul(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(8, 8) + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.reciprocal(self.w)
        return torch.cat([y, x]) @ self.w


def test_a_dropped_search_frees_its_program_by_reference_counting() -> None:
    # accepted: its rewiring is recorded (the returned-values record); a list argument:
    # the list pattern's matcher runs
    div = Rule(name="reciprocal_mul",
               pattern=op("aten.mul.Tensor", capture("x"),
                          op("aten.reciprocal.default", capture("y"))),
               replacement=replace_with("aten.div.Tensor", ref("x"), ref("y")))
    cat = Rule(name="cat_pair",
               pattern=op("aten.cat.default", [capture("a"), capture("b")]),
               replacement=replace_with("aten.cat.default", [ref("a"), ref("b")]))
    with _collector_off():
        ep = torch.export.export(_CatMul(), (torch.randn(8, 8),))
        found = find_matches(ep, [div, cat])
        assert [m.rule.name for m in found.accepted] == ["reciprocal_mul", "cat_pair"]
        # (its weight is the module's, and its graph module and graph refer to each other:
        # torch's own cycles, which hold no fusionkit object)
        program = weakref.ref(ep)
        del ep, found
        assert program() is None


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.Parameter(torch.rand(_WEIGHT[1]) + 0.5)
        self.lin = torch.nn.Linear(_WEIGHT[1], _WEIGHT[0], bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return self.lin(y)


def _weight_copies(objects: list[object]) -> list[torch.Tensor]:
    # plain tensors only: a FakeTensor of the shape is metadata, and a weakref proxy in the
    # garbage raises on isinstance once its referent is gone
    return [o for o in objects if type(o) in (torch.Tensor, torch.nn.Parameter)
            and tuple(o.shape) == _WEIGHT]  # type: ignore[attr-defined]


def test_a_vulkan_lowering_leaves_no_weight_copy_to_the_cyclic_collector() -> None:
    ep = torch.export.export(_Model(), (torch.randn(2, _WEIGHT[1]),))
    with _collector_off():
        prog = to_edge_transform_and_lower(
            ep, transform_passes=vulkan_adapter.transform_passes(),
            partitioner=[vulkan_adapter.VulkanPartitioner()])
        assert any(n.op == "call_function" and "call_delegate" in str(n.target)
                   for n in prog.exported_program().graph_module.graph.nodes)
        del prog
        left = _weight_copies(_unreachable())
    assert left == []
