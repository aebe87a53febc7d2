"""ExecuTorch's XNNPACK op tests with fusionkit installed, shard 0 of 2 (see ``xnnpack_ops_stock``)."""

from __future__ import annotations

import pytest

pytest.importorskip("executorch.backends.xnnpack")
pytest.importorskip("torchao")

from xnnpack_ops_stock import check_shard, requires_opt_in


@requires_opt_in
def test_stock_xnnpack_ops_shard_0(tmp_path) -> None:  # type: ignore[no-untyped-def]
    check_shard(0, tmp_path)


def test_twins_report_a_preprocess_whose_bytes_depend_on_fusionkit(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The shards' byte-identity checks are not vacuous: a preprocess whose output differs
    with the gates on and off, the rules on and off, or with fusionkit installed and not,
    is recorded as a mismatch of all three twins (and one that does not, is not)."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir.backend.backend_details import PreprocessResult
    from stock_xnnpack_tests import fusionkit_xnnpack_plugin as plugin

    from fusionkit.backends import xnnpack_adapter
    from fusionkit.backends.xnnpack_adapter import preprocess_rules
    from fusionkit.integration import pass_gating

    seen: list[tuple[bool, bool, bool]] = []

    def fake(edge_program: object, compile_specs: object) -> PreprocessResult:
        state = (xnnpack_adapter.is_installed(), pass_gating.is_enabled(),
                 preprocess_rules.is_enabled())
        seen.append(state)
        flag = all(state) and edge_program == ["differs"]
        return PreprocessResult(processed_bytes=b"gated" if flag else b"same")

    monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(fake))
    monkeypatch.setattr(plugin, "TWINS", {"preprocess_calls": 0, "identical": 0,
                                          "mismatches": [], "stock_identical": 0,
                                          "stock_mismatches": [], "rules_off_identical": 0,
                                          "rules_off_mismatches": []})
    monkeypatch.setattr(plugin, "MODE", "fusionkit")
    monkeypatch.setitem(plugin.STATE, "current", "t")
    was_installed = xnnpack_adapter.is_installed()
    with xnnpack_adapter.install():
        plugin._install_twin()
        try:
            assert XnnpackBackend.preprocess(["same"], []).processed_bytes == b"same"
            assert XnnpackBackend.preprocess(["differs"], []).processed_bytes == b"gated"
        finally:
            plugin._uninstall_twin()
        assert xnnpack_adapter.is_installed()
    assert xnnpack_adapter.is_installed() == was_installed
    assert XnnpackBackend.__dict__["preprocess"].__func__ is fake
    # stock first, then gates off, then rules off, then the real call
    assert seen == [(False, True, True), (True, False, True), (True, True, False),
                    (True, True, True)] * 2
    diff = "processed_bytes differ (4 vs 5 bytes)"
    assert plugin.TWINS == {"preprocess_calls": 2, "identical": 1, "stock_identical": 1,
                            "rules_off_identical": 1,
                            "mismatches": [{"test": "t", "difference": diff}],
                            "stock_mismatches": [{"test": "t", "difference": diff}],
                            "rules_off_mismatches": [{"test": "t", "difference": diff}]}
