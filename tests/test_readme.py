"""The README and the guides in docs/ say what the code does: their snippets run.

Every ```python block of README.md and of each docs/*.md runs, in order, in one namespace
per file (so a guide can build a program in one block and lower it in the next), from the
repository root. A block that cannot run here is preceded by ``<!-- not run: REASON -->``.
A plain block preceded by ``<!-- output -->`` is what the python block before it prints.
Every ```yaml block that starts with ``version: 1`` is a spec that must load; every
``fusionkit ...`` command line names a real subcommand and real options; every relative
link points to a file (and heading) that exists.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from models import export_edge, outputs_close, run_program

import fusionkit

ROOT = Path(fusionkit.__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.S | re.M)
_MARK = re.compile(r"<!--\s*(not run|output)\s*:?\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    mark: str | None  # "not run", "output" or None
    reason: str
    line: int


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, each with the marker on the line before it."""
    text = path.read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        out.append(Block(m.group(1), m.group(2), mark.group(1) if mark else None,
                         mark.group(2) if mark else "", text.count("\n", 0, m.start()) + 1))
    return out


def _python_blocks() -> list[str]:
    return [b.text for b in blocks(README) if b.lang == "python"]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def run_snippets(path: Path) -> tuple[dict[str, object], list[str]]:
    """Run a file's python blocks in order in one namespace; returns it and each block's stdout."""
    scope: dict[str, object] = {"__name__": f"snippets_{path.stem}"}
    printed = []
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for b in blocks(path):
            if b.lang != "python" or b.mark == "not run":
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    exec(compile(b.text, f"{_name(path)}:{b.line}", "exec"), scope)
                except Exception as e:  # name the block: the traceback's file is the doc
                    raise AssertionError(f"{_name(path)}, block at line {b.line} failed: "
                                         f"{type(e).__name__}: {e}") from e
            printed.append(out.getvalue())
    finally:
        os.chdir(cwd)
    return scope, printed


#: namespaces of the files whose snippets ran, for the checks that read their results
_RAN: dict[str, dict[str, object]] = {}


@pytest.mark.parametrize("path", [p for p in DOCS if any(b.lang == "python" for b in blocks(p))],
                         ids=_name)
def test_snippets_run_and_print_what_the_text_shows(path: Path) -> None:
    scope, printed = run_snippets(path)
    _RAN[_name(path)] = scope
    ran = iter(printed)
    last = None
    for b in blocks(path):
        if b.lang == "python" and b.mark != "not run":
            last = next(ran)
        elif b.mark == "output":
            assert last is not None, f"{_name(path)}:{b.line}: output block before any python block"
            assert last.strip() == b.text.strip(), f"{_name(path)}:{b.line}: the block above prints\n{last}"


def test_not_run_blocks_say_why_and_are_few() -> None:
    skipped = [(p, b) for p in DOCS for b in blocks(p) if b.mark == "not run"]
    for p, b in skipped:
        assert b.reason, f"{_name(p)}:{b.line}: <!-- not run: ... --> needs a reason"
        assert b.lang == "python", f"{_name(p)}:{b.line}: only python blocks run"
    assert len(skipped) <= 3, [f"{_name(p)}:{b.line}" for p, b in skipped]


def test_readme_names_the_two_commands_and_they_exist() -> None:
    text = README.read_text()
    for cmd in ("bash scripts/demo", "bash scripts/test"):
        assert cmd in text
        assert (ROOT / cmd.split()[1]).is_file()
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


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


def _specs() -> list[tuple[Path, Block]]:
    return [(p, b) for p in DOCS for b in blocks(p)
            if b.lang == "yaml" and b.text.startswith("version: 1")]


def test_yaml_specs_load() -> None:
    from fusionkit.specs import load_spec_text

    names = set()
    for path, b in _specs():
        for rule in load_spec_text(b.text, file=f"{_name(path)}:{b.line}"):
            assert rule.root_keys, f"{_name(path)}:{b.line}: {rule.name} has no root op"
            names.add(rule.name)
    # README's spec, the traced rule, and verify's wrong and corrected examples
    assert {"reciprocal_mul", "llama_rms_norm", "add_relu_wrong"} <= names


def test_traced_rule_is_printed_as_the_guides_show_it() -> None:
    """authoring.md's to_python text and yaml.md's YAML are what the traced rule prints."""
    from fusionkit import to_python
    from fusionkit.specs import rules_to_yaml

    scope = _RAN.get("docs/authoring.md") or run_snippets(ROOT / "docs" / "authoring.md")[0]
    rule = scope["rule"]  # rebuilt by executing the printed DSL code: equal to the traced one
    printed = [b.text for b in blocks(ROOT / "docs" / "authoring.md")
               if b.lang == "python" and "name='llama_rms_norm'" in b.text]
    assert printed and to_python(rule).strip() == printed[0].strip()
    (traced,) = [b.text for p, b in _specs() if "llama_rms_norm" in b.text]
    assert rules_to_yaml([rule]).strip() == traced.strip()


def _subcommands() -> dict[str, object]:
    from fusionkit.app.cli import build_parser

    (action,) = [a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(action.choices)


def _command_lines() -> list[tuple[str, str]]:
    """(where, command with its continuation lines) for every ``fusionkit X`` in a code block."""
    out = []
    for path in DOCS:
        for b in blocks(path):
            if b.lang == "python":
                continue
            current: list[str] | None = None
            for i, line in enumerate(b.text.splitlines()):
                m = re.match(r"\s*(?:\$\s+)?fusionkit\s+(\S.*)$", line)
                if m:
                    current = [m.group(1)]
                    out.append((f"{_name(path)}:{b.line + 1 + i}", current))
                elif current is not None and line[:1].isspace() and line.strip().startswith("["):
                    current.append(line.strip())
                else:
                    current = None
    return [(where, " ".join(parts).split("#")[0]) for where, parts in out]


def test_every_command_shown_exists_with_its_options() -> None:
    subs = _subcommands()
    lines = _command_lines()
    assert {cmd.split()[0] for _, cmd in lines} >= {"lower", "explain", "check", "simulate", "demo"}
    for where, cmd in lines:
        name, *rest = cmd.split()
        assert name in subs, f"{where}: `fusionkit {name}` is not a subcommand ({sorted(subs)})"
        parser = subs[name]
        nested = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if nested and rest and not rest[0].startswith("-"):
            assert rest[0] in nested[0].choices, f"{where}: `fusionkit {name} {rest[0]}`"
            parser = nested[0].choices[rest[0]]
        for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", cmd):
            assert opt in parser._option_string_actions, f"{where}: `fusionkit {name}` has no {opt}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_point_to_files_and_headings_that_exist() -> None:
    for path in DOCS:
        text = _FENCE.sub("", path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{_name(path)}: link to {target}: no such file"
            if anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+\s+(.*)$", _FENCE.sub("", dest.read_text()), flags=re.M)
                assert anchor in {_slug(h) for h in headings}, f"{_name(path)}: no heading #{anchor}"
