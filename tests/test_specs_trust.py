"""A spec never runs code without the user's consent (issue 14, item 5).

A spec names Python as ``package.module:attr`` (a ``custom`` check, a Python
replacement). Importing that module runs its top-level code, so loading or
validating a spec imports nothing it names unless the user opted in: ``trust``
or an allow-list of module prefixes, in the Python API and on the command line.
Each test uses a module name of its own, so no import is cached between them.
"""

from __future__ import annotations

import itertools
import sys
import textwrap
from pathlib import Path

import pytest

from fusionkit.app.cli import main
from fusionkit.specs import SpecError, load_spec_text, load_specs, validate_specs
from fusionkit.specs.trust import ImportPolicy

_ids = itertools.count()


def _spec(check_ref: str, build_ref: str | None = None) -> str:
    """A rule whose custom check (and optionally its replacement) is Python code."""
    replacement = (f"  replacement: {{fn: '{build_ref}', reads: [x]}}\n" if build_ref else
                   "  replacement: {op: aten.silu.default, args: [{ref: x}]}\n")
    return textwrap.dedent("""\
        version: 1
        rules:
        - name: silu
          pattern:
            op: aten.mul.Tensor
            args: [{capture: x}, {op: aten.sigmoid.default, args: [{capture: x}]}]
          constraints:
          - custom: {fn: '%s', name: mine, reads: [x]}
        """) % check_ref + replacement


@pytest.fixture
def evil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module on the path whose import writes a file; returns (its name, that file)."""
    name = f"fk_evil_{next(_ids)}"
    marker = tmp_path / "written"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "def check(ctx):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name, marker


def test_a_spec_naming_this_prints_nothing(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "this", raising=False)
    with pytest.raises(SpecError) as info:
        load_spec_text(_spec("this:s"), file="zen.yaml")
    e = info.value
    assert (e.file, e.line, e.path) == ("zen.yaml", 8, "rules[0].constraints[0].custom.fn")
    assert "--trust" in e.message and "--allow-module this" in e.message
    (summary,) = validate_specs_text(_spec("this:s"), capsys)
    assert [r.ref for r in summary.references] == ["this:s"]
    assert not summary.references[0].imported
    assert capsys.readouterr().out == "" and "this" not in sys.modules


def validate_specs_text(text: str, capsys: pytest.CaptureFixture[str]) -> list:  # type: ignore[type-arg]
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "spec.yaml"
        p.write_text(text)
        return validate_specs([p])


def test_a_module_that_writes_a_file_writes_nothing(evil: tuple[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    name, marker = evil
    spec = tmp_path / "evil.yaml"
    spec.write_text(_spec(f"{name}:check", build_ref=f"{name}:check"))
    with pytest.raises(SpecError, match=r"evil\.yaml:8: rules\[0\]\.constraints\[0\]\.custom\.fn"):
        load_specs([spec])
    (summary,) = validate_specs([spec])
    assert [(r.path, r.imported) for r in summary.references] == [
        ("rules[0].constraints[0].custom.fn", False), ("rules[0].replacement.fn", False)]
    # the command line: validate checks the form and imports nothing; loading refuses (exit 2)
    assert main(["specs", "validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "evil.yaml: ok" in out and "not imported" in out and f"{name}:check" in out
    assert main(["explain", "fusionkit.app.demo_model:demo_factory", "--spec", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:8: rules[0].constraints[0].custom.fn:" in err and "--trust" in err
    assert not marker.exists() and name not in sys.modules


def test_opt_in_by_module_prefix(evil: tuple[str, Path]) -> None:
    name, marker = evil
    text = _spec(f"{name}:check")
    with pytest.raises(SpecError, match="--allow-module"):
        load_spec_text(text, allow_modules=[name[:-1]])  # a prefix of the name is not its package
    with pytest.raises(SpecError):
        load_spec_text(text, allow_modules=["fusionkit"])
    assert not marker.exists()
    (rule,) = load_spec_text(text, allow_modules=[name])
    assert marker.read_text() == "ran"
    assert rule.constraints[0].fn is sys.modules[name].check  # type: ignore[attr-defined]


def test_opt_in_by_trust_on_the_command_line(evil: tuple[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    name, marker = evil
    spec = tmp_path / "evil.yaml"
    spec.write_text(_spec(f"{name}:check"))
    assert main(["specs", "validate", str(spec), "--trust"]) == 0
    assert marker.exists() and ": imported" in capsys.readouterr().out


def test_allowed_module_of_a_subpackage(evil: tuple[str, Path], tmp_path: Path) -> None:
    pkg = tmp_path / f"fk_pkg_{next(_ids)}"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("def check(ctx):\n    return None\n")
    (rule,) = load_spec_text(_spec(f"{pkg.name}.sub:check"), allow_modules=[pkg.name])
    assert rule.constraints[0].fn.__module__ == f"{pkg.name}.sub"  # type: ignore[attr-defined]


@pytest.mark.parametrize("ref", ["os;x:y", "import:check", "pkg.class:f", "pkg:", "pkg.mod"])
def test_malformed_references_are_errors_without_importing(ref: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(_spec(ref), trust=True)
    assert info.value.path == "rules[0].constraints[0].custom.fn" and info.value.line == 8


def test_allow_list_must_be_module_names() -> None:
    with pytest.raises(ValueError, match="not a dotted module name"):
        ImportPolicy.of(allow_modules=["os; rm"])
    assert ImportPolicy.of(allow_modules="a.b").allows("a.b.c:f")
    assert not ImportPolicy.of(allow_modules="a.b").allows("a.bc:f")
