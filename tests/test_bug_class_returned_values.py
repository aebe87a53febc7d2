"""Bug class: a value that is both an intermediate and a program output.

A copy whose result the program returns, removed by a redundant-op rule, leaves its
source in its place among the outputs. When the program returns that source already
(``return y, y.clone()``), one value stands for two outputs: ExecuTorch's Vulkan runtime
aborts at execute ("Vulkan graph declares 1 inputs and 1 outputs, but the delegate call
supplied 3 arguments") and XNNPACK refuses the lowering ("Output node ... is already in
the inputs"); stock 1.5.1 fails both ways, and fusionkit's rules did too, having copied
stock's rewrite. The core now declines a match that would not rewire a returned value
exactly (:mod:`fusionkit.find.returned_values`), for every rule.

Generated programs (hypothesis) hand every shipped rule set values that are returned,
some of them also through a copy, and the rewritten program must still return one value
of its own per output; a few programs run end to end on the real Vulkan runtime and on
XNNPACK against eager.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from vulkan_runtime_oracle import adapter_state_restored, lower_one_way, session

from fusionkit import find_matches
from fusionkit.apply.rewrite import apply_matches
from fusionkit.passes import rule_set

real_vulkan = session()

#: (name, what it computes from one (2, 8) value): each aims at a shipped rule family
STEPS: dict[str, Any] = {
    "clone": lambda m, v: v.clone(),
    "alias": lambda m, v: torch.ops.aten.alias(v),
    "copy": lambda m, v: torch.ops.aten._to_copy(v),
    "add_relu": lambda m, v: torch.relu(v + 1.0),
    "mul": lambda m, v: v * 2.0,
    "views": lambda m, v: v.view(16).view(2, 8),
    "unsqueeze": lambda m, v: v.unsqueeze(0).squeeze(0),
    "linear": lambda m, v: torch.nn.functional.linear(v, m.w, m.b),
    "mm_add": lambda m, v: torch.mm(v, m.w.t()) + m.b,
}


class Generated(torch.nn.Module):
    """``steps``: (step, index of its input among the values so far: 0 is the input);
    ``returned``: (value index, returned through a clone?)."""

    def __init__(self, steps: list[tuple[str, int]], returned: list[tuple[int, bool]]) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(8, 8, generator=g))
        self.b = torch.nn.Parameter(torch.randn(8, generator=g))
        self.steps, self.returned = steps, returned

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x]
        for name, i in self.steps:
            values.append(STEPS[name](self, values[i]))
        return tuple(values[i].clone() if through_clone else values[i]
                     for i, through_clone in self.returned)


@st.composite
def programs(draw: Any) -> Generated:
    n = draw(st.integers(1, 4))
    steps = [(draw(st.sampled_from(sorted(STEPS))), draw(st.integers(0, k))) for k in range(n)]
    picks = draw(st.lists(st.tuples(st.integers(0, n), st.booleans()), min_size=1, max_size=4,
                          unique=True))
    # a value returned as itself twice is the program's own choice, not a rule's: once only
    seen: set[int] = set()
    returned = []
    for i, through_clone in picks:
        if not through_clone and i in seen:
            continue
        if not through_clone:
            seen.add(i)
        returned.append((i, through_clone))
    return Generated(steps, returned)


X = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))


def _edge_program(m: torch.nn.Module) -> Any:
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(m, (X,))
    return to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)) \
        .exported_program()


def _outputs(ep: Any) -> list[Any]:
    return list(ep.graph_module.graph.output_node().args[0])


#: every shipped rule set that runs on these ops (``builtin``'s rules are among ``vulkan``'s)
RULE_SETS = ("vulkan_preprocess", "xnnpack", "vulkan")


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(programs())
@example(Generated([("mul", 0)], [(1, False), (1, True)]))  # return y, y.clone()
@example(Generated([("add_relu", 0)], [(1, True), (1, False)]))  # add + relu, returned twice
@example(Generated([("mul", 0)], [(1, True), (1, True)]))  # two clones of one value
@example(Generated([("mul", 0), ("alias", 1)], [(2, True), (1, True)]))  # a chain of copies
@example(Generated([], [(0, True), (0, True)]))  # the input, returned through two clones
def test_every_rule_set_keeps_one_value_per_returned_output(m: Generated) -> None:
    want = m(X)
    program = _edge_program(m)
    for name in RULE_SETS:
        ep = copy.deepcopy(program)
        before = _outputs(ep)
        placeholders_before = sum(o.op == "placeholder" for o in before)
        ms = find_matches(ep, rule_set(name), strict=True,
                          check_replacements=name not in ("vulkan_preprocess", "xnnpack"))
        apply_matches(ep, ms.accepted, strict=True)
        after = _outputs(ep)
        assert len(after) == len(before)
        # one value of its own per output, no more outputs that are the program's input
        assert len(set(after)) == len(set(before)), (name, m.steps, m.returned,
                                                     [str(a) for a in ms.accepted])
        assert sum(o.op == "placeholder" for o in after) <= placeholders_before, \
            (name, m.steps, m.returned)
        # each output spec names the node the output node returns
        specs = [s.arg.name for s in ep.graph_signature.output_specs]
        assert specs == [o.name for o in after], (name, specs, [o.name for o in after])
        if name == "xnnpack":  # its fused activations live in node metadata, for XNNPACK
            continue
        got = ep.module()(X)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


def test_a_returned_copy_declines_with_the_reason() -> None:
    m = Generated([("mul", 0)], [(1, False), (1, True)])
    ms = find_matches(_edge_program(m), rule_set("xnnpack"), strict=True,
                      check_replacements=False)
    d = [d for d in ms.declined if d.rule == "xnnpack_remove_identity_clone"]
    assert len(d) == 1 and d[0].step == "escape", [str(x) for x in ms.declined]
    assert "which the program returns already" in d[0].reason
    assert d[0].node is not None and d[0].node.name in d[0].reason


# ------------------------------------------------------------------ end to end


E2E = {
    "returned_and_cloned": Generated([("mul", 0)], [(1, False), (1, True)]),
    "relu_returned_and_cloned": Generated([("add_relu", 0)], [(1, True), (1, False)]),
}


def _xnnpack(m: torch.nn.Module, stock: bool) -> list[torch.Tensor]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    import fusionkit.backends.xnnpack_adapter as xa

    ep = torch.export.export(m, (X,))
    was = xa.is_installed()
    try:
        if stock:
            xa.uninstall()
            et = to_edge_transform_and_lower(ep, partitioner=[StockXnnpackPartitioner()])
        else:
            et = to_edge_transform_and_lower(ep, transform_passes=xa.transform_passes(),
                                             partitioner=[xa.XnnpackPartitioner()])
        pte = et.to_executorch().buffer
    finally:
        (xa.install if was else xa.uninstall)()
    return list(_load_for_executorch_from_buffer(pte).forward((X,)))


@pytest.mark.parametrize("case", sorted(E2E))
def test_returned_values_on_xnnpack(case: str) -> None:
    m = E2E[case]
    want = m(X)
    with pytest.raises(Exception, match="is already in the inputs"):
        _xnnpack(m, stock=True)
    got = _xnnpack(m, stock=False)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def test_returned_values_on_the_real_vulkan_runtime(real_vulkan: Any) -> None:
    if real_vulkan is None:
        pytest.skip("no real Vulkan runtime")
    import fusionkit.backends.vulkan_adapter as vk

    m = E2E["returned_and_cloned"]
    want = m(X)
    with adapter_state_restored():
        stock, _ = lower_one_way(m, (X,), "stock")
        vk.install()
        ours, _ = lower_one_way(m, (X,), "fusionkit")
    res = real_vulkan.run(bytes(stock.buffer), [X])  # stock: one delegate output for two
    assert not res.ok and "the delegate call supplied 3 arguments" in res.message, res.message
    res = real_vulkan.run(bytes(ours.buffer), [X])
    assert res.ok, res.message
    assert len(res.outputs) == len(want)
    for g, w in zip(res.outputs, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def test_check_and_the_simulator_name_the_argument_count_abort() -> None:
    """Stock's program (one delegate output for two program outputs) is refused by the
    runtime at execute; ``check()`` and the simulator say so in the runtime's words, and
    pass ours (the real runtime's verdicts: the test above)."""
    import fusionkit.backends.vulkan_adapter as vk
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import check
    from fusionkit.backends.vulkan_adapter.inspect.simulator import (
        RuntimeConditionError,
        simulate,
    )

    m = E2E["returned_and_cloned"]
    with adapter_state_restored():
        stock, _ = lower_one_way(m, (X,), "stock")
        vk.install()
        ours, _ = lower_one_way(m, (X,), "fusionkit")
    (problem,) = check(stock)
    assert "declares 1 inputs and 1 outputs, but the delegate call supplied 3 arguments" \
        in problem.message, problem.message
    with pytest.raises(RuntimeConditionError, match="the delegate call supplied 3 arguments"):
        simulate(stock, X)
    assert check(ours) == []
    for g, w in zip(simulate(ours, X), m(X), strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)
