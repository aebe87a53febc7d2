"""``fusionkit exec``: a launcher in front of a program fusionkit does not own.

The program's exit code passes through (a signal as 128 + N); a mistake in the launcher's
own input is one line and exit 2; a program that never imports ExecuTorch is left alone;
one that lowers with ExecuTorch's *stock* partitioner gets fusionkit's rules, and the
summary and JSON report say what they did; an environment's own ``sitecustomize`` still
runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LAUNCH = [sys.executable, "-m", "fusionkit.app.cli", "exec"]


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAUNCH, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize(("args", "says"), [
    (["--backend", "tpu", "--", "true"], "unknown backend tpu"),
    ([], "no command"),
    (["-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    (["--", "no-such-command-anywhere"], "no-such-command-anywhere: command not found"),
    (["--", "missing_script.py"], "missing_script.py: no such file"),
    (["-m"], "-m: give the module to run"),
    (["--bogus", "x"], "unknown option '--bogus'"),
])
def test_a_launcher_mistake_is_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                                   says: str) -> None:
    done = _run(args, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_exit_codes_pass_through_and_no_executorch_means_nothing_done(tmp_path: Path) -> None:
    done = _run(["--", sys.executable, "-c", "import sys; print('hi'); sys.exit(7)"], tmp_path)
    assert done.returncode == 7 and done.stdout == "hi\n"
    assert "fusionkit did nothing" in done.stderr
    killed = _run(["--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), "
                   "signal.SIGTERM)"], tmp_path)
    assert killed.returncode == 128 + 15


def test_module_is_found_from_the_users_directory(tmp_path: Path) -> None:
    (tmp_path / "mytool.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    done = _run(["-m", "mytool", "--flag", "x"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "args ['--flag', 'x']"  # the program's, not the launcher's


def test_the_environments_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['MINE_RAN'] = '1'\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    done = _run(["--", sys.executable, "-c", "import os; print(os.environ.get('MINE_RAN'))"],
                tmp_path, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr


STOCK_LOWERING = textwrap.dedent('''
    import sys, torch
    from executorch.exir import to_edge_transform_and_lower
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.bn = torch.nn.BatchNorm2d(8)
        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    torch.manual_seed(0)
    m = M().eval()
    m.bn.running_mean.uniform_(-1, 1); m.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(m, (x,))
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
    data = pte.buffer
    out = _load_for_executorch_from_buffer(data).forward((x,))[0]
    err = float((out - m(x)).abs().max())
    print("max_abs", err)
    sys.exit(0 if err < 1e-4 else 3)
''')


def test_a_stock_lowering_gets_fusionkits_rules(tmp_path: Path) -> None:
    """ExecuTorch's own XnnpackPartitioner, not fusionkit's: under the launcher the conv +
    batch norm + relu is fused by fusionkit's preprocess rules, the program still equals
    eager, and the report says which rules fused."""
    script = tmp_path / "lower.py"
    script.write_text(STOCK_LOWERING)
    report = tmp_path / "report.json"
    done = _run(["--backend", "xnnpack", "--report", str(report), "--", str(script)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "max_abs" in done.stdout
    data = json.loads(report.read_text())
    assert data["exit_code"] == 0 and data["processes"] == 1
    xnn = data["backends"]["xnnpack"]
    assert xnn["installed_in"] == 1 and not xnn["install_errors"]
    assert xnn["fused"].get("xnnpack_conv_batch_norm") == 1, xnn
    assert "fusionkit exec: xnnpack: " in done.stderr and " fused (" in done.stderr
    assert data["fusionkit_seconds"] > 0


QUANTIZE_STEP = textwrap.dedent('''
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    x = torch.randn(1, 3, 8, 8)
    gm = torch.export.export(m, (x,)).module()
    prepare_pt2e(gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
    print("prepared")
''')


def test_the_quantize_steps_fold_is_counted_under_the_backend(tmp_path: Path) -> None:
    """The conv + batch-norm fold of ``prepare_pt2e`` (the quantize step every adapter
    installs) is the adapter's, not a user's rule: the report and the summary count it under
    the backend."""
    script = tmp_path / "prepare.py"
    script.write_text(QUANTIZE_STEP)
    report = tmp_path / "report.json"
    done = _run(["--backend", "xnnpack", "--report", str(report), "--", str(script)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["backends"]["xnnpack"]["fused"].get("quantize_conv_batch_norm") == 1, data
    assert "user" not in data["backends"], data["backends"].get("user")
    assert "fusionkit exec: user" not in done.stderr


SPLIT_LOWERING = textwrap.dedent(f'''
    import sys
    sys.path.insert(0, {str(Path(__file__).parent)!r})
    import torch
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from split_narrow import INPUTS, SplitNarrow

    ep = torch.export.export(SplitNarrow().eval(), INPUTS)
    to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()]).to_executorch()
    print("lowered")
''')


def test_the_summary_lists_what_fusionkit_placed_after_the_partitioner(tmp_path: Path) -> None:
    """ExecuTorch's own VulkanPartitioner splits this program in two and puts the
    ``.item()``'s assertions in the partition that does not read it (stock's lowering
    fails, ``tests/test_runtime_assertions.py``). Under the launcher they are moved, the
    program lowers, and the summary and the report say so."""
    script = tmp_path / "lower.py"
    script.write_text(SPLIT_LOWERING)
    report = tmp_path / "report.json"
    done = _run(["--backend", "vulkan", "--report", str(report), "--", str(script)], tmp_path)
    assert done.returncode == 0 and "lowered" in done.stdout, done.stderr[-3000:]
    placed = json.loads(report.read_text())["backends"]["vulkan"]["placed"]
    moved = [p for p in placed if p["what"].startswith("runtime assertion moved")]
    assert moved and moved[0]["count"] >= 1, placed
    assert "node(s) placed by fusionkit after the partitioner" in done.stderr
    assert "runtime assertion moved" in done.stderr


WAITS = textwrap.dedent('''
    import sys, torch
    def fk():
        return sorted(m for m in sys.modules if m.startswith("fusionkit"))
    from executorch.exir import to_edge_transform_and_lower
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.linear(x, torch.ones(4, 4)) + 1

    ep = torch.export.export(M(), (torch.randn(2, 4),))
    print("before", ",".join(fk()))
    to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    print("after", ",".join(fk()))
''')


def test_fusionkit_enters_the_process_at_the_first_lowering_step(tmp_path: Path) -> None:
    """Imports of ExecuTorch, torchao and a ``torch.export`` leave the process as stock has
    it: only the launcher's own standard-library modules; the first lowering step installs
    the adapter, and the report names the call that did."""
    script = tmp_path / "waits.py"
    script.write_text(WAITS)
    report = tmp_path / "report.json"
    done = _run(["--backend", "xnnpack", "--report", str(report), "--", str(script)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                 if line.startswith(("before ", "after ")))
    before, after = lines["before"].split(","), lines["after"].split(",")
    assert not [m for m in before if m.startswith(("fusionkit.backends", "fusionkit.integration"))
                or m in ("fusionkit.rules", "fusionkit.matcher")], before
    assert "fusionkit.backends.xnnpack_adapter" in after
    data = json.loads(report.read_text())
    assert data["backends"]["xnnpack"]["installed_in"] == 1
    [by] = data["installed_by"]
    assert by.startswith("executorch.backends.xnnpack."), by
