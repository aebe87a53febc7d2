"""The example zoo's stand-in checkpoints: seeded, batch norms away from the identity, and
written under the name torchvision would download (where torchvision imports)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.stand_in_weights import _spread


def test_batch_norms_are_drawn_away_from_the_identity_and_seeded() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                              torch.nn.LazyLinear(4))
    net(torch.randn(1, 3, 5, 5))
    torch.nn.init.zeros_(net[3].weight)  # a head initialised to zeros, as ViT's is
    state = net.state_dict()
    a = _spread(state, torch.Generator().manual_seed(0))
    b = _spread(state, torch.Generator().manual_seed(0))
    assert a.keys() == state.keys()
    for key in state:
        assert torch.equal(a[key], b[key]), key
    assert torch.equal(a["0.weight"], state["0.weight"])  # the conv is left as initialised
    assert torch.equal(a["1.num_batches_tracked"], state["1.num_batches_tracked"])
    for key in ("1.running_mean", "1.running_var", "1.weight", "1.bias"):
        assert not torch.equal(a[key], state[key]), key
    assert bool((a["1.running_var"] >= 0.5).all())
    assert len(a["3.weight"].unique()) == a["3.weight"].numel()  # no constant tensor is left
    net.load_state_dict(a)  # still a loadable state dict of the same module


def test_a_torchvision_model_loads_its_stand_in_without_a_download(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torchvision", exc_type=ImportError)
    from benchmarks.stand_in_weights import write_stand_in

    checkpoints = tmp_path / "hub" / "checkpoints"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    assert write_stand_in("mv3", checkpoints) == ["mobilenet_v3_small-047dcff4.pth"]
    first = (checkpoints / "mobilenet_v3_small-047dcff4.pth").stat().st_mtime_ns
    # there already: loaded, not rewritten; a model that downloads nothing has none
    assert write_stand_in("mv3", checkpoints) == ["mobilenet_v3_small-047dcff4.pth"]
    assert (checkpoints / "mobilenet_v3_small-047dcff4.pth").stat().st_mtime_ns == first
    assert write_stand_in("linear", checkpoints) == []
    from executorch.examples.models.model_factory import EagerModelFactory

    def no_download(*a: object, **k: object) -> None:
        raise AssertionError("downloaded")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_download)
    model = EagerModelFactory.create_model("mobilenet_v3", "MV3Model")[0]
    saved = torch.load(checkpoints / "mobilenet_v3_small-047dcff4.pth")
    for key, t in model.state_dict().items():
        assert torch.equal(t, saved[key]), key
