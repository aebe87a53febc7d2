"""Seeded stand-ins for the published weights the example zoo's torchvision models download.

``mv2``, ``mv3``, ``resnet18``, ``resnet50``, ``ic3``, ``vit`` and ``dl3`` build their
torchvision architecture with ``weights=...DEFAULT``, and torchvision fetches the
checkpoint into ``$TORCH_HOME/hub/checkpoints`` on first use. Offline that download fails,
so these models never reached a backend. A checkpoint already in that directory is loaded
without a download (``torch.hub.load_state_dict_from_url``), so this module writes one for
each model: its own architecture's state dict, seeded, with batch-norm statistics and
affine parameters drawn away from the identity (zero mean, unit variance and ``y = x``
would make every conv + batch-norm fold a no-op), and no tensor left constant (ViT's
zero-initialised head would make every output 0). The commands then run unedited, in a
process whose ``TORCH_HOME`` points at the stand-ins; nothing of the user's cache is
touched.

How it finds the file and the state dict without knowing each builder: in a child,
torchvision's ``WeightsEnum.get_state_dict`` is made to hand back a marker, and the
``load_state_dict`` that receives it writes the module's freshly initialised state dict
under the URL's file name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["SEED", "write_stand_in", "write_stand_ins"]

SEED = 0


class _Wanted(dict):  # type: ignore[type-arg]
    """What ``get_state_dict`` returns while stand-ins are written: the file's name."""

    def __init__(self, filename: str) -> None:
        super().__init__()
        self.filename = filename


def _spread(state: dict[str, Any], generator: Any) -> dict[str, Any]:
    """Batch-norm statistics and affine parameters drawn away from the identity; constant
    tensors drawn around their value."""
    import torch

    out = dict(state)
    for key, t in state.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            continue
        if key.endswith("running_mean"):
            out[key] = torch.randn(t.shape, generator=generator) * 0.1
        elif key.endswith("running_var"):
            out[key] = torch.rand(t.shape, generator=generator) + 0.5
        elif t.numel() > 1 and bool((t == t.flatten()[0]).all()):
            # a constant initialisation (a classifier head's zeros, a norm's ones) would
            # make every output the same whatever the program computes
            base = float(t.flatten()[0])
            out[key] = base + (0.1 if base else 0.02) * torch.randn(t.shape, generator=generator)
    for key in list(out):
        if key.endswith("running_var"):
            stem = key[: -len("running_var")]
            for name, scale, shift in (("weight", 0.2, 1.0), ("bias", 0.1, 0.0)):
                t = out.get(stem + name)
                if isinstance(t, torch.Tensor):
                    out[stem + name] = torch.randn(t.shape, generator=generator) * scale + shift
    return out


def write_stand_in(model: str, checkpoints: Path) -> list[str]:
    """Build ``model`` (an ``executorch.examples.models`` name) once, writing a stand-in for
    every checkpoint it would download into ``checkpoints`` (one there already is kept);
    returns the stand-ins it loads (none: it downloads nothing through torchvision). Runs
    in this process."""
    import torch
    from torchvision.models import _api

    used: list[str] = []  # written here, or written before and loaded
    original_get = _api.WeightsEnum.get_state_dict
    original_load = torch.nn.Module.load_state_dict

    def get_state_dict(self: Any, *a: Any, **k: Any) -> Any:
        filename = os.path.basename(self.url)
        if (checkpoints / filename).exists():
            used.append(filename)
            return original_get(self, *a, **k)
        return _Wanted(filename)

    def load_state_dict(self: Any, state: Any, *a: Any, **k: Any) -> Any:
        if not isinstance(state, _Wanted):
            return original_load(self, state, *a, **k)
        generator = torch.Generator().manual_seed(SEED)
        checkpoints.mkdir(parents=True, exist_ok=True)
        torch.save(_spread(self.state_dict(), generator), checkpoints / state.filename)
        used.append(state.filename)
        return torch.nn.modules.module._IncompatibleKeys([], [])

    _api.WeightsEnum.get_state_dict = get_state_dict  # type: ignore[method-assign]
    torch.nn.Module.load_state_dict = load_state_dict  # type: ignore[method-assign,assignment]
    try:
        from executorch.examples.models import MODEL_NAME_TO_MODEL
        from executorch.examples.models.model_factory import EagerModelFactory

        torch.manual_seed(SEED)
        module, cls = MODEL_NAME_TO_MODEL[model]
        EagerModelFactory.create_model(module, cls)
    finally:
        _api.WeightsEnum.get_state_dict = original_get  # type: ignore[method-assign]
        torch.nn.Module.load_state_dict = original_load  # type: ignore[method-assign]
    return used


def write_stand_ins(models: list[str], torch_home: Path, timeout: float = 900) -> dict[str, str]:
    """Stand-ins for each model, each built in a child process with ``TORCH_HOME`` set to
    ``torch_home``; model -> what happened (``stand-in FILE...``, ``nothing to write``, or
    ``failed: `` and the child's last line)."""
    checkpoints = torch_home / "hub" / "checkpoints"
    env = {**os.environ, "TORCH_HOME": str(torch_home), "HF_HUB_OFFLINE": "1"}
    done: dict[str, str] = {}
    code = ("import sys, pathlib; from benchmarks.stand_in_weights import write_stand_in; "
            "print(' '.join(write_stand_in(sys.argv[1], pathlib.Path(sys.argv[2]))))")
    for model in models:
        try:
            p = subprocess.run([sys.executable, "-c", code, model, str(checkpoints)], env=env,
                               capture_output=True, text=True, timeout=timeout,
                               cwd=Path(__file__).resolve().parents[1])
        except subprocess.TimeoutExpired:
            done[model] = f"timed out after {timeout:.0f} s"
            continue
        lines = (p.stdout if p.returncode == 0 else p.stderr).strip().splitlines()
        done[model] = ("stand-in " + lines[-1] if p.returncode == 0 and lines and lines[-1]
                       else "nothing to write" if p.returncode == 0
                       else f"failed: {lines[-1] if lines else p.returncode}")
    return done
