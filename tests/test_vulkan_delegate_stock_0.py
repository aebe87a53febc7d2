"""ExecuTorch's Vulkan delegate suite, shard 0 of 2, simulated (see ``vulkan_delegate_stock``)."""

from __future__ import annotations

import pytest

pytest.importorskip("executorch.backends.vulkan")
pytest.importorskip("torchao")

from vulkan_delegate_stock import check_shard, requires_opt_in


@requires_opt_in
def test_stock_vulkan_delegate_suite_shard_0(tmp_path) -> None:  # type: ignore[no-untyped-def]
    check_shard(0, tmp_path)
