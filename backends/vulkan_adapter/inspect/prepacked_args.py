"""The op arguments the Vulkan runtime prepacks: it requires a constant there.

Taken from the runtime's C++ sources (``shared/vulkan-prepacked-args.md``). One table
serves :func:`.prepack_check.check` and the transform passes
(:func:`~fusionkit.backends.vulkan_adapter.rules.constant_args`: the arguments
``FoldParameterSubgraphsPass`` folds); it is kept apart from the checker so that a
lowering imports the table only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PREPACKED_ARGS", "PrepackedArg"]


@dataclass(frozen=True)
class PrepackedArg:
    """An op argument the runtime requires to be a constant (a TensorRef)."""

    index: int
    name: str
    #: the runtime accepts None in its place
    none_ok: bool = False


#: serialized op name -> the arguments ``prepack_standard`` requires to be TensorRefs
PREPACKED_ARGS: dict[str, tuple[PrepackedArg, ...]] = {
    "et_vk.rms_norm.default": (PrepackedArg(1, "weight"),),
    # NativeLayerNorm.cpp (v1.4.1 through main) throws on a None weight *and* a None bias
    # ("native_layer_norm requires bias to be non-None"), whatever the op registry accepts
    "aten.native_layer_norm.default": (PrepackedArg(2, "weight"), PrepackedArg(3, "bias")),
    "aten.native_group_norm.default": (PrepackedArg(1, "weight"), PrepackedArg(2, "bias")),
    "aten._native_batch_norm_legit_no_training.default": (
        PrepackedArg(1, "weight"),
        PrepackedArg(2, "bias"),
        PrepackedArg(3, "running_mean"),
        PrepackedArg(4, "running_var"),
    ),
    "aten.embedding.default": (PrepackedArg(0, "weight"),),
    # Linear.cpp linear_packed_weight: prepack_fp_linear_weight(weight) and, when there is
    # one, prepack_standard(bias, passthrough=false); a weight computed at run time (a
    # dequantize left on the CPU) aborts in toTensorRef: "Expected value to have type
    # TensorRef"
    "aten.linear.default": (PrepackedArg(1, "weight"), PrepackedArg(2, "bias", none_ok=True)),
    # Convolution.cpp: every path prepacks the weight (conv2d: prepack_weights, a PrepackNode
    # that calls get_tref; conv1d: prepack_standard(weight, passthrough=false); the resize
    # functions read get_tref(weight)->sizes) and the bias (prepack_biases: a PrepackNode,
    # None gives zeros). A weight the graph computes -- weight_norm's g * v / |v|, as in
    # wav2vec2's positional conv -- is refused at load: "(graph.val_is_tref(tensor_data)) is
    # false!" (tests/test_vulkan_real_runtime_norm_rank.py, on the real runtime)
    "aten.convolution.default": (PrepackedArg(1, "weight"),
                                 PrepackedArg(2, "bias", none_ok=True)),
    "et_vk.conv_with_clamp.default": (PrepackedArg(1, "weight"),
                                      PrepackedArg(2, "bias", none_ok=True)),
}
