"""Every graph walk of the engine is total: it handles every kind of FX node target.

Programs are built to hold each kind of target torch.export and ExecuTorch put in
a graph — ATen and edge overloads, ``operator.getitem``, higher-order operators
(``cond``, ``while_loop``, ``wrap_with_set_grad_enabled``, ``auto_functionalized``,
``executorch_call_delegate``), a mutating custom op, a Python function without a
schema, ``get_attr`` nodes and SymInt arithmetic (``sym_size``, ``operator.mul``).
On every node of each, every walk (op identity, program inputs, constant folding)
answers or refuses with a reason, and the finder — the built-in rules plus probe
rules generated from the graph's own ops, with folding constraints and
multi-output parts — never raises (the suite runs in strict mode).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.export import ExportedProgram
from torch.fx import Node

from fusionkit import (
    CASTS,
    PrepackableConstant,
    Rule,
    capture,
    find_matches,
    op,
    ref,
    replace_with,
    through,
)
from fusionkit.check.constraints import constant_fold_sources
from fusionkit.check.folding import FoldError, evaluate_constant
from fusionkit.find.finder import DECLINE_STEPS
from fusionkit.match.pattern import also, outputs
from fusionkit.passes import rule_set
from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import (
    impurity,
    is_assertion,
    is_edge_target,
    is_python_operator,
    op_key,
    schema_of,
    target_name,
    writes_to,
)


class Cond(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x * self.w, lambda x: x + self.w, (x,))


class While(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.while_loop import while_loop

        i = torch.zeros((), dtype=torch.int64)
        return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2), (i, x))[1]


class NoGrad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = x.sin()
        return y + 1


@torch.library.custom_op("fusionkit_test::accumulate", mutates_args=("buf",))
def accumulate(buf: torch.Tensor, x: torch.Tensor) -> None:
    buf.add_(x)


@accumulate.register_fake
def _(buf: torch.Tensor, x: torch.Tensor) -> None:
    return None


class Mutates(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        accumulate(self.buf, x)
        return self.buf * x


class Chunk(nn.Module):
    """A weight computed from constants through chunk -> getitem (AdaLN-style)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = (1 + self.w).chunk(2)
        return x * scale + shift


class Sym(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        return x.reshape(n * 4) * (n + 1)


def _python_double(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def _with_python_function() -> ExportedProgram:
    """A call_function node whose target is a plain Python function (no schema)."""
    ep = torch.export.export(Chunk(), (torch.randn(4),))
    graph = ep.graph_module.graph
    mul = next(n for n in graph.nodes if op_key(n.target) == "aten.mul.Tensor")
    with graph.inserting_after(mul):
        fn = graph.call_function(_python_double, (mul,))
    mul.replace_all_uses_with(fn, delete_user_cb=lambda u: u is not fn)
    fn.meta["val"] = mul.meta["val"]
    ep.graph_module.recompile()
    return ep


def _delegated() -> ExportedProgram:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(2, 4),))
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    return prog.exported_program()


def _edge(model: nn.Module, *inputs: torch.Tensor) -> ExportedProgram:
    from executorch.exir import to_edge

    return to_edge(torch.export.export(model.eval(), inputs)).exported_program()


class AdaLNLike(nn.Module):
    """The structure of diffusers' AdaLayerNormContinuous(norm_type="rms_norm"): an RMSNorm
    without weight, scaled by ``1 + scale`` where scale and shift are chunks of a linear
    of the conditioning embedding (chunk -> getitem of a computed tensor)."""

    def __init__(self, d: int = 16, cond: int = 8) -> None:
        super().__init__()
        self.linear = nn.Linear(cond, 2 * d)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(torch.nn.functional.silu(emb)).chunk(2, dim=1)
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return normed * (1 + scale)[:, None, :] + shift[:, None, :]


ADALN_INPUTS = (torch.randn(1, 4, 16), torch.randn(1, 8))


X4 = (torch.randn(4),)
KINDS: dict[str, Callable[[], ExportedProgram]] = {
    "cond": lambda: torch.export.export(Cond(), X4),
    "while_loop": lambda: torch.export.export(While(), X4),
    "wrap_with_set_grad_enabled": lambda: torch.export.export(NoGrad(), X4),
    "mutating_custom_op": lambda: torch.export.export(Mutates(), X4),
    "auto_functionalized": lambda: torch.export.export(Mutates(), X4).run_decompositions(),
    "chunk_getitem_aten": lambda: torch.export.export(Chunk(), X4),
    "chunk_getitem_edge": lambda: _edge(Chunk(), *X4),
    "symint": lambda: torch.export.export(
        Sym(), (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("n", min=2)},)),
    "python_function": _with_python_function,
    "executorch_call_delegate": _delegated,
    "adaln_rms_edge": lambda: _edge(AdaLNLike().eval(), *ADALN_INPUTS),
}

#: targets each program must really contain (so the test covers what it claims)
EXPECTED = {
    "cond": "cond", "while_loop": "while_loop",
    "wrap_with_set_grad_enabled": "wrap_with_set_grad_enabled",
    "mutating_custom_op": "fusionkit_test.accumulate.default",
    "auto_functionalized": "auto_functionalized", "chunk_getitem_aten": "operator.getitem",
    "chunk_getitem_edge": "operator.getitem", "symint": "aten.sym_size.int",
    "python_function": "_python_double", "executorch_call_delegate": "executorch_call_delegate",
    "adaln_rms_edge": "operator.getitem",
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def program(request: pytest.FixtureRequest) -> tuple[str, ExportedProgram]:
    return request.param, KINDS[request.param]()


def _probe_rules(ep: ExportedProgram) -> list[Rule]:
    """Rules rooted at every op of the graph, capturing (behind casts) each argument,
    folding each tensor argument, and a second output found downstream of it."""
    rules: list[Rule] = []
    seen: set[str] = set()
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    keys = sorted({k for n in nodes if (k := op_key(n.target)) is not None})
    for n in nodes:
        key = op_key(n.target)
        if key is None or key in seen or not n.args:
            continue
        seen.add(key)
        args = [through(CASTS, capture(f"a{i}")) for i in range(len(n.args))]
        folds = [PrepackableConstant(f"a{i}", fold=True) for i, a in enumerate(n.args)
                 if isinstance(a, Node)]
        primary = op(key, *args, commutative=False, strict_defaults=False)
        rules.append(Rule(f"probe_{len(rules)}", primary, replace_with("aten.relu.default",
                                                                         ref("a0")), folds))
        if isinstance(n.args[0], Node):
            other = op(keys, capture("b0"), commutative=False, strict_defaults=False)
            multi = outputs(op(key, *args, commutative=False, strict_defaults=False),
                            also("o", other, near="a0"))
            rules.append(Rule(f"probe_{len(rules)}", multi,
                              replace_with("aten.relu.default", ref("a0"))))
    return rules


def test_program_holds_the_target_kind(program: tuple[str, ExportedProgram]) -> None:
    kind, ep = program
    names = {target_name(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(EXPECTED[kind] in name for name in names), sorted(names)


def test_identity_walks_answer_for_every_node(program: tuple[str, ExportedProgram]) -> None:
    _, ep = program
    inputs = ProgramInputs(ep)
    for n in ep.graph.nodes:
        assert isinstance(target_name(n.target), str) and target_name(n.target)
        key = op_key(n.target)
        assert (key is None) == (schema_of(n.target) is None) or n.op != "call_function"
        is_assertion(n)
        is_edge_target(n.target)
        assert isinstance(inputs.describe(n), str)
        inputs.kind_of(n)
        inputs.constant(n)
        inputs.is_user_input(n)
        inputs.is_mutable_buffer(n)
        inputs.is_written(n)
        why = impurity(n.target)
        assert why is None or why.startswith(f"({target_name(n.target)}), which ")
        writes_to(n, set(n.all_input_nodes))
        is_python_operator(n.target)


def test_folding_answers_or_refuses_with_a_reason(program: tuple[str, ExportedProgram]) -> None:
    _, ep = program
    inputs = ProgramInputs(ep)
    folded = 0
    for n in ep.graph.nodes:
        sources, why = constant_fold_sources(n, inputs)
        if sources is None:
            assert why, n.format_node()
            with pytest.raises(FoldError):
                evaluate_constant(n, inputs)
            continue
        if n.op == "placeholder" or not isinstance(n.meta.get("val"), torch.Tensor):
            continue
        try:
            value = evaluate_constant(n, inputs)
        except FoldError as e:  # refused with a reason, never another exception
            assert str(e)
            continue
        folded += 1
        assert value.dtype == n.meta["val"].dtype and value.shape == n.meta["val"].shape
    if program[0].startswith("chunk_getitem"):
        assert folded >= 3  # 1 + w, and both chunks through getitem


def test_finder_never_raises_on_any_target(program: tuple[str, ExportedProgram]) -> None:
    kind, ep = program
    rules = [*rule_set("builtin"), *_probe_rules(ep)]
    # strict: any exception would propagate. The probe rules' replacements are wrong on
    # purpose (relu for any op): building them, as find_matches does by default, would
    # rightly refuse them; the matching is what is under test here
    ms = find_matches(ep, rules, strict=True, check_replacements=False)
    for d in ms.declined:
        assert d.step in DECLINE_STEPS or d.step in {c.kind for r in rules for c in r.constraints}
        assert d.step != "error" and d.reason
    if kind.startswith("chunk_getitem"):  # x * scale folds scale (a getitem of a chunk)
        assert any(m.folds for m in ms.accepted)


def test_seen_failure_1_adaln_rms_norm_lowers_for_vulkan() -> None:
    """Seen failure #1 (issue 14): AdaLN-style rms_norm lowered with transform_passes() +
    VulkanPartitioner() died with IndexError in constant_fold_sources (an op-name split on
    operator.getitem). It lowers now, the modulated norm declined with a reason, and the
    program computes what eager does."""
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes

    torch.manual_seed(0)
    model = AdaLNLike().eval()
    passes = transform_passes()
    prog = to_edge_transform_and_lower(torch.export.export(model, ADALN_INPUTS),
                                       transform_passes=passes,
                                       partitioner=[VulkanPartitioner()])
    assert prog.exported_program().graph_module is not None
    ep = _edge(model, *ADALN_INPUTS)
    ms = find_matches(ep, rule_set("builtin"), strict=True)
    (d,) = [d for d in ms.declined if d.rule == "rms_norm"]
    assert d.step == "prepackable_constant" and "user input" in d.reason, str(d)


def test_operator_functions_fold_but_other_callables_do_not() -> None:
    ep = _with_python_function()
    inputs = ProgramInputs(ep)
    (py,) = [n for n in ep.graph.nodes if n.target is _python_double]
    sources, why = constant_fold_sources(py, inputs)
    assert sources is None and "_python_double" in why
    items = [n for n in ep.graph.nodes if n.target is operator.getitem]
    assert items and all(constant_fold_sources(n, inputs)[0] is not None for n in items)


class _Writes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2))

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        y.mul_(2)
        return torch.relu(x) + torch.rand_like(x) + self.count + y + z


def test_the_program_writes_buffers_and_inputs_it_mutates() -> None:
    ep = torch.export.export(_Writes(), (torch.ones(2), torch.ones(2), torch.ones(2)))
    inputs = ProgramInputs(ep)
    written = {n.name for n in ep.graph.nodes if inputs.is_written(n)}
    names = {s.arg.name: s.target or s.arg.name for s in ep.graph_signature.input_specs}
    assert {names[n] for n in written} == {"count", "y"}, written


def test_an_in_place_op_writes_only_its_written_argument() -> None:
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    add_ = g.call_function(torch.ops.aten.add_.Tensor, (a, b))
    pure = g.call_function(torch.ops.aten.add.Tensor, (a, b))
    g.output((add_, pure))
    assert writes_to(add_, {a}) and not writes_to(add_, {b})
    assert not writes_to(pure, {a, b})


@pytest.mark.parametrize(("target", "verdict"), [
    (torch.ops.aten.relu.default, None),
    (torch.ops.aten.rand_like.default, "not deterministic"),
    (torch.ops.aten.empty.memory_format, "not deterministic"),
    (torch.ops.aten.add_.Tensor, "mutates its inputs"),
    (operator.getitem, "not an operator with a schema"),
])
def test_one_verdict_on_pure_deterministic_ops(target: object, verdict: str | None) -> None:
    why = impurity(target)
    assert (why is None) if verdict is None else (why is not None and verdict in why), why


@pytest.mark.parametrize(("target", "python_operator"), [
    (operator.getitem, True),
    (operator.add, True),
    (torch.ops.aten.add.Tensor, False),
    (math.sqrt, False),
    (lambda x: x, False),
])
def test_python_operators_are_told_from_other_schemaless_calls(
    target: object, python_operator: bool
) -> None:
    assert is_python_operator(target) is python_operator
    # a Python operator folds; any other call without a schema is refused
    from fusionkit.check.folding import _target_refusal

    assert (_target_refusal(target) is None) is (python_operator or schema_of(target) is not None)
