"""The ExecuTorch releases fusionkit supports, refused outside the range before any work,
and the one place (``fusionkit.integration.versions``) that says what differs between them."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fusionkit
from fusionkit.integration import versions
from fusionkit.integration.versions import (
    MAIN_EXECUTORCH,
    SUPPORTED_EXECUTORCH,
    TESTED_EXECUTORCH,
    Features,
    UnsupportedExecuTorchError,
)

REPO = Path(fusionkit.__file__).resolve().parent.parent


def _in_range(major: int, minor: int, patch: int, suffix: str) -> bool:
    """The range by hand: [1.4.0, 1.6.0); a pre-release or dev build of a release comes
    before it (so 1.4.0rc1 is out, 1.5.0rc1 in), a local or post tag after."""
    pre = suffix.startswith(("rc", "a", "b", ".dev"))
    key = (major, minor, patch, 0 if pre else 1)
    return (1, 4, 0, 1) <= key < (1, 6, 0, 0)


@given(st.integers(0, 2), st.integers(0, 9), st.integers(0, 3),
       st.sampled_from(["", "+cpu", "rc1", "a2", ".dev20260101", ".post1"]))
def test_the_range_is_the_one_pyproject_states(major: int, minor: int, patch: int,
                                               suffix: str) -> None:
    version = f"{major}.{minor}.{patch}{suffix}"
    assert versions.is_supported(version) == _in_range(major, minor, patch, suffix), version
    if not versions.is_supported(version):
        with pytest.raises(UnsupportedExecuTorchError) as e:
            versions.require_supported("x", version)
        assert f"ExecuTorch {version} is not supported" in str(e.value)
        assert SUPPORTED_EXECUTORCH in str(e.value)
    else:
        assert versions.require_supported("x", version) == version


def test_tested_releases_main_pin_and_pyproject_agree() -> None:
    assert all(versions.is_supported(v) for v in TESTED_EXECUTORCH)
    assert MAIN_EXECUTORCH in TESTED_EXECUTORCH
    for bad in ("not installed", "1.3.1", "1.6.0", "1.6.0.dev20260101", "garbage"):
        assert not versions.is_supported(bad), bad
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"executorch{SUPPORTED_EXECUTORCH}"' in pyproject
    assert 'requires-python = ">=3.10"' in pyproject
    # scripts/bootstrap installs and asserts the main pin
    bootstrap = (REPO / "scripts" / "bootstrap").read_text()
    assert f'"executorch=={MAIN_EXECUTORCH}"' in bootstrap
    assert f'version("executorch") == "{MAIN_EXECUTORCH}"' in bootstrap


def test_this_environment_runs_a_tested_release() -> None:
    found = versions.installed_executorch_version()
    assert found in TESTED_EXECUTORCH, found
    assert versions.features().version == found


def test_features_name_the_release_that_brought_them() -> None:
    assert [Features.of(v).bf16_delegation for v in ("1.4.0", "1.4.1", "1.5.0", "1.5.1")] == [
        False, False, True, True]


def test_the_bf16_feature_matches_the_installed_executorch_source() -> None:
    """The flag is what the installed XNNPACK code does: its partitioner config reads
    ``enable_bf16`` and its serializer keeps bf16 constants exactly when the flag is set."""
    from executorch.backends.xnnpack.operators import node_visitor
    from executorch.backends.xnnpack.partition.config import xnnpack_config

    has_flag = "enable_bf16" in inspect.getsource(xnnpack_config)
    keeps = re.search(r"const_val\.dtype not in \(torch\.float16, torch\.bfloat16\)",
                      inspect.getsource(node_visitor.NodeVisitor.get_serialized_buffer_index))
    assert has_flag == versions.features().bf16_delegation
    assert bool(keeps) == versions.features().bf16_delegation


class _Bf16(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.c = torch.nn.Parameter(torch.rand(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.c


def _delegates(ep: torch.export.ExportedProgram, partitioner: object) -> tuple[list[bytes],
                                                                              list[bytes]]:
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    gm = edge.exported_program().graph_module
    payloads = [m.processed_bytes for n, m in gm.named_children() if n.startswith("lowered_module")]
    named = edge.to_executorch()._named_data
    return payloads, list(named.buffers) if named is not None else []


def test_bf16_constants_are_written_as_the_installed_executorch_writes_them() -> None:
    """A bf16 model through fusionkit's XNNPACK serializer and through ExecuTorch's own:
    the same delegate payload and constant bytes on every supported release (1.5.x: the
    weight stays bf16; 1.4.x delegates no bf16 linear)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as StockXnnpackPartitioner,
    )

    from fusionkit.backends import xnnpack_adapter

    torch.manual_seed(0)
    ep = torch.export.export(_Bf16().to(torch.bfloat16).eval(),
                             (torch.randn(2, 8, dtype=torch.bfloat16),))
    kw = {"enable_bf16": True} if versions.features().bf16_delegation else {}
    xnnpack_adapter.uninstall()
    stock = _delegates(ep, StockXnnpackPartitioner(**kw))
    ours = _delegates(ep, xnnpack_adapter.XnnpackPartitioner(**kw))
    assert ours == stock
    if versions.features().bf16_delegation:
        assert len(ours[0]) == 1
        # the 4x8 weight as bf16 (2 bytes each), the bias forced to fp32 (4 bytes each)
        assert sorted(len(b) for b in ours[1]) == [16, 64]


def test_the_command_refuses_an_unsupported_executorch_before_any_work(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    from fusionkit.app import cli, model_loader

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(versions, "installed_executorch_version", lambda: "1.3.1")
    monkeypatch.setattr(model_loader, "load_model", no_work)
    out = tmp_path / "m.pte"
    for argv in (["lower", "fusionkit.app.demo_model:demo_factory", "--backend", "xnnpack",
                  "-o", str(out)],
                 ["explain", "fusionkit.app.demo_model:demo_factory"],
                 ["demo"]):
        assert cli.main(argv) == cli.EXIT_USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fusionkit: error: fusionkit {argv[0]}: "
                                                   "ExecuTorch 1.3.1 is not supported"), err
        assert SUPPORTED_EXECUTORCH in err[0]
    assert not out.exists()
    # the commands that need no ExecuTorch internals still work
    assert cli.main(["schema"]) == cli.EXIT_OK
