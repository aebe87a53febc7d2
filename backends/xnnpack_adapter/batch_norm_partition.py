"""A batch norm that reads a dequantized tensor stays on the CPU.

Why: ExecuTorch 1.5.1's XNNPACK partitioner takes a batch norm no convolution absorbs when
``DecomposeBatchNorm.can_decompose_batch_norm`` says it becomes a 1x1 depthwise
convolution. That check never looks at the input. When the input is a dequantize (a
quantized convolution's output the batch norm reads, while the program also returns it, so
the fold into the convolution is declined), XNNPACK reads the int8 tensor before the
dequantize and the decomposed convolution's weight is float: a mixed convolution XNNPACK
cannot compute. Held-out conv + batch-norm models quantized with XNNPACK's quantizer show
all three outcomes with stock: ``Weight and Input should both be quantized`` at lowering
(a conv1d), a program 2.39 off the fake-quantized model with no error (a conv2d), and
``Failed to execute method forward, error: 0x1`` at run time (a transposed conv2d).

What: the check refuses such a batch norm, with the reason in the partitioner's log
(``why``); the batch norm runs on the CPU with the portable kernel, on the float tensor.
fusionkit's own decomposition rule (``xnnpack_decompose_batch_norm``) declines the same
batch norm for the same reason. Part of the adapter's patch set (the adapter's
partitioner installs it while it partitions; ``install()`` process-wide).
"""

from __future__ import annotations

import importlib
from typing import Any

from fusionkit.integration.hooks import PatchSet
from fusionkit.passes.xnnpack.decompose_batch_norm import dequantized

__all__ = ["PATCHES", "REASON"]

_MODULE = "executorch.backends.xnnpack._passes.decompose_batch_norm"
REASON = ("its input is dequantized: a float depthwise convolution of an int8 tensor, "
          "which XNNPACK cannot compute (kept on the CPU by fusionkit)")


def _can_decompose_batch_norm(node: Any, exported_program: Any, why: Any = None) -> bool:
    cls = importlib.import_module(_MODULE).DecomposeBatchNorm
    args = getattr(node, "args", ())
    if args and dequantized(args[0]):
        if why is not None:
            why(node, f"batch norm `{node.name}`: {REASON}")
        return False
    original = PATCHES.original(cls, "can_decompose_batch_norm")
    return bool(original(node, exported_program, why))


def _patches() -> list[tuple[Any, str, Any]]:
    cls = importlib.import_module(_MODULE).DecomposeBatchNorm
    return [(cls, "can_decompose_batch_norm", staticmethod(_can_decompose_batch_norm))]


#: ``DecomposeBatchNorm.can_decompose_batch_norm`` refuses a batch norm of a dequantized
#: tensor; part of the adapter's patch set
PATCHES = PatchSet(f"fusionkit.backends.xnnpack_adapter.batch_norm_partition ({_MODULE}."
                   "DecomposeBatchNorm.can_decompose_batch_norm)", _patches)
