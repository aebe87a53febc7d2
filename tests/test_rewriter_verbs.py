"""The Rewriter's graph-editing verbs, for real and under the probe.

Each verb is run by a small rule on a small exported program: applied for real
(``apply_matches``), the program changes as the verb says and still computes what eager
does; built in the probe's scratch graph (``build_in_scratch``), the same replacement
creates the same ops and the program is untouched. A replacement that fails after the
verbs ran leaves the program exactly as it was. And no replacement asks which graph it
builds into: the sources hold no such test, and one function writes a program's private
signature attributes.
"""

from __future__ import annotations

import ast
import copy
import operator
import re
from pathlib import Path
from typing import Any

import torch
from models import export_edge, outputs_close, rand_inputs, run_program
from torch import nn
from torch.export.graph_signature import InputKind

from fusionkit import (
    PrepackableConstant,
    PythonReplacement,
    Rule,
    any_value,
    capture,
    find_matches,
    lit,
    op,
)
from fusionkit.apply.rewrite import apply_matches
from fusionkit.check.constraints import CheckContext
from fusionkit.edit.probe import ProbeRewriter, build_in_scratch
from fusionkit.program_inputs import ProgramInputs
from fusionkit.targets import op_key

ROOT = Path(__file__).resolve().parents[1]

CONV = "aten.convolution.default"


# ------------------------------------------------------------------- programs


class ConvScale(nn.Module):
    """A convolution times a per-channel constant (folded into its weight and bias)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(2, 3, 3)
        self.register_buffer("scale", torch.rand(1, 3, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * self.scale


class MaxValues(nn.Module):
    """``max(x, dim)``'s values, returned by the program (a getitem is the output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=1)[0]


class TwoScales(nn.Module):
    """One constant read by two products (two matches of one rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("s", torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x * self.s), torch.relu(y * self.s)


class ConstScale(nn.Module):
    """A product with a constant read once (the constant can be replaced by a copy)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.register_buffer("s", torch.rand(4) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


def _conv() -> Any:
    return op(CONV, capture("x"), capture("w"), capture("b"), any_value("stride"),
              any_value("padding"), any_value("dilation"), lit(False),
              any_value("output_padding"), any_value("groups")).bind("conv")


def scale_conv(rw: Any, conv: Any, x: Any, w: Any, b: Any, s: Any, stride: Any, padding: Any,
               dilation: Any, output_padding: Any, groups: Any) -> Any:
    """fresh_constant, move_before and edit: the convolution reads a folded weight and bias."""
    scale = rw.tensor(s).reshape(-1)
    w_new = rw.fresh_constant(f"{w.name}_scaled", rw.tensor(w) * scale.reshape(-1, 1, 1, 1))
    rw.move_before(w_new, w)
    b_new = rw.fresh_constant(f"{b.name}_scaled", rw.tensor(b) * scale)
    rw.move_before(b_new, w)
    args = list(conv.args)
    args[1], args[2] = w_new, b_new
    return rw.edit(conv, tuple(args))


def conv_scale_rule(replacement: Any = scale_conv) -> Rule:
    return Rule("verbs_conv_scale", op("aten.mul.Tensor", _conv(), capture("s")),
                PythonReplacement(replacement),
                constraints=[PrepackableConstant(n) for n in ("w", "b", "s")])


def values_only(rw: Any, m: Any, x: Any, dim: Any) -> Any:
    """insert_at, reroute and erase: ``amax`` in place of ``max.dim``, its getitems rerouted."""
    rw.insert_at(m)
    new = rw.call("aten.amax.default", x, [dim])
    for item in list(rw.root.users):
        rw.reroute(item, new)
        rw.erase(item)
    return rw.root


def max_values_rule() -> Rule:
    return Rule("verbs_values_only",
                op("aten.max.dim", capture("x"), capture("dim"), strict_defaults=False).bind("m"),
                PythonReplacement(values_only))


def copied_scale(rw: Any, x: Any, s: Any) -> Any:
    """Two fresh constants of one name in one replacement, and one per match."""
    a = rw.fresh_constant("s_copy", rw.tensor(s))
    b = rw.fresh_constant("s_copy", rw.tensor(s) * 0.0)
    assert a is not b
    return rw.call("aten.add.Tensor", rw.call("aten.mul.Tensor", x, a),
                   rw.call("aten.mul.Tensor", x, b))


def copied_scale_rule() -> Rule:
    return Rule("verbs_copied_scale", op("aten.mul.Tensor", capture("x"), capture("s")),
                PythonReplacement(copied_scale), constraints=[PrepackableConstant("s")])


def repack(rw: Any, x: Any, s: Any) -> Any:
    """move_before, reroute and erase on a placeholder: the constant is replaced by a copy
    that stands where it stood, and goes with its signature entry and tensor."""
    copy_ = rw.fresh_constant(f"{s.name}_packed", rw.tensor(s).clone())
    rw.move_before(copy_, s)
    rw.reroute(s, copy_)  # the product (the match's root) reads the copy
    rw.erase(s)
    return rw.call("aten.mul.Tensor", x, copy_)


def repack_rule(replacement: Any = repack) -> Rule:
    return Rule("verbs_repack", op("aten.mul.Tensor", capture("x"), capture("s")),
                PythonReplacement(replacement), constraints=[PrepackableConstant("s")])


# ------------------------------------------------------------------- helpers


def _apply(ep: Any, rule: Rule) -> Any:
    found = find_matches(ep, [rule])
    assert found.accepted, [d.reason for d in found.declined]
    return apply_matches(ep, found.accepted, strict=True)


def _probe(ep: Any, rule: Rule) -> list[ProbeRewriter]:
    """Every accepted match's replacement, built in the probe."""
    found = find_matches(ep, [rule])
    assert found.accepted
    inputs = ProgramInputs(ep)
    out = []
    for m in found.accepted:
        ctx = CheckContext(ep, inputs, m.root, m.captures, rule=rule.name)
        out.append(build_in_scratch(rule.replacement, ctx, rule.name)[0])
    return out


def _state(ep: Any) -> tuple[Any, ...]:
    """What a probe must never change and a rollback must restore, by identity and order."""
    sig = ep.graph_signature
    return (ep.graph_module, sig, list(sig.input_specs), list(sig.output_specs),
            dict(ep.state_dict), dict(ep.constants),
            [(n, n.name, n.args, n.kwargs, dict(n.meta)) for n in ep.graph_module.graph.nodes])


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if a[0] is not b[0] or a[1] is not b[1] or a[2] != b[2] or a[3] != b[3]:
        return False
    if list(a[4]) != list(b[4]) or any(a[4][k] is not b[4][k] for k in a[4]):
        return False
    if list(a[5]) != list(b[5]) or any(a[5][k] is not b[5][k] for k in a[5]):
        return False
    return len(a[6]) == len(b[6]) and all(
        x[0] is y[0] and x[1:4] == y[1:4] and x[4].keys() == y[4].keys()
        for x, y in zip(a[6], b[6], strict=True))


def _placeholders_match_specs(ep: Any) -> bool:
    names = [p.name for p in ep.graph_module.graph.find_nodes(op="placeholder")]
    return names == [getattr(s.arg, "name", None) for s in ep.graph_signature.input_specs]


def _created_ops(ep: Any, rule: str) -> list[str]:
    return [str(op_key(n.target)) for n in ep.graph_module.graph.nodes
            if n.op == "call_function" and n.meta.get("fusionkit_rule") == rule]


# ------------------------------------------------------------------- the verbs


def test_fresh_constants_move_beside_their_source_and_the_conv_is_edited_in_place() -> None:
    x = rand_inputs((1, 2, 6, 6))
    model = ConvScale().eval()
    ep = export_edge(model, x)
    conv = next(n for n in ep.graph_module.graph.nodes if op_key(n.target) == CONV)
    w = conv.args[1]
    res = _apply(ep, conv_scale_rule())
    assert res.modified and res.new_roots == [conv]  # the same node, edited in place
    assert not conv._erased and conv.args[1] is not w
    placeholders = list(ep.graph_module.graph.find_nodes(op="placeholder"))
    names = [p.name for p in placeholders]
    # right where the source weight was: the folded weight, then the folded bias
    i = names.index(conv.args[1].name)
    assert names[i + 1] == conv.args[2].name
    assert _placeholders_match_specs(ep)
    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs}
    assert kinds[conv.args[1].name] == kinds[conv.args[2].name] == InputKind.CONSTANT_TENSOR
    assert "aten.mul.Tensor" not in [str(op_key(n.target)) for n in
                                     ep.graph_module.graph.nodes if n.op == "call_function"]
    assert outputs_close(run_program(ep, *x), model(*x))


def test_the_probe_leaves_the_program_alone_and_its_edited_conv_stands_for_itself() -> None:
    ep = export_edge(ConvScale().eval(), rand_inputs((1, 2, 6, 6)))
    conv = next(n for n in ep.graph_module.graph.nodes if op_key(n.target) == CONV)
    before = _state(ep)
    rule = conv_scale_rule()
    found = find_matches(ep, [rule])
    (m,) = found.accepted
    rw, built = build_in_scratch(rule.replacement,
                                 CheckContext(ep, ProgramInputs(ep), m.root, m.captures), "r")
    assert _same(before, _state(ep))
    assert built is conv and list(rw.ops()) == []  # the conv, as the edit leaves it
    folded = [n for n in rw.graph.nodes if n.op == "placeholder" and "_scaled" in n.name]
    assert len(folded) == 2  # the folded constants, in the scratch graph only


def test_a_rerouted_program_output_keeps_its_output_spec() -> None:
    x = rand_inputs((3, 5))
    model = MaxValues().eval()
    ep = export_edge(model, x)
    probed = _probe(copy.deepcopy(ep), max_values_rule())
    res = _apply(ep, max_values_rule())
    (amax,) = [n for n in ep.graph_module.graph.nodes if op_key(n.target) == "aten.amax.default"]
    assert res.modified
    assert ep.graph_module.graph.output_node().args[0][0] is amax
    (spec,) = ep.graph_signature.output_specs
    assert spec.arg.name == amax.name
    assert not any(n.target is operator.getitem
                   for n in ep.graph_module.graph.nodes)
    # the probe created what the rewrite created, in the same order
    assert [str(op_key(n.target)) for n in probed[0].ops()] == _created_ops(ep, "verbs_values_only")
    assert outputs_close(run_program(ep, *x), model(*x))


def test_a_fresh_constant_never_reuses_a_name() -> None:
    x, y = rand_inputs((2, 4), (2, 4))
    model = TwoScales().eval()
    ep = export_edge(model, (x, y))
    probed = _probe(ep, copied_scale_rule())
    for rw in probed:  # under the probe too: two calls, two constants
        made = [n for n in rw.graph.nodes if n.op == "placeholder" and n.name.startswith("s_copy")]
        assert len(made) == 2
    _apply(ep, copied_scale_rule())
    made = [n for n in ep.graph_module.graph.find_nodes(op="placeholder")
            if str(n.meta.get("requested_name", "")).startswith("s_copy")]
    assert len(made) == 4  # two per match, none found by name
    assert len({n.meta["requested_name"] for n in made}) == 4
    assert len({n.name for n in made}) == 4
    assert _placeholders_match_specs(ep)
    assert outputs_close(run_program(ep, x, y), model(x, y))


def test_an_erased_placeholder_goes_with_its_spec_and_tensor() -> None:
    x = rand_inputs((2, 4))
    ep = export_edge(ConstScale().eval(), x)
    (s,) = [p for p in ep.graph_module.graph.find_nodes(op="placeholder")
            if p.name != "x"]
    target = next(sp.target for sp in ep.graph_signature.input_specs if sp.arg.name == s.name)
    before = _state(ep)
    (rw,) = _probe(ep, repack_rule())
    assert _same(before, _state(ep))  # the probe erased nothing
    assert [str(op_key(n.target)) for n in rw.ops()] == ["aten.mul.Tensor"]
    _apply(ep, repack_rule())
    assert s._erased
    assert all(sp.arg.name != s.name for sp in ep.graph_signature.input_specs)
    assert target not in ep.state_dict and target not in ep.constants
    assert _placeholders_match_specs(ep)
    assert outputs_close(run_program(ep, *x), ConstScale().eval()(*x))


def test_a_replacement_failing_after_the_verbs_leaves_the_program_as_it_was() -> None:
    """The journal undoes each verb: a moved placeholder, a rerouted and an erased node,
    the signature entries they changed, the tensors they dropped."""

    class Boom(RuntimeError):
        pass

    armed = [False]  # raise while applying, not while the matches are decided

    def boom() -> None:
        if armed[0]:
            raise Boom

    def failing_repack(rw: Any, x: Any, s: Any) -> Any:
        out = repack(rw, x, s)
        boom()
        return out

    def failing_values(rw: Any, m: Any, x: Any, dim: Any) -> Any:
        out = values_only(rw, m, x, dim)
        boom()
        return out

    def failing_scale(rw: Any, conv: Any, x: Any, w: Any, b: Any, s: Any, stride: Any,
                      padding: Any, dilation: Any, output_padding: Any, groups: Any) -> Any:
        out = scale_conv(rw, conv, x, w, b, s, stride, padding, dilation, output_padding,
                         groups)
        rw.move_before(b, w)  # a placeholder the program had: moved back by the rollback
        boom()
        return out

    cases = [(ConstScale(), (rand_inputs((2, 4))), repack_rule(failing_repack)),
             (MaxValues(), rand_inputs((3, 5)),
              Rule("verbs_values_only", max_values_rule().pattern,
                   PythonReplacement(failing_values))),
             (ConvScale(), rand_inputs((1, 2, 6, 6)), conv_scale_rule(failing_scale))]
    for model, inputs, rule in cases:
        ep = export_edge(model.eval(), inputs)
        before = _state(ep)
        armed[0] = False
        found = find_matches(ep, [rule])
        armed[0] = True
        res = apply_matches(ep, found.accepted, strict=False)
        assert not res.modified and len(res.failed) == 1
        assert isinstance(res.failed[0].error, Boom)
        assert _same(before, _state(ep)), rule.name
        assert _placeholders_match_specs(ep)
        assert outputs_close(run_program(ep, *inputs), model(*inputs))


# ------------------------------------------------------------------- the sources


_GUARD = re.compile(r"\.graph\s+is\s+(not\s+)?(rw\.graph|\w+\.graph|rw\.ep\.graph_module\.graph)"
                    r"|\brw\.graph\s+is\b|graph\s+is\s+(not\s+)?ep\.graph_module\.graph")


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def test_no_replacement_asks_which_graph_it_builds_into() -> None:
    """A replacement uses the Rewriter's verbs, each correct under the probe: none tests
    whether it builds into the program or a scratch graph."""
    found = [f"{p.relative_to(ROOT)}:{i}" for p in _sources("passes", "backends")
             for i, line in enumerate(p.read_text().splitlines(), 1) if _GUARD.search(line)]
    assert found == []


def _private_program_writes(tree: ast.AST) -> list[int]:
    """Lines assigning ``x._graph_signature``, ``x._graph_module`` or a spec list
    (``x.input_specs = ...`` / ``x.output_specs = ...``)."""
    out = []
    for node in ast.walk(tree):
        targets: list[Any] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Subscript):
                t = t.value  # x.input_specs[:] = ...
            if isinstance(t, ast.Attribute) and t.attr in (
                    "_graph_signature", "_graph_module", "input_specs", "output_specs"):
                out.append(node.lineno)
    return out


def test_one_place_changes_a_programs_signature() -> None:
    """Only ``fusionkit/edit/signature.py`` assigns a program's signature, graph module or
    spec lists (the lists in place; the private attributes only in ``reattach``)."""
    one_place = ROOT / "fusionkit" / "edit" / "signature.py"
    found = [f"{p.relative_to(ROOT)}:{line}"
             for p in _sources("fusionkit", "passes", "backends") if p != one_place
             for line in _private_program_writes(ast.parse(p.read_text()))]
    assert found == []
    tree = ast.parse(one_place.read_text())
    private = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute)
               and n.attr in ("_graph_signature", "_graph_module") and isinstance(n.ctx, ast.Store)]
    owners = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
              and any(p in ast.walk(f) for p in private)}
    assert owners == {"reattach"}


def test_a_computed_constant_is_computed_when_the_program_gets_it_only() -> None:
    """``Computed``: the probe types the new constant from its announced shape and dtype
    and never computes it (a repacked weight over every weight of an LLM, per probe); the
    real rewrite computes it once; a value unlike its announcement is a rule bug, raised."""
    from fusionkit.edit.builder import Computed, FusionError

    calls: list[int] = []

    def doubling(shape: tuple[int, ...]) -> Any:
        def doubled(rw: Any, x: Any, s: Any) -> Any:
            def compute() -> torch.Tensor:
                calls.append(1)
                return rw.tensor(s) * 2.0

            c = rw.fresh_constant(f"{s.name}_doubled", Computed(shape, torch.float32, compute))
            return rw.call("aten.mul.Tensor", x, c)

        return doubled

    x = rand_inputs((2, 4))
    model = ConstScale().eval()
    rule = Rule("verbs_computed", op("aten.mul.Tensor", capture("x"), capture("s")),
                PythonReplacement(doubling((4,))), constraints=[PrepackableConstant("s")])
    ep = export_edge(model, x)
    (rw,) = _probe(ep, rule)
    assert calls == []
    made = [n for n in rw.graph.nodes if n.op == "placeholder" and n.name.endswith("_doubled")]
    assert [tuple(n.meta["val"].shape) for n in made] == [(4,)]
    _apply(ep, rule)
    assert len(calls) == 1
    assert outputs_close(run_program(ep, *x), model(*x) * 2.0)  # x * (2 s)

    ep = export_edge(model, x)
    found = find_matches(ep, [Rule("verbs_computed_wrong",
                                   op("aten.mul.Tensor", capture("x"), capture("s")),
                                   PythonReplacement(doubling((1,))),
                                   constraints=[PrepackableConstant("s")])])
    before = _state(ep)
    try:
        apply_matches(ep, found.accepted, strict=True)
    except FusionError as e:
        assert "announced (1,)" in str(e)
    else:
        raise AssertionError("a computed constant unlike its announcement was accepted")
    assert _same(before, _state(ep))  # nothing half-applied


class SharedScale(torch.nn.Module):
    """Two multiplies by one constant: two matches sharing one source weight."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("s", torch.tensor([0.5, 1.0, 2.0, 4.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.s).relu() + (x.sin() * self.s)


def test_a_computed_constant_shared_by_two_matches_is_computed_once() -> None:
    """The second match asking for the same name gets the first's placeholder, and its
    ``Computed`` is not run again (a repacked weight computed twice for nothing)."""
    from fusionkit.edit.builder import Computed

    calls: list[int] = []

    def doubled(rw: Any, x: Any, s: Any) -> Any:
        def compute() -> torch.Tensor:
            calls.append(1)
            return rw.tensor(s) * 2.0

        c = rw.constant(f"{s.name}_doubled", Computed((4,), torch.float32, compute))
        return rw.call("aten.mul.Tensor", x, c)

    x = rand_inputs((2, 4))
    model = SharedScale().eval()
    rule = Rule("verbs_computed_shared", op("aten.mul.Tensor", capture("x"), capture("s")),
                PythonReplacement(doubled), constraints=[PrepackableConstant("s")])
    ep = export_edge(model, x)
    found = find_matches(ep, [rule])
    assert len(found.accepted) == 2
    apply_matches(ep, found.accepted, strict=True)
    assert len(calls) == 1
    made = [n for n in ep.graph_module.graph.nodes
            if n.op == "placeholder" and n.name.endswith("_doubled")]
    assert len(made) == 1 and len(made[0].users) == 2
    expect = (x[0] * model.s * 2).relu() + x[0].sin() * model.s * 2
    assert outputs_close(run_program(ep, *x), expect)
