"""Every user mistake of a command is one line naming the input, exit status 2
(issue 43, item 2), and ``check`` / ``lower`` say what they checked and did (item 3).

The table is held-out style: each bad input is a file or name a newcomer gives by
mistake (a text file as a ``.pte``, a ``.pte`` as a MODEL, a factory that raises, a module
next to them). The commands run in-process (``fusionkit.app.cli.main``) from the user's
directory, so the table costs one torch import; one case runs the installed command.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fusionkit.app import cli

TINY = '''
import torch


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def gemma_norm():
    return Norm(), (torch.randn(2, 8),)


def conv_bn():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    return m, (torch.randn(1, 3, 8, 8),)


def relu():
    return torch.nn.ReLU(), (torch.randn(2, 8),)


def boom():
    raise RuntimeError("factory exploded")


def wrong():
    return 42


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
            return x
        return -x


def unexportable():
    return Branchy(), (torch.randn(2),)


NOT_CALLABLE = 3


def rules_boom():
    raise ValueError("no rules today")
'''


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A newcomer's directory: their models package, their files, good and bad."""
    d = tmp_path_factory.mktemp("user")
    (d / "mymodels").mkdir()
    (d / "mymodels" / "__init__.py").write_text("")
    (d / "mymodels" / "tiny.py").write_text(TINY)
    (d / "mymodels" / "broken.py").write_text("raise ImportError('needs a GPU')\n")
    (d / "mymodels" / "typo.py").write_text("def f(:\n")
    (d / "notes.txt").write_text("hello\n")
    (d / "notes.pte").write_text("hello\n")
    (d / "notes.pt2").write_text("hello\n")
    (d / "empty.pte").write_bytes(b"")
    (d / "damaged.pte").write_bytes(b"\x08\x00\x00\x00ET12" + b"\xff" * 40)
    (d / "a_dir.pte").mkdir()
    (d / "a_file").write_text("")
    sys.path.insert(0, str(d))
    try:
        from mymodels.tiny import gemma_norm
    finally:
        sys.path.remove(str(d))
        for name in [m for m in sys.modules if m == "mymodels" or m.startswith("mymodels.")]:
            del sys.modules[name]
    module, inputs = gemma_norm()
    torch.export.save(torch.export.export(module, inputs), str(d / "tiny.pt2"))
    (d / "truncated.pt2").write_bytes((d / "tiny.pt2").read_bytes()[:300])
    from fusionkit.app.lowering import lower

    for backend in ("vulkan", "xnnpack"):
        module, inputs = gemma_norm()
        pte = lower(torch.export.export(module, inputs), backend).pte
        name = f"tiny_{backend}"
        (d / f"{name}.pte").write_bytes(pte)
    shutil.copy(d / "tiny_vulkan.pte", d / "lowered_as_model.pt2")
    return d


def run_in(d: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch,
           capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.chdir(d)
    for name in [m for m in sys.modules if m == "mymodels" or m.startswith("mymodels.")]:
        monkeypatch.delitem(sys.modules, name)
    capfd.readouterr()
    code = cli.main(argv)
    out, err = capfd.readouterr()
    return code, out, err


#: (argv, the input the one line must name); every one exits 2
BAD_INPUTS: list[tuple[list[str], str]] = [
    # check: a file that is not a .pte
    (["check", "notes.txt"], "notes.txt"),
    (["check", "notes.pte"], "notes.pte"),
    (["check", "tiny.pt2"], "tiny.pt2"),
    (["check", "empty.pte"], "empty.pte"),
    (["check", "damaged.pte"], "damaged.pte"),
    (["check", "a_dir.pte"], "a_dir.pte"),
    (["check", "missing.pte"], "missing.pte"),
    # run: the same, and a method the program does not have
    (["run", "notes.pte"], "notes.pte"),
    (["run", "notes.pte", "--backend", "arm"], "notes.pte"),
    (["run", "tiny_xnnpack.pte", "--backend", "arm"], "tiny_xnnpack.pte"),
    (["run", "tiny_vulkan.pte", "--method", "nope"], "--method nope"),
    (["run", "tiny_vulkan.pte", "--timeout", "0"], "--timeout 0"),
    # MODEL: a file of the wrong kind
    (["explain", "notes.txt"], "notes.txt"),
    (["explain", "notes.pt2"], "notes.pt2"),
    (["explain", "truncated.pt2"], "truncated.pt2"),
    (["explain", "tiny_vulkan.pte"], "tiny_vulkan.pte"),
    (["explain", "lowered_as_model.pt2"], "lowered_as_model.pt2"),
    (["explain", "mymodels/tiny.py"], "mymodels/tiny.py"),
    (["explain", "mymodels"], "mymodels"),
    (["explain", "missing.pt2"], "missing.pt2"),
    (["explain", "gemma_norm"], "gemma_norm"),
    # MODEL: a factory that raises, returns the wrong thing, cannot be found or exported
    (["explain", "mymodels.tiny:boom"], "mymodels.tiny:boom"),
    (["explain", "mymodels.tiny:wrong"], "mymodels.tiny:wrong"),
    (["explain", "mymodels.tiny:nothere"], "mymodels.tiny:nothere"),
    (["explain", "mymodels.tiny:NOT_CALLABLE"], "mymodels.tiny:NOT_CALLABLE"),
    (["explain", "mymodels.tiny:unexportable"], "mymodels.tiny:unexportable"),
    (["explain", "mymodels.broken:f"], "mymodels.broken:f"),
    (["explain", "mymodels.typo:f"], "mymodels.typo:f"),
    (["explain", "no_such_module:factory"], "no_such_module:factory"),
    (["simulate", "mymodels.tiny:boom"], "mymodels.tiny:boom"),
    (["lower", "mymodels.tiny:boom", "--backend", "vulkan", "-o", "out.pte"],
     "mymodels.tiny:boom"),
    # demo: a missing model, a factory that raises, --out that is a file
    (["demo", "missing.pt2"], "missing.pt2"),
    (["demo", "mymodels.tiny:boom"], "mymodels.tiny:boom"),
    (["demo", "--out", "a_file"], "a_file"),
    # outputs checked before the work
    (["lower", "tiny.pt2", "--backend", "vulkan", "-o", "no_dir/out.pte"], "no_dir/out.pte"),
    (["lower", "tiny.pt2", "--backend", "vulkan", "-o", "a_dir.pte"], "a_dir.pte"),
    (["exec", "--report", "no_dir/r.json", "--", "true"], "no_dir/r.json"),
    # verify: its module loader looks where the MODEL loader does
    (["verify", "mymodels.tiny:rules_boom"], "mymodels.tiny:rules_boom"),
    (["verify", "mymodels.tiny:nothere"], "mymodels.tiny:nothere"),
    (["verify", "mymodels.broken:rules"], "mymodels.broken:rules"),
    (["verify", "vulkan", "--cases", "0"], "--cases 0"),
]


@pytest.mark.parametrize(("argv", "names"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_a_bad_input_is_one_line_naming_it_exit_2(
        user_dir: Path, argv: list[str], names: str, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_in(user_dir, argv, monkeypatch, capfd)
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("fusionkit: error: ") and names in lines[0], lines[0]
    assert "Traceback" not in err


def test_the_installed_command_says_one_line_for_a_text_file_as_pte(user_dir: Path) -> None:
    exe = shutil.which("fusionkit")
    cmd = [exe] if exe else [sys.executable, "-m", "fusionkit.app.cli"]
    r = subprocess.run([*cmd, "check", "notes.txt"], capture_output=True, text=True,
                       cwd=user_dir, timeout=300)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["fusionkit: error: notes.txt: not an ExecuTorch program; "
                                     "expected a .pte"]


def test_a_module_and_a_path_of_the_users_directory(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    for model in ("mymodels.tiny:gemma_norm", "tiny.pt2"):
        code, out, err = run_in(user_dir, ["explain", model], monkeypatch, capfd)
        assert code == 0, err
        assert "1 fused" in out


def test_a_script_that_changed_directory_passes_the_users(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """``scripts/demo`` changes into the repository: FUSIONKIT_CWD is the user's directory."""
    repo = Path(cli.__file__).resolve().parents[2]
    monkeypatch.setenv(cli.CWD_VARIABLE, str(user_dir))
    for model in ("mymodels.tiny:gemma_norm", "tiny.pt2"):
        monkeypatch.setenv(cli.CWD_VARIABLE, str(user_dir))
        code, out, err = run_in(repo, ["explain", model, "--json"], monkeypatch, capfd)
        assert code == 0, err
        assert len(json.loads(out)["accepted"]) == 1
    monkeypatch.setenv(cli.CWD_VARIABLE, str(user_dir / "gone"))
    code, _out, err = run_in(repo, ["explain", "tiny.pt2"], monkeypatch, capfd)
    assert code == 2 and len(err.splitlines()) == 1 and "gone" in err
    script = (repo / "scripts" / "demo").read_text()
    assert script.index('export FUSIONKIT_CWD="$PWD"') < script.index("cd ")


# ------------------------------------------------------------------ what check and lower say


def test_check_names_the_backends_it_read(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_in(user_dir, ["check", "tiny_vulkan.pte"], monkeypatch, capfd)
    assert code == 0
    assert out.splitlines() == ["tiny_vulkan.pte: checked 1 Vulkan (VulkanBackend) payload(s): "
                                "no problems found"]
    code, out, _ = run_in(user_dir, ["check", "tiny_xnnpack.pte"], monkeypatch, capfd)
    assert code == 0 and "no problems found" not in out
    (line,) = out.splitlines()
    assert line.startswith("tiny_xnnpack.pte: nothing checked: `fusionkit check` reads Vulkan "
                           "payloads only, and this program has ")
    assert "XNNPACK (XnnpackBackend)" in line
    code, out, _ = run_in(user_dir, ["check", "tiny_xnnpack.pte", "--json"], monkeypatch, capfd)
    report = json.loads(out)
    assert report["checked"] == {} and report["problems"] == []
    assert set(report["not_checked"]) == {"XnnpackBackend"}


def test_lower_shows_only_rules_that_did_something_and_a_legend(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_in(user_dir, ["lower", "mymodels.tiny:gemma_norm", "--backend", "vulkan",
                                     "-o", "lowered.pte"], monkeypatch, capfd)
    assert code == 0
    rows = [ln.split() for ln in out.splitlines()]
    table = [r for r in rows if len(r) == 5 and r[1:].count("0") < 4 and r[1].isdigit()]
    assert table == [["rms_norm", "1", "0", "0", "0"]]
    assert not any(len(r) == 5 and r[1:] == ["0", "0", "0", "0"] for r in rows)
    assert any(ln.startswith("(") and "more rules matched nothing" in ln
               for ln in out.splitlines())
    assert "nothing was fused" not in out
    legend = [ln for ln in out.splitlines() if ln.startswith("legend: ")]
    assert len(legend) == 1 and all(w in legend[0] for w in ("fused =", "folded =", "declined ="))


def test_lower_shows_the_folds_done_in_preprocess(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_in(user_dir, ["lower", "mymodels.tiny:conv_bn", "--backend", "vulkan",
                                     "-o", "bn_vulkan.pte"], monkeypatch, capfd)
    assert code == 0
    assert "in vulkan preprocess (ExecuTorch's rewrites, run as fusionkit rules):" in out
    assert "  FuseBatchNormPass: 1 folded (conv + batch norm" in out
    assert "nothing was fused" not in out
    code, out, _ = run_in(user_dir, ["lower", "mymodels.tiny:conv_bn", "--backend", "xnnpack",
                                     "-o", "bn.pte", "--json"], monkeypatch, capfd)
    assert json.loads(out)["preprocess"]["FuseBatchNormPass"]["fused"] == 1


def test_lower_says_when_nothing_was_fused(
        user_dir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_in(user_dir, ["lower", "mymodels.tiny:relu", "--backend", "vulkan",
                                     "-o", "relu.pte"], monkeypatch, capfd)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].startswith("no fusion rule matched (") and "rules tried)" in lines[1]
    assert "nothing was fused or folded: the program is lowered as exported" in lines
    assert "rule" not in lines[1].split()[:1]  # no empty table header
