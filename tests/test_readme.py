"""The README's example rule is real code that fuses what it says it fuses."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from models import export_edge, outputs_close, run_program

import fusionkit

README = Path(fusionkit.__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_names_the_two_commands_and_they_exist() -> None:
    text = README.read_text()
    root = README.parent
    for cmd in ("bash scripts/demo", "bash scripts/test"):
        assert cmd in text
        assert (root / cmd.split()[1]).is_file()
    assert "bash scripts/test" in (root / ".ci" / "run").read_text() or \
        "scripts/test" in (root / ".ci" / "run").read_text()


class MMBias(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 4))
        self.b = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.b + torch.mm(x, self.w), torch.mm(x, self.w) + y  # second: bias is an input


def test_readme_rule_example_runs_and_fuses() -> None:
    scope: dict[str, object] = {}
    exec(_python_blocks()[0], scope)  # the "rule in ten lines" block
    rule = scope["rule"]
    assert isinstance(rule, fusionkit.Rule)
    model = MMBias()
    inputs = (torch.randn(3, 8), torch.randn(3, 4))
    ep = export_edge(model, inputs)
    p = fusionkit.FusionPass([rule])
    res = p(ep)
    assert res.modified and p.report.total_fused == 1
    (decline,) = p.report.declined
    assert decline.step == "prepackable_constant" and "is a user input" in decline.reason
    assert outputs_close(run_program(res.exported_program, *inputs), model(*inputs))


def test_public_api_is_complete_and_importing_fusionkit_is_cheap() -> None:
    import subprocess
    import sys

    assert set(fusionkit.__all__) == set(fusionkit.EXPORTS)
    for name in fusionkit.__all__:
        assert getattr(fusionkit, name) is not None
    code = "import sys, fusionkit, fusionkit.app.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_readme_yaml_specs_load() -> None:
    from fusionkit.specs import load_spec_text

    traced, silu = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    (rule,) = load_spec_text(silu, file="README.md")
    assert rule.name == "silu" and rule.root_keys == frozenset({"aten.mul.Tensor"})
    (rule,) = load_spec_text(traced, file="README.md")  # the rule traced from LlamaRMSNorm
    assert rule.name == "llama_rms_norm" and rule.root_keys == frozenset({"aten.mul.Tensor"})
