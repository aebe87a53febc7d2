"""A corpus of replacement ops, judged at find time and then tried for real (issue 23).

One user rule per op: ``relu(x)`` replaced by ``op(x)``. Core ops with a
portable kernel, non-core ops (with and without an out variant), an op whose
out variant has no kernel in the runtime, a replacement returning the wrong
dtype, a Python number where the edge dialect wants a tensor, a delegate-only
op. Both directions are proved: every accepted match lowers, loads on the
portable runtime and computes what eager does; every declined one, forced in
anyway (the search told not to build the replacement), really fails —
``to_edge``'s verifier, ``to_executorch()`` or the runtime's load — so no
decline is a false alarm.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from fusionkit import FusionPass, Rule, capture, find_matches, op, ref, replace_with, why_not
from fusionkit.apply.rewrite import apply_matches

X = torch.rand(2, 5) + 0.1


class ReluPlusOne(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1


#: op -> what it computes, for the ops expected to be accepted
RUNNABLE = {
    "aten.sigmoid.default": torch.sigmoid,
    "aten.tanh.default": torch.tanh,
    "aten.gelu.default": torch.nn.functional.gelu,
    "aten.hardtanh.default": torch.nn.functional.hardtanh,
    "aten.erf.default": torch.erf,
    "aten.reciprocal.default": torch.reciprocal,
}
#: op -> the phrase the decline must carry
NOT_RUNNABLE = {
    "aten.silu.default": "not in the core ATen opset",       # no aten::silu.out kernel either
    "aten.hardswish.default": "not in the core ATen opset",
    "aten.square.default": "not in the core ATen opset",
    "aten.relu6.default": "has no out variant",
    "aten.selu.default": "has no out variant",
    "aten.alias.default": "has no out variant",              # core ATen, but no out variant
}


def _rule(target: str, *extra: Any) -> Rule:
    return Rule(f"relu_to_{target.split('.')[1]}", op("aten.relu.default", capture("x")),
                replace_with(target, ref("x"), *extra))


@pytest.fixture(scope="module")
def edge_base() -> Any:
    from executorch.exir import to_edge

    return to_edge(torch.export.export(ReluPlusOne().eval(), (X,))).exported_program()


@pytest.fixture
def edge(edge_base: Any) -> Any:
    """A fresh EdgeProgramManager (passes and to_executorch change their program in place)."""
    from executorch.exir import EdgeProgramManager

    return EdgeProgramManager({"forward": copy.deepcopy(edge_base)})


def _runs(ep: Any) -> torch.Tensor:
    """Serialize ``ep`` as the user's pipeline would (verified edge program, to_executorch),
    load it on the portable runtime, run it."""
    from executorch.exir import EdgeProgramManager
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    et = EdgeProgramManager({"forward": copy.deepcopy(ep)}).to_executorch()
    out: torch.Tensor = _load_for_executorch_from_buffer(et.buffer).forward((X,))[0]
    return out


@pytest.mark.parametrize("target", sorted(RUNNABLE))
def test_an_accepted_replacement_lowers_loads_and_computes_what_eager_does(
        edge: Any, target: str) -> None:
    rule = _rule(target)
    p = FusionPass([rule], strict=False)
    lowered = edge.transform([p])
    assert p.report.total_fused == 1 and not p.report.declined, str(p.report)
    out = _runs(lowered.exported_program())
    torch.testing.assert_close(out, RUNNABLE[target](X) + 1, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("target", sorted(NOT_RUNNABLE))
def test_a_declined_replacement_is_declined_everywhere_and_would_really_fail(
        edge: Any, target: str) -> None:
    rule = _rule(target)
    ep = copy.deepcopy(edge.exported_program())
    ms = find_matches(ep, [rule], strict=False)
    assert not ms.accepted
    (d,) = ms.declined
    assert d.step == "executable" and d.reason.startswith(target), str(d)
    assert NOT_RUNNABLE[target] in d.reason, str(d)
    verdict = why_not(ep, rule, d.root)  # the same verdict, asked about the node
    assert (verdict.step, verdict.reason) == ("executable", d.reason)
    p = FusionPass([rule], strict=False)
    assert not p(copy.deepcopy(ep)).modified
    assert [r.reason for r in p.report.declined] == [d.reason]
    # forced in anyway, the program does not run: the decline was needed
    forced = find_matches(ep, [rule], check_replacements=False)
    apply_matches(ep, forced.accepted)
    with pytest.raises(Exception):  # noqa: B017 - whichever stage refuses it
        _runs(ep)


def test_a_number_where_the_edge_op_wants_a_tensor_is_declined(edge: Any) -> None:
    """``add.Tensor(x, 1e-5)`` in an edge program: the verifier's dtype check refuses it."""
    rule = _rule("aten.add.Tensor", 1e-5)
    ep = copy.deepcopy(edge.exported_program())
    (d,) = find_matches(ep, [rule], strict=False).declined
    assert d.step == "executable" and "does not take these dtypes" in d.reason, str(d)
    apply_matches(ep, find_matches(ep, [rule], check_replacements=False).accepted)
    with pytest.raises(Exception):  # noqa: B017
        _runs(ep)


def test_a_replacement_of_the_wrong_dtype_is_an_error_decline_before_anything_changes(
        edge: Any) -> None:
    rule = _rule("aten.isfinite.default")  # returns bool where relu returned float
    ep = copy.deepcopy(edge.exported_program())
    nodes = [n.format_node() for n in ep.graph.nodes]
    p = FusionPass([rule], strict=False)
    assert not p(ep).modified
    (d,) = p.report.errors
    assert d.error_type == "FusionError" and "bool" in d.reason, str(d)
    assert [n.format_node() for n in ep.graph.nodes] == nodes
    with pytest.raises(Exception, match="bool"):
        find_matches(ep, [rule], strict=True)


def test_the_authors_exception_list_is_trusted(edge: Any) -> None:
    """An op the program's EdgeCompileConfig admits (``_core_aten_ops_exception_list``): the
    author vouches that their runtime runs it, and the rule is applied."""
    from executorch.exir import EdgeCompileConfig, to_edge

    cfg = EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.aten.silu.default])
    ep = to_edge(torch.export.export(ReluPlusOne().eval(), (X,)),
                 compile_config=cfg).exported_program()
    assert len(find_matches(ep, [_rule("aten.silu.default")]).accepted) == 1


def test_a_delegate_only_op_is_judged_by_the_named_delegate(edge: Any, vulkan_ops: None) -> None:
    """``et_vk.*`` has no CPU kernel by design: by default it is assumed delegated (the
    Vulkan adapter checks its partitioner for real); a target naming a delegate that
    refuses it declines it with that delegate's reason."""
    from fusionkit.find.executable import Delegate, ExecutionTarget

    rule = Rule("relu_to_vk", op("aten.relu.default", capture("x")),
                replace_with("et_vk.rms_norm.default", ref("x"), ref("x"), 1e-6))
    ep = copy.deepcopy(edge.exported_program())
    assert len(find_matches(ep, [rule]).accepted) == 1
    refuse = Delegate("Vulkan", lambda n: "blocked by the partitioner's options",
                      frozenset({"et_vk"}))
    (d,) = find_matches(ep, [rule], target=ExecutionTarget([refuse]), strict=False).declined
    assert d.step == "executable" and "blocked by the partitioner's options" in d.reason
    take = Delegate("Vulkan", lambda n: None, frozenset({"et_vk"}))
    assert len(find_matches(ep, [_rule("aten.silu.default")],
                            target=ExecutionTarget([take])).declined) == 1  # not asked: aten


def test_an_error_decline_is_logged_and_fails_the_cli_under_strict(
        edge: Any, caplog: pytest.LogCaptureFixture) -> None:
    import argparse
    import logging

    from fusionkit.app.cli import EXIT_OK, EXIT_PROBLEMS, _exit_status

    p = FusionPass([_rule("aten.isfinite.default")], strict=False)
    with caplog.at_level(logging.WARNING, logger="fusionkit"):
        p(edge.exported_program())
    (d,) = p.report.errors
    assert any(str(d) in r.getMessage() for r in caplog.records), caplog.text
    assert _exit_status(argparse.Namespace(strict=True), p.report) == EXIT_PROBLEMS
    assert _exit_status(argparse.Namespace(strict=False), p.report) == EXIT_OK
