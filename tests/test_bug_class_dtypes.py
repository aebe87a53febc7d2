"""Bug class: an operand whose dtype the fused op does not take.

A statically quantized linear with a float output (``x -> quantize -> dequantize ->
linear(dequantize_per_channel(w))``) is fused into ``et_vk.linear_q8ta_q8csw``, whose
Vulkan kernel quantizes a *float* activation itself (``QuantizedLinear.cpp``:
``fp_input``). Stock 1.5.1 hands it the int8 tensor (pytorch/executorch#22775), and so did
fusionkit's rule: the program lowers, ``check()`` and the simulator passed it, and the
real runtime aborts at load ("Could not find ShaderInfo with name
clone_buffer_to_image_int8_int32"). Now the Vulkan delegate declares the dtypes its
kernels take per operand (``passes/vulkan_delegate.py`` ``OPERAND_DTYPES``), the core
declines any replacement feeding them another one
(:mod:`fusionkit.check.operand_dtypes`), ``check()`` and the simulator report a payload
that does, and the rule passes the float tensor the input quantize reads.

Generated quantized programs (hypothesis) put int8 activations (graph inputs and
quantized values, dequantized or not) in front of every shipped rule set: the rewritten
program never feeds an op a dtype its backend does not take. One program runs end to
end on the real Vulkan runtime and on XNNPACK against eager.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from vulkan_pattern_helpers import I8, declined, edge, qd
from vulkan_runtime_oracle import adapter_state_restored, lower_one_way, session

import fusionkit.passes.vulkan_delegate  # noqa: F401  (declares the Vulkan operand dtypes)
from fusionkit import find_matches
from fusionkit.apply.rewrite import apply_matches
from fusionkit.check.operand_dtypes import OPERAND_DTYPES, operand_dtype_refusal
from fusionkit.passes import rule_set

real_vulkan = session()


class QLinear(torch.nn.Module):
    """A static int8 linear. ``source``: ``"int8_input"`` (the graph input is the int8
    tensor) or ``"quantized"`` (a float input quantized in the graph); ``requant``: the
    output is quantized again (the q8ta route); ``relu``: a relu after the linear;
    ``add``: the dequantized activation also feeds an add (a quantized binary's operand)."""

    def __init__(self, k: int, n: int, source: str, requant: bool, relu: bool,
                 add: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(k * 31 + n)
        self.register_buffer("w", torch.randint(-127, 128, (n, k), dtype=I8, generator=g))
        self.register_buffer("s", torch.rand(n, generator=g) * 0.01 + 0.001)
        self.register_buffer("z", torch.zeros(n, dtype=torch.int64))
        self.source, self.requant, self.relu, self.add = source, requant, relu, add

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xq = x if self.source == "int8_input" else qd.quantize_per_tensor(
            x, 0.05, 3, -128, 127, I8)
        xd = qd.dequantize_per_tensor(xq, 0.05, 3, -128, 127, I8)
        w = qd.dequantize_per_channel(self.w, self.s, self.z, 0, -127, 127, I8)
        y = torch.nn.functional.linear(xd, w)
        if self.relu:
            y = torch.relu(y)
        outs = [qd.quantize_per_tensor(y, 0.1, -2, -128, 127, I8) if self.requant else y]
        if self.add:
            outs.append(qd.quantize_per_tensor(xd + xd, 0.1, 0, -128, 127, I8))
        return tuple(outs)

    def example(self, rows: int) -> torch.Tensor:
        k = self.w.shape[1]
        if self.source == "int8_input":
            return torch.randint(-128, 127, (rows, k), dtype=I8,
                                 generator=torch.Generator().manual_seed(rows))
        return torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))


@st.composite
def programs(draw: Any) -> tuple[QLinear, torch.Tensor]:
    m = QLinear(k=draw(st.sampled_from([8, 16, 6])), n=draw(st.sampled_from([4, 8, 12])),
                source=draw(st.sampled_from(["int8_input", "quantized"])),
                requant=draw(st.booleans()), relu=draw(st.booleans()), add=draw(st.booleans()))
    return m, m.example(draw(st.sampled_from([1, 4])))


#: every shipped rule set that runs on a Vulkan or XNNPACK program
RULE_SETS = ("vulkan", "vulkan_preprocess", "xnnpack")


def _unaccepted_operands(ep: Any) -> list[str]:
    return [f"{n.name}: {why}" for n in ep.graph_module.graph.nodes
            if n.op == "call_function" and (why := operand_dtype_refusal(n)) is not None]


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(programs())
@example((QLinear(16, 8, "int8_input", False, False, False), torch.zeros(4, 16, dtype=I8)))
@example((QLinear(16, 8, "quantized", False, False, True), torch.randn(4, 16)))
def test_no_rule_feeds_an_op_a_dtype_it_does_not_take(case: tuple[QLinear, torch.Tensor]
                                                       ) -> None:
    m, x = case
    program = edge(m, (x,))
    for name in RULE_SETS:
        ep = copy.deepcopy(program)
        assert _unaccepted_operands(ep) == []
        ms = find_matches(ep, rule_set(name), strict=True,
                          check_replacements=name not in ("vulkan_preprocess", "xnnpack"))
        apply_matches(ep, ms.accepted, strict=True)
        assert _unaccepted_operands(ep) == [], (name, [str(a) for a in ms.accepted])


def test_the_float_linear_takes_the_float_activation() -> None:
    """With a float input quantized in the graph, the q8csw route fuses and reads that float
    input (the kernel quantizes it with the same scale and zero point); given the int8
    graph input itself, the table declines it, naming the operand and its dtype."""
    m = QLinear(16, 8, "quantized", False, False, False)
    ep = edge(m, (m.example(4),))
    ms = find_matches(ep, rule_set("vulkan"), strict=True)
    assert [a.rule.name for a in ms.accepted] == ["quantized_linear_q8csw"]
    apply_matches(ep, ms.accepted, strict=True)
    fused = [n for n in ep.graph_module.graph.nodes
             if n.op == "call_function" and "linear_q8ta_q8csw" in str(n.target)]
    assert len(fused) == 1 and fused[0].args[0].op == "placeholder"
    assert fused[0].args[0].meta["val"].dtype == torch.float32

    m = QLinear(16, 8, "int8_input", False, False, False)
    ms = find_matches(edge(m, (m.example(4),)), rule_set("vulkan"), strict=True)
    assert not ms.accepted
    reasons = declined(ms, "quantized_linear_q8csw")
    assert any(r.startswith("executable: et_vk.linear_q8ta_q8csw.default takes 'x' as "
                            "float16 / float32 only") and "`x`, int8" in r for r in reasons), \
        reasons


def test_the_static_tools_read_the_same_table() -> None:
    from fusionkit.backends.vulkan_adapter.inspect.runtime_conditions import violated

    for op, args in OPERAND_DTYPES.items():
        for arg, entry in args.items():
            bad = next(d for d in (torch.int8, torch.float32) if d not in entry.dtypes)
            ok = next(iter(entry.dtypes))
            names = [c.name for c in violated(op, {arg: torch.empty(1, dtype=bad)})]
            assert f"{arg}_dtype" in names, (op, arg, names)
            names = [c.name for c in violated(op, {arg: torch.empty(1, dtype=ok)})]
            assert f"{arg}_dtype" not in names, (op, arg, names)


# ------------------------------------------------------------------ end to end


def test_a_static_float_output_linear_on_the_real_runtime_and_xnnpack(real_vulkan: Any
                                                                      ) -> None:
    """Stock hands the int8 tensor to linear_q8ta_q8csw: check() and the simulator now say
    so, and the real runtime aborts at load; ours runs equal to eager, on Vulkan and on
    XNNPACK."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
    from vulkan_runtime_oracle import simulated_or_condition

    import fusionkit.backends.vulkan_adapter as vk
    import fusionkit.backends.xnnpack_adapter as xa
    from fusionkit.backends.vulkan_adapter.inspect.simulator import RuntimeConditionError

    m = QLinear(16, 8, "quantized", False, False, False)
    x = m.example(4)
    with torch.no_grad():
        want = m(x)[0]
    with adapter_state_restored():
        stock, _ = lower_one_way(m, (x,), "stock")
        vk.install()
        ours, _ = lower_one_way(m, (x,), "fusionkit")
    problems = vk.check(stock)
    assert [(p.op, p.arg_name) for p in problems] == [("et_vk.linear_q8ta_q8csw.default", "x")]
    assert isinstance(simulated_or_condition(stock, (x,)), RuntimeConditionError)
    assert vk.check(ours) == []
    sim = simulated_or_condition(ours, (x,))
    assert isinstance(sim, list), sim
    # int8 activations: one input step (0.05) times the weights is the resolution
    torch.testing.assert_close(sim[0], want, atol=1e-4, rtol=1e-4)
    if real_vulkan is not None:
        res = real_vulkan.run(bytes(stock.buffer), [x])
        assert not res.ok and "clone_buffer_to_image_int8_int32" in res.message, res.message
        res = real_vulkan.run(bytes(ours.buffer), [x])
        assert res.ok, res.message
        torch.testing.assert_close(res.outputs[0], want, atol=1e-4, rtol=1e-4)
    # XNNPACK: the same program through fusionkit's adapter, on the CPU runtime (the
    # quantized kernels library gives the weight's dequantize its out variant)
    import executorch.kernels.quantized  # noqa: F401

    was = xa.is_installed()
    try:
        et = to_edge_transform_and_lower(torch.export.export(m, (x,)),
                                         transform_passes=xa.transform_passes(),
                                         partitioner=[xa.XnnpackPartitioner()]).to_executorch()
    finally:
        (xa.install if was else xa.uninstall)()
    got = _load_for_executorch_from_buffer(et.buffer).forward((x,))[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", sorted(OPERAND_DTYPES))
def test_every_declared_op_exists(op: str) -> None:
    """The table names ops by their real key (a typo would judge nothing)."""
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401

    ns, name, overload = op.split(".")
    schema = getattr(getattr(getattr(torch.ops, ns), name), overload)._schema
    assert set(OPERAND_DTYPES[op]) <= {a.name for a in schema.arguments}
