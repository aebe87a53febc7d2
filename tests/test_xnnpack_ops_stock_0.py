"""ExecuTorch's XNNPACK op tests with fusionkit installed, shard 0 of 2 (see ``xnnpack_ops_stock``)."""

from __future__ import annotations

import pytest

pytest.importorskip("executorch.backends.xnnpack")
pytest.importorskip("torchao")

from xnnpack_ops_stock import check_shard, requires_opt_in


@requires_opt_in
def test_stock_xnnpack_ops_shard_0(tmp_path) -> None:  # type: ignore[no-untyped-def]
    check_shard(0, tmp_path)


def test_twin_reports_a_preprocess_whose_bytes_depend_on_the_gates(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The shards' byte-identity check is not vacuous: a preprocess whose output differs
    with the gates on and off is recorded as a mismatch (and one that does not, is not)."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir.backend.backend_details import PreprocessResult
    from stock_xnnpack_tests import fusionkit_xnnpack_plugin as plugin

    from fusionkit.integration import pass_gates

    seen: list[bool] = []

    def fake(edge_program: object, compile_specs: object) -> PreprocessResult:
        seen.append(pass_gates.is_enabled())
        flag = pass_gates.is_enabled() and edge_program == ["differs"]
        return PreprocessResult(processed_bytes=b"gated" if flag else b"same")

    monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(fake))
    monkeypatch.setattr(plugin, "TWINS", {"preprocess_calls": 0, "identical": 0,
                                          "mismatches": []})
    monkeypatch.setitem(plugin.STATE, "current", "t")
    plugin._install_twin()
    try:
        assert XnnpackBackend.preprocess(["same"], []).processed_bytes == b"same"
        assert XnnpackBackend.preprocess(["differs"], []).processed_bytes == b"gated"
    finally:
        plugin._uninstall_twin()
    assert XnnpackBackend.__dict__["preprocess"].__func__ is fake
    assert seen == [False, True, False, True]  # the gates-off twin runs first
    assert plugin.TWINS["preprocess_calls"] == 2 and plugin.TWINS["identical"] == 1
    assert plugin.TWINS["mismatches"] == [
        {"test": "t", "difference": "processed_bytes differ (4 vs 5 bytes)"}]
