"""The Arm quantizer's conv-scale fold, without writing into the user's module.

``TOSAQuantizer.transform_for_annotation`` (ExecuTorch 1.5.1, run by ``prepare_pt2e``)
runs ``FoldScalarMulIntoConvPass(tfa_pass=True)`` on the graph module being quantized.
With no exported program it folds ``conv(x, w, b) * s`` by writing ``w * s`` into the
tensor the ``get_attr`` reads, in place (``_set_get_attr_tensor``: ``copy_``). That graph
module is ``torch.export.export(model).module()``, which shares the model's parameters:
the user's own ``nn.Module`` is scaled, 2x after one ``prepare_pt2e`` of a ``conv * 2``,
4x after two (``tests/test_arm_conv_batch_norm.py`` shows it).

:data:`PATCHES` replaces that one method: the folded value becomes a new tensor bound to
the graph module's attribute (a new ``Parameter`` where there was one, a buffer where
there was a buffer), so the fold is the stock one -- the same quantized graph, the same
numbers -- and the model's tensors are never written. :class:`TOSAQuantizer`,
:class:`EthosUQuantizer` and :class:`VgfQuantizer` take exactly what Arm's take and run
their ``transform_for_annotation`` under it; ``PATCHES.install()`` puts it in place
process-wide (for Arm's own quantizers too) until ``uninstall()``. In the float path the
fold is the rules of :mod:`fusionkit.passes.arm.scalar_mul_conv`, on the exported
program's constants.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.fx import GraphModule, Node

from fusionkit.integration.hooks import PatchSet

__all__ = ["PATCHES", "EthosUQuantizer", "TOSAQuantizer", "VgfQuantizer", "rebind_attribute"]

_PASS_MODULE = "executorch.backends.arm._passes.fold_scalar_mul_into_conv_pass"


def rebind_attribute(self: Any, node: Node, tensor: torch.Tensor) -> bool:
    """``FoldScalarMulIntoConvPass._set_get_attr_tensor`` that binds a new tensor to the
    attribute ``node`` reads instead of copying into the one there (which may be the
    user's). False where the stock method returns False (no owning module, no tensor)."""
    owning = node.graph.owning_module
    if owning is None:
        return False
    *path, name = str(node.target).split(".")
    try:
        owner = owning.get_submodule(".".join(path))
    except AttributeError:
        return False
    old = getattr(owner, name, None)
    if not isinstance(old, torch.Tensor):
        return False
    new = tensor.detach().to(device=old.device, dtype=old.dtype).clone()
    if name in owner._parameters:
        owner._parameters[name] = torch.nn.Parameter(new, requires_grad=old.requires_grad)
    elif name in owner._buffers:
        owner._buffers[name] = new
    else:
        setattr(owner, name, new)
    return True


def _patches() -> list[tuple[Any, str, Any]]:
    import importlib

    cls = importlib.import_module(_PASS_MODULE).FoldScalarMulIntoConvPass
    if not callable(getattr(cls, "_set_get_attr_tensor", None)):
        from fusionkit.integration.hooks import UnsupportedExecuTorchError

        raise UnsupportedExecuTorchError(
            f"{_PASS_MODULE}.FoldScalarMulIntoConvPass has no _set_get_attr_tensor; this "
            "ExecuTorch build does not look like the one this patch was written against")
    return [(cls, "_set_get_attr_tensor", rebind_attribute)]


PATCHES = PatchSet(
    f"fusionkit.backends.arm_adapter.quantizer (FoldScalarMulIntoConvPass."
    f"_set_get_attr_tensor in {_PASS_MODULE}: a new tensor, never a write into the module's)",
    _patches)


def _quantizer(name: str) -> type:
    import importlib

    return getattr(importlib.import_module("executorch.backends.arm.quantizer"), name)  # type: ignore[no-any-return]


def _annotating(cls: Any) -> Any:
    """``cls`` whose ``transform_for_annotation`` runs under :data:`PATCHES`."""

    class Quantizer(cls):  # type: ignore[misc,valid-type]
        #: prepare_pt2e given this quantizer folds conv + batch norm with fusionkit's rules
        fusionkit_quantize_step = True

        @functools.wraps(cls.__init__)  # type: ignore[misc]  # (the stock signature shown)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            from fusionkit.backends import quantize_step

            quantize_step.ensure_call_site()

        def transform_for_annotation(self, model: GraphModule) -> GraphModule:
            with PATCHES.install():
                return super().transform_for_annotation(model)  # type: ignore[no-any-return]

    Quantizer.__name__ = Quantizer.__qualname__ = cls.__name__
    Quantizer.__module__ = __name__
    Quantizer.__doc__ = (f"ExecuTorch's ``{cls.__name__}``; its conv-scale fold binds new "
                         "tensors instead of writing into the model's (:data:`PATCHES`), and "
                         "``prepare_pt2e`` folds its conv + batch norms with fusionkit's rules "
                         "(:mod:`fusionkit.backends.quantize_step`).")
    return Quantizer


TOSAQuantizer: Any = _annotating(_quantizer("TOSAQuantizer"))
EthosUQuantizer: Any = _annotating(_quantizer("EthosUQuantizer"))
VgfQuantizer: Any = _annotating(_quantizer("VgfQuantizer"))
