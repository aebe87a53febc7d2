"""Run a lowered Vulkan program on the CPU by interpreting its serialized payloads.

ExecuTorch's wheel has no Vulkan runtime, so a bad payload usually shows itself
first as an abort on a phone. :func:`simulate` executes a lowered program in
Python instead::

    from fusionkit.backends.vulkan_adapter import simulate
    out = simulate(prog, x)   # prog: EdgeProgramManager or ExecutorchProgramManager

What runs
---------
* The program's own top-level graph (``prog.exported_program()``): placeholders
  come from its state dict / constants and the given inputs, every
  ``call_function`` node runs its op (for an ``ExecutorchProgramManager`` these are
  the out-variants and ``memory.alloc`` of the emitted program), ``getitem`` picks
  delegate outputs.
* Each ``executorch_call_delegate`` of a ``VulkanBackend`` delegate runs the
  **serialized payload**, never the original FX graph or tensors: the VkGraph is
  decoded by :mod:`.payload`, constants are the bytes exactly as serialized (the
  program's named data, or the payload's raw section). For an
  ``EdgeProgramManager`` the payload and named data are the lowered module's
  ``processed_bytes`` / ``named_data_store_output``; for an
  ``ExecutorchProgramManager`` they are read back from ``prog.buffer`` (the .pte):
  the k-th delegate call of the graph is the k-th ``DelegateCall`` instruction
  of the method's chain, whose ``delegate_index`` names the payload.
* Each ``OperatorCall`` of the chain is executed with its ATen implementation
  (``torch.ops.<ns>.<op>.<overload>``; ``et_vk.*`` ops with the reference
  kernels of ``executorch.backends.vulkan.custom_ops_lib``), its ``args`` resolved
  from the VkGraph's values by the operator's schema: ``Int``/``Double``/``Bool``/
  ``String``, ``IntList``/``DoubleList``/``BoolList``, ``ValueList`` (tensor lists,
  or int lists holding ``SymInt`` values), ``Null`` and ``SymInt``. The last id is
  the output (a ``ValueList`` for ops with several outputs).

The runtime's rules that are enforced
-------------------------------------
* ``et_vk.prepack`` and every argument in :data:`.prepack_check.PREPACKED_ARGS` (from
  ``shared/vulkan-prepacked-args.md``) must be a constant (a ``VkTensor`` with
  ``constant_id >= 0``, a TensorRef); otherwise :class:`NotConstantError` is
  raised with the condition the runtime aborts on
  (``... (graph.val_is_tref(tensor_data)) is false!``), naming op and argument.
* The quantized and KV-cache ops prepack more arguments (weights, scales, sums,
  bias: :data:`.runtime_conditions.PREPACKED`); they raise :class:`NotConstantError`
  the same way. Each op's :data:`.runtime_conditions.CONDITIONS` (group size,
  channel counts, alignment, shapes the runtime accepts: its ``VK_CHECK_COND``
  text, or what the shader would misread) raise :class:`RuntimeConditionError`
  naming op, argument and condition before the op runs.
* A scalar is read as the runtime reads it: a float argument from an ``Int``, ``Double``
  or ``Bool`` (``extract_scalar<T>`` casts); an argument the runtime reads only as an
  ``Int`` (``graph.get_int``: a conv's ``groups``, ``avg_pool2d``'s ``divisor_override``,
  the KV-cache ops' ``start_pos``) serialized as a ``Double`` breaks a runtime condition
  (``<arg>_is_int``; stock's serializer gives ``groups=1`` the value of an earlier
  ``1.0``: ``Expected value to have type Int, got DOUBLE instead``).
* An operator the simulator cannot execute raises :class:`UnsupportedOperatorError`
  naming it; nothing is skipped.
* A constant whose bytes are shorter than its tensor raises; a longer one is read
  from its first byte, as the runtime's staging copy reads it (this is how the
  stock serializer's "whole base storage of a view" bug gives wrong numbers).
* A value read before any op wrote it, a reference outside the graph, an output
  whose shape or kind differs from what the VkGraph declares: :class:`SimulationError`.
* A ``.pte``'s inputs are resized as the runtime resizes them before a call: an input
  of other sizes than a static tensor's, or of more elements than a bounded tensor was
  planned with, raises :class:`SimulationError` (the runtime: ``Error resizing tensor at
  input i``); a program specialized to its example sizes is refused at any other.

Dtypes, storage types and memory layouts
----------------------------------------
* Every tensor is held in the dtype its ``VkTensor.datatype`` declares (``VkDataType``:
  BOOL, UINT8, INT8, INT32, FLOAT16, FLOAT32, FLOAT64, INT64): delegate inputs are
  converted to it when they enter (the runtime's staging copy, e.g. int64 -> int32
  with the default ``downcast_64_bit``), each op's result is converted to its
  output's datatype, and delegate outputs are converted back to the dtype the
  program's graph expects of the delegate call.
* The serializer writes ``ScalarType``/``Device``/``Layout``/``MemoryFormat``
  arguments as ``Null``; like the runtime, the simulator takes a ``ScalarType``
  from the declared output tensor (for ``dequantize_*``'s ``dtype``/``input_dtype``:
  the input's; for ``choose_qparams*``: int8),
  and passes ``None`` for device/layout/memory format.
* ``storage_type`` (buffer / 3-D texture / 2-D texture) and ``memory_layout``
  (width/height/channels packed, ...) of tensors and the graph overrides are
  **ignored**: they decide how the GPU stores a tensor, not its values, and the
  runtime's staging copies convert to and from contiguous order. Likewise the
  ``dim_order`` of ``_to_dim_order_copy``/``_clone_dim_order`` only changes strides.
  Texture-size limits are not checked.
* At the delegate's boundary the program's dim orders do matter: the runtime copies
  each input's memory into staging, and each result into an output's memory, in
  contiguous order whatever the tensor's dim order (``VulkanBackend::execute``; found
  on the real runtime). The simulator does the same
  (:func:`.runtime_conditions.as_read_by_runtime` / ``as_written_by_runtime``), so a
  channels_last (0, 2, 3, 1) delegate output holds the NCHW result's bytes, as on the
  runtime; :func:`.prepack_check.check` reports it
  (:data:`.runtime_conditions.DELEGATE_DIM_ORDER`). It computes, it does not raise: an
  elementwise delegate whose input and output share one dim order is right on the
  runtime too.
* ``aten.gelu`` computes the tanh approximation whatever ``approximate`` says, as the
  runtime's only gelu shader does (``unary_op.yaml``; 4.7e-4 from the erf form).
* ``mem_obj_id`` (memory planning: tensors sharing one allocation) is not
  simulated: every value has its own storage.

Supported operators
-------------------
:data:`SUPPORTED_OPS`: every op of ExecuTorch 1.5.1's Vulkan op registry
(``op_registry.py``, enumerated by ``tests/test_vulkan_simulator_quantized.py``),
by serialized name (a torch ``OpOverload`` outside ``aten``, like the ``llama``
KV-cache ops, serializes without its namespace: both spellings are accepted).
Most run generically through their schema (ATen, or the reference kernels of
``custom_ops_lib`` / ``quantized_decomposed`` / ``torchao``); the special cases
are ``et_vk.prepack`` (the constant rule, then a copy), ``et_vk.conv_with_clamp``
(bounds cast to the tensor's dtype like the runtime: ``FuseClampPass`` writes
relu's upper bound as ``sys.float_info.max``), ``sym_size.int``,
``et_vk.select_as_symint``, ``et_vk.apply_rotary_emb_hf`` (its reference
with the first half of cos/sin for both halves, as the runtime's shader reads them:
:func:`first_half_twice`), the symbolic-int ``operator`` functions, the graph's
asserts, and the quantized / KV-cache ops of :data:`RUNTIME_OP_NAMES`, which run
with what the Vulkan *runtime* computes (:mod:`.quantized_ops`: weight layouts as
the prepack shaders read them, integer accumulation with the serialized weight
sums; where ExecuTorch's Python reference differs, the runtime wins and that
module says where). Ops the runtime has no kernel for because ``vulkan_preprocess``
fuses or removes them first (``torchao.quantize_affine``, ``aten.alias_copy``,
...) run with their ATen / reference semantics. The training ops run with
ExecuTorch's reference kernels. Which ops the tests exercise through real
lowerings is listed in ``tests/test_vulkan_simulator.py``.

* runtime semantics (:mod:`.quantized_ops`): ``custom_sdpa.default``,
  ``et_vk.embedding_q4gsw.default``, ``et_vk.linear_dq8ca_q4gsw.default``,
  ``et_vk.linear_q4gsw.default``, ``et_vk.linear_q8ta_q8csw.default``,
  ``et_vk.linear_qcs4w.default``, ``et_vk.q8ta_conv2d.default``,
  ``et_vk.q8ta_conv2d_dw.default``, ``et_vk.q8ta_conv2d_pw.default``,
  ``et_vk.q8ta_conv2d_transposed.default``, ``et_vk.q8ta_linear.default``,
  ``et_vk.q8ta_linear_gemv.default``, ``et_vk.q8ta_pixel_shuffle.default``,
  ``llama.custom_sdpa.default``, ``llama.sdpa_with_kv_cache.default``,
  ``llama.update_cache.default``, ``sdpa_with_kv_cache.default``,
  ``torchao.choose_qparams_affine.default``, ``update_cache.default``
* et_vk: ``et_vk.adamw_step.default``, ``et_vk.apply_rotary_emb.default``,
  ``et_vk.apply_rotary_emb_hf.default``, ``et_vk.apply_rotary_emb_interleaved.default``,
  ``et_vk.conv_with_clamp.default``, ``et_vk.fused_ce.default``,
  ``et_vk.grid_priors.default``, ``et_vk.linear_dW.default``,
  ``et_vk.linear_q4gsw_backward.default``, ``et_vk.prepack.default``,
  ``et_vk.q4gsw_requant.default``, ``et_vk.q8ta_add.default``, ``et_vk.q8ta_relu.default``,
  ``et_vk.rms_norm.default``, ``et_vk.sdpa.default``, ``et_vk.select_as_symint.default``
* quantized_decomposed: ``quantized_decomposed.choose_qparams.tensor``,
  ``quantized_decomposed.choose_qparams_per_token_asymmetric.default``,
  ``quantized_decomposed.dequantize_per_channel.default``,
  ``quantized_decomposed.dequantize_per_tensor.default``,
  ``quantized_decomposed.dequantize_per_tensor.tensor``,
  ``quantized_decomposed.dequantize_per_token.default``,
  ``quantized_decomposed.embedding_4bit.dtype``,
  ``quantized_decomposed.quantize_per_channel.default``,
  ``quantized_decomposed.quantize_per_tensor.default``,
  ``quantized_decomposed.quantize_per_tensor.tensor``,
  ``quantized_decomposed.quantize_per_token.default``
* torchao: ``torchao.dequantize_affine.default``, ``torchao.quantize_affine.default``
* aten: ``aten._log_softmax.default``,
  ``aten._native_batch_norm_legit_no_training.default``, ``aten._softmax.default``,
  ``aten._to_copy.default``, ``aten._weight_int8pack_mm.default``, ``aten.abs.default``,
  ``aten.add.Tensor``, ``aten.addmm.default``, ``aten.alias_copy.default``,
  ``aten.amax.default``, ``aten.amin.default``, ``aten.arange.start_step``,
  ``aten.argmax.default``, ``aten.argmin.default``, ``aten.avg_pool2d.default``,
  ``aten.bitwise_and.Tensor``, ``aten.bitwise_not.default``, ``aten.bitwise_or.Tensor``,
  ``aten.bmm.default``, ``aten.cat.default``, ``aten.clamp.default``,
  ``aten.clone.default``, ``aten.constant_pad_nd.default``,
  ``aten.convolution.default``, ``aten.copy.default``, ``aten.cos.default``,
  ``aten.div.Tensor``, ``aten.div.Tensor_mode``, ``aten.embedding.default``,
  ``aten.eq.Scalar``, ``aten.eq.Tensor``, ``aten.exp.default``,
  ``aten.expand_copy.default``, ``aten.flip.default``, ``aten.full.default``,
  ``aten.full_like.default``, ``aten.gather.default``, ``aten.ge.Scalar``,
  ``aten.ge.Tensor``, ``aten.gelu.default``, ``aten.grid_sampler_2d.default``,
  ``aten.gt.Scalar``, ``aten.gt.Tensor``, ``aten.hardshrink.default``,
  ``aten.hardswish.default``, ``aten.hardtanh.default``, ``aten.index.Tensor``,
  ``aten.index_select.default``, ``aten.le.Scalar``, ``aten.le.Tensor``,
  ``aten.leaky_relu.default``, ``aten.linear.default``, ``aten.log10.default``,
  ``aten.logical_and.default``, ``aten.logical_not.default``,
  ``aten.logical_or.default``, ``aten.lt.Scalar``, ``aten.lt.Tensor``,
  ``aten.max_pool2d.default``, ``aten.max_pool2d_with_indices.default``,
  ``aten.mean.dim``, ``aten.minimum.default``, ``aten.mm.default``, ``aten.mul.Tensor``,
  ``aten.native_group_norm.default``, ``aten.native_layer_norm.default``,
  ``aten.ne.Scalar``, ``aten.neg.default``, ``aten.ones.default``,
  ``aten.ones_like.default``, ``aten.permute.default``, ``aten.permute_copy.default``,
  ``aten.pixel_shuffle.default``, ``aten.pow.Tensor_Scalar``,
  ``aten.pow.Tensor_Tensor``, ``aten.relu.default``, ``aten.repeat.default``,
  ``aten.round.default``, ``aten.rsqrt.default``, ``aten.scalar_tensor.default``,
  ``aten.select_copy.int``, ``aten.sigmoid.default``, ``aten.sin.default``,
  ``aten.slice_copy.Tensor``, ``aten.split_with_sizes_copy.default``,
  ``aten.sqrt.default``, ``aten.squeeze_copy.dims``, ``aten.sub.Tensor``,
  ``aten.sum.dim_IntList``, ``aten.t_copy.default``, ``aten.tanh.default``,
  ``aten.unfold_copy.default``, ``aten.unsqueeze_copy.default``,
  ``aten.upsample_bilinear2d.vec``, ``aten.upsample_nearest2d.vec``,
  ``aten.view_copy.default``, ``aten.where.self``, ``aten.zeros.default``,
  ``aten.zeros_like.default``
* dim_order_ops: ``dim_order_ops._clone_dim_order.default``,
  ``dim_order_ops._to_dim_order_copy.default``
* symbolic ints and asserts (no schema): ``_assert_scalar.default``, ``add``, ``eq``,
  ``floordiv``, ``ge``, ``gt``, ``le``, ``lt``, ``mul``, ``sub``,
  ``sym_constrain_range_for_size.default``, ``sym_size.int``
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fusionkit.integration.spilled_data import blob_bytes

from .payload import VkGraph, VkTensor, VkValue, VulkanPayload, decode_payload
from .prepack_check import ABORT, BACKEND_ID, PREPACKED_ARGS, describe_value, stored_dtype
from .quantized_ops import RUNTIME_OPS
from .runtime_conditions import (
    CACHE_ROWS_UNWRITTEN,
    CONDITIONS,
    DELEGATE_ARGUMENT_COUNT,
    NOT_SIMULATED,
    OUTPUT_DTYPE_ARGUMENT,
    PREPACKED,
    SDPA_WITH_KV_CACHE,
    UNQUALIFIED_LLAMA,
    RuntimeCondition,
    RuntimeSymInt,
    as_read_by_runtime,
    as_written_by_runtime,
    conditions_for,
    contiguous_dim_order,
    delegate_argument_count,
    violated,
)
from .shaders import missing_shader

__all__ = [
    "RUNTIME_OP_NAMES",
    "SUPPORTED_OPS",
    "VK_TORCH_DTYPES",
    "DelegateRun",
    "NotConstantError",
    "RuntimeConditionError",
    "SimulationError",
    "UnsupportedOperatorError",
    "run_payload",
    "simulate",
    "unload",
]

#: VkDataType -> torch dtype
VK_TORCH_DTYPES: dict[int, torch.dtype] = {
    0: torch.bool, 1: torch.uint8, 2: torch.int8, 3: torch.int32, 4: torch.float16,
    5: torch.float32, 6: torch.float64, 7: torch.int64,
}

PREPACK = "et_vk.prepack.default"
GELU = "aten.gelu.default"
HF_ROPE = "et_vk.apply_rotary_emb_hf.default"


def first_half_twice(table: torch.Tensor) -> torch.Tensor:
    """What the runtime's ``apply_rotary_emb_hf`` shader reads of a cos/sin table: the first
    half of the last dim, for both halves (it assumes transformers' ``cat((f, f), -1)``;
    found on the real runtime, where the op's CPU reference reads the whole table)."""
    half = table.shape[-1] // 2
    return torch.cat((table[..., :half], table[..., :half]), dim=-1)


class SimulationError(RuntimeError):
    """The payload cannot be executed as the Vulkan runtime would execute it."""


class NotConstantError(SimulationError):
    """An argument the runtime prepacks (``prepack_standard``) is not a TensorRef."""

    def __init__(self, message: str, op: str, arg_index: int, arg_name: str) -> None:
        super().__init__(message)
        self.op, self.arg_index, self.arg_name = op, arg_index, arg_name


class RuntimeConditionError(SimulationError):
    """An argument breaks a condition the Vulkan runtime aborts on, or computes garbage
    under (:data:`.runtime_conditions.CONDITIONS`)."""

    def __init__(self, message: str, op: str, arg_name: str,
                 condition: RuntimeCondition) -> None:
        super().__init__(message)
        self.op, self.arg_name, self.condition = op, arg_name, condition


class UnsupportedOperatorError(SimulationError):
    """The payload calls an operator the simulator has no implementation for."""

    def __init__(self, message: str, op: str) -> None:
        super().__init__(message)
        self.op = op


# ---------------------------------------------------------------- operator table

#: ops of the ExecuTorch 1.5.1 Vulkan op registry run through their ATen/et_vk schema
_SCHEMA_OPS: tuple[str, ...] = (
    # unary
    "aten.abs.default", "aten.cos.default", "aten.exp.default", "aten.gelu.default",
    "aten.hardshrink.default", "aten.hardswish.default", "aten.hardtanh.default",
    "aten.neg.default", "aten.relu.default", "aten.sigmoid.default", "aten.sin.default",
    "aten.sqrt.default", "aten.rsqrt.default", "aten.tanh.default", "aten.round.default",
    "aten.leaky_relu.default", "aten.log10.default", "aten.clamp.default",
    "aten.logical_not.default", "aten.bitwise_not.default",
    # binary / comparison
    "aten.add.Tensor", "aten.sub.Tensor", "aten.minimum.default", "aten.mul.Tensor",
    "aten.div.Tensor", "aten.div.Tensor_mode", "aten.pow.Tensor_Tensor",
    "aten.pow.Tensor_Scalar", "aten.eq.Tensor", "aten.lt.Tensor", "aten.le.Tensor",
    "aten.gt.Tensor", "aten.ge.Tensor", "aten.eq.Scalar", "aten.ne.Scalar",
    "aten.lt.Scalar", "aten.le.Scalar", "aten.ge.Scalar", "aten.gt.Scalar",
    "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.logical_and.default",
    "aten.logical_or.default", "aten.where.self",
    # copies and dtype conversion
    "aten.copy.default", "aten._to_copy.default", "aten.clone.default",
    "dim_order_ops._to_dim_order_copy.default", "dim_order_ops._clone_dim_order.default",
    "aten.alias_copy.default",
    # reductions, softmax
    "aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default",
    "aten.argmax.default", "aten.argmin.default", "aten._softmax.default",
    "aten._log_softmax.default",
    # matmul / linear / conv / pool
    "aten.bmm.default", "aten.mm.default", "aten.addmm.default", "aten.linear.default",
    "aten.convolution.default",
    "aten.avg_pool2d.default", "aten.max_pool2d.default",
    "aten.max_pool2d_with_indices.default",
    # shape and indexing
    "aten.permute.default", "aten.permute_copy.default", "aten.view_copy.default",
    "aten.squeeze_copy.dims", "aten.unsqueeze_copy.default", "aten.unfold_copy.default",
    "aten.gather.default", "aten.expand_copy.default", "aten.cat.default",
    "aten.select_copy.int", "aten.slice_copy.Tensor", "aten.split_with_sizes_copy.default",
    "aten.t_copy.default", "aten.flip.default", "aten.index_select.default",
    "aten.index.Tensor", "aten.repeat.default", "aten.constant_pad_nd.default",
    "aten.pixel_shuffle.default", "aten.upsample_nearest2d.vec",
    "aten.upsample_bilinear2d.vec", "aten.grid_sampler_2d.default",
    # creation
    "aten.arange.start_step", "aten.full.default", "aten.full_like.default",
    "aten.ones.default", "aten.ones_like.default", "aten.zeros.default",
    "aten.zeros_like.default", "aten.scalar_tensor.default", "et_vk.grid_priors.default",
    # normalization, embedding
    "aten.embedding.default", "aten._native_batch_norm_legit_no_training.default",
    "aten.native_group_norm.default", "aten.native_layer_norm.default",
    "et_vk.rms_norm.default",
    # fused transformer ops
    "et_vk.apply_rotary_emb.default", "et_vk.apply_rotary_emb_hf.default",
    "et_vk.sdpa.default", "et_vk.apply_rotary_emb_interleaved.default",
    # quantize / dequantize (runtime: quantize_and_pack / unpack_and_dequantize shaders)
    "quantized_decomposed.quantize_per_tensor.default",
    "quantized_decomposed.quantize_per_tensor.tensor",
    "quantized_decomposed.dequantize_per_tensor.default",
    "quantized_decomposed.dequantize_per_tensor.tensor",
    "quantized_decomposed.quantize_per_channel.default",
    "quantized_decomposed.dequantize_per_channel.default",
    "quantized_decomposed.quantize_per_token.default",
    "quantized_decomposed.dequantize_per_token.default",
    "quantized_decomposed.choose_qparams.tensor",
    "quantized_decomposed.choose_qparams_per_token_asymmetric.default",
    "quantized_decomposed.embedding_4bit.dtype",
    "torchao.quantize_affine.default", "torchao.dequantize_affine.default",
    # int8 activation elementwise ops (dequantize -> op -> requantize)
    "et_vk.q8ta_add.default", "et_vk.q8ta_relu.default", "et_vk.q8ta_pixel_shuffle.default",
    # weight-only linears with their own packing
    "et_vk.linear_qcs4w.default", "aten._weight_int8pack_mm.default",
    # training ops
    "et_vk.linear_q4gsw_backward.default", "et_vk.q4gsw_requant.default",
    "et_vk.linear_dW.default", "et_vk.fused_ce.default", "et_vk.adamw_step.default",
)

#: name as serialized (``node.target.__name__``) -> Python implementation, for ops
#: without a torch schema (symbolic ints) or with runtime rules of their own
_SPECIAL: dict[str, Callable[..., Any]] = {}

#: every operator name :func:`simulate` executes, as serialized in ``OperatorCall.name``
SUPPORTED_OPS: frozenset[str] = frozenset()  # filled in below

_SYMINT_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "floordiv": operator.floordiv, "lt": operator.lt, "gt": operator.gt,
    "le": operator.le, "ge": operator.ge, "eq": operator.eq,
}


def _load_op_libraries() -> None:
    """Register the et_vk (Vulkan reference kernels) and dim_order ops with torch."""
    import executorch.backends.vulkan.custom_ops_lib
    import executorch.exir.passes.dim_order_ops_registry  # noqa: F401
    import torch.ao.quantization.fx._decomposed  # noqa: F401  quantized_decomposed.*
    import torchao.quantization.quant_primitives  # noqa: F401  torchao.*
    from executorch.exir.passes import _quant_patterns_and_replacements  # noqa: F401
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  llama.*


def _torch_op(name: str) -> Any:
    """``"aten.add.Tensor"`` -> ``torch.ops.aten.add.Tensor`` (None if there is none)."""
    parts = name.split(".")
    if len(parts) != 3:
        return None
    ns, op, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError):
        return None


# ------------------------------------------------------------------- values


@dataclass
class _Const:
    """A TensorRef: a constant exactly as serialized."""

    tensor: torch.Tensor


_UNSET = object()


def _vk_dtype(t: VkTensor, what: str) -> torch.dtype:
    dt = VK_TORCH_DTYPES.get(t.datatype)
    if dt is None:
        raise SimulationError(f"{what} has datatype {t.dtype_name} ({t.datatype}), which "
                              "has no torch dtype")
    return dt


_SHADER_CONDITION = RuntimeCondition(
    "aten.<binary>", "shader_variant", ("self",),
    "shader 'binary_' + op + storage suffix(out) + dtype suffix(in1) is registered",
    "BinaryOp.cpp: add_binary_op_node (VK_KERNEL_FROM_STR)", "abort", lambda _a: True,
    "the shader registry must hold the variant the runtime composes")


class _Delegate:
    """One Vulkan payload being executed."""

    def __init__(self, payload: VulkanPayload, named_data: Callable[[str], bytes | None],
                 label: str) -> None:
        _load_op_libraries()
        self.g: VkGraph = payload.graph
        self.raw = payload.raw
        self.named_data = named_data
        self.label = label
        #: a probed RuntimeInventory, or None (see simulate())
        self.runtime: Any = None
        self.values: list[Any] = [_UNSET] * len(self.g.values)
        self.static = True  # inputs arrived with the shapes the VkGraph declares
        #: chain indices of prepack ops already run: the runtime prepacks once, when
        #: the program is loaded, and keeps the packed tensors (and in-place updates
        #: to them, e.g. a KV cache) for every later execution
        self.prepacked: set[int] = set()
        #: value id of a KV cache -> the rows ``sdpa_with_kv_cache`` wrote since load (the
        #: runtime does not load a cache's serialized values: ``cache_rows_written``, whose
        #: ``uninitialized_state`` also makes the real runtime's runners isolate the program;
        #: ``testing.compute_attn_weight_with_kv_cache``, the same caches, has no torch op
        #: and is not simulated)
        self.cache_rows: dict[int, torch.Tensor] = {}
        for vid, v in enumerate(self.g.values):
            self.values[vid] = self._initial(vid, v)

    def cache_rows_unwritten(self, caches: Sequence[int], pos: int, rows: int) -> int:
        """How many rows in ``[0, pos)`` of ``caches`` were not written since load; then
        marks ``[pos, pos + rows)`` written, as the op is about to write them."""
        unwritten = 0
        for vid in caches:
            t = self.tensor_meta(vid)
            length = int(t.dims[1]) if t is not None and len(t.dims) > 1 else pos + rows
            mask = self.cache_rows.setdefault(vid, torch.zeros(max(length, pos + rows),
                                                               dtype=torch.bool))
            unwritten += int((~mask[:max(pos, 0)]).sum())
            mask[max(pos, 0):pos + rows] = True
        return unwritten

    # -- errors
    def err(self, msg: str) -> SimulationError:
        return SimulationError(f"{self.label}: {msg}")

    # -- initial values
    def _initial(self, vid: int, v: VkValue) -> Any:
        k = v.kind
        if k in ("Null", "NONE"):
            return None
        if k in ("Int", "Double", "Bool", "String"):
            return v.value
        if k in ("IntList", "DoubleList", "BoolList"):
            return list(v.value)
        if k == "VkTensor":
            t = v.tensor
            assert t is not None
            return _Const(self._constant(vid, t)) if t.is_constant else _UNSET
        if k in ("ValueList", "SymInt"):
            return _UNSET  # resolved on read / written by an op or an input
        raise self.err(f"value {vid} has unknown kind {k!r}")

    def _constant(self, vid: int, t: VkTensor) -> torch.Tensor:
        what = f"constant {t.constant_id} (value {vid}, {t.dtype_name}{list(t.dims)})"
        if t.constant_id >= len(self.g.constants):
            raise self.err(f"{what} refers past the graph's {len(self.g.constants)} constants")
        c = self.g.constants[t.constant_id]
        dtype = _vk_dtype(t, what)
        need = t.numel * dtype.itemsize
        if c.in_named_data:
            data = self.named_data(c.named_key)
            if data is None:
                raise self.err(f"{what}: named data {c.named_key!r} is not in the program "
                               "(kept in a separate .ptd?)")
        else:
            data = self.raw[c.offset:c.offset + c.length]
        if len(data) < need:
            raise self.err(f"{what} has {len(data)} bytes, its tensor needs {need}: the "
                           "runtime would read past the end of the constant")
        # the runtime's staging copy reads the tensor's bytes from the constant's start
        buf = bytearray(data[:need])
        if need == 0:
            return torch.empty(tuple(t.dims), dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype).reshape(tuple(t.dims)).clone()

    # -- reading values
    def read(self, vid: int, who: str) -> Any:
        if not 0 <= vid < len(self.values):
            raise self.err(f"{who} refers to value {vid}, but the graph has "
                           f"{len(self.values)} values")
        v = self.g.values[vid]
        if v.kind == "ValueList":
            return [self.read(i, who) for i in v.value]
        x = self.values[vid]
        if x is _UNSET:
            raise self.err(f"{who} reads value {vid} ({describe_value(v)}) before any op or "
                           "input wrote it")
        return x

    def tensor_meta(self, vid: int) -> VkTensor | None:
        v = self.g.value(vid)
        return None if v is None else v.tensor

    # -- writing values
    def write(self, vid: int, x: Any, who: str) -> None:
        v = self.g.value(vid)
        if v is None:
            raise self.err(f"{who} writes value {vid}, but the graph has {len(self.values)} "
                           "values")
        if v.kind == "ValueList":
            items = list(x) if isinstance(x, (tuple, list)) else None
            if items is None or len(items) != len(v.value):
                raise self.err(f"{who} produced {type(x).__name__} for value {vid}, a "
                               f"ValueList of {len(v.value)}")
            for i, item in zip(v.value, items, strict=True):
                self.write(i, item, who)
            return
        if v.kind in ("Null", "NONE") and x is None:
            return  # an op without an output (_assert_scalar)
        t = v.tensor
        if t is not None:
            if t.is_constant:
                raise self.err(f"{who} writes value {vid}, a constant (TensorRef)")
            if not isinstance(x, torch.Tensor):
                raise self.err(f"{who} produced {type(x).__name__} for value {vid}, a tensor")
            want = _vk_dtype(t, f"value {vid}")
            if self.static and tuple(x.shape) != tuple(t.dims):
                raise self.err(f"{who} produced shape {list(x.shape)} for value {vid}, which "
                               f"the VkGraph declares as {list(t.dims)}")
            self.values[vid] = x.to(want).contiguous()
            return
        if v.kind == "SymInt":
            if isinstance(x, torch.Tensor):
                x = x.item()
            self.values[vid] = int(x)
            return
        raise self.err(f"{who} writes value {vid} of kind {v.kind}")

    # -- running
    def run(self, inputs: Sequence[Any]) -> list[Any]:
        ids = self.g.input_ids
        if len(inputs) != len(ids):
            raise self.err(f"the delegate takes {len(ids)} inputs, got {len(inputs)}")
        self.static = True
        for k, (vid, x) in enumerate(zip(ids, inputs, strict=True)):
            t = self.tensor_meta(vid)
            if t is not None and isinstance(x, torch.Tensor):
                if tuple(x.shape) != tuple(t.dims):
                    self.static = False
                self.values[vid] = x.to(_vk_dtype(t, f"input {k}")).contiguous()
            else:
                self.write(vid, x, f"input {k}")
        #: the first condition under which the runtime computes garbage: raised once every
        #: op ran, since an abort anywhere (the runtime builds every op first) comes first
        self.garbage: RuntimeConditionError | None = None
        for index, call in enumerate(self.g.chain):
            if index in self.prepacked:
                continue
            self.call(index, call.name, call.args)
            if call.name == PREPACK:
                self.prepacked.add(index)
        if self.garbage is not None:
            raise self.garbage
        return [self.read(vid, f"output {k}") for k, vid in enumerate(self.g.output_ids)]

    def condition_broken(self, who: str, name: str, bad: Sequence[RuntimeCondition]) -> None:
        """Raise for the first abort among ``bad``; a garbage condition is kept for the end
        of the run (the op still computes what it would have)."""
        for c in sorted(bad, key=lambda c: c.effect != "abort"):
            err = RuntimeConditionError(f"{self.label}: {who} argument {c.args[0]!r}: "
                                        f"{c.message()}", name, c.args[0], c)
            if c.effect == "abort":
                raise err
            if getattr(self, "garbage", None) is None:
                self.garbage = err
            return

    def require_constant(self, name: str, index: int, arg_name: str, vid: int) -> None:
        v = self.g.value(vid)
        t = None if v is None else v.tensor
        if t is not None and t.is_constant:
            return
        where = f"{name} argument {index} ({arg_name})"
        raise NotConstantError(
            f"{self.label}: {where} is not a constant (TensorRef): value {vid} is "
            f"{describe_value(v)}; {ABORT}", name, index, arg_name)

    def call(self, index: int, name: str, ids: Sequence[int]) -> None:
        who = f"op #{index} {name}"
        if not ids:
            raise self.err(f"{who} has no output value")
        ins, out = list(ids[:-1]), ids[-1]
        # the runtime's prepack rule, before anything runs
        if name == PREPACK:
            if len(ins) != 1:
                raise self.err(f"{who} takes 1 argument, the call has {len(ins)}")
            self.require_constant(name, 0, "x", ins[0])
        for arg in PREPACKED_ARGS.get(name, ()):
            if arg.index >= len(ins):
                raise self.err(f"{who} argument {arg.index} ({arg.name}) is missing")
            v = self.g.value(ins[arg.index])
            if arg.none_ok and v is not None and v.kind in ("Null", "NONE"):
                continue
            self.require_constant(name, arg.index, arg.name, ins[arg.index])
        if self.runtime is not None:
            self.require_available(who, name, ins, out)
        special = _SPECIAL.get(name)
        try:
            if special is not None:
                result = special(self, who, ins, out)
            elif name in _SCHEMA_SET:
                result = self.call_schema(who, name, ins, out)
            else:
                raise UnsupportedOperatorError(
                    f"{self.label}: {who}: the simulator cannot execute operator {name!r} "
                    "(not in SUPPORTED_OPS)", name)
        except SimulationError:
            raise
        except Exception as e:
            garbage: RuntimeConditionError | None = getattr(self, "garbage", None)
            if garbage is not None:  # past garbage, nothing is sound
                raise garbage from e
            raise self.err(f"{who} failed on the CPU: {type(e).__name__}: {e}") from e
        self.write(out, result, who)

    def require_available(self, who: str, name: str, ins: list[int], out: int) -> None:
        """What the probed runtime lacks stops here, as it stops the runtime."""
        if not self.runtime.has_operator(name):
            raise UnsupportedOperatorError(
                f"{self.label}: {who}: {self.runtime.describe()} has no such operator; it aborts "
                f"with 'Missing operator: {name}'", name)
        shader = missing_shader(name, self.tensor_meta(out),
                                self.tensor_meta(ins[0]) if ins else None,
                                self.runtime.shaders, self.g.storage_type_override)
        if shader is not None:
            raise RuntimeConditionError(
                f"{self.label}: {who}: {self.runtime.describe()} has no shader {shader!r}; it "
                f"aborts with 'Could not find ShaderInfo with name {shader}'", name, "self",
                _SHADER_CONDITION)

    def marked_symints(self, named: dict[str, Any], arguments: Sequence[Any], ins: list[int]
                       ) -> dict[str, Any]:
        """``named`` as the runtime conditions read it: each scalar the graph computes as it
        runs (a SymInt value) marked as :class:`RuntimeSymInt`, for the conditions on what
        the runtime reads once; a scalar serialized as a ``Double`` or a ``Bool`` where the
        schema wants an int is its float / bool again (:func:`resolve` cast it, as
        ``extract_scalar`` does), for the conditions on what the runtime reads only as an
        ``Int`` (``graph.get_int``)."""
        out = dict(named)
        for a, vid in zip(arguments, ins, strict=False):
            v = self.g.value(vid)
            if v is None:
                continue
            if v.kind == "SymInt" and isinstance(out.get(a.name), int):
                out[a.name] = RuntimeSymInt(out[a.name])
            elif v.kind == "Double" and isinstance(out.get(a.name), int):
                out[a.name] = float(v.value)
            elif v.kind == "Bool" and type(out.get(a.name)) is int:
                out[a.name] = bool(v.value)
        return out

    def check_conditions(self, who: str, name: str, op: Any, args: Sequence[Any],
                         kwargs: dict[str, Any], ins: list[int]) -> None:
        """Stop (or note garbage) where ``name``'s runtime conditions do not hold."""
        if not conditions_for(name):
            return
        named = dict(zip([a.name for a in op._schema.arguments], args, strict=False))
        named.update(kwargs)
        bad = violated(name, self.marked_symints(named, op._schema.arguments, ins))
        if bad:
            self.condition_broken(who, name, bad)

    def call_schema(self, who: str, name: str, ins: list[int], out: int) -> Any:
        op, args, kwargs = self.schema_args(who, name, ins, out)
        judged = kwargs
        if name in OUTPUT_DTYPE_ARGUMENT and kwargs.get("dtype") is None:
            written = self.g.value(out)
            if written is not None and written.tensor is not None:
                judged = {**kwargs, "dtype": stored_dtype(written.tensor)}
        self.check_conditions(who, name, op, args, judged, ins)  # e.g. the rotary ops' shapes
        if name == GELU:  # the runtime's shader has the tanh form only (unary_op.yaml)
            args, kwargs = args[:1], {"approximate": "tanh"}
        return op(*args, **kwargs)

    def schema_args(self, who: str, name: str, ins: list[int], out: int
                    ) -> tuple[Any, list[Any], dict[str, Any]]:
        """The torch op of ``name`` and its arguments resolved by its schema."""
        op = _torch_op(name)
        if op is None:
            raise UnsupportedOperatorError(
                f"{self.label}: {who}: operator {name!r} is not registered with torch", name)
        schema = op._schema
        if len(ins) != len(schema.arguments):
            raise self.err(f"{who} has {len(ins)} arguments, its schema {len(schema.arguments)}")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for a, vid in zip(schema.arguments, ins, strict=True):
            val = self.resolve(who, name, a, vid, ins, out)
            if a.kwarg_only:
                kwargs[a.name] = val
            else:
                args.append(val)
        return op, args, kwargs

    def resolve(self, who: str, name: str, a: Any, vid: int, ins: list[int], out: int) -> Any:
        """The Python value of schema argument ``a`` from VkGraph value ``vid``."""
        v = self.g.value(vid)
        if v is None:
            raise self.err(f"{who} argument {a.name!r} refers to value {vid}, but the graph "
                           f"has {len(self.values)} values")
        # real_type: a ScalarType argument's ``type`` is ``int``
        ty = str(getattr(a, "real_type", a.type))
        if ty.startswith("Optional[") and ty.endswith("]"):
            ty = ty[len("Optional["):-1]
        ty = ty.rstrip("?")
        if v.kind in ("Null", "NONE"):
            if ty == "ScalarType":
                return self.implied_dtype(who, name, a.name, ins, out)
            return None  # Device, Layout, MemoryFormat, or an optional left out
        x = self.read(vid, f"{who} argument {a.name!r}")
        if isinstance(x, _Const):
            x = x.tensor
        if isinstance(x, list):
            x = [e.tensor if isinstance(e, _Const) else e for e in x]
        # Stock's serializer dedups scalars by Python equality (1 == 1.0 share an entry;
        # fusionkit's constant_serializer keys them by type), and the runtime's
        # extract_scalar<T> casts Int/Double/Bool to the type it wants: do the same. What
        # it reads only as an Int (graph.get_int: a conv's groups) is a runtime condition
        # (runtime_conditions._INT_READ), judged on the serialized kind (marked_symints).
        if ty == "float" and isinstance(x, (int, bool)):
            x = float(x)
        elif ty in ("int", "SymInt") and isinstance(x, (float, bool)):
            x = int(x)
        elif ty == "bool" and isinstance(x, (int, float)):
            x = bool(x)
        return x

    def implied_dtype(self, who: str, name: str, arg: str, ins: list[int], out: int
                      ) -> torch.dtype:
        """A ScalarType the serializer wrote as Null: the runtime takes it from a tensor."""
        src = out
        if "dequantize" in name and arg in ("dtype", "input_dtype"):
            src = ins[0]
        elif "choose_qparams" in name:
            return torch.int8  # the int type the parameters are chosen for
        t = self.tensor_meta(src)
        if t is None:
            ov = self.g.value(out)
            if ov is not None and ov.kind == "ValueList" and ov.value:
                t = self.tensor_meta(ov.value[0])
        if t is None:
            raise self.err(f"{who}: cannot infer ScalarType argument {arg!r} (written as Null) "
                           "from a tensor")
        return _vk_dtype(t, f"{who} {arg}")


_SCHEMA_SET = frozenset(_SCHEMA_OPS)


def _prepack(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
    x = d.read(ins[0], who)
    assert isinstance(x, _Const)  # require_constant ran
    return x.tensor.clone()


def _conv_with_clamp(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
    # FuseClampPass writes relu's upper bound as sys.float_info.max; the runtime casts the
    # bounds to the tensor's float type (+inf), torch.clamp refuses the overflow
    op, args, kwargs = d.schema_args(who, "et_vk.conv_with_clamp.default", ins, out)
    d.check_conditions(who, "et_vk.conv_with_clamp.default", op, args, kwargs, ins)
    y = torch.convolution(*args[:9])
    lo, hi = (None if b is None else torch.tensor(float(b), dtype=torch.float64).to(y.dtype)
              for b in args[9:11])
    return torch.clamp(y, lo, hi)


def _sym_size(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
    x = d.read(ins[0], who)
    x = x.tensor if isinstance(x, _Const) else x
    return int(x.shape[d.read(ins[1], who)])


def _select_as_symint(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
    x = d.read(ins[0], who)
    x = x.tensor if isinstance(x, _Const) else x
    return int(x.select(d.read(ins[1], who), d.read(ins[2], who)).item())


def _symint_op(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def run(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
        a, b = (d.read(i, who) for i in ins)
        return fn(a, b)
    return run


def _runtime_op(op_name: str) -> Callable[..., Any]:
    """Run ``op_name`` with :mod:`.quantized_ops`: its prepacked arguments must be
    constants, its :mod:`.runtime_conditions` must hold."""
    impl = RUNTIME_OPS.get(op_name)

    def run(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
        op = _torch_op(op_name)
        if op is None:
            raise UnsupportedOperatorError(
                f"{d.label}: {who}: operator {op_name!r} is not registered with torch", op_name)
        schema = op._schema
        if len(ins) != len(schema.arguments):
            raise d.err(f"{who} has {len(ins)} arguments, its schema {len(schema.arguments)}")
        names = [a.name for a in schema.arguments]
        for arg in PREPACKED.get(op_name, ()):
            i = names.index(arg)
            v = d.g.value(ins[i])
            if v is not None and v.kind in ("Null", "NONE"):
                continue
            d.require_constant(op_name, i, arg, ins[i])
        named = {a.name: d.resolve(who, op_name, a, vid, ins, out)
                 for a, vid in zip(schema.arguments, ins, strict=True)}
        marked = d.marked_symints(named, schema.arguments, ins)
        if op_name == SDPA_WITH_KV_CACHE:
            marked[CACHE_ROWS_UNWRITTEN] = d.cache_rows_unwritten(
                [ins[names.index(c)] for c in ("key_cache", "value_cache")],
                int(named["start_pos"]), int(named["key"].shape[1]))
        bad = violated(op_name, marked)
        if bad:
            d.condition_broken(who, op_name, bad)
        if op_name == HF_ROPE:  # the shader reads cos/sin's first half only
            named.update((k, first_half_twice(named[k])) for k in ("freqs_cos", "freqs_sin"))
        if impl is not None:
            return impl(named)
        return op(*[named[a.name] for a in schema.arguments if not a.kwarg_only],
                  **{a.name: named[a.name] for a in schema.arguments if a.kwarg_only})

    return run


def _assert_scalar(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
    if not d.read(ins[0], who):
        raise d.err(f"{who}: the graph's assertion failed: {d.read(ins[1], who)}")
    return None


def _no_op(d: _Delegate, who: str, ins: list[int], out: int) -> Any:
    return None


#: serialized name -> the name the op is registered under with torch (a torch
#: ``OpOverload`` of a non-aten namespace serializes without its namespace)
_LLAMA_ALIASES = {n: f"llama.{n}" for n in UNQUALIFIED_LLAMA}

#: ops executed by :mod:`.quantized_ops` (runtime semantics), by serialized name
RUNTIME_OP_NAMES: frozenset[str] = frozenset(RUNTIME_OPS) | frozenset(_LLAMA_ALIASES)
#: ops whose prepacked arguments and runtime conditions are checked before they run (not
#: the table's ops that have no torch op to run: ``NOT_SIMULATED``)
_CHECKED = (frozenset(RUNTIME_OPS) | frozenset(PREPACKED)
            | frozenset(c.op for c in CONDITIONS if c.op not in NOT_SIMULATED))

_SPECIAL.update({
    **{n: _runtime_op(n) for n in _CHECKED},
    **{alias: _runtime_op(n) for alias, n in _LLAMA_ALIASES.items()},
    "_assert_scalar.default": _assert_scalar,
    "sym_constrain_range_for_size.default": _no_op,
    PREPACK: _prepack,
    "et_vk.conv_with_clamp.default": _conv_with_clamp,
    "sym_size.int": _sym_size,
    "et_vk.select_as_symint.default": _select_as_symint,
    **{n: _symint_op(f) for n, f in _SYMINT_OPS.items()},
})

SUPPORTED_OPS = frozenset(_SCHEMA_OPS) | frozenset(_SPECIAL)


def run_payload(payload: bytes | VulkanPayload, inputs: Sequence[Any],
                named_data: dict[str, bytes] | Callable[[str], bytes | None] | None = None,
                label: str = "Vulkan delegate") -> list[Any]:
    """Execute one Vulkan delegate payload on ``inputs`` (in ``input_ids`` order).

    ``named_data``: key -> bytes (or a lookup function) for constants kept in the
    program's named data. Returns the outputs in ``output_ids`` order, in the
    dtypes the VkGraph declares.
    """
    p = payload if isinstance(payload, VulkanPayload) else decode_payload(bytes(payload))
    lookup: Callable[[str], bytes | None]
    if named_data is None:
        lookup = lambda _key: None  # noqa: E731
    elif callable(named_data):
        lookup = named_data
    else:
        lookup = named_data.get
    return _Delegate(p, lookup, label).run(inputs)


# ------------------------------------------------------------ program access


def _named_lookup(nd: Any) -> Callable[[str], bytes | None]:
    """key -> bytes of a NamedDataStoreOutput (the .pte's entries and external ones)."""
    def lookup(key: str) -> bytes | None:
        if nd is None:
            return None
        entry = (getattr(nd, "pte_data", None) or {}).get(key)
        if entry is None:
            for entries in (getattr(nd, "external_data", None) or {}).values():
                if key in entries:
                    entry = entries[key]
                    break
        return None if entry is None else blob_bytes(nd.buffers[entry.buffer_index])
    return lookup


@dataclass
class _Source:
    """Where the payloads of one method come from."""

    #: k-th executorch_call_delegate node -> (backend id, payload, named-data lookup),
    #: or None to take them from the lowered module itself (EdgeProgramManager)
    pte_delegates: list[tuple[str, bytes]] | None
    named: Callable[[str], bytes | None] | None
    #: k-th delegate call -> how many arguments the serialized call passes (a .pte only)
    pte_arguments: list[int] | None = None
    #: the method's inputs as the .pte declares them: (shape dynamism, sizes) of a tensor,
    #: None for another value (a .pte only)
    pte_inputs: list[tuple[int, list[int]] | None] | None = None


def _pte_source(pte: bytes, method: str) -> _Source:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DataLocation, DelegateCall

    pf = deserialize_pte_binary(pte)
    plans = {p.name: p for p in pf.program.execution_plan}
    if method not in plans:
        raise SimulationError(f"the program has no method {method!r} ({sorted(plans)})")
    plan = plans[method]
    calls: list[tuple[str, bytes]] = []
    arguments: list[int] = []
    for chain in plan.chains:
        for ins in chain.instructions:
            if not isinstance(ins.instr_args, DelegateCall):
                continue
            d = plan.delegates[ins.instr_args.delegate_index]
            ref = d.processed
            if ref.location != DataLocation.INLINE:
                raise SimulationError(f"delegate {ins.instr_args.delegate_index} of {method!r} "
                                      f"keeps its payload in location {ref.location}")
            calls.append((d.id, bytes(pf.program.backend_delegate_data[ref.index].data)))
            arguments.append(len(ins.instr_args.args))
    inputs: list[tuple[int, list[int]] | None] = []
    for i in plan.inputs:
        v = plan.values[i].val
        sizes = getattr(v, "sizes", None)
        inputs.append(None if sizes is None else (int(v.shape_dynamism), list(sizes)))
    return _Source(calls, _named_lookup(pf.named_data), arguments, inputs)


def _check_input_sizes(declared: list[tuple[int, list[int]] | None], inputs: list[Any]
                       ) -> None:
    """The runtime resizes each input tensor to the given one's sizes before a call
    (``method.cpp``: ``Error resizing tensor at input i``): a static tensor takes its own
    sizes only, a bounded one at most the elements it was planned with."""
    from executorch.exir.schema import TensorShapeDynamism

    if len(declared) != len(inputs):
        return
    for i, (d, x) in enumerate(zip(declared, inputs, strict=True)):
        if d is None or not isinstance(x, torch.Tensor):
            continue
        dynamism, sizes = d
        if dynamism == TensorShapeDynamism.STATIC and list(x.shape) != sizes:
            raise SimulationError(
                f"input {i}: the program declares a static tensor of sizes {sizes}, given "
                f"{list(x.shape)} (the runtime: 'Attempted to resize a static tensor'; "
                "was the program exported, or lowered, with these sizes fixed?)")
        capacity = math.prod(sizes)
        if dynamism == TensorShapeDynamism.DYNAMIC_BOUND and x.numel() > capacity:
            raise SimulationError(
                f"input {i}: the program plans at most {capacity} elements (sizes {sizes}), "
                f"given {list(x.shape)} (the runtime: 'Attempted to resize a bounded tensor "
                f"with a maximum capacity of {capacity} elements')")


def _is_delegate_call(node: torch.fx.Node) -> bool:
    from executorch.exir.delegate import executorch_call_delegate

    return node.op == "call_function" and node.target is executorch_call_delegate


def _dim_order(v: Any) -> tuple[int, ...] | None:
    """The dim order of a program value (its node's ``meta["val"]``), None for a non-tensor
    or one whose layout is that of a contiguous tensor anyway."""
    if not isinstance(v, torch.Tensor) or v.dim() < 2:
        return None
    try:
        order = tuple(int(d) for d in v.dim_order())
        return None if contiguous_dim_order(v.shape, order) else order
    except Exception:  # symbolic sizes / strides: like the runtime's tensors, contiguous
        return None


def _boundary_dim_orders(node: torch.fx.Node) -> tuple[list[Any], list[Any]]:
    """The dim orders of a delegate call's inputs and outputs in the program (None where
    contiguous): the runtime copies each in contiguous order whatever it is."""
    ins = [_dim_order(a.meta.get("val")) if isinstance(a, torch.fx.Node) else None
           for a in node.args[1:]]
    val = node.meta.get("val")
    outs = [_dim_order(v) for v in (val if isinstance(val, (tuple, list)) else [val])]
    return ins, outs


def _expected_dtypes(node: torch.fx.Node) -> list[torch.dtype | None]:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return [v.dtype if isinstance(v, torch.Tensor) else None for v in vals]


@dataclass
class DelegateRun:
    """What one delegate call ran (recorded by :func:`simulate` when given ``trace``)."""

    index: int
    label: str
    #: the chain's op names, in execution order
    ops: list[str]
    inputs: list[Any]
    outputs: list[Any]
    #: the ``LoweredBackendModule`` of the call (its ``original_module`` is the
    #: partition before preprocess: an eager reference)
    lowered: Any


#: program -> (method, delegate call index) -> the loaded delegate: like a loaded
#: ExecuTorch Method, a program keeps its prepacked constants between calls
_LOADED: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], _Delegate]] = (
    weakref.WeakKeyDictionary())


def unload(program: Any) -> None:
    """Forget ``program``'s loaded delegates: the next :func:`simulate` prepacks afresh
    (a KV cache kept inside a delegate starts from its serialized bytes again)."""
    _LOADED.pop(program, None)


def _user_outputs(outputs: list[Any], specs: Sequence[Any], method: str) -> list[Any]:
    """The output node's user outputs. After ``to_executorch`` the node may leave out a
    buffer mutation an out-variant op made in place (``llama.update_cache.out`` writing
    its cache on the CPU) while the signature still lists it: the user outputs are then
    the node's last ones, as a signature lists mutations first."""
    from torch.export.graph_signature import OutputKind

    if len(outputs) == len(specs):
        return [o for o, s in zip(outputs, specs, strict=True) if s.kind == OutputKind.USER_OUTPUT]
    count = sum(s.kind == OutputKind.USER_OUTPUT for s in specs)
    if len(outputs) < count:
        raise SimulationError(f"{method}: the output node has {len(outputs)} values, the "
                              f"signature {count} user outputs")
    return outputs[len(outputs) - count:]


@torch.no_grad()  # a runtime computes no gradients; out= CPU kernels refuse autograd
def simulate(program: Any, *inputs: Any, method: str = "forward",
             trace: list[DelegateRun] | None = None, runtime: Any = "auto") -> Any:
    """Run ``program`` on the CPU, executing its Vulkan delegates from their payloads.

    ``program``: the ``EdgeProgramManager`` of ``to_edge_transform_and_lower``, its
    ``ExportedProgram`` (``.exported_program()``), or the ``ExecutorchProgramManager``
    of ``.to_executorch()`` (whose serialized payloads are run). ``inputs``: the method's
    user inputs. Returns the outputs structured as the exported module returns them.

    Raises :class:`NotConstantError` where the Vulkan runtime would abort on a
    non-constant prepacked argument, :class:`UnsupportedOperatorError` for an
    operator it cannot execute, :class:`SimulationError` for other malformed
    payloads. See the module docstring for what is and is not modelled.
    ``trace``: a list that receives one :class:`DelegateRun` per delegate call.
    ``runtime``: what the runtime has (an operator it lacks stops the simulation as the
    runtime's ``Missing operator`` does, and so does a shader variant it lacks:
    :func:`missing_shader`): a probed
    :class:`~fusionkit.backends.vulkan_adapter.runtime_probe.RuntimeInventory`; ``"auto"``
    (the default), the installed runtime's probe, else what the wheel implies
    (:func:`~fusionkit.backends.vulkan_adapter.wheel_inventory.wheel_inventory`); ``None``:
    the wheel's, whatever is installed.

    Like a loaded ExecuTorch program, ``program`` keeps its delegates' prepacked
    constants between calls (mutable state such as a KV cache carries over);
    :func:`unload` drops them.
    """
    from executorch.exir import ExecutorchProgramManager
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from torch.export.graph_signature import InputKind

    from fusionkit import as_exported_program

    from ..wheel_inventory import effective_inventory

    ep = as_exported_program(program, method, who="simulate()")  # TypeError for anything else
    runtime = effective_inventory(runtime)
    if isinstance(program, ExecutorchProgramManager):
        source = _pte_source(bytes(program.buffer), method)
    else:  # an EdgeProgramManager or an ExportedProgram: the lowered modules' own payloads
        source = _Source(None, None)
    gm = ep.graph_module
    sig = ep.graph_signature
    flat_inputs = pytree.tree_leaves(inputs)
    user_specs = [s for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    if len(flat_inputs) != len(user_specs):
        raise TypeError(f"{method} takes {len(user_specs)} inputs, got {len(flat_inputs)}")
    if source.pte_inputs is not None:
        _check_input_sizes(source.pte_inputs, flat_inputs)

    env: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    user_iter = iter(flat_inputs)
    for node, spec in zip(placeholders, sig.input_specs, strict=True):
        if spec.kind == InputKind.USER_INPUT:
            env[node] = next(user_iter)
        elif spec.target in ep.state_dict:
            env[node] = ep.state_dict[spec.target]
        elif spec.target in ep.constants:
            env[node] = ep.constants[spec.target]
        else:
            raise SimulationError(f"placeholder {node.name} ({spec.kind.name} "
                                  f"{spec.target!r}) has no value in the program")

    def value_of(a: Any) -> Any:
        return env[a] if isinstance(a, torch.fx.Node) else a

    delegate_no = 0
    outputs: list[Any] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            env[node] = getattr(gm, node.target)
        elif node.op == "output":
            outputs = list(node.args[0])
        elif _is_delegate_call(node):
            lm = value_of(node.args[0])
            assert isinstance(lm, LoweredBackendModule)
            in_orders, out_orders = _boundary_dim_orders(node)
            # the runtime reads an input's memory in contiguous order, whatever its dim order
            args = [as_read_by_runtime(x, o) if o is not None and isinstance(x, torch.Tensor)
                    else x for x, o in zip([value_of(a) for a in node.args[1:]], in_orders,
                                           strict=True)]
            label = f"{method}: delegate {delegate_no} ({lm.backend_id})"
            if source.pte_delegates is not None:
                if delegate_no >= len(source.pte_delegates):
                    raise SimulationError(f"{label}: the .pte has only "
                                          f"{len(source.pte_delegates)} delegate calls")
                backend, payload = source.pte_delegates[delegate_no]
                named = source.named
            else:
                backend, payload = lm.backend_id, bytes(lm.processed_bytes)
                named = _named_lookup(getattr(lm, "named_data_store_output", None))
            if backend != BACKEND_ID:
                raise UnsupportedOperatorError(
                    f"{label}: only {BACKEND_ID} delegates can be simulated, not {backend}",
                    backend)
            decoded = decode_payload(payload)
            # the serialized call's argument count (an edge program's call also lists the
            # buffers the delegate mutates, which the serialized call does not pass)
            message = None if source.pte_arguments is None else delegate_argument_count(
                len(decoded.graph.input_ids), len(decoded.graph.output_ids),
                source.pte_arguments[delegate_no])
            if message is not None:
                raise RuntimeConditionError(f"{label}: {message}", DELEGATE_ARGUMENT_COUNT.op,
                                            "args", DELEGATE_ARGUMENT_COUNT)
            # the inputs as they were before the delegate ran (it may update caches in place)
            before = ([a.clone() if isinstance(a, torch.Tensor) else a for a in args]
                      if trace is not None else [])
            loaded = _LOADED.setdefault(program, {})
            key = (method, delegate_no)
            if key not in loaded:
                loaded[key] = _Delegate(decoded, named or (lambda _k: None), label)
            loaded[key].runtime = runtime
            outs = loaded[key].run(args)
            if trace is not None:
                trace.append(DelegateRun(delegate_no, label, decoded.graph.op_names(),
                                         before, list(outs), lm))
            want = _expected_dtypes(node)
            outs = [o.to(w) if isinstance(o, torch.Tensor) and w is not None else o
                    for o, w in zip(outs, want + [None] * (len(outs) - len(want)), strict=False)]
            # ... and writes the result into an output's memory in contiguous order too
            env[node] = tuple(
                as_written_by_runtime(o, d) if d is not None and isinstance(o, torch.Tensor)
                else o for o, d in zip(outs, out_orders + [None] * (len(outs) - len(out_orders)),
                                       strict=False))
            delegate_no += 1
        elif node.op == "call_function":
            args, kwargs = pytree.tree_map(value_of, (node.args, node.kwargs))
            try:
                env[node] = node.target(*args, **kwargs)
            except Exception as e:
                raise SimulationError(f"{method}: node {node.name} ({node.target}) failed: "
                                      f"{type(e).__name__}: {e}") from e
        else:
            raise SimulationError(f"{method}: cannot run node {node.name} of kind {node.op}")

    user = [value_of(o) for o in _user_outputs(outputs, sig.output_specs, method)]
    out_spec = getattr(ep.call_spec, "out_spec", None)
    if out_spec is not None:
        try:
            return pytree.tree_unflatten(user, out_spec)
        except Exception:  # a spec not matching the user outputs: return them flat
            pass
    return user[0] if len(user) == 1 else tuple(user)
