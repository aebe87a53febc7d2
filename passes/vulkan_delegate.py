"""What fusionkit's core must know of ExecuTorch's Vulkan delegate, told it on import.

The core judges every op a replacement creates before the program changes
(:mod:`fusionkit.find.executable`); without a partitioner at hand it cannot know that
``et_vk.*`` exists only inside the Vulkan delegate (no CPU kernel by design), which module
registers those ops, or which other ops Vulkan's operator registry takes. That is Vulkan's
knowledge, so it lives here, not in the core: the Vulkan rules and the Vulkan adapter
import this module, and the ``fusionkit.delegates`` entry point (pyproject.toml) lets the
core find it when a user's own rule names ``et_vk`` ops with nothing but fusionkit imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from fusionkit import register_delegate

#: the op namespace only the Vulkan delegate runs, and the module whose import registers it
NAMESPACES: dict[str, tuple[str, ...]] = {"et_vk": ("executorch.backends.vulkan.custom_ops_lib",)}


def supported_ops() -> Iterable[Any]:
    """The targets ExecuTorch's Vulkan operator registry lists (imported when first asked)."""
    from executorch.backends.vulkan.op_registry import vulkan_supported_ops

    return list(vulkan_supported_ops)


_FLOAT = (torch.float32, torch.float16)
_INT8 = (torch.int8,)
_QUANTIZES_ITSELF = ("QuantizedLinear.cpp reads it as fp_input and quantizes it itself "
                     "(add_quantize_and_pack_4h4w_node); given the int8 tensor, the runtime "
                     "aborts at load: 'Could not find ShaderInfo with name "
                     "clone_buffer_to_image_int8_int32'")

#: op -> tensor argument -> (the dtypes the Vulkan runtime's kernel takes, why): the core
#: declines a replacement feeding it another dtype (fusionkit.check.operand_dtypes), and
#: check() / the simulator report a payload that does (inspect/runtime_conditions.py)
OPERAND_DTYPES: dict[str, dict[str, tuple[tuple[torch.dtype, ...], str]]] = {
    "et_vk.linear_q8ta_q8csw.default": {"x": (_FLOAT, _QUANTIZES_ITSELF)},
    "et_vk.linear_dq8ca_q4gsw.default": {
        "input": (_FLOAT, "QuantizedLinear.cpp quantizes the float input per row with "
                          "input_scales / input_zp")},
    "et_vk.linear_q4gsw.default": {
        "self": (_FLOAT, "a weight-only kernel: float activations (QuantizedLinear.cpp)")},
    "et_vk.linear_qcs4w.default": {
        "self": (_FLOAT, "a weight-only kernel: float activations (QuantizedLinearQCSNW.cpp)")},
    "et_vk.q8ta_linear.default": {
        "x": (_INT8, "Q8taLinear.cpp reads the packed int8 activation")},
    "et_vk.q8ta_linear_gemv.default": {
        "x": (_INT8, "Q8taLinearGemv.cpp reads the packed int8 activation")},
}

register_delegate("Vulkan", namespaces=NAMESPACES, supported_ops=supported_ops,
                  operand_dtypes=OPERAND_DTYPES)

__all__ = ["NAMESPACES", "OPERAND_DTYPES", "supported_ops"]
