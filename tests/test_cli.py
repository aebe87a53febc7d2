"""The `fusionkit` command, driven through its installed entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fusionkit

REPO = Path(fusionkit.__file__).resolve().parent.parent
RMS_NORM_YAML = REPO / "passes" / "specs" / "rms_norm.yaml"
DEMO = "fusionkit.app.demo_model:demo_factory"


def fusionkit_cmd(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fusionkit")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "fusionkit.app.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def run_concurrently(*argvs: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Each process spends most of its time importing torch: run two at a time."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda a: fusionkit_cmd(*a), argvs))


@pytest.fixture(scope="module")
def explained() -> dict[str, subprocess.CompletedProcess[str]]:
    json_run, table_run = run_concurrently(("explain", DEMO, "--json"), ("explain", DEMO))
    return {"json": json_run, "table": table_run}


def test_console_script_is_installed() -> None:
    assert shutil.which("fusionkit") is not None


def test_schema_prints_json_schema_and_specs_validate() -> None:
    r, ok = run_concurrently(("schema",), ("specs", "validate", str(RMS_NORM_YAML)))
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    assert schema["title"] == "fusionkit spec" and "rules" in schema["properties"]
    assert ok.returncode == 0, ok.stderr
    assert "rms_norm.yaml: ok" in ok.stdout and "1 rule(s): rms_norm" in ok.stdout


def test_specs_validate_user_error_exit_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(RMS_NORM_YAML.read_text().replace("aten.rsqrt.default", "aten.rsqrtt.default"))
    r = fusionkit_cmd("specs", "validate", str(bad))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "rsqrtt" in t)
    assert f"bad.yaml:{line}: rules[0].pattern.args[0].inner.args[1].op:" in r.stderr
    assert "aten.rsqrtt.default" in r.stderr


def test_bad_model_and_bad_arguments_exit_2(tmp_path: Path) -> None:
    bad_import, missing_pt2, bad_backend, missing_pte, missing_spec = run_concurrently(
        ("explain", "no.such.module:factory"),
        ("explain", str(tmp_path / "missing.pt2")),
        ("lower", DEMO, "--backend", "metal", "-o", "x.pte"),
        ("check", str(tmp_path / "missing.pte")),
        ("explain", DEMO, "--spec", str(tmp_path / "missing.yaml")),
    )
    assert bad_import.returncode == 2 and "cannot import" in bad_import.stderr
    assert missing_pt2.returncode == 2 and "no such file" in missing_pt2.stderr
    assert bad_backend.returncode == 2 and "invalid choice" in bad_backend.stderr
    assert missing_pte.returncode == 2 and "no such file" in missing_pte.stderr
    assert missing_spec.returncode == 2 and "missing.yaml: no such file" in missing_spec.stderr
    for r in (bad_import, missing_pt2, bad_backend, missing_pte, missing_spec):
        assert "Traceback" not in r.stderr + r.stdout


def test_explain_json_lists_accepted_and_declined(
        explained: dict[str, subprocess.CompletedProcess[str]]) -> None:
    r = explained["json"]
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert len(data["accepted"]) == 4  # parameter, buffer, cast (folded), 1.0 + weight (folded)
    assert sum(bool(a["folded"]) for a in data["accepted"]) == 2
    declined = {d["node"]: d for d in data["declined"] if d["step"] == "prepackable_constant"}
    assert "scale" in declined and "is a user input" in declined["scale"]["reason"]
    adaln = [d for d in declined.values() if "depends on a user input `cond`" in d["reason"]]
    assert len(adaln) == 1


def test_explain_table_is_plain_when_not_a_tty_and_agrees_with_json(
        explained: dict[str, subprocess.CompletedProcess[str]]) -> None:
    a = explained["table"]
    assert a.returncode == 0, a.stderr
    assert "\x1b[" not in a.stdout and "Failed to load" not in a.stderr
    lines = a.stdout.splitlines()
    assert lines[1].split() == ["rule", "verdict", "root", "step", "node", "reason"]
    data = json.loads(explained["json"].stdout)
    rows = [ln.split()[:3] for ln in lines[3:]]
    # one row per decision, in graph order, the same decisions as --json
    assert sorted(r[2] for r in rows) == sorted(
        [m["root"] for m in data["accepted"]] + [d["root"] for d in data["declined"]])
    assert [r[1] for r in rows].count("fused") == len(data["accepted"])


def test_explain_with_extra_spec_and_pt2(tmp_path: Path) -> None:
    from fusionkit.app.demo_model import demo_factory

    module, inputs = demo_factory()
    path = tmp_path / "demo.pt2"
    torch.export.save(torch.export.export(module, inputs), str(path))
    spec = tmp_path / "relu.yaml"
    spec.write_text("version: 1\nrules:\n- name: rsqrt_mean\n  pattern:\n    op: aten.rsqrt.default\n"
                    "    args: [{op: aten.add.Tensor, args: [{capture: m}, {capture: e}]}]\n"
                    "  constraints: [{user_input: {capture: m}}, {user_input: {capture: e}}]\n"
                    "  replacement: {op: aten.rsqrt.default, args: [{ref: m}]}\n")
    r = fusionkit_cmd("explain", str(path), "--spec", str(spec), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    spec_declines = [d for d in data["declined"] if d["rule"] == "rsqrt_mean"]
    assert len(spec_declines) == 6 and all(d["step"] == "user_input" for d in spec_declines)
    assert len([a for a in data["accepted"] if a["rule"] == "rms_norm"]) == 4


@pytest.fixture(scope="module")
def lowered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("cli")
    paths = {}
    backends = ("xnnpack", "vulkan")
    runs = run_concurrently(*[("lower", DEMO, "--backend", b, "-o", str(out / f"demo_{b}.pte"),
                               "--json") for b in backends])
    for backend, r in zip(backends, runs, strict=True):
        p = out / f"demo_{backend}.pte"
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["output"] == str(p) and report["bytes"] == p.stat().st_size
        paths[backend] = p
        paths[f"{backend}_report"] = out / f"{backend}.json"
        paths[f"{backend}_report"].write_text(r.stdout)
    return paths


def test_lower_xnnpack_pte_runs_and_matches_eager(lowered: dict[str, Path]) -> None:
    from fusionkit.app.demo_model import demo_factory
    from fusionkit.app.runtime import max_abs_error, run_pte

    module, inputs = demo_factory()
    with torch.no_grad():
        want = module(*inputs)
    assert max_abs_error(run_pte(lowered["xnnpack"].read_bytes(), inputs), want) < 1e-4


def test_lower_vulkan_reports_fusions_and_passes_check(lowered: dict[str, Path]) -> None:
    report = json.loads(lowered["vulkan_report"].read_text())
    (rms,) = [r for r in report["rules"] if r["rule"] == "rms_norm"]
    assert rms["fused"] == 4 and rms["folded_constants"] == 2
    r = fusionkit_cmd("check", str(lowered["vulkan"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checked 1 Vulkan (VulkanBackend) payload(s): no problems found" in r.stdout


def test_check_flags_stock_vulkan_output(tmp_path: Path) -> None:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from fusionkit.app.demo_model import demo_factory
    from fusionkit.backends import vulkan_adapter

    module, inputs = demo_factory()
    vulkan_adapter.uninstall()
    prog = to_edge_transform_and_lower(torch.export.export(module, inputs),
                                       partitioner=[VulkanPartitioner()]).to_executorch()
    path = tmp_path / "stock.pte"
    path.write_bytes(prog.buffer)
    r = fusionkit_cmd("check", str(path), "--json")
    assert r.returncode == 1
    report = json.loads(r.stdout)
    assert report["checked"] == {"VulkanBackend": report["delegates"]["VulkanBackend"]}
    problems = report["problems"]
    weight_problems = [p for p in problems if "et_vk.rms_norm.default argument 1" in p]
    assert len(weight_problems) == 4  # cast, 1.0 + weight, graph input, AdaLN
