"""XNNPACK constant serialization on fusionkit's core constant access.

ExecuTorch 1.5.1 (``backends/xnnpack/operators/node_visitor.py``) writes each
constant as ``untyped_storage()`` from byte 0, and per-channel(-group) scales
without ``contiguous()``. The functions below re-implement the three places that
produce constant bytes – ``NodeVisitor.get_serialized_buffer_index`` (weights,
biases, every other constant, including those XNNPACK's own preprocess passes
create), ``NodeVisitor.get_quant_params`` (per-channel and per-channel-group
scales) and ``NodeVisitor.convert_to_qc4w`` (int4 packing) – on
:mod:`fusionkit.program_inputs` (what a placeholder is bound to) and
:mod:`fusionkit.integration.tensor_bytes` (the tensor's own bytes). Keys stay content
hashes (``sha256`` / ``"scale_" + sha256``) of the *exact* bytes, so the
NamedDataStore de-duplicates identical constants and nothing else. A weight of a MiB or
more is handed to the NamedDataStore as a file (:mod:`fusionkit.integration.spilled_data`)
where ExecuTorch takes one, not as a second copy in memory until the ``.pte`` is written.

:data:`SERIALIZER_PATCHES` swaps them in (plus ``get_param_tensor``, which ExecuTorch
imported by value into ``node_visitor`` and ``quant_params``, and the
NamedDataStore's ``_tensor_to_bytes``) and puts back the very same objects when
uninstalled; the adapter's patch set (:mod:`.install`) includes it. The replacements
mirror the code of the supported ExecuTorch releases; where those differ (bf16 constants:
kept bf16 from 1.5.0, written as fp32 before), they ask
:func:`fusionkit.integration.versions.features`.
"""

from __future__ import annotations

import hashlib
import importlib
import weakref
from typing import Any, cast

import torch
from torch.export import ExportedProgram

from fusionkit import ProgramInputs
from fusionkit.integration.hooks import (
    Installation,
    PatchSet,
    UnsupportedExecuTorchError,
)
from fusionkit.integration.spilled_data import SERDE_PATCHES, constant_blob
from fusionkit.integration.tensor_bytes import (
    acquire_named_data_fix,
    pack_int4,
    release_named_data_fix,
    tensor_bytes,
)
from fusionkit.integration.versions import features

__all__ = [
    "SERIALIZER_PATCHES",
    "Installation",
    "UnsupportedExecuTorchError",
    "constant_tensor",
    "convert_to_qc4w",
    "get_quant_params",
    "get_serialized_buffer_index",
]


_NV = "executorch.backends.xnnpack.operators.node_visitor"
_QP = "executorch.backends.xnnpack.operators.quant_params"


# ----------------------------------------------------------------------------- constants

class _WeaklyHeldInputs(ProgramInputs):
    """:class:`ProgramInputs` holding its program weakly. The cache below is keyed weakly
    by the program; a value holding the program itself would keep its key, and with it
    every preprocessed program and each constant it delegated, alive until the process
    ends (+1.7 GB at the end of a Qwen3-0.6B ``export_llm`` on XNNPACK)."""

    @property  # type: ignore[override]
    def _ep(self) -> ExportedProgram:
        ep = self._program()
        if ep is None:
            raise ReferenceError("the program these inputs index no longer exists")
        return ep

    @_ep.setter
    def _ep(self, ep: ExportedProgram) -> None:
        self._program = weakref.ref(ep)


_inputs_cache: weakref.WeakKeyDictionary[ExportedProgram, tuple[Any, int, ProgramInputs]] = (
    weakref.WeakKeyDictionary()
)


def _program_inputs(ep: ExportedProgram) -> ProgramInputs:
    sig = ep.graph_signature
    key = (sig, len(sig.input_specs))
    hit = _inputs_cache.get(ep)
    if hit is not None and hit[0] is key[0] and hit[1] == key[1]:
        return hit[2]
    inputs = _WeaklyHeldInputs(ep)
    _inputs_cache[ep] = (sig, len(sig.input_specs), inputs)
    return inputs


def constant_tensor(ep: ExportedProgram, node: torch.fx.Node) -> torch.Tensor | None:
    """The tensor a node is bound to, via :class:`fusionkit.ProgramInputs`.

    Parameters, buffers and lifted constants come from the program's signature;
    a mutable buffer (initial value) or a ``get_attr`` node falls back to the
    stock lookup. Returns the stored tensor itself (possibly a view).
    """
    ref = _program_inputs(ep).constant(node)
    if ref is not None:
        return ref.tensor
    from executorch.backends.xnnpack.utils import utils as xnn_utils

    return cast("torch.Tensor | None", xnn_utils.get_param_tensor(ep, node))


# ----------------------------------------------------------------------------- replacements


def convert_to_qc4w(inp: torch.Tensor) -> torch.Tensor:
    """XNNPACK qc4w packing (``NodeVisitor.convert_to_qc4w``): low nibble = even element."""
    return pack_int4(inp, low_nibble_first=True)


def _kept_float_dtypes() -> tuple[torch.dtype, ...]:
    """Float dtypes the installed ExecuTorch's serializer writes as they are (others: fp32)."""
    return (torch.float16, torch.bfloat16) if features().bf16_delegation else (torch.float16,)


def get_serialized_buffer_index(
    self: Any,
    tensor: torch.fx.Node,
    xnn_graph: Any,
    vals_to_ids: dict[torch.fx.Node, int],
    convert_to_nhwc: bool,
    swap_in_out_for_weights: bool,
    quant_params: Any,
    force_fp32: bool = False,
    groups: int = 1,
) -> int:
    """``NodeVisitor.get_serialized_buffer_index`` writing the constant's exact bytes."""
    nv = importlib.import_module(_NV)
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import (
        ConstantDataOffset,
    )
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import (
        CONSTANT_TENSOR_ALIGNMENT,
    )
    from executorch.backends.xnnpack.utils.xnnpack_constants import UINT64_MAX

    assert swap_in_out_for_weights or groups == 1, "groups is option for swap_in_out_for_weights"
    get_attr_node = tensor if quant_params is None else quant_params.q_input
    if not nv.is_param_node(self.exported_program, get_attr_node):
        nv.check_or_raise(
            not swap_in_out_for_weights,
            "Swapping N and C dimensions is only valid for constant data tensors",
        )
        return 0

    buffer_idx = len(xnn_graph.constant_data)
    const_val = constant_tensor(self.exported_program, get_attr_node)
    assert const_val is not None and isinstance(const_val, torch.Tensor)
    const_val = const_val.detach()

    if quant_params is not None and not quant_params.is_dynamic:
        const_val = quant_params.quantize_tensor(const_val)
    elif const_val.dtype not in _kept_float_dtypes() or force_fp32:
        const_val = const_val.to(dtype=torch.float32)

    if swap_in_out_for_weights:
        # (inc, oc/groups, ...) -> (oc, inc/groups, ...) for depthwise / transposed conv
        shape = const_val.shape
        const_val = const_val.reshape((groups, shape[0] // groups, *shape[1:]))
        const_val = const_val.permute((0, 2, 1, *range(3, const_val.dim())))
        const_val = const_val.reshape((shape[1] * groups, shape[0] // groups, *shape[2:]))

    if quant_params is not None and quant_params.is_qc4w:
        # stock packs after its NHWC conversion, but packing makes the tensor 2-d
        # (squeeze) in logical order, so the NHWC step has no effect on qc4w data
        data, named_key = constant_blob(self.convert_to_qc4w(const_val))
    elif convert_to_nhwc:
        nv.check_or_raise(const_val.dim() == 4, "Converting to nhwc requires 4d tensor")
        data, named_key = constant_blob(const_val, dim_order=(0, 2, 3, 1))
    else:
        data, named_key = constant_blob(const_val)

    size = len(data)
    nv.check_or_raise(
        size > 0, f"Serializing constant data node {tensor} but tensor value has no bytes"
    )
    xnn_graph.constant_data.append(
        ConstantDataOffset(offset=UINT64_MAX, size=size, named_key=named_key)
    )
    custom_meta = tensor.meta.get("custom", None)
    external_tag = custom_meta.get("delegate_constant_tag", None) if custom_meta else None
    self._named_data_store.add_named_data(
        named_key, data, alignment=CONSTANT_TENSOR_ALIGNMENT, external_tag=external_tag
    )
    return buffer_idx


def get_quant_params(
    self: Any, quant_params: Any, xnn_graph: Any, external_tag: str | None = None
) -> Any:
    """``NodeVisitor.get_quant_params`` writing the scales' exact bytes in logical order.

    Per-channel-group scales are written as bf16 (as XNNPACK expects), per-channel
    scales as fp32.
    """
    from executorch.backends.xnnpack.serialization.xnnpack_graph_schema import (
        ConstantDataOffset,
        PerChannelGroupQuant,
        PerChannelQuant,
        PerTensorQuant,
        PerTokenDynamicQuant,
    )
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import (
        CONSTANT_TENSOR_ALIGNMENT,
    )
    from executorch.backends.xnnpack.utils.xnnpack_constants import UINT64_MAX

    if quant_params.per_channel:
        scale = cast(torch.Tensor, quant_params.scale)
        buffer_idx = len(xnn_graph.constant_data)
        num_scales = scale.numel()
        if quant_params.per_channel_group:
            scale = scale.to(torch.bfloat16)
        else:
            scale = scale.to(torch.float32)
        data = tensor_bytes(scale)
        scale_name = "scale_" + hashlib.sha256(data).hexdigest()
        xnn_graph.constant_data.append(
            ConstantDataOffset(offset=UINT64_MAX, size=len(data), named_key=scale_name)
        )
        self._named_data_store.add_named_data(
            scale_name, data, CONSTANT_TENSOR_ALIGNMENT, external_tag
        )
        if quant_params.per_channel_group:
            return PerChannelGroupQuant(
                scale=[],
                channel_dim=quant_params.axis,
                group_size=quant_params.group_size,
                scale_buffer_idx=buffer_idx,
                num_scales=num_scales,
            )
        return PerChannelQuant(
            scale=[],
            channel_dim=quant_params.axis,
            scale_buffer_idx=buffer_idx,
            num_scales=num_scales,
        )
    if quant_params.is_dynamic:
        return PerTokenDynamicQuant(num_nonbatch_dims=quant_params.num_nonbatch_dims)
    return PerTensorQuant(
        scale=cast(float, quant_params.scale), zero_point=cast(int, quant_params.zp)
    )


# ----------------------------------------------------------------------------- install


def _patches() -> list[tuple[Any, str, Any]]:
    nv = importlib.import_module(_NV)
    qp = importlib.import_module(_QP)
    cls = nv.NodeVisitor
    return [
        (cls, "get_serialized_buffer_index", get_serialized_buffer_index),
        (cls, "get_quant_params", get_quant_params),
        (cls, "convert_to_qc4w", staticmethod(convert_to_qc4w)),
        # imported by value: weights (node_visitor) and scales (quant_params)
        (nv, "get_param_tensor", constant_tensor),
        (qp, "get_param_tensor", constant_tensor),
    ]


#: the serializer's own patches; the adapter's patch set (:data:`.install.PATCHES`)
#: includes them with the preprocess rules and the pass gates
SERIALIZER_PATCHES = PatchSet("fusionkit.backends.xnnpack_adapter.serializer", _patches,
                              before_install=acquire_named_data_fix,
                              after_uninstall=release_named_data_fix,
                              includes=(SERDE_PATCHES,))
