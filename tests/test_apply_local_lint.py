"""Apply's safety net checks only what the apply changed, and still catches every fault.

``apply_matches`` used to run ``Graph.lint()`` on the whole graph once per
apply; it now checks the nodes its journal saw created or rerouted
(:func:`fusionkit.apply.rewrite.lint`). Each fault below is one a replacement can
really make and the per-match checks do not see (a node it creates or rewires
behind the engine's back): it is injected, and both the local check and the
old whole-graph ``Graph.lint`` must reject the apply and leave the program
exactly as it was — so the cheaper check drops none of the faults the old one
caught. The fast paths of building metadata (a fresh FakeTensor without the
constructor) are checked against the slow ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from models import export_edge, fresh, outputs_close, run_program
from test_apply_atomic import assert_unchanged, snapshot
from torch import nn

import fusionkit.apply.rewrite as rewrite_mod
from fusionkit import Rule, capture, find_matches, op
from fusionkit.apply.rewrite import apply_matches
from fusionkit.edit.builder import FusionError
from fusionkit.rule import PythonReplacement
from fusionkit.targets import dialect_target


class Chain(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.sin(x)
        b = torch.relu(torch.relu(a))
        return torch.cos(b * 2), a + 1


X = torch.randn(2, 4)


@pytest.fixture(scope="module")
def base() -> Any:
    return export_edge(Chain(), (X,))


def _nodes(rw: Any) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in rw.graph.nodes}


def _relu(rw: Any) -> Any:
    return dialect_target("aten.relu.default", like=rw.root.target)


def _direct(rw: Any, *args: Any) -> torch.fx.Node:
    """A node the replacement makes with the graph's own API (the engine does not see it)."""
    with rw.graph.inserting_before(rw.insert_before):
        n = rw.graph.call_function(_relu(rw), args)
    n.meta["val"] = rw.root.meta["val"]
    return n


def _later(rw: Any) -> torch.fx.Node:
    """A node after the insertion point: the ``mul`` reading the fused relu."""
    (user,) = rw.root.users
    return user


#: fault -> what the replacement does besides building the fused relu
FAULTS = {
    # a helper node reading a node defined after it
    "reads a later node": lambda rw, x: _direct(rw, _later(rw)),
    # a helper node reading a node the replacement erased
    "reads an erased node": lambda rw, x: _direct(rw, _erased(rw, x)),
    # a helper node reading a node of another graph
    "reads a foreign node": lambda rw, x: _direct(rw, _foreign()),
    # an existing node rewired to read a later one (through FX's own API)
    "rewires an earlier node": lambda rw, x: _nodes(rw)["aten_sin_default"].replace_input_with(
        _nodes(rw)["x"], _later(rw)),
    # a new node given a name the graph already uses
    "duplicates a name": lambda rw, x: setattr(_direct(rw, x), "name", "aten_sin_default"),
    # a get_attr of an attribute the module lacks
    "missing attribute": lambda rw, x: _get_attr(rw, "fk_no_such_attribute"),
}


def _erased(rw: Any, x: torch.fx.Node) -> torch.fx.Node:
    tmp = rw.call("aten.relu.default", x)
    rw.graph.erase_node(tmp)
    return tmp


def _foreign() -> torch.fx.Node:
    g = torch.fx.Graph()
    p = g.placeholder("elsewhere")
    p.meta["val"] = X
    return p


def _get_attr(rw: Any, name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FX warns about the missing attribute, too
        with rw.graph.inserting_before(rw.insert_before):
            rw.graph.get_attr(name)


def faulty_rule(fault: str | None) -> Rule:
    def build(rw: Any, c: Mapping[str, Any]) -> Any:
        out = rw.call("aten.relu.default", c["x"])
        if fault is not None:
            FAULTS[fault](rw, c["x"])
        return out

    return Rule("relu_relu", op("aten.relu.default", op("aten.relu.default", capture("x"))),
                PythonReplacement(build, frozenset({"x"})))


def _whole_graph_lint(ep: Any, journal: Any) -> None:
    ep.graph_module.graph.lint()  # what apply ran before: the reference


@pytest.mark.parametrize("checker", ["local", "whole graph"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_the_per_match_checks_miss_is_caught_and_undone(
        monkeypatch: pytest.MonkeyPatch, base: Any, fault: str, checker: str) -> None:
    if checker == "whole graph":
        monkeypatch.setattr(rewrite_mod, "lint", _whole_graph_lint)
    ep = fresh(base)
    # apply's own backstop is under test: the replacement is not judged at find time
    ms = find_matches(ep, [faulty_rule(fault)], check_replacements=False)
    assert len(ms.accepted) == 1
    before = snapshot(ep)
    expected = FusionError if checker == "local" else RuntimeError
    with pytest.raises(expected):
        apply_matches(ep, ms.accepted, strict=True)
    assert_unchanged(ep, before)
    res = apply_matches(ep, ms.accepted, strict=False)
    assert not res.applied and [f.during for f in res.failed] == ["lint"]
    assert_unchanged(ep, before)


def test_a_correct_rewrite_passes_both_checks(base: Any) -> None:
    ep = fresh(base)
    res = apply_matches(ep, find_matches(ep, [faulty_rule(None)], check_replacements=False).accepted, strict=True)
    assert len(res.applied) == 1
    ep.graph_module.graph.lint()
    assert outputs_close(run_program(ep, X), Chain()(X))


def test_a_node_rewired_by_a_failing_replacement_is_restored(base: Any) -> None:
    """``replace_input_with`` inside a replacement is journaled (FX's replace hook)."""
    def build(rw: Any, c: Mapping[str, Any]) -> Any:
        nodes = _nodes(rw)
        nodes["aten_add_tensor"].replace_input_with(nodes["aten_sin_default"], c["x"])
        raise RuntimeError("after rewiring")

    rule = Rule("relu_relu", op("aten.relu.default", op("aten.relu.default", capture("x"))),
                PythonReplacement(build, frozenset({"x"})))
    ep = fresh(base)
    ms = find_matches(ep, [rule], check_replacements=False)  # apply's rollback under test
    before = snapshot(ep)
    res = apply_matches(ep, ms.accepted, strict=False)
    assert not res.applied and [f.during for f in res.failed] == ["replacement"]
    assert_unchanged(ep, before)


# ------------------------------------------------------------- fast FakeTensors


def test_a_fresh_fake_tensor_equals_the_constructors() -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from fusionkit.edit import meta_cache

    mode = FakeTensorMode()
    cpu = torch.device("cpu")
    meta_cache.clear()
    for shape, stride in (((2, 3), (3, 1)), ((4, 1, 5), (1, 20, 4)), ((), ())):
        fast = meta_cache._new_fake(mode, torch.empty_strided(shape, stride, device="meta"), cpu)
        slow = FakeTensor(mode, torch.empty_strided(shape, stride, device="meta"), cpu)
        assert type(fast) is type(slow) and fast.fake_mode is mode
        assert fast.__dict__ == slow.__dict__
        assert torch._C._dispatch_keys(fast) == torch._C._dispatch_keys(slow)
        assert (fast.shape, fast.stride(), fast.device, fast.dtype) == (
            slow.shape, slow.stride(), slow.device, slow.dtype)
        with mode:
            y = fast * 2 + slow  # usable under its mode like any fake tensor
        assert isinstance(y, FakeTensor) and y.shape == slow.shape
    # the data-pointer guard is set as the constructor sets it (a strict mode: it raises;
    # the default mode warns once per process, which cannot be observed twice)
    mode._allow_unsafe_data_ptr_access = False
    fast = meta_cache._new_fake(mode, torch.empty(3, device="meta"), cpu)
    slow = FakeTensor(mode, torch.empty(3, device="meta"), cpu)
    assert _data_ptr_guard(fast) == _data_ptr_guard(slow) != "none"
    assert meta_cache._FRESH_STATE[cpu] is not None  # the fast path was taken


def _data_ptr_guard(t: torch.Tensor) -> str:
    """How ``t`` reacts to ``data_ptr()``: the guard a FakeTensor must carry."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            t.data_ptr()
        except Exception as e:
            return f"raises {type(e).__name__}"
    return f"warns {caught[0].category.__name__}" if caught else "none"


def test_an_unknown_fake_tensor_state_keeps_the_constructor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from fusionkit.edit import meta_cache

    meta_cache.clear()
    real = FakeTensor.__new__

    def with_extra(cls: Any, *a: Any, **kw: Any) -> Any:
        out = real(cls, *a, **kw)
        out.some_new_state = 1  # what a newer torch might add
        return out

    monkeypatch.setattr(FakeTensor, "__new__", with_extra)
    mode = FakeTensorMode()
    t = meta_cache._new_fake(mode, torch.empty(2, device="meta"), torch.device("cpu"))
    assert meta_cache._FRESH_STATE[torch.device("cpu")] is None
    assert t.some_new_state == 1  # built by the constructor
    meta_cache.clear()


# ------------------------------------------------------------- node creation


def test_a_call_node_is_created_as_create_node_creates_it() -> None:
    """``_create_call`` skips FX's pytree walk; the node is the same, symbolic args warn."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from fusionkit.edit.builder import _create_call

    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    cat = torch.ops.aten.cat.default
    for args, kwargs in ((([a, b], 0), {}), ((a,), {"dim": [b, 1], "f": 0.5}), ((), {})):
        ref = g.create_node("call_function", cat, args, kwargs, name="cat")
        got = _create_call(g, cat, args, kwargs, "cat")
        assert got.args == ref.args and got.kwargs == ref.kwargs
        assert [type(x) for x in got.args] == [type(x) for x in ref.args]
        assert type(got.kwargs) is type(ref.kwargs)
        assert list(got._input_nodes) == list(ref._input_nodes)
        assert all(got in n.users for n in got._input_nodes)
        assert got.name != ref.name and got.prev is ref  # a name of its own, in order
    sym = ShapeEnv().create_unbacked_symint()
    with pytest.warns(UserWarning, match="Raw SymInt"):
        node = _create_call(g, cat, ((a,), sym), {}, "cat")
    assert node.args == ((a,), sym)
    g.lint()


# ------------------------------------------------------------- new constants


class TwoChains(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(torch.relu(x + 1)), torch.relu(torch.relu(x * 2))


def test_many_new_constants_keep_signature_graph_and_index_in_step() -> None:
    """Adding constants reuses what it learnt (no rescan per add) and stays exact."""
    from torch.export.graph_signature import InputKind

    from fusionkit.edit.builder import ProgramConstants
    from fusionkit.program_inputs import ProgramInputs

    ep = export_edge(Chain(), (X,))
    pc = ProgramConstants(ep)
    values = {f"k{i}": torch.full((i % 3 + 1, 2), float(i)) for i in range(40)}
    nodes = {name: pc.add(name, v) for name, v in values.items()}
    assert pc.add("k7", torch.zeros(1)) is nodes["k7"]  # the same node for the same name
    phs = ep.graph_module.graph.find_nodes(op="placeholder")
    specs = ep.graph_signature.input_specs
    assert [s.arg.name for s in specs] == [p.name for p in phs]
    kinds = [s.kind for s in specs]
    assert kinds.index(InputKind.USER_INPUT) == len(kinds) - 1  # constants before inputs
    fresh_index = ProgramInputs(ep)
    for name, node in nodes.items():
        assert torch.equal(pc.tensor(node), values[name])
        assert fresh_index.constant(node) == pc.inputs.constant(node)
        val = node.meta["val"]
        assert (val.shape, val.stride(), val.dtype) == (values[name].shape,
                                                        values[name].stride(),
                                                        values[name].dtype)
    ep.graph_module.graph.lint()
    assert outputs_close(run_program(ep, X), Chain()(X))


def test_a_constant_added_by_an_undone_replacement_can_be_added_again() -> None:
    """After a rollback the constants' indexes are rebuilt: no reference to undone nodes."""
    calls = [0]

    def build(rw: Any, c: Mapping[str, Any]) -> Any:
        k = rw.constant("fk_shared", torch.ones(4))
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("the first match fails after adding its constant")
        return rw.call("aten.add.Tensor", rw.call("aten.relu.default", c["x"]),
                       rw.call("aten.mul.Tensor", k, 0.0))

    rule = Rule("relu_relu", op("aten.relu.default", op("aten.relu.default", capture("x"))),
                PythonReplacement(build, frozenset({"x"})))
    x = torch.randn(4)
    ep = export_edge(TwoChains(), (x,))
    ms = find_matches(ep, [rule], check_replacements=False)  # apply's rollback under test
    assert len(ms.accepted) == 2
    calls[0] = 0  # the finder may build a returned value's replacement in scratch: count apply's
    res = apply_matches(ep, ms.accepted, strict=False)
    assert len(res.applied) == 1 and [f.during for f in res.failed] == ["replacement"]
    shared = [n for n in ep.graph_module.graph.nodes if n.name.startswith("fk_shared")]
    assert len(shared) == 1 and not shared[0]._erased and shared[0].users
    assert shared[0].name in ep.constants
    ep.graph_module.graph.lint()
    assert outputs_close(run_program(ep, x), TwoChains()(x))


def test_a_new_constants_fake_value_equals_from_tensor() -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from fusionkit.edit import meta_cache

    mode = FakeTensorMode()
    for v in (torch.ones(3, 4), torch.arange(6, dtype=torch.int8).reshape(2, 3),
              torch.zeros(()), torch.ones(4, 2).t(), torch.ones(5)[1:]):
        got = meta_cache.fake_constant(v, mode)
        ref = mode.from_tensor(v, static_shapes=True)
        assert isinstance(got, FakeTensor) and got.fake_mode is mode
        assert (got.shape, got.stride(), got.dtype, got.device, got.storage_offset(),
                got.requires_grad) == (ref.shape, ref.stride(), ref.dtype, ref.device,
                                       ref.storage_offset(), ref.requires_grad)


def test_a_search_computes_each_tensors_metadata_key_once() -> None:
    """Inside ``keys_remembered`` (what ``find_matches`` decides in) a tensor's key is
    computed once and is the key computed outside; a new tensor is never given the key
    of an earlier one whose id it took, and the memo ends with the outermost scope."""
    from fusionkit.edit import meta_cache

    a = torch.empty(2, 3)
    outside = meta_cache.metadata_key(a)
    with meta_cache.keys_remembered():
        assert meta_cache.metadata_key(a) == outside
        with meta_cache.keys_remembered():  # nested: the same memo
            assert meta_cache._remembered is not None and id(a) in meta_cache._remembered
        memo = meta_cache._remembered
        assert memo is not None
        # a forged entry for a's id is served only to a itself
        memo[id(a)] = (a, ("T", "forged"))
        assert meta_cache.metadata_key(a) == ("T", "forged")
        b = torch.empty(4)
        memo[id(b)] = (a, ("T", "forged"))  # another tensor held under b's id
        assert meta_cache.metadata_key(b) == meta_cache.metadata_key(torch.empty(4)) != (
            "T", "forged")
    assert meta_cache._remembered is None
    assert meta_cache.metadata_key(a) == outside
