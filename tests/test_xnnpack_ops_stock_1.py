"""ExecuTorch's XNNPACK op tests with fusionkit installed, shard 1 of 2 (see ``xnnpack_ops_stock``)."""

from __future__ import annotations

import pytest

pytest.importorskip("executorch.backends.xnnpack")
pytest.importorskip("torchao")

from xnnpack_ops_stock import check_shard, requires_opt_in


@requires_opt_in
def test_stock_xnnpack_ops_shard_1(tmp_path) -> None:  # type: ignore[no-untyped-def]
    check_shard(1, tmp_path)
