"""The Vulkan pass list's first call pays only for what the program holds.

In a fresh process, ``transform_passes()`` run on a program without KV-cache attention
does not import the ``llama`` op library (the causal_sdpa rule names its ops by key),
imports the prepacked-argument table and not the payload checker, nor the module that
loads and runs the runtime, and does not judge the cached runtime probe's staleness
(every rule of both Vulkan rule sets built and read) unless an answer depends on it, nor
scan the installed distributions' entry points or parse their METADATA.
The runtime library's sha256 is remembered next to it, by its exact stat. Where the op library is loaded, the sdpa
pattern is the one ``op()`` builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys
import executorch.exir  # noqa: F401
from benchmarks import graphs
from fusionkit.backends.vulkan_adapter import runtime_probe as rp, transform_passes

from fusionkit import targets

stale_checks, entry_point_scans = [], []
original = rp._stale
rp._stale = lambda ops: stale_checks.append(1) or original(ops)
scan = targets.delegate_entry_points
targets.delegate_entry_points = lambda: entry_point_scans.append(1) or scan()
ep = graphs.build("norms", 2)
before = set(sys.modules)
for p in transform_passes():
    res = p(ep)
    ep = getattr(res, "exported_program", None) or ep
fused = sum(1 for n in ep.graph_module.graph.nodes if "rms_norm" in str(n.target))
print(json.dumps({"modules": sorted(sys.modules), "stale_checks": len(stale_checks),
                  "fused": fused, "new_modules": sorted(set(sys.modules) - before),
                  "entry_point_scans": len(entry_point_scans)}))
"""


@pytest.fixture(scope="module")
def child() -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_the_first_call_imports_what_the_program_needs_only(child: dict[str, object]) -> None:
    assert child["fused"] == 2  # the pass list did its work
    modules = set(child["modules"])  # type: ignore[arg-type]
    assert "executorch.extension.llm.custom_ops.custom_ops" not in modules
    assert "fusionkit.backends.vulkan_adapter.inspect.prepacked_args" in modules
    assert "fusionkit.backends.vulkan_adapter.inspect.prepack_check" not in modules
    # where the runtime is and its cached probe, not the module that loads and runs it
    assert "fusionkit.backends.vulkan_adapter.runtime" not in modules
    # the fused et_vk.rms_norm is one the probe recorded present (or there is no probe):
    # no answer depended on the probe's staleness
    assert child["stale_checks"] == 0
    # the et_vk ops it creates are described by the adapter already: no scan of every
    # installed distribution's entry points, and no distribution's METADATA parsed (the
    # runtime's directory is named by versions read from the dist-info directory names)
    assert child["entry_point_scans"] == 0
    assert not [m for m in child["new_modules"] if m.startswith("email")]  # type: ignore[union-attr]


def test_the_runtime_directory_versions_are_the_distributions_own() -> None:
    from importlib.metadata import version

    from fusionkit.backends.vulkan_adapter import runtime_location as loc

    for dist in ("executorch", "torch", "PyYAML"):
        assert loc._version(dist) == version(dist)


def test_the_sdpa_pattern_names_its_ops_by_their_keys() -> None:
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from fusionkit import any_value, capture, op
    from fusionkit.passes.vulkan import sdpa
    from fusionkit.targets import op_key, resolve_op

    for key in (sdpa.SDPA, sdpa.UPDATE):
        assert op_key(resolve_op(key)) == key
    lazy = sdpa.llama_op(sdpa.SDPA, capture("q"), strict_defaults=False, scale=any_value("s"))
    assert lazy == op(sdpa.SDPA, capture("q"), strict_defaults=False, scale=any_value("s"))
    assert sdpa.llama_op(sdpa.UPDATE, capture("a")) == op(sdpa.UPDATE, capture("a"))


def test_the_installed_runtime_is_looked_up_again_when_its_variables_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fusionkit.backends.vulkan_adapter import delegation
    from fusionkit.backends.vulkan_adapter import runtime_location as rt

    assert delegation._RUNTIME_VARIABLES[0] == rt.RUNTIME_ENV
    monkeypatch.setenv("FUSIONKIT_CACHE", str(tmp_path))  # an empty cache: no runtime
    monkeypatch.delenv(rt.RUNTIME_ENV, raising=False)
    assert rt.find_runtime() is None and delegation.runtime_inventory() is None


def test_the_library_sha256_is_remembered_by_exact_stat(tmp_path: Path) -> None:
    import hashlib

    from fusionkit.backends.vulkan_adapter import runtime_location as loc

    lib = tmp_path / "lib.so"
    lib.write_bytes(b"one")
    assert loc.library_sha256(lib) == hashlib.sha256(b"one").hexdigest()
    memo = tmp_path / "lib.so.sha256"
    assert memo.read_text().endswith(hashlib.sha256(b"one").hexdigest())
    loc._SHA256.clear()  # a fresh process: the remembered sha256 is read back
    assert loc.library_sha256(lib) == hashlib.sha256(b"one").hexdigest()
    # a forged memo for another stat is not believed; a changed file is hashed again
    memo.write_text("1 2 3 4 " + "0" * 64)
    loc._SHA256.clear()
    assert loc.library_sha256(lib) == hashlib.sha256(b"one").hexdigest()
    lib.write_bytes(b"two!")
    loc._SHA256.clear()
    assert loc.library_sha256(lib) == hashlib.sha256(b"two!").hexdigest()
