"""CompactConstantsPass: every constant gets a storage of its own, usable in any transform_passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusionkit.integration.compact_constants import CompactConstantsPass, compact_tensor, is_compact
from fusionkit.integration.tensor_bytes import owns_storage_exactly, tensor_bytes
from fusionkit.program_inputs import ProgramInputs


class Views(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        base = torch.randn(3, 8, 8)
        self.w = torch.nn.Parameter(base[1].clone())  # owns its storage: untouched
        self.register_buffer("off", base[1])
        self.register_buffer("t", base[2].t())
        cl = torch.randn(4, 8, 3, 3).contiguous(memory_format=torch.channels_last)
        self.register_buffer("cl", cl[2:])

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.linear(x, self.w) + F.linear(x, self.off) + F.linear(x, self.t), F.conv2d(img, self.cl)


INPUTS = (torch.randn(2, 8), torch.randn(1, 8, 5, 5))


def test_pass_compacts_exactly_the_views() -> None:
    m = Views().eval()
    ep = torch.export.export(m, INPUTS)
    before = {k: v for k, v in ep.state_dict.items()}
    p = CompactConstantsPass()
    res = p(ep)
    assert res.modified
    assert sorted(c.target for c in p.compacted) == ["cl", "off", "t"]
    assert ep.state_dict["w"] is before["w"]
    assert isinstance(ep.state_dict["w"], torch.nn.Parameter)
    for name in ("off", "t", "cl"):
        new = ep.state_dict[name]
        assert owns_storage_exactly(new) and new.is_contiguous()
        assert torch.equal(new, before[name])
    inputs = ProgramInputs(ep)
    for node in ep.graph.nodes:
        ref = inputs.constant(node)
        if ref is not None:  # placeholder meta follows the new strides
            assert tuple(node.meta["val"].stride()) == tuple(ref.tensor.stride())
    again = CompactConstantsPass()
    assert not again(ep).modified and again.compacted == []
    torch.testing.assert_close(ep.module()(*INPUTS), m(*INPUTS))


def test_keep_channels_last_and_parameters() -> None:
    cl = torch.randn(4, 8, 3, 3).contiguous(memory_format=torch.channels_last)[2:]
    kept = compact_tensor(cl, keep_channels_last=True)
    assert kept.is_contiguous(memory_format=torch.channels_last) and owns_storage_exactly(kept)
    assert is_compact(kept, keep_channels_last=True) and not is_compact(kept)
    p = torch.nn.Parameter(torch.randn(4, 4)[1:], requires_grad=False)  # a Parameter on a view
    c = compact_tensor(p)
    assert isinstance(c, torch.nn.Parameter) and not c.requires_grad
    assert owns_storage_exactly(c) and tensor_bytes(c) == tensor_bytes(p)


@pytest.mark.slow
def test_pass_alone_fixes_stock_xnnpack() -> None:
    """Stock 1.5.1 partitioner, no fusionkit serializer: the pass alone gives correct, compact output."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    from fusionkit.backends import xnnpack_adapter

    class L(torch.nn.Module):
        def __init__(self, w: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("w", w)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.w)

    xnnpack_adapter.uninstall()
    torch.manual_seed(0)
    base, x = torch.randn(3, 8, 8), torch.randn(2, 8)
    m = L(base[1]).eval()
    p = CompactConstantsPass()
    et = to_edge_transform_and_lower(
        torch.export.export(m, (x,)), transform_passes=[p], partitioner=[XnnpackPartitioner()]
    ).to_executorch()
    out = _load_for_executorch_from_buffer(et.buffer).forward((x,))[0]
    assert [c.storage_nbytes_before for c in p.compacted] == [3 * 8 * 8 * 4]
    assert [c.nbytes_after for c in p.compacted] == [8 * 8 * 4]
    assert (out - m(x)).abs().max() < 1e-5
    assert not xnnpack_adapter.is_installed()
