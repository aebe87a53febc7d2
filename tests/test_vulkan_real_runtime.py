"""The real Vulkan runtime from the library: programs run in a child, refusals and hangs
come back as the runtime's own message, the test run survives them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fusionkit.backends.vulkan_adapter import runtime as rt


def _stock_pte(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> bytes:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner
    from executorch.exir import to_edge_transform_and_lower

    import fusionkit.backends.vulkan_adapter as va

    va.uninstall()
    ep = torch.export.export(module, args)
    return bytes(to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()])
                 .to_executorch().buffer)


class MatmulRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x @ y).relu()


class CastRMSNorm(torch.nn.Module):
    """The seed's cast row: stock fuses it into an RMSNorm whose weight is not a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return normed * self.weight.type_as(x)


class Slow(torch.nn.Module):
    """About a minute of work on lavapipe: something to time out on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(6):
            x = (x @ x).tanh()
        return x


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    torch.manual_seed(0)
    x, y = torch.randn(4, 8), torch.randn(8, 4)
    cast = CastRMSNorm().eval()
    xc = torch.randn(2, 8)
    from test_vulkan_real_runtime_probe import MaskedFill

    return {"matmul": (_stock_pte(MatmulRelu(), (x, y)), (x, y)),
            "cast": (_stock_pte(cast, (xc,)), (xc,), cast),
            # stock delegates aten.logical_not, which the public runtime lacks: an abort
            "mask": (_stock_pte(MaskedFill(), (xc,)), (xc,)),
            "slow": (_stock_pte(Slow(), (torch.randn(2048, 2048),)), (torch.randn(2048, 2048),))}


def test_runs_in_a_child_and_refusals_and_hangs_come_back_as_results(
        vulkan_runtime: Any, programs: dict[str, Any]) -> None:
    mm, margs = programs["matmul"]
    cast, cargs, _ = programs["cast"]
    slow, sargs = programs["slow"]
    results = rt.run_many_in_child([
        rt.Job(mm, margs),
        rt.Job(cast, cargs),                       # the seed bug, for real
        rt.Job(mm[: len(mm) // 2], margs),         # a truncated file
        rt.Job(mm, None),                          # random inputs from the method's meta
        rt.Job(mm, margs[:1]),                     # an input missing
        rt.Job(slow, sargs),                       # killed at the timeout ...
        rt.Job(mm, margs),                         # ... and the rest runs in a fresh child
    ], timeout=8)
    ok, seed, truncated, drawn, missing, hung, after = results
    assert ok.ok, ok.message
    torch.testing.assert_close(ok.outputs[0], MatmulRelu()(*margs))
    assert ok.device and not ok.device.startswith(("unknown", "none")), ok.device
    assert seed.status == "error"
    assert "prepack_standard" in seed.message
    assert "(graph.val_is_tref(tensor_data)) is false!" in seed.message
    assert truncated.status == "error" and "File size is too small" in truncated.message
    assert drawn.ok and [tuple(t.shape) for t in drawn.inputs] == [(4, 8), (8, 4)]
    torch.testing.assert_close(drawn.outputs[0], MatmulRelu()(*drawn.inputs))
    assert missing.status == "error" and "Input 1 has not been set" in missing.message
    assert hung.status == "timeout" and hung.outputs is None, hung
    assert after.ok, after.message
    torch.testing.assert_close(after.outputs[0], MatmulRelu()(*margs))


def test_a_session_keeps_one_child_for_many_programs(
        vulkan_runtime: Any, programs: dict[str, Any]) -> None:
    mm, margs = programs["matmul"]
    cast, cargs, _ = programs["cast"]
    mask, xargs = programs["mask"]
    slow, sargs = programs["slow"]
    with rt.RuntimeSession(timeout=8) as session:
        first = session.run(mm, margs)
        seed = session.run(cast, cargs)            # refused: the child lives on
        again = session.run(mm, margs)
        assert session.children == 1
        died = session.run(mask, xargs)            # 'Missing operator' kills the child ...
        after_abort = session.run(mm, margs)       # ... the next program gets a fresh one
        hung = session.run(slow, sargs)            # killed at the timeout
        last = session.run(mm, None)
        assert session.children == 3
    for r in (first, again, after_abort):
        assert r.ok, r.message
        torch.testing.assert_close(r.outputs[0], MatmulRelu()(*margs))
    assert seed.status == "error" and "(graph.val_is_tref(tensor_data)) is false!" in seed.message
    assert died.status == "abort" and "Missing operator" in (died.message or ""), died
    assert hung.status == "timeout", hung
    assert last.ok and [tuple(t.shape) for t in last.inputs] == [(4, 8), (8, 4)]
    assert not session.work.exists()


def test_a_child_that_cannot_start_is_reported_for_every_program(
        vulkan_runtime: Any, programs: dict[str, Any]) -> None:
    mm, margs = programs["matmul"]
    results = rt.run_many_in_child([rt.Job(mm, margs)] * 2, startup_timeout=0.01)
    assert [r.status for r in results] == ["abort", "abort"]
    assert all("could not start" in (r.message or "") for r in results)


def test_no_runtime_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv(rt.RUNTIME_ENV, str(tmp_path / "missing.so"))
    assert rt.find_runtime() is None
    with pytest.raises(rt.RuntimeNotFoundError, match="scripts/vulkan-runtime"):
        rt.run_in_child(b"", ())
    monkeypatch.delenv(rt.RUNTIME_ENV)
    monkeypatch.setenv("FUSIONKIT_CACHE", str(tmp_path))
    assert rt.find_runtime() is None
    # a cache entry whose library does not match its checksum is not used
    entry = tmp_path / "vulkan-runtime" / (
        f"executorch-{rt.version('executorch')}_torch-{rt.version('torch').split('+')[0]}_x")
    entry.mkdir(parents=True)
    (entry / rt.LIBRARY).write_bytes(b"not a library")
    (entry / "SHA256SUMS").write_text(f"{'0' * 64}  {rt.LIBRARY}\n")
    assert rt.find_runtime() is None


def test_fusionkit_run_reports_the_runtimes_verdict(
        vulkan_runtime: Any, programs: dict[str, Any], tmp_path: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fusionkit.app.cli import main

    good, bad = tmp_path / "good.pte", tmp_path / "seed.pte"
    good.write_bytes(programs["matmul"][0])
    bad.write_bytes(programs["cast"][0])
    assert main(["run", str(good), "--backend", "vulkan", "--json"]) == 0
    ok = json.loads(capsys.readouterr().out)
    assert ok["status"] == "ok" and ok["check_problems"] == [] and ok["device"]
    assert [o["shape"] for o in ok["outputs"]] == [[4, 4]]
    assert main(["run", str(bad)]) == 1
    text = capsys.readouterr().out
    assert "the runtime refused it" in text and "(graph.val_is_tref(tensor_data)) is false!" in text
    assert "check() agrees" in text  # check() predicted the refusal
    assert main(["run", str(tmp_path / "missing.pte")]) == 2
