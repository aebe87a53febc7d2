"""A :class:`RuntimeSession`'s child never outlives its parent.

The child serves programs until the parent writes ``stop``. A parent that is killed (a
test's timeout, Ctrl-C twice, the OOM killer) or exits without ``close()`` never writes
it: the child used to poll its work directory forever, holding the loaded runtime.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

PARENT = textwrap.dedent("""
    import sys, time, torch
    from fusionkit.backends.vulkan_adapter import runtime as rt

    class Add(torch.nn.Module):
        def forward(self, x):
            return x + 1

    from executorch.exir import to_edge
    pte = to_edge(torch.export.export(Add(), (torch.ones(2),))).to_executorch().buffer
    runner = rt.RuntimeSession()
    result = runner.run(pte, [torch.ones(2)])
    print(result.status, runner._proc.pid, flush=True)
    if sys.argv[1] == "exit":  # leaves without close(): the directory's finalizer runs
        sys.exit(0)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("how", ["killed", "exit"])
def test_the_child_ends_with_its_parent(vulkan_runtime: Path, how: str, tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    assert parent.stdout is not None
    line = parent.stdout.readline().split()
    assert line and line[0] == "ok", line
    child = int(line[1])
    assert _alive(child)
    if how == "killed":
        os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=60)
    deadline = time.monotonic() + 20
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the runtime child {child} outlived its parent ({how})")
