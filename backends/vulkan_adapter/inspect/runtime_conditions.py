"""What ExecuTorch's Vulkan runtime requires of its quantized / fused operators.

Each :class:`RuntimeCondition` is one requirement read from the runtime's C++
(``backends/vulkan/runtime/graph/ops/impl/*.cpp``) or GLSL shaders, at
pytorch/executorch ``cff6f4dd32`` (the mirror whose ``custom_ops_lib.py`` is
byte-identical to the 1.5.1 wheel's): the op, the schema arguments involved,
the runtime's own condition text (``VK_CHECK_COND(...)`` where there is one),
where it is, and what happens when it does not hold:

* ``abort`` -- the runtime throws while building the graph (``VK_CHECK_COND`` /
  ``VK_THROW``);
* ``garbage`` -- nothing checks it, the shader reads the wrong bytes (a stride,
  a truncated loop): the model runs and computes wrong numbers.

:data:`PREPACKED` lists the arguments the runtime prepacks (``prepack_standard``
or a prepack shader), which must be constants (TensorRefs) exactly like
``shared/vulkan-prepacked-args.md`` describes for the float ops.

``check(args)`` takes the op's schema arguments by name; tensors may be real,
fake (``node.meta["val"]``) or anything with ``.shape``/``.dtype``, so a fusion
rule can evaluate the same condition before it fuses::

    from fusionkit.backends.vulkan_adapter.inspect.runtime_conditions import violated
    bad = violated("et_vk.linear_q4gsw.default", {"self": x, "weights": w, ...})

The simulator (:mod:`.simulator`) raises :class:`RuntimeConditionError` for the
first violated condition of an op, naming the op and argument.

A condition with ``uninitialized_state`` is about state the runtime makes when it loads
the program and never initialises (the fused KV-cache ops' caches: ``add_tensor_like``);
:data:`UNINITIALIZED_STATE_OPS`, the names such ops have in a payload, is what the real
runtime's runners (:mod:`..runtime`) run in a child that has run nothing else, so a
condition added here updates them. Ops in :data:`NOT_SIMULATED` are in the table for what
the runtime does with them only: ``testing.compute_attn_weight_with_kv_cache`` (the
runtime's own C++ op test's entry point, same caches as ``sdpa_with_kv_cache``) has no
torch op, so neither the simulator nor ``check()`` can run or evaluate it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fusionkit import guards_suppressed_for

__all__ = [
    "CONDITIONS",
    "DELEGATE_ARGUMENT_COUNT",
    "DELEGATE_DIM_ORDER",
    "NOT_SIMULATED",
    "OUTPUT_DTYPE_ARGUMENT",
    "PREPACKED",
    "UNINITIALIZED_STATE_OPS",
    "UNQUALIFIED_LLAMA",
    "RuntimeCondition",
    "RuntimeSymInt",
    "as_read_by_runtime",
    "as_written_by_runtime",
    "conditions_for",
    "contiguous_dim_order",
    "delegate_argument_count",
    "serialized_name",
    "violated",
]

Effect = Literal["abort", "garbage"]


@dataclass(frozen=True)
class RuntimeCondition:
    """One requirement the Vulkan runtime places on an operator's arguments."""

    op: str
    #: short identifier, unique per op
    name: str
    #: the schema arguments the condition is about (the first one is named in errors)
    args: tuple[str, ...]
    #: the runtime's condition, as written in its source
    condition: str
    #: where: ``File.cpp: function`` or ``shader.glsl``
    source: str
    effect: Effect
    #: True when the condition holds for these schema arguments
    check: Callable[[Mapping[str, Any]], bool]
    #: why the runtime needs it (one line)
    why: str = ""
    #: the condition is about state the runtime makes at load and never initialises: the
    #: op's state starts as whatever memory the allocator gives (another program's data
    #: after a free), so the runners isolate a program with this op
    #: (:data:`UNINITIALIZED_STATE_OPS`)
    uninitialized_state: bool = False

    def holds(self, args: Mapping[str, Any]) -> bool:
        return bool(self.check(args))

    def message(self) -> str:
        if self.effect == "abort":
            return f"the runtime aborts in {self.source}: ({self.condition}) is false!"
        return (f"the runtime computes garbage ({self.source}): {self.condition} does not "
                f"hold{': ' + self.why if self.why else ''}")


# ------------------------------------------------------------------ helpers


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in v.shape)


def _size(v: Any, dim: int) -> int:
    return int(v.shape[dim])


def _dim(v: Any) -> int:
    return len(v.shape)


def _none(v: Any) -> bool:
    return v is None


LINEAR_Q4GSW = "et_vk.linear_q4gsw.default"
LINEAR_DQ8CA_Q4GSW = "et_vk.linear_dq8ca_q4gsw.default"
LINEAR_Q8TA_Q8CSW = "et_vk.linear_q8ta_q8csw.default"
Q8TA_LINEAR = "et_vk.q8ta_linear.default"
Q8TA_LINEAR_GEMV = "et_vk.q8ta_linear_gemv.default"
Q8TA_CONV2D = "et_vk.q8ta_conv2d.default"
Q8TA_CONV2D_PW = "et_vk.q8ta_conv2d_pw.default"
Q8TA_CONV2D_DW = "et_vk.q8ta_conv2d_dw.default"
Q8TA_CONV2D_T = "et_vk.q8ta_conv2d_transposed.default"
Q8TA_PIXEL_SHUFFLE = "et_vk.q8ta_pixel_shuffle.default"
EMBEDDING_Q4GSW = "et_vk.embedding_q4gsw.default"
LINEAR_QCS4W = "et_vk.linear_qcs4w.default"
WEIGHT_INT8PACK_MM = "aten._weight_int8pack_mm.default"
CHOOSE_QPARAMS_AFFINE = "torchao.choose_qparams_affine.default"
UPDATE_CACHE = "llama.update_cache.default"
CUSTOM_SDPA = "llama.custom_sdpa.default"
SDPA_WITH_KV_CACHE = "llama.sdpa_with_kv_cache.default"
#: registered by the runtime (``SDPA.cpp``: ``compute_attn_weight_with_kv_cache_impl``) for
#: its own C++ op test (``sdpa_test.cpp``); no torch op: not simulated (:data:`NOT_SIMULATED`)
COMPUTE_ATTN_WEIGHT_WITH_KV_CACHE = "testing.compute_attn_weight_with_kv_cache.default"
#: the count of cache rows ``sdpa_with_kv_cache`` reads that it never wrote since load: the
#: simulator, which keeps the loaded caches between calls, passes it to the conditions
#: (a static check has no such count, and the condition holds there)
CACHE_ROWS_UNWRITTEN = "_cache_rows_unwritten"

#: op -> the arguments the runtime prepacks (must be TensorRefs; an optional one may be None)
PREPACKED: dict[str, tuple[str, ...]] = {
    LINEAR_Q4GSW: ("weights", "weight_scales", "bias"),
    LINEAR_DQ8CA_Q4GSW: ("weights", "weight_sums", "weight_scales", "bias"),
    LINEAR_Q8TA_Q8CSW: ("weights", "weight_sums", "weight_scales", "bias"),
    Q8TA_LINEAR: ("weights", "weight_sums", "weight_scales", "bias"),
    Q8TA_LINEAR_GEMV: ("weights", "weight_sums", "weight_scales", "bias"),
    Q8TA_CONV2D: ("weights", "weight_sums", "weight_scales", "bias"),
    Q8TA_CONV2D_PW: ("weights", "weight_sums", "weight_scales", "bias"),
    Q8TA_CONV2D_DW: ("weights", "weight_sums", "weight_scales", "bias"),
    Q8TA_CONV2D_T: ("weights", "weight_sums", "weight_scales", "bias"),
    EMBEDDING_Q4GSW: ("weight", "weight_scales"),
    LINEAR_QCS4W: ("weight", "scales"),
    WEIGHT_INT8PACK_MM: ("mat2", "scales"),
    "et_vk.linear_q4gsw_backward.default": ("weights", "weight_scales"),
}


def _q4_n(a: Mapping[str, Any]) -> int:
    return _size(a["weights"], 0)


def _q4_k(a: Mapping[str, Any]) -> int:
    return _size(a["weights"], 1) * 2


def _groups_ok(k: int, g: int) -> bool:
    return g > 0 and g % 4 == 0 and k % g == 0


def _q4gsw_conditions(op: str, x: str, src: str) -> list[RuntimeCondition]:
    return [
        RuntimeCondition(
            op, "weight_rank", ("weights",), "weights.dim() == 2 ([N, K/2] uint8)",
            src, "abort", lambda a: _dim(a["weights"]) == 2,
            "the prepack reads sizes_of(weight).at(0) and .at(1)"),
        RuntimeCondition(
            op, "n_multiple_of_4", ("weights",),
            "N % 4 == 0" if op == LINEAR_Q4GSW else "K % 4 == 0",
            "Q4gswLinear.cpp: prepack_q4_w_4x8_nc_buffer" if op == LINEAR_Q4GSW
            else "QuantizedLinear.cpp: quantized_linear_impl",
            "abort",
            (lambda a: _q4_n(a) % 4 == 0) if op == LINEAR_Q4GSW
            else (lambda a: _size(a[x], -1) % 4 == 0)),
        RuntimeCondition(
            op, "k_multiple_of_8", ("weights",), "K % 8 == 0",
            "pack_q4_linear_weight__w_4x8.glsl" if op == LINEAR_Q4GSW
            else "QuantizedLinear.cpp: prepack_quantized_linear_weight",
            "garbage" if op == LINEAR_Q4GSW else "abort",
            lambda a: _q4_k(a) % 8 == 0,
            "each weight row is read as ceil(K/8) uint32 words; a [N, K/2] row of "
            "K % 8 == 4 is 2 bytes shorter, so every later row is read shifted"),
        RuntimeCondition(
            op, "group_size", ("group_size",), "group_size % 4 == 0 && K % group_size == 0",
            "q4gsw_linear_gemm__w_4x8.glsl" if op == LINEAR_Q4GSW
            else "linear_dq8ca_q4gsw_tiled.glsl",
            "garbage", lambda a: _groups_ok(_q4_k(a), int(a["group_size"])),
            "K4_per_group = group_size / 4 and num_groups = K4 / K4_per_group: a partial "
            "group is dropped, a group size not a multiple of 4 mixes scales"),
        RuntimeCondition(
            op, "input_k", (x, "weights"), "input.size(-1) == 2 * weights.size(1)",
            "Q4gswLinear.cpp / QuantizedLinear.cpp", "garbage",
            lambda a: _size(a[x], -1) == _q4_k(a),
            "the GEMM walks the input's K, the GEMV and the group count the weight's"),
        RuntimeCondition(
            op, "input_rank", (x,), "in_sizes.size() == 2 || in_sizes.size() == 3",
            "Q4gswLinear.cpp: resize_q4gsw_linear_node" if op == LINEAR_Q4GSW
            else "QuantizedLinear.cpp: resize_linear_qw_node",
            "abort", lambda a: _dim(a[x]) in (2, 3),
            "the output is resized to [M, N] or [B, M, N] only"),
        RuntimeCondition(
            op, "scales_shape", ("weight_scales",),
            "weight_scales.sizes() == {K / group_size, N4 * 4}",
            "q4gsw_linear_gemm__w_4x8.glsl: t_scales[group_i * N4 + n4]", "garbage",
            lambda a: (_dim(a["weight_scales"]) == 2
                       and int(a["group_size"]) > 0
                       and _size(a["weight_scales"], 0) == _q4_k(a) // int(a["group_size"])
                       and _size(a["weight_scales"], 1) == -(-_q4_n(a) // 4) * 4),
            "scales are read with a row stride of N rounded up to 4 ([K/G, N], transposed)"),
        RuntimeCondition(
            op, "bias_size", ("bias",), "bias.numel() >= N", "linear_fp_bias_load.glslh",
            "garbage", lambda a: _none(a.get("bias")) or
            (_dim(a["bias"]) == 1 and _size(a["bias"], 0) >= _q4_n(a))),
    ]


def _qcs4w_conditions() -> list[RuntimeCondition]:
    """``linear_qcs4w`` (QuantizedLinearQCSNW.cpp): ``check_linear_qcsnw_args``, then
    ``VK_CHECK_COND(can_use_tiled_impl(...))``; N % 8 and M == 1 measured on lavapipe."""
    op, src = LINEAR_QCS4W, "QuantizedLinearQCSNW.cpp: "
    n = lambda a: _size(a["weight"], 0)  # noqa: E731
    return [
        RuntimeCondition(op, "input_rank", ("self",), "mat1_sizes.size() == 2 || "
                         "mat1_sizes.size() == 3", src + "check_linear_qcsnw_args", "abort",
                         lambda a: _dim(a["self"]) in (2, 3)),
        RuntimeCondition(op, "input_k", ("self", "weight"), "val_at(-1, mat1_sizes) == "
                         "val_at(-1, qmat2_sizes) * 2", src + "check_linear_qcsnw_args",
                         "abort", lambda a: _size(a["self"], -1) == 2 * _size(a["weight"], -1)),
        RuntimeCondition(op, "scales_size", ("scales",), "val_at(-1, scales_sizes) == "
                         "val_at(-2, qmat2_sizes)", src + "check_linear_qcsnw_args", "abort",
                         lambda a: _dim(a["scales"]) == 1 and _size(a["scales"], 0) == n(a)),
        RuntimeCondition(op, "one_batch", ("self",), "dim_of(mat1) != 3 || size_at(0, mat1) "
                         "== 1", src + "can_use_tiled_impl", "abort",
                         lambda a: _dim(a["self"]) != 3 or _size(a["self"], 0) == 1),
        RuntimeCondition(op, "k_multiple_of_4", ("self",), "size_at(-1, mat1) % 4 == 0",
                         src + "can_use_tiled_impl", "abort",
                         lambda a: _size(a["self"], -1) % 4 == 0),
        RuntimeCondition(op, "n_multiple_of_4", ("weight",), "size_at(-1, out) % 4 == 0",
                         src + "can_use_tiled_impl", "abort", lambda a: n(a) % 4 == 0),
        RuntimeCondition(
            op, "n_multiple_of_8", ("weight",), "N % 8 == 0",
            "pack_int4_linear_weight_transposed_interleaved.glsl", "garbage",
            lambda a: n(a) % 8 == 0,
            "the weight is interleaved in blocks of 8 output channels; with N % 8 == 4 the "
            "last block is read past the [N, K/2] buffer (lavapipe, N = 12 / 20: errors "
            "1.1-1.9 in 4 or 8 of the N outputs)"),
        RuntimeCondition(
            op, "not_gemv", ("self",), "size_at(-2, mat1) != 1",
            src + "add_linear_qcsnw_tiled_node (get_shader_info)", "abort",
            lambda a: _size(a["self"], -2) != 1,
            "one input row takes the coop kernel, whose 4-bit variants read a texture2d "
            "weight while the prepack makes a buffer: linear_qcs4w_coop_texture3d_texture3d_"
            "buffer_texture2d_float_o4x1 is not in the shader registry"),
    ]


def _channels(v: Any) -> int:
    return _size(v, -3) if _dim(v) >= 3 else 1


#: measured on lavapipe: pt2e conv -> max-pool -> x.sum(1, keepdim=True) + x (or x[:, :1] + x),
#: C = 1 against C = 8: errors 1.1-5.2 on outputs of magnitude 2-7 (equal shapes: exact)
_Q8TA_ADD_CHANNELS = RuntimeCondition(
    "et_vk.q8ta_add.default", "no_channel_broadcast", ("input_a", "input_b"),
    "input_a.size(-3) == input_b.size(-3)", "q8ta_binary.glsl (Q8taBinary.cpp)", "garbage",
    lambda a: _channels(a["input_a"]) == _channels(a["input_b"]),
    "the int8 tensors are packed 4 channels to a block; Q8taBinary.cpp resizes the output "
    "to the broadcast size, but an operand with one channel is not broadcast across the "
    "blocks of the other")


def _dq8ca_extra() -> list[RuntimeCondition]:
    op = LINEAR_DQ8CA_Q4GSW
    return [
        RuntimeCondition(
            op, "weight_sums_shape", ("weight_sums",),
            "weight_sums.sizes() == {K / group_size, N4 * 4} (when K / group_size > 1)",
            "linear_int_weight_sums_load.glslh: t_weight_sums[group * N4 + n4]", "garbage",
            lambda a: (_dim(a["weight_sums"]) == 2
                       and int(a["group_size"]) > 0
                       and _size(a["weight_sums"], 0) == _q4_k(a) // int(a["group_size"])
                       and (_size(a["weight_sums"], 0) == 1
                            or _size(a["weight_sums"], 1) == -(-_q4_n(a) // 4) * 4)),
            "the sums of group g are read at g * N (N rounded up to 4); ExecuTorch pads "
            "their rows to a multiple of 8, so for N % 8 == 4 every group after the "
            "first is read shifted"),
        RuntimeCondition(
            op, "input_qparams_per_row", ("input_scales", "input_zp"),
            "input_scales.numel() == input_zp.numel() == M (one per row)",
            "linear_int8_input_scales_zps_load.glslh", "garbage",
            lambda a: (int(_numel(a["input_scales"])) == _rows(a["input"])
                       and int(_numel(a["input_zp"])) == _rows(a["input"]))),
    ]


def _numel(v: Any) -> int:
    n = 1
    for s in v.shape:
        n *= int(s)
    return n


def _rows(x: Any) -> int:
    return _numel(x) // max(_size(x, -1), 1)


def _q8_linear_conditions(op: str) -> list[RuntimeCondition]:
    src = {Q8TA_LINEAR: "Q8taLinear.cpp: q8ta_linear",
           Q8TA_LINEAR_GEMV: "Q8taLinearGemv.cpp: q8ta_linear_gemv",
           LINEAR_Q8TA_Q8CSW: "QuantizedLinear.cpp: quantized_linear_impl"}[op]
    return [
        RuntimeCondition(op, "k_multiple_of_4", ("x",), "K % 4 == 0", src, "abort",
                         lambda a: _size(a["x"], -1) % 4 == 0,
                         "a group of 4 input channels must sit on a texel boundary"),
        RuntimeCondition(
            op, "weight_shape", ("weights",), "weights.sizes() == {N, K} (int8)", src,
            "garbage", lambda a: _dim(a["weights"]) == 2 and
            _size(a["weights"], 1) >= _size(a["x"], -1)),
        RuntimeCondition(
            op, "per_channel_params", ("weight_scales", "weight_sums"),
            "weight_scales.numel() >= N && weight_sums.numel() >= N",
            "linear_fp_per_out_channel_params.glslh", "garbage",
            lambda a: (_numel(a["weight_scales"]) >= _size(a["weights"], 0)
                       and _numel(a["weight_sums"]) >= _size(a["weights"], 0))),
    ]


def _conv_conditions(op: str) -> list[RuntimeCondition]:
    def icg(a: Mapping[str, Any]) -> int:
        return _size(a["x"], -3) // max(int(a["groups"]), 1)

    conds = [
        RuntimeCondition(
            op, "input_rank", ("x",), "x.dim() == 4 (N, C, H, W; batch 1)",
            "Q8taConv2d.cpp: q8ta_conv2d_check_packed_dim_info", "abort",
            lambda a: _dim(a["x"]) == 4 and _size(a["x"], 0) == 1),
        RuntimeCondition(
            op, "per_channel_params", ("weight_scales", "weight_sums"),
            "weight_scales.numel() >= OC && weight_sums.numel() >= OC",
            "conv2d_q8_utils.glslh", "garbage",
            lambda a: min(_numel(a["weight_scales"]), _numel(a["weight_sums"]))
            >= (_size(a["weights"], -1) if op == Q8TA_CONV2D_DW else _size(a["weights"], 0))
            or op == Q8TA_CONV2D_DW),
    ]
    if op in (Q8TA_CONV2D, Q8TA_CONV2D_T, Q8TA_CONV2D_PW):
        conds.append(RuntimeCondition(
            op, "grouped_in_channels", ("groups",),
            "conv_params.groups == 1 || conv_params.in_channels_per_group % 4 == 0",
            "Q8taConv2d.cpp: add_q8ta_conv2d_node" if op != Q8TA_CONV2D_T
            else "Q8taConv2dTransposed.cpp", "abort",
            lambda a: int(a["groups"]) == 1 or icg(a) % 4 == 0))
    if op == Q8TA_CONV2D_T:
        conds.append(RuntimeCondition(
            op, "dilation_1", ("dilation",),
            "conv_params.dilation[0] == 1 && conv_params.dilation[1] == 1",
            "Q8taConv2dTransposed.cpp", "abort",
            lambda a: all(int(d) == 1 for d in a["dilation"]),
            "q8ta_conv2d_transposed only supports dilation=1"))
    if op == Q8TA_CONV2D_DW:
        conds += [
            RuntimeCondition(op, "weight_rank", ("weights",), "ndim == 3 ([K_h, K_w, OC])",
                             "Q8taConv2dDW.cpp: prepack_q8ta_conv2d_dw_weights", "abort",
                             lambda a: _dim(a["weights"]) == 3),
            RuntimeCondition(op, "depthwise", ("groups",), "groups_val == in_channels",
                             "Q8taConv2dDW.cpp: q8ta_conv2d_dw", "abort",
                             lambda a: int(a["groups"]) == _size(a["x"], -3)),
        ]
    else:
        conds.append(RuntimeCondition(
            op, "weight_rank", ("weights",), "weights.dim() == 2 ([OC, K_h*K_w*IC/g], K padded "
            "to 4)", "Q8taConv2d.cpp: prepack_q8ta_conv2d_weights", "abort",
            lambda a: _dim(a["weights"]) == 2 and
            _size(a["weights"], 1) >= int(a["kernel_size"][0]) * int(a["kernel_size"][1]) * icg(a)))
    if op == Q8TA_CONV2D_PW:
        conds.append(RuntimeCondition(
            op, "pointwise", ("kernel_size", "stride", "padding"),
            "kernel 1x1, stride 1, padding 0, groups 1", "Q8taConv2dPW.cpp", "garbage",
            lambda a: (list(map(int, a["kernel_size"])) == [1, 1]
                       and list(map(int, a["stride"])) == [1, 1]
                       and list(map(int, a["padding"])) == [0, 0] and int(a["groups"]) == 1),
            "the pointwise shader ignores kernel size, stride, padding and groups"))
    return conds


def _cache_rows_written(op: str, impl: str) -> RuntimeCondition:
    """The KV caches ``op`` makes with ``add_tensor_like`` (``SDPA.cpp``: ``impl``, at
    ``cff6f4dd``): read back only where the op wrote them since load. The simulator counts
    the rows (:data:`CACHE_ROWS_UNWRITTEN`); a static check has no count, and it holds."""
    return RuntimeCondition(
        op, "cache_rows_written", ("key_cache", "value_cache", "start_pos"),
        "every cache row in [0, start_pos) was written by this op since the program loaded",
        f"SDPA.cpp: {impl} (add_tensor_like)", "garbage",
        lambda a: not a.get(CACHE_ROWS_UNWRITTEN, 0),
        "the runtime makes the caches with add_tensor_like, which copies the serialized "
        "cache's sizes but not its values: rows the op has not written hold whatever device "
        "memory it was given", uninitialized_state=True)


CONDITIONS: tuple[RuntimeCondition, ...] = (
    *_q4gsw_conditions(LINEAR_Q4GSW, "self", "Q4gswLinear.cpp"),
    *_q4gsw_conditions(LINEAR_DQ8CA_Q4GSW, "input", "QuantizedLinear.cpp"),
    *_dq8ca_extra(),
    *_qcs4w_conditions(),
    _Q8TA_ADD_CHANNELS,
    *_q8_linear_conditions(LINEAR_Q8TA_Q8CSW),
    *_q8_linear_conditions(Q8TA_LINEAR),
    *_q8_linear_conditions(Q8TA_LINEAR_GEMV),
    *_conv_conditions(Q8TA_CONV2D),
    *_conv_conditions(Q8TA_CONV2D_PW),
    *_conv_conditions(Q8TA_CONV2D_DW),
    *_conv_conditions(Q8TA_CONV2D_T),
    RuntimeCondition(
        EMBEDDING_Q4GSW, "embed_dim_32", ("weight",), "graph.get_int(embed_dim_ref) % 32 == 0",
        "EmbeddingQ4gsw.cpp: add_embedding_q4gsw_node", "abort",
        lambda a: (_size(a["weight"], -1) * 2) % 32 == 0, "embed_dim must be a multiple of 32"),
    RuntimeCondition(
        EMBEDDING_Q4GSW, "group_size", ("group_size",),
        "group_size % 4 == 0 && embed_dim % group_size == 0", "embedding_q4gsw.glsl",
        "garbage", lambda a: _groups_ok(_size(a["weight"], -1) * 2, int(a["group_size"])),
        "4 consecutive values share the scale of the first; groups_per_row = "
        "embed_dim / group_size is truncated"),
    RuntimeCondition(
        EMBEDDING_Q4GSW, "scales_shape", ("weight_scales",),
        "weight_scales.numel() == num_embeddings * embed_dim / group_size",
        "embedding_q4gsw.glsl: t_scales[idx * groups_per_row + dim / group_size]",
        "garbage",
        lambda a: int(a["group_size"]) > 0 and _numel(a["weight_scales"]) ==
        _size(a["weight"], 0) * (_size(a["weight"], -1) * 2 // int(a["group_size"]))),
    RuntimeCondition(
        Q8TA_PIXEL_SHUFFLE, "upscale_2", ("upscale_factor",), "r == 2",
        "Q8taPixelShuffle.cpp: add_q8ta_pixel_shuffle_node", "abort",
        lambda a: int(a["upscale_factor"]) == 2),
    RuntimeCondition(
        Q8TA_PIXEL_SHUFFLE, "rank_4", ("input",), "graph.dim_of(packed_int8_input) == 4",
        "Q8taPixelShuffle.cpp: add_q8ta_pixel_shuffle_node", "abort",
        lambda a: _dim(a["input"]) == 4),
    RuntimeCondition(
        CHOOSE_QPARAMS_AFFINE, "per_row", ("block_size",),
        "block_size == [1, ..., 1, input.size(-1)]",
        "ChooseQParams.cpp: choose_qparams_affine_impl", "abort",
        lambda a: (list(map(int, a["block_size"]))
                   == [1] * (_dim(a["input"]) - 1) + [_size(a["input"], -1)]),
        "Unsupported input case for choose_qparams_affine"),
    RuntimeCondition(
        UPDATE_CACHE, "batch_1", ("value", "cache"),
        "graph.size_at<int32_t>(-4, value) == 1 && graph.size_at<int32_t>(-4, cache) == 1",
        "SDPA.cpp: update_cache_impl", "abort",
        lambda a: _size(a["value"], -4) == 1 and _size(a["cache"], -4) == 1),
    RuntimeCondition(
        UPDATE_CACHE, "heads_and_dim", ("value", "cache"),
        "size_at(-1, value) == size_at(-1, cache) && size_at(-2, value) == size_at(-2, cache)",
        "SDPA.cpp: update_cache_impl", "abort",
        lambda a: _shape(a["value"])[-2:] == _shape(a["cache"])[-2:]),
    RuntimeCondition(
        CUSTOM_SDPA, "batch_1", ("query", "key", "value"),
        "size_at(-4, q_projected) == 1 && size_at(-4, k_cache) == 1 && size_at(-4, v_cache) == 1",
        "SDPA.cpp: sdpa_impl", "abort",
        lambda a: all(_size(a[k], -4) == 1 for k in ("query", "key", "value"))),
    RuntimeCondition(
        CUSTOM_SDPA, "kv_same_shape", ("key", "value"),
        "graph.sizes_of(k_cache) == graph.sizes_of(v_cache)", "SDPA.cpp: sdpa_impl", "abort",
        lambda a: _shape(a["key"]) == _shape(a["value"])),
    RuntimeCondition(
        CUSTOM_SDPA, "head_dim", ("query", "key"),
        "size_at(-1, q_projected) == size_at(-1, k_cache)", "SDPA.cpp: sdpa_impl", "abort",
        lambda a: _size(a["query"], -1) == _size(a["key"], -1)),
    RuntimeCondition(
        CUSTOM_SDPA, "causal_no_mask", ("attn_mask", "drpout_p", "is_causal", "scale"),
        "val_is_none(attn_mask) && dropout_p == 0 && val_is_none(scale) && is_causal",
        "SDPA.cpp: sdpa_impl", "abort",
        lambda a: (a.get("attn_mask") is None and not a.get("drpout_p")
                   and a.get("scale") is None and a.get("is_causal") in (None, True))),
    RuntimeCondition(
        SDPA_WITH_KV_CACHE, "rank_4", ("query", "key", "value"),
        "graph.dim_of(q) == 4 && graph.dim_of(k) == 4 && graph.dim_of(v) == 4",
        "SDPA.cpp: sdpa_with_kv_cache_impl", "abort",
        lambda a: all(_dim(a[k]) == 4 for k in ("query", "key", "value"))),
    RuntimeCondition(
        SDPA_WITH_KV_CACHE, "head_dim", ("query", "key"), "size_at(-1, q) == size_at(-1, k)",
        "SDPA.cpp: sdpa_with_kv_cache_impl", "abort",
        lambda a: _size(a["query"], -1) == _size(a["key"], -1)),
    RuntimeCondition(
        SDPA_WITH_KV_CACHE, "kv_seq", ("key", "value"), "size_at(-2, k) == size_at(-2, v)",
        "SDPA.cpp: sdpa_with_kv_cache_impl", "abort",
        lambda a: _size(a["key"], -2) == _size(a["value"], -2)),
    _cache_rows_written(SDPA_WITH_KV_CACHE, "sdpa_with_kv_cache_impl"),
    _cache_rows_written(COMPUTE_ATTN_WEIGHT_WITH_KV_CACHE,
                        "compute_attn_weight_with_kv_cache_impl"),
)

#: ops of :data:`CONDITIONS` the simulator does not run and ``check()`` does not evaluate
#: (no torch op, hence no schema to name their arguments by)
NOT_SIMULATED: frozenset[str] = frozenset({COMPUTE_ATTN_WEIGHT_WITH_KV_CACHE})

def _rotary_conditions(op: str) -> list[RuntimeCondition]:
    """RotaryEmbedding.cpp: add_rotary_embedding_node / add_rotary_embedding_hf_node. With
    q and k laid out [B, H, S, D] (transformers), dim -3 is the heads: a GQA model, whose
    k has fewer heads than q, aborts here (found on the real runtime)."""
    fn = "add_rotary_embedding_hf_node" if op.endswith("_hf.default") else "add_rotary_embedding_node"
    conds = [
        RuntimeCondition(op, "head_dim", ("xq", "xk"),
                         "graph.size_at<int>(-1, xq) == graph.size_at<int>(-1, xk)",
                         f"RotaryEmbedding.cpp: {fn}", "abort",
                         lambda a: _size(a["xq"], -1) == _size(a["xk"], -1)),
        RuntimeCondition(op, "same_dim_3", ("xk", "xq"),
                         "graph.size_at<int>(-3, xq) == graph.size_at<int>(-3, xk)",
                         f"RotaryEmbedding.cpp: {fn}", "abort",
                         lambda a: _size(a["xq"], -3) == _size(a["xk"], -3),
                         "q and k must agree in dim -3 (the heads in [B, H, S, D]: no GQA)"),
    ]
    if op.endswith("_hf.default"):
        conds += [
            RuntimeCondition(op, "rotary_dim", ("freqs_cos",),
                             "graph.size_at<int>(-1, freqs_cos) <= graph.size_at<int>(-1, xq)"
                             " && graph.size_at<int>(-1, freqs_cos) % 8 == 0",
                             f"RotaryEmbedding.cpp: {fn}", "abort",
                             lambda a: _size(a["freqs_cos"], -1) <= _size(a["xq"], -1)
                             and _size(a["freqs_cos"], -1) % 8 == 0),
            RuntimeCondition(op, "freqs_shapes", ("freqs_sin",),
                             "graph.sizes_of(freqs_cos) == graph.sizes_of(freqs_sin)",
                             f"RotaryEmbedding.cpp: {fn}", "abort",
                             lambda a: _shape(a["freqs_cos"]) == _shape(a["freqs_sin"])),
        ]
    else:
        conds.append(RuntimeCondition(
            op, "freqs_half", ("freqs_cos",),
            "graph.size_at<int>(-1, xq) == graph.size_at<int>(-1, freqs_cos) * 2",
            f"RotaryEmbedding.cpp: {fn}", "abort",
            lambda a: _size(a["xq"], -1) == 2 * _size(a["freqs_cos"], -1)))
    return conds


class RuntimeSymInt(int):
    """A scalar argument the graph computes while it runs (a ``SymInt`` value of the
    payload, e.g. ``x.shape[0]`` under dynamic shapes): its value, marked as such for
    conditions on what the runtime reads only once, when it builds the graph."""


def _integral(v: Any) -> bool:
    return v is None or float(v).is_integer()


#: conditions of the public runtime that ExecuTorch's own 1.5.1 delegate suite ran into
#: (tests/vulkan_delegate_stock.py on the real runtime; docs/vulkan-runtime-fidelity.md)
_SUITE_FOUND: tuple[RuntimeCondition, ...] = (
    RuntimeCondition(
        "aten.index.Tensor", "one_index_tensor", ("indices",), "indices_list->size() == 1",
        "IndexTensor.cpp: index_tensor", "abort", lambda a: len(a["indices"]) == 1,
        "index.Tensor: only one index tensor is supported (indexing dim d > 0 serializes "
        "as d None entries before it)"),
    RuntimeCondition(
        "aten.arange.start_step", "integral_start_step", ("step", "start"),
        "start and step are integers (resize_arange_node reads them with "
        "extract_scalar<int64_t>)", "Arange.cpp: resize_arange_node", "abort",
        lambda a: _integral(a.get("start")) and _integral(a.get("step")),
        "a fractional step truncates (0.5 -> 0) and div_up(end - start, 0) is a "
        "division by zero: the process dies of SIGFPE when the output is resized"),
    RuntimeCondition(
        "aten.arange.start_step", "start_known_when_built", ("start",),
        "start and step are constants (add_arange_node writes them into the shader's "
        "parameters once, when the graph is built)", "Arange.cpp: add_arange_node",
        "garbage",
        lambda a: all(_known_when_built(a.get(k)) for k in ("start", "step")),
        "a start the graph computes at run time (a SymInt such as x.shape[0]) is read "
        "before it is computed; resizing fixes the length, not the values"),
    RuntimeCondition(
        "aten.clamp.default", "bounds_known_when_built", ("max", "min"),
        "min and max are constants (add_clamp_node reads them once, when the graph is "
        "built)", "UnaryOp.cpp: add_clamp_node", "garbage",
        lambda a: all(_known_when_built(a.get(k)) for k in ("min", "max")),
        "a bound the graph computes at run time (a SymInt such as x.shape[0]) is read "
        "before it is computed"),
)

def _known_when_built(v: Any) -> bool:
    """Not a value the graph computes as it runs: a payload's SymInt (RuntimeSymInt) or a
    node's ``torch.SymInt`` / ``torch.SymFloat`` (a size, an ``.item()``): the partitioner
    sees the node's, the simulator and ``check()`` the payload's, and all three agree."""
    import torch

    return not isinstance(v, (RuntimeSymInt, torch.SymInt, torch.SymFloat))


def _serialized_int(v: Any) -> bool:
    """Not an argument the payload holds as a ``Double`` or a ``Bool`` (which the
    simulator and ``check()`` pass to the conditions as a float / a bool; an ``Int`` is an
    int, a ``SymInt`` a RuntimeSymInt, and a node's argument a Python or torch SymInt)."""
    return not isinstance(v, (bool, float))


def _int_read(op: str, arg: str, source: str, effect: Effect = "abort",
              why: str = "") -> RuntimeCondition:
    return RuntimeCondition(
        op, f"{arg}_is_int", (arg,), f"values_.at({arg}).isInt()", source, effect,
        lambda a: _serialized_int(a.get(arg)),
        why or f"the runtime reads {arg} with the strict graph.get_int (Value::toInt: "
        "'Expected value to have type Int, got DOUBLE instead'); extract_scalar would "
        "have cast a Double")


#: int arguments the runtime reads only as an ``Int`` value (``graph.get_int`` ->
#: ``Value::toInt``, ``val_is_int``, ``get_or_create_int_param_buffer``), found for issue
#: 24's OpMix program: stock's ``VkGraphBuilder`` shares one value among equal scalars,
#: so ``groups=1`` after a ``1.0`` in the same delegate is serialized as ``Double``
#: (fusionkit's :mod:`..constant_serializer` keys them by type). The float arguments
#: are read with the lenient ``extract_scalar<T>``, which casts Int/Double/Bool.
_INT_READ: tuple[RuntimeCondition, ...] = (
    _int_read("aten.convolution.default", "groups",
              "Value.h: toInt, from Convolution.cpp: conv (graph.get_int(args[8]))"),
    _int_read("et_vk.conv_with_clamp.default", "groups",
              "Value.h: toInt, from Convolution.cpp: conv (graph.get_int(args[8]))"),
    _int_read(Q8TA_CONV2D, "groups",
              "Value.h: toInt, from Q8taConv2d.cpp: prepack_quantized_conv2d_weight"),
    _int_read(Q8TA_CONV2D_T, "groups",
              "Value.h: toInt, from Q8taConv2d.cpp: prepack_quantized_conv2d_weight"),
    _int_read("aten.avg_pool2d.default", "divisor_override",
              "Pool.cpp: create_divisor_params (val_is_int(divisor_override) ? "
              "get_int(divisor_override) : 0)", "garbage",
              "a divisor_override serialized as a Double is taken as none: the window's "
              "size divides instead"),
    *(_int_read(op, "start_pos",
                "ComputeGraph.cpp: get_or_create_int_param_buffer / read_symint, from "
                "SDPA.cpp", why="the runtime takes start_pos as an Int or a SymInt only "
                "('Cannot create a int param buffer for the given value')")
      for op in (UPDATE_CACHE, CUSTOM_SDPA, SDPA_WITH_KV_CACHE)),
)

def _grouped_conv_ok(a: Mapping[str, Any]) -> bool:
    w, g = a["weight"], int(a["groups"])
    if _dim(w) != 4 or g == 1 or a.get("transposed"):
        return True
    if _size(w, 0) == g and _size(w, 1) == 1:  # Conv2dMethod::Depthwise
        return True
    if _size(w, 2) == 1 and _size(w, 3) == 1:
        # Conv2dMethod::Pointwise: conv2d_pw_impl is not given groups; every output
        # channel reads the first in_channels / groups input channels (group 0's)
        return False
    return _size(w, 1) % 4 == 0


def _grouped_conv(op: str) -> RuntimeCondition:
    return RuntimeCondition(
        op, "grouped_in_channels_4", ("weight", "groups"),
        "groups == 1 || depthwise || (kernel not 1x1 && in_channels / groups % 4 == 0) "
        "(2-D, not transposed)",
        "Convolution.cpp: conv2d, Conv2dMethod::SlidingWindow; Conv2dPW.cpp: conv2d_pw_impl",
        "garbage", _grouped_conv_ok,
        "measured on lavapipe: a 3x3 conv with groups > 1 and 1, 2, 3 or 6 input channels "
        "per group computes wrong values (fp32 1.2-2.6 off eager, fp16 0.59), 4 or 8 per "
        "group and depthwise are right (fp32, fp16); a 1x1 conv with groups > 1 (not "
        "depthwise) is wrong whatever the group size (0.8-1.3 off: conv2d_pw_impl takes no "
        "groups, each output channel reads group 0's input channels); conv1d (the "
        "conv1d shader has in_group_size) is right")


def _conv1d_pw_groups_ok(a: Mapping[str, Any]) -> bool:
    w = a["weight"]
    return _dim(w) != 3 or _size(w, 2) != 1 or int(a["groups"]) == 1


def _conv1d_pw_groups(op: str) -> RuntimeCondition:
    # op_registry's pick_conv_storage makes a kernel-1 conv1d height-packed, which
    # Convolution.cpp: conv routes to et_vk.conv1d_pw (before the depthwise check)
    return RuntimeCondition(
        op, "conv1d_pw_groups_1", ("groups", "weight"),
        "graph.get_int(args[6]) == 1", "Conv1dPW.cpp: conv1d_pw", "abort",
        _conv1d_pw_groups_ok,
        "a conv1d with kernel size 1 runs as conv1d_pw, which only supports groups=1 "
        "(grouped and depthwise kernel-1 conv1d refused at load on lavapipe)")


CONDITIONS = (*CONDITIONS, *_rotary_conditions("et_vk.apply_rotary_emb.default"),
              *_rotary_conditions("et_vk.apply_rotary_emb_hf.default"), *_SUITE_FOUND,
              *_INT_READ, _grouped_conv("aten.convolution.default"),
              _grouped_conv("et_vk.conv_with_clamp.default"),
              _conv1d_pw_groups("aten.convolution.default"),
              _conv1d_pw_groups("et_vk.conv_with_clamp.default"))

#: the normalization ops' rank: LeViT's Linear + BatchNorm1d (a 2-D batch norm) is refused at
#: load, wav2vec2's GroupNorm over conv1d features (3-D) is all NaN on lavapipe; both pass
#: through ExecuTorch's partitioner (tests/test_vulkan_real_runtime_norm_rank.py shows each
#: on the real runtime)
_NORM_RANK: tuple[RuntimeCondition, ...] = (
    RuntimeCondition(
        "aten._native_batch_norm_legit_no_training.default", "batch_norm_4d", ("input",),
        "in_sizes.size() == 4", "BatchNorm.cpp: add_native_batch_norm_node", "abort",
        lambda a: _dim(a["input"]) == 4,
        "BatchNorm only support 4d tensor: a BatchNorm1d (2-D or 3-D input) that no "
        "conv absorbed is refused when the graph is built"),
    RuntimeCondition(
        "aten.native_group_norm.default", "group_norm_4d", ("input",),
        "input is 4-D (N, C, H, W)", "GroupNorm.cpp: add_native_group_norm_node, "
        "group_norm_reduce_texture.glsl", "garbage",
        lambda a: _dim(a["input"]) == 4,
        "measured on lavapipe: GroupNorm over a 3-D (N, C, L) input computes NaN "
        "everywhere (16 groups or 4 of 16 channels, 79 positions), the same norm over "
        "(N, C, L, 1) is right (7e-7); nothing checks the rank"),
)

CONDITIONS = (*CONDITIONS, *_NORM_RANK)


def _as_stored(dtype: Any) -> Any:
    """The dtype a Vulkan tensor holds a value of ``dtype`` in (64-bit ones are narrowed)."""
    import torch

    return {torch.int64: torch.int32, torch.float64: torch.float32}.get(dtype, dtype)


def _copy_is_not_a_buffer_blit(a: Mapping[str, Any]) -> bool:
    """False when ``_to_copy`` keeps the stored dtype between non-float tensors: the
    registry gives those a buffer, and the runtime copies them with a blit, texture-only.
    With no ``dtype`` (a payload's call, where the output's dtype stands for it:
    :data:`OUTPUT_DTYPE_ARGUMENT`) it is not judged."""
    import torch

    src, out = getattr(a["self"], "dtype", None), a.get("dtype")
    if src is None or not isinstance(out, torch.dtype):
        return True
    floats = {torch.float16, torch.float32}
    if src in floats and out in floats:  # any storage: the tagging pass may give textures
        return True
    return _as_stored(src) != _as_stored(out)


#: ``aten._to_copy`` between equal stored dtypes: ``export_llm``'s local/global attention
#: copies an int32 position to int64, and the program aborts at its first call
_TO_COPY: tuple[RuntimeCondition, ...] = (
    RuntimeCondition(
        "aten._to_copy.default", "blit_needs_textures", ("self", "dtype"),
        "graph->storage_type_of(src_) != utils::kBuffer && "
        "graph->storage_type_of(dst_) != utils::kBuffer",
        "ToCopy.cpp: add_to_copy_node, BlitNode.cpp: encode", "abort",
        _copy_is_not_a_buffer_blit,
        "a copy keeping its stored dtype (or float <-> half) is a BlitNode, which takes "
        "textures only; op_registry's pick_to_copy_storage gives every non-float copy "
        "CONTIGUOUS_BUFFER"),
)

CONDITIONS = (*CONDITIONS, *_TO_COPY)


def _scalar_known(arg: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda a: _known_when_built(a.get(arg))


#: the tensor-scalar ops of ``BinaryScalarOp.cpp``: ``add_binary_scalar_op_node`` reads the
#: scalar once, into the shader's push constants, when it builds the graph
#: (``extract_int32_scalar``: ``graph.read_symint``); a later call keeps the first value.
#: ``export_llm``'s local/global attention compares its ring buffer's positions with the
#: position (``arange(n) < start_pos``): every decode step after the first kept the
#: prefill's position, and the model attended to the new token alone
_SCALAR_READ_ONCE: tuple[RuntimeCondition, ...] = tuple(
    RuntimeCondition(
        op, "scalar_known_when_built", (arg,),
        f"{arg} is a constant (add_binary_scalar_op_node writes it into the push constants "
        "once, when the graph is built)", "BinaryScalarOp.cpp: add_binary_scalar_op_node",
        "garbage", _scalar_known(arg),
        f"a {arg} the graph computes at run time (a SymInt such as input_pos.item()) is "
        "read at the first call only: later calls compare with that first value")
    for op, arg in (("aten.pow.Tensor_Scalar", "exponent"), ("aten.eq.Scalar", "other"),
                    ("aten.ne.Scalar", "other"), ("aten.lt.Scalar", "other"),
                    ("aten.le.Scalar", "other"), ("aten.gt.Scalar", "other"),
                    ("aten.ge.Scalar", "other")))

CONDITIONS = (*CONDITIONS, *_SCALAR_READ_ONCE)

#: ops whose ``dtype`` argument is their output's dtype: a payload leaves it out (None), so
#: ``check()`` and the simulator read the output tensor's instead
OUTPUT_DTYPE_ARGUMENT: frozenset[str] = frozenset({"aten._to_copy.default"})


def _ints(v: Any) -> list[int]:
    return [int(i) for i in v] if isinstance(v, (list, tuple)) else [int(v)]


def _conv2d_padding_ok(a: Mapping[str, Any]) -> bool:
    return _dim(a["weight"]) != 4 or len(_ints(a["padding"])) == 2


def _generic_depthwise(a: Mapping[str, Any]) -> bool:
    """Convolution.cpp's ``Conv2dMethod::Depthwise`` with a kernel that has no output-tile
    shader (``conv2d_dw_output_tile.yaml``: 3x3 and 5x5 only): the generic ``conv2d_dw``."""
    w = a["weight"]
    if _dim(w) != 4 or a.get("transposed") or int(a["groups"]) == 1:
        return False
    depthwise = _size(w, 0) == int(a["groups"]) and _size(w, 1) == 1
    kernel = (_size(w, 2), _size(w, 3))
    return depthwise and kernel not in ((3, 3), (5, 5), (1, 1))


def _dw_width_padding_ok(a: Mapping[str, Any]) -> bool:
    return not _generic_depthwise(a) or _ints(a["padding"])[-1] == 0


def _dw_stride_dilation_ok(a: Mapping[str, Any]) -> bool:
    return not _generic_depthwise(a) or (
        set(_ints(a["stride"])) == {1} and set(_ints(a["dilation"])) == {1})


def _conv_2d_conditions(op: str) -> tuple[RuntimeCondition, ...]:
    """Found on two vision models (a SigLIP-style patch embedding, ConvNeXt V2's depthwise
    7x7; ``tests/test_vulkan_static_verdicts.py``), measured on lavapipe."""
    return (
        RuntimeCondition(
            op, "conv2d_padding_2", ("padding", "weight"),
            "ints.size() == 2", "VecUtils.h: make_ivec2, from Convolution.cpp (a 2-D conv's "
            "padding)", "abort", _conv2d_padding_ok,
            "a 2-D conv with padding='valid' (SigLIP's patch embedding) is exported with "
            "padding [0] (one entry for both dims), which the runtime refuses when it builds "
            "the graph; an output_padding of one entry is not read (measured: it runs)"),
        RuntimeCondition(
            op, "depthwise_width_padding_0", ("padding", "weight", "groups"),
            "depthwise with a kernel other than 3x3 / 5x5 (the generic conv2d_dw shader): "
            "padding along the width == 0",
            "conv2d_dw.glsl (Convolution.cpp: Conv2dMethod::Depthwise, no output-tile "
            "variant for the kernel)", "garbage", _dw_width_padding_ok,
            "measured on lavapipe: a depthwise conv with a 2x2, 4x4, 6x6, 7x7 (ConvNeXt), "
            "9x9 or 3x5 kernel and a padding along the width computes wrong values (fp32 "
            "1.1-2.6 off eager, fp16 2.1), padding along the height only or none is right, "
            "3x3 and 5x5 kernels (output-tile shaders) are right with any padding"),
        RuntimeCondition(
            op, "depthwise_stride_dilation_1", ("stride", "weight", "groups", "dilation"),
            "depthwise with a kernel other than 3x3 / 5x5: stride == 1 and dilation == 1",
            "ShaderRegistry.cpp: get_shader_info (Convolution.cpp composes conv2d_dw_sned_"
            "<dtype>, which no template generates: 'Could not find ShaderInfo with name "
            "conv2d_dw_sned_float')", "abort", _dw_stride_dilation_ok,
            "measured on lavapipe: a 7x7 depthwise conv with stride 2 or dilation 2 is "
            "refused at load, its shader name missing from the registry (and from the "
            "wheel's shader templates: conv2d_dw_sned_output_tile has 3x3 and 5x5 only)"),
    )


CONDITIONS = (*CONDITIONS, *_conv_2d_conditions("aten.convolution.default"),
              *_conv_2d_conditions("et_vk.conv_with_clamp.default"))


def _dtype_holds(v: Any, dtypes: frozenset[Any]) -> bool:
    dtype = getattr(v, "dtype", None)
    return dtype is None or dtype in dtypes  # (a payload tensor of unknown dtype: not judged)


def _operand_dtype_conditions() -> tuple[RuntimeCondition, ...]:
    """One condition per operand whose dtypes the Vulkan delegate declares
    (``passes/vulkan_delegate.py`` ``OPERAND_DTYPES``, the table the core declines a
    replacement by): ``check()`` and the simulator report the payload that breaks it."""
    from fusionkit.check.operand_dtypes import dtype_names
    from fusionkit.passes.vulkan_delegate import OPERAND_DTYPES

    def holds(arg: str, allowed: frozenset[Any]) -> Callable[[Mapping[str, Any]], bool]:
        return lambda a: _dtype_holds(a[arg], allowed)

    out = []
    for op, args in OPERAND_DTYPES.items():
        for arg, (dtypes, why) in args.items():
            allowed = frozenset(dtypes)
            out.append(RuntimeCondition(
                op, f"{arg}_dtype", (arg,), f"{arg}.dtype in {{{dtype_names(allowed)}}}",
                f"{op}'s kernel (operand dtypes: passes/vulkan_delegate.py)", "abort",
                holds(arg, allowed), why))
    return tuple(out)


CONDITIONS = (*CONDITIONS, *_operand_dtype_conditions())

_BY_OP: dict[str, tuple[RuntimeCondition, ...]] = {}
for _c in CONDITIONS:
    _BY_OP[_c.op] = (*_BY_OP.get(_c.op, ()), _c)


def conditions_for(op: str) -> tuple[RuntimeCondition, ...]:
    """The conditions of ``op`` (serialized name, e.g. ``"et_vk.linear_q4gsw.default"``)."""
    return _BY_OP.get(_alias(op), ())


#: torch.ops.llama.X.default serializes as "X.default" (``VkGraphBuilder`` names an op
#: ``node.target.__name__``, without a non-aten ``OpOverload``'s namespace)
UNQUALIFIED_LLAMA = ("update_cache.default", "custom_sdpa.default",
                     "sdpa_with_kv_cache.default")


def _alias(op: str) -> str:
    return "llama." + op if op in UNQUALIFIED_LLAMA else op


def serialized_name(op: str) -> str:
    """The name a Vulkan payload gives ``op`` (a :data:`CONDITIONS` op): ``"llama.X.default"``
    is ``"X.default"`` for the llama ops above, every other op its own name."""
    bare = op.removeprefix("llama.")
    return bare if bare in UNQUALIFIED_LLAMA else op


#: the payload names of the ops with an ``uninitialized_state`` condition: state the runtime
#: makes at load and never initialises. The real runtime's runners run a program with one
#: in a child that has run nothing else (:func:`..runtime.uninitialized_state`).
UNINITIALIZED_STATE_OPS: frozenset[str] = frozenset(
    serialized_name(c.op) for c in CONDITIONS if c.uninitialized_state)


def violated(op: str, args: Mapping[str, Any]) -> list[RuntimeCondition]:
    """The conditions of ``op`` that ``args`` (schema name -> value) do not meet.

    A condition whose check cannot be evaluated on these arguments (a missing
    argument, an unexpected type) counts as violated: the runtime would not
    have accepted them either.
    """
    bad = []
    # a node's symbolic sizes and scalars (x.shape[0]) are judged by their example values
    # without a guard: float(s) or s % 8 == 0 would specialize the user's program to the
    # example size. An unbacked value (an .item()) has none and still raises: violated.
    with guards_suppressed_for(args.values()):
        for c in conditions_for(op):
            try:
                ok = c.holds(args)
            except Exception:
                ok = False
            if not ok:
                bad.append(c)
    return bad


# ------------------------------------------------------- the delegate's boundary


def contiguous_dim_order(shape: Any, dim_order: Any) -> bool:
    """True when a tensor of ``shape`` laid out in ``dim_order`` has the bytes of a
    contiguous one (the dims of size > 1 keep their order)."""
    moved = [int(d) for d in dim_order if int(shape[int(d)]) != 1]
    return moved == sorted(moved)


#: found on the real runtime (a conv with a channels_last weight, whose output is
#: channels_last as in eager; tests/test_vulkan_real_runtime_dim_order.py): not an op's
#: condition but one of every delegate input and output, so it is not in :data:`CONDITIONS`
DELEGATE_DIM_ORDER = RuntimeCondition(
    "executorch_call_delegate", "contiguous_dim_order", ("dim_order",),
    "the delegate input's / output's dim order is contiguous (0, 1, ..., n-1)",
    "VulkanBackend.cpp: VulkanBackend::execute (maybe_cast_and_copy_into_staging / "
    "maybe_cast_and_copy_from_staging of data_ptr, numel)", "garbage",
    lambda a: contiguous_dim_order(a["shape"], a["dim_order"]),
    "the runtime copies a delegate input's memory, and the result into an output's memory, "
    "in contiguous order whatever the tensor's dim order: a channels_last (0, 2, 3, 1) "
    "tensor is read and written as if it were NCHW")


DELEGATE_ARGUMENT_COUNT = RuntimeCondition(
    "executorch_call_delegate", "argument_count", ("args",),
    "args.size() == num_inputs + num_outputs",
    "VulkanBackend.cpp: VulkanBackend::execute", "abort",
    lambda a: a["supplied"] == a["inputs"] + a["outputs"],
    "the delegate call passes its inputs then its outputs, one argument each; a graph that "
    "declares fewer (one value returned for two outputs) or more (a mutated buffer serialized "
    "as an output) is refused at execute")


def delegate_argument_count(inputs: int, outputs: int, supplied: int) -> str | None:
    """The runtime's abort message when a delegate call passes ``supplied`` arguments to a
    graph of ``inputs`` inputs and ``outputs`` outputs (None: the counts agree)."""
    if DELEGATE_ARGUMENT_COUNT.holds({"inputs": inputs, "outputs": outputs,
                                      "supplied": supplied}):
        return None
    return (f"Vulkan graph declares {inputs} inputs and {outputs} outputs, but the delegate "
            f"call supplied {supplied} arguments: {DELEGATE_ARGUMENT_COUNT.message()}")


def as_read_by_runtime(x: Any, dim_order: Any) -> Any:
    """What the delegate computes on, given the program's tensor ``x`` held in
    ``dim_order``: its memory read in contiguous order, with ``x``'s shape."""
    order = [int(d) for d in dim_order]
    return x.permute(order).contiguous().reshape(x.shape)


def as_written_by_runtime(y: Any, dim_order: Any) -> Any:
    """The program's tensor (laid out in ``dim_order``) after the runtime copies the
    delegate's result ``y`` into its memory in contiguous order."""
    order = [int(d) for d in dim_order]
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return y.contiguous().reshape([y.shape[d] for d in order]).permute(inverse)
