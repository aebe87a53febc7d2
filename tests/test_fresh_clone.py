"""What a newcomer meets on a fresh clone, with no ``../shared`` beside it and nothing cached:
every script the README names exists, and without a real Vulkan runtime the scripts and the
demo say so in one line, with the way to get one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_every_script_the_readme_names_exists() -> None:
    named = set(re.findall(r"bash (scripts/[\w-]+)", README.read_text()))
    assert {"scripts/demo", "scripts/test", "scripts/vulkan-runtime",
            "scripts/executorch-source"} <= named
    for script in named:
        assert (ROOT / script).is_file(), script


def test_vulkan_runtime_without_one_says_why_in_one_line(tmp_path: Path) -> None:
    """No cache, no prebuilt: exit 1, one line naming the prebuilt looked for (a relative path
    is the user's, from the directory the script runs in) and both ways to get a runtime;
    nothing installed with apt for a runtime that is not there."""
    env = dict(os.environ, FUSIONKIT_CACHE=str(tmp_path / "cache"),
               FUSIONKIT_VULKAN_PREBUILT="no-such-prebuilt", PYTHON=sys.executable)
    env.pop("FUSIONKIT_VULKAN_RUNTIME", None)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "vulkan-runtime")], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert str(tmp_path / "no-such-prebuilt") in line
    assert "bash scripts/executorch-source" in line and "--source DIR" in line
    assert "FUSIONKIT_VULKAN_PREBUILT" in line and "apt" not in line


def test_demo_without_a_runtime_says_whose_verdict_it_shows(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    from fusionkit.app import demo_job
    from fusionkit.backends.vulkan_adapter import runtime

    monkeypatch.setattr(runtime, "find_runtime", lambda: None)
    assert demo_job._real_runtime(b"", b"", (), None) is None
    (line,) = capsys.readouterr().out.splitlines()
    assert "no real Vulkan runtime" in line and "simulator" in line
    assert "scripts/vulkan-runtime --source DIR" in line
