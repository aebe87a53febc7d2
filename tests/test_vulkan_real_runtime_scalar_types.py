"""Scalars serialized as their own type, on the real Vulkan runtime (issue 24: OpMix).

ExecuTorch 1.5.1's ``VkGraphBuilder.get_or_create_scalar_value`` shares one payload value
among equal scalars, keyed by the Python scalar: ``1 == 1.0``, so a conv's ``groups=1``
serialized after a ``1.0`` of the same delegate (a clamp bound, ``x > 1.0``) is the
``Double`` 1.0. The runtime reads ``groups`` with the strict ``graph.get_int``
(``Value::toInt``) and refuses the program at load: ``(isInt()) is false! Expected value
to have type Int, got DOUBLE instead`` — ``test_vulkan_simulator``'s OpMix program
(``x > 1.0`` and a conv in one delegate), though each of its parts ran alone.
``avg_pool2d`` takes a ``divisor_override`` that is not an ``Int`` as none (``val_is_int``):
wrong values. fusionkit's ``constant_serializer`` keys the shared scalars by type.

Held-out programs (tiny, one child for all; the models are ``held_out_models``'): with
fusionkit's lowering every one runs equal to eager on the runtime, the simulator agrees and
``check()`` finds nothing; stock's lowering of the same models is refused (the conv) or
wrong (the pool) there, and the simulator and ``check()`` say so, naming the argument
(``groups_is_int`` / ``divisor_override_is_int`` in ``inspect/runtime_conditions.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from held_out_models import clamp_conv, clamp_pool, opmix
from torch import nn
from torch.utils import _pytree as pytree
from vulkan_runtime_oracle import adapter_state_restored, lower_one_way, simulated_or_condition

import fusionkit.backends.vulkan_adapter as vk
from fusionkit.backends.vulkan_adapter import constant_serializer, decode_payload
from fusionkit.backends.vulkan_adapter import runtime as rt
from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates
from fusionkit.backends.vulkan_adapter.inspect.simulator import RuntimeConditionError

pytestmark = pytest.mark.usefixtures("vulkan_ops")

TOINT = "Expected value to have type Int, got DOUBLE instead"


@dataclass
class Case:
    name: str
    make: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
    #: the op and argument stock's payload holds as a Double, and the condition it breaks
    op: str
    arg: str
    #: stock's outcome on the runtime ("refused", "wrong"), or None: not lowered by stock
    stock: str | None
    runs: dict[str, Lowered] = field(default_factory=dict)


@dataclass
class Lowered:
    pte: bytes
    #: payload value kind of ``arg`` at every call of ``op``
    kinds: list[str]
    problems: list[Any]
    simulated: Any
    eager: list[torch.Tensor]
    real: Any = None


CASES = (
    ("clamp_conv", clamp_conv, "et_vk.conv_with_clamp.default", "groups", "refused"),
    ("clamp_pool", clamp_pool, "aten.avg_pool2d.default", "divisor_override", "wrong"),
    # the program; stock's lowering is refused before (linear's weight: toTensorRef)
    ("opmix", opmix, "et_vk.conv_with_clamp.default", "groups", None),
)

#: the schema position of the argument in the payload's call
ARG_INDEX = {"groups": 8, "divisor_override": 6}


def _kinds(et: Any, op: str, arg: str) -> list[str]:
    out = []
    for d in vulkan_delegates(et):
        g = decode_payload(d.payload).graph
        for call in g.chain:
            if call.name == op:
                v = g.value(call.args[ARG_INDEX[arg]])
                out.append(v.kind if v is not None else "missing")
    return out


def _lower(case: Case, path: str) -> Lowered:
    m, args = case.make()
    et, _ = lower_one_way(m, args, path)
    with torch.no_grad():
        eager = pytree.tree_leaves(m(*args))
    return Lowered(bytes(et.buffer), _kinds(et, case.op, case.arg), list(vk.check(et)),
                   simulated_or_condition(et, args), eager)


@pytest.fixture(scope="module")
def cases(vulkan_runtime: object) -> Iterator[list[Case]]:
    out = [Case(*c) for c in CASES]
    with adapter_state_restored():
        for case in out:
            case.runs["ours"] = _lower(case, "ours")
            if case.stock is not None:
                case.runs["stock"] = _lower(case, "stock")
    todo = [(case, low) for case in out for low in case.runs.values()]
    results = rt.run_many_in_child([rt.Job(low.pte, list(case.make()[1])) for case, low in todo],
                                   timeout=300)
    for (_, low), res in zip(todo, results, strict=True):
        low.real = res
    yield out


def _close(got: Any, want: list[torch.Tensor]) -> bool:
    return (isinstance(got, (list, tuple)) and len(got) == len(want) and all(
        g.shape == w.shape and torch.allclose(g.double(), w.double(), atol=1e-4, rtol=1e-4)
        for g, w in zip(got, want, strict=True)))


def _outcome(low: Lowered) -> str:
    if not low.real.ok:
        return "refused"
    return "ok" if _close(low.real.outputs, low.eager) else "wrong"


def _said(low: Lowered) -> str:
    e = low.simulated
    if isinstance(e, RuntimeConditionError):
        return ("wrong: " if e.condition.effect == "garbage" else "refused: ") + e.condition.name
    return "ok" if _close(e, low.eager) else "wrong"


def test_ours_serializes_ints_as_ints_and_runs_equal_to_eager(cases: list[Case]) -> None:
    # (kinds, the runtime's outcome, the simulator's, check()'s problems) for every program,
    # so that a failure shows whether the static tools agreed with the runtime
    got = {c.name: (sorted(set(c.runs["ours"].kinds)), _outcome(c.runs["ours"]),
                    _said(c.runs["ours"]), [str(p) for p in c.runs["ours"].problems],
                    c.runs["ours"].real.message) for c in cases}
    want: dict[str, Any] = {c.name: (["Int"], "ok", "ok", [], got[c.name][4]) for c in cases}
    assert got == want


def test_stock_doubles_are_refused_or_wrong_as_predicted(cases: list[Case]) -> None:
    stock = [c for c in cases if c.stock is not None]
    assert len(stock) == 2
    for case in stock:
        low = case.runs["stock"]
        assert "Double" in low.kinds, (case.name, low.kinds)
        outcome = _outcome(low)
        assert outcome == case.stock, (case.name, outcome, low.real.message)
        if outcome == "refused":
            assert TOINT in low.real.message, low.real.message
        else:  # ran: the override is ignored, the window's size divides
            err = max(float((r - e).abs().max()) for r, e in zip(low.real.outputs, low.eager,
                                                                   strict=True))
            assert err > 0.1, err
        # the simulator stops (abort) or flags garbage, naming the op and the argument
        e = low.simulated
        assert isinstance(e, RuntimeConditionError), (case.name, e)
        assert e.condition is not None and e.condition.name == f"{case.arg}_is_int"
        assert e.condition.effect == ("abort" if case.stock == "refused" else "garbage")
        assert case.op in str(e) and case.arg in str(e)
        # check() reports exactly that argument
        named = [(p.op, p.arg_name) for p in low.problems if p.kind == "runtime_condition"]
        assert named == [(case.op, case.arg)], [str(p) for p in low.problems]


def test_the_serializer_keys_shared_scalars_by_type() -> None:
    from executorch.backends.vulkan.serialization.vulkan_graph_builder import VkGraphBuilder
    from executorch.exir.backend.utils import DelegateMappingBuilder

    def kinds(*scalars: Any) -> list[tuple[str, Any]]:
        m = torch.export.export(nn.ReLU(), (torch.randn(2),))
        b = VkGraphBuilder(m, DelegateMappingBuilder(generated_identifiers=True))
        ids = [b.get_or_create_value_for(s) for s in scalars]
        vals = [b.values[i].value for i in ids]
        return [(type(v).__name__, v.int_val if hasattr(v, "int_val") else
                 v.double_val if hasattr(v, "double_val") else v.bool_val) for v in vals]

    scalars = (1.0, 1, True, -0.0, 0.0, 0, 2, 2)
    was = constant_serializer.is_installed()
    try:
        constant_serializer.uninstall()
        stock = kinds(*scalars)
        constant_serializer.install()
        ours = kinds(*scalars)
    finally:
        (constant_serializer.install if was else constant_serializer.uninstall)()
    # stock: 1 takes 1.0's Double, 0.0 takes -0.0's, 0 takes that Double too
    assert stock == [("Double", 1.0), ("Double", 1.0), ("Bool", True), ("Double", -0.0),
                     ("Double", -0.0), ("Double", -0.0), ("Int", 2), ("Int", 2)], stock
    assert ours == [("Double", 1.0), ("Int", 1), ("Bool", True), ("Double", -0.0),
                    ("Double", 0.0), ("Int", 0), ("Int", 2), ("Int", 2)], ours
    assert str(ours[3][1]) == "-0.0" and str(ours[4][1]) == "0.0"
