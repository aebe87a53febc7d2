"""One view of a rule across commands (issue 42, item 4).

``verify`` says where a rule can never fire — its replacement declined at ``executable``
or by the partitioner on every case — judged as ``explain`` judges it; ``explain --verify``
and ``verify`` give one verdict for one rule and budget; and the Vulkan delegation check
names an operator as the payload ``run`` executes does (``et_vk.rms_norm.default``), in the
ATen programs ``verify`` builds too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fusionkit.app.firing import ANY_BACKEND, judges
from fusionkit.app.lowering import edge_program
from fusionkit.app.verify_job import status_of, verification_text, verify_targets
from fusionkit.authoring.verify import EQUAL
from fusionkit.find.finder import find_matches
from fusionkit.specs import load_specs

SILU = """\
version: 1
rules:
- name: mul_sigmoid_to_silu
  pattern:
    op: aten.mul.Tensor
    args: [{capture: x}, {op: aten.sigmoid.default, args: [{capture: x}]}]
  replacement: {op: aten.silu.default, args: [{ref: x}]}
"""

RECIPROCAL = """\
version: 1
rules:
- name: reciprocal_mul
  pattern:
    op: aten.mul.Tensor
    args: [{capture: x}, {op: aten.reciprocal.default, args: [{capture: y}]}]
  constraints: [{dtype: {capture: y, dtypes: [float32, float16]}}]
  replacement: {op: aten.div.Tensor, args: [{ref: x}, {ref: y}]}
"""

MODELS = """\
import torch


class Swish(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


def swish():
    return Swish(), (torch.randn(2, 8),)


class GemmaNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16))

    def forward(self, x):
        norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return norm * (1.0 + self.weight)


def gemma_norm():
    return GemmaNorm(), (torch.randn(2, 16),)
"""


def _spec(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of small models next to the user (explain's MODEL is module:factory)."""
    (tmp_path / "one_view_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "one_view_models"


def test_a_yaml_rule_declined_at_executable_is_equal_but_never_fires(tmp_path: Path) -> None:
    (rule,) = load_specs([str(_spec(tmp_path, SILU, "silu.yaml"))])
    (v,) = verify_targets([rule], cases=2, backend="vulkan")
    assert v.status == EQUAL
    assert v.verdict == "equal, but never fires on vulkan", v.verdict
    why = v.never_fires["vulkan"]
    assert "executable" in why and "aten.silu.default is not in the core ATen opset" in why
    assert v.firing["vulkan"]["fires"] is False and v.firing["vulkan"]["cases"] >= 1
    # what explain says of a model's program: the reason is its decline, word for word
    class Swish(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.sigmoid(x)

    edge = edge_program(torch.export.export(Swish(), (torch.randn(3, 4),)))
    (declined,) = find_matches(edge, [rule]).declined
    assert declined.step == "executable" and declined.reason in why
    # said prominently: the verdict line, the JSON, the exit status
    text = verification_text([v])
    assert text.startswith("mul_sigmoid_to_silu: equal, but NEVER FIRES on vulkan"), text
    record = v.to_dict()
    assert record["verdict"] == "equal, but never fires on vulkan"
    assert record["never_fires"] == {"vulkan": why} and record["status"] == EQUAL
    assert status_of([v]) == 1
    assert "1 never fire" in text.splitlines()[-1]
    from fusionkit.app.html_report import render_html

    page = render_html([], "t", {v.rule: v})
    assert "equal, but never fires on vulkan" in page and "aten.silu.default is not in" in page


def test_a_rule_that_fires_says_so_and_exits_0(tmp_path: Path) -> None:
    (rule,) = load_specs([str(_spec(tmp_path, RECIPROCAL, "reciprocal.yaml"))])
    (v,) = verify_targets([rule], cases=2)  # no backend: a spec's rule, any backend
    assert v.status == EQUAL and v.verdict == EQUAL and not v.never_fires
    assert v.firing == {ANY_BACKEND: {"fires": True, "cases": 1}}
    assert status_of([v]) == 0
    assert f"  fires on {ANY_BACKEND}" in verification_text([v])


def test_shipped_rules_are_judged_where_they_are_registered() -> None:
    from fusionkit.passes import rule_set

    rms = next(r for r in rule_set("vulkan") if r.name == "rms_norm")
    assert list(judges(rms)) == ["vulkan"]
    fold = next(r for r in rule_set("vulkan_preprocess") if r.name == "conv_batch_norm")
    assert list(judges(fold)) == ["vulkan"]  # (judged as the Vulkan preprocess judges it)
    # an XNNPACK preprocess rule: explain applies no XNNPACK rule, so it is not judged
    xnn = rule_set("xnnpack")[0]
    assert dict(judges(xnn)) == {}


def test_judging_an_xnnpack_rule_imports_no_vulkan_adapter() -> None:
    """Where a rule is registered is read from the registry: an XNNPACK rule's verification
    does not import another backend's adapter."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from fusionkit.passes import rule_set\n"
            "from fusionkit.app.firing import judges\n"
            "assert dict(judges(rule_set('xnnpack')[0])) == {}\n"
            "print(sorted(m for m in sys.modules if m.startswith('fusionkit.backends.vulkan_adapter')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def _json_of(capsys: Any) -> Any:
    return json.loads(capsys.readouterr().out)


def _same_verdict(a: dict[str, Any], b: dict[str, Any]) -> None:
    a, b = dict(a), dict(b)
    a.pop("seconds"), b.pop("seconds")
    assert a == b


def test_explain_verify_and_verify_give_one_verdict(tmp_path: Path, models: str,
                                                    capsys: Any) -> None:
    """The YAML silu rule (never fires) and the shipped rms_norm on a Gemma norm (the
    adapter's rule carries the Vulkan delegation check; both commands verify the
    registered rule and judge the adapter's on the edge program), at one budget."""
    from fusionkit.app.cli import main

    spec = str(_spec(tmp_path, SILU, "silu.yaml"))
    assert main(["explain", f"{models}:swish", "--spec", spec, "--verify", "--cases", "2",
                 "--json"]) == 0
    explained = _json_of(capsys)["verification"]["mul_sigmoid_to_silu"]
    assert main(["verify", spec, "--backend", "vulkan", "--cases", "2", "--json"]) == 1
    (verified,) = _json_of(capsys)
    _same_verdict(explained, verified)
    assert verified["verdict"] == "equal, but never fires on vulkan"

    assert main(["explain", f"{models}:gemma_norm", "--verify", "--cases", "2", "--json"]) == 0
    explained = _json_of(capsys)["verification"]["rms_norm"]
    assert main(["verify", "vulkan", "--rule", "rms_norm", "--cases", "2", "--json"]) == 0
    (verified,) = _json_of(capsys)
    _same_verdict(explained, verified)
    assert verified["status"] == EQUAL and verified["firing"]["vulkan"]["fires"] is True


def test_the_delegation_check_names_operators_as_the_payload_run_executes(
        vulkan_runtime: Any) -> None:
    """``et_vk.rms_norm.default`` is what the lowered payload holds and what the real
    runtime ran; the delegation check asks the probed runtime about that name for a node
    of an ATen program (as ``verify`` exports it), where it used to ask about
    ``rms_norm.default`` (the ATen overload's ``__name__``), which the runtime does not
    register: "cannot check: ... has no operator rms_norm.default"."""
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.authoring.verify import verify
    from fusionkit.backends.vulkan_adapter import (
        VulkanPartitioner,
        decode_payload,
        transform_passes,
    )
    from fusionkit.backends.vulkan_adapter import runtime as rt
    from fusionkit.backends.vulkan_adapter.delegation import (
        AUTO,
        PartitionerSupport,
        missing_operator,
        payload_name,
        runtime_inventory,
        with_delegation_check,
    )
    from fusionkit.backends.vulkan_adapter.inspect.prepack_check import vulkan_delegates
    from fusionkit.passes import rule_set

    inventory = runtime_inventory(AUTO)
    assert inventory is not None, "the real runtime is installed: it is probed"

    class Norm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    x = torch.randn(2, 16)
    model = Norm().eval()
    prog = to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                       transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()]).to_executorch()
    names = {o for d in vulkan_delegates(prog) for o in decode_payload(d.payload).graph.op_names()}
    assert "et_vk.rms_norm.default" in names, sorted(names)
    ran = rt.run_in_child(bytes(prog.buffer), [x])
    assert ran.status == "ok", ran.message
    torch.testing.assert_close(ran.outputs[0], model(x), atol=1e-4, rtol=1e-4)

    # a node of the ATen program verify builds: named as the payload names it
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401  (registers et_vk)

    g = torch.fx.Graph()
    a, w = g.placeholder("x"), g.placeholder("w")
    node = g.call_function(torch.ops.et_vk.rms_norm.default, (a, w, 1e-6))
    assert payload_name(node, before_edge=True) == "et_vk.rms_norm.default"
    assert inventory.has_operator("et_vk.rms_norm.default")
    assert missing_operator(node, inventory, before_edge=True) is None
    # inside preprocess a node is serialized as it is: the ATen form's own name
    assert payload_name(node) == "rms_norm.default"

    # the adapter's rule (with its delegation check, as explain lists it) verifies equal
    rms = next(r for r in rule_set("vulkan") if r.name == "rms_norm")
    v = verify(with_delegation_check(rms, PartitionerSupport(), AUTO), cases=2, max_examples=150)
    assert v.status == EQUAL, str(v)
    assert "has no operator" not in str(v.declined)
