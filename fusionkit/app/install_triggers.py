"""Install fusionkit's adapters at the first call of anything they patch, not before.

Why: ``fusionkit exec`` must leave a process as it was until fusionkit has work to do.
Installing the adapters imports fusionkit's rules, matcher and their dependencies; done
when ExecuTorch is imported, that import sits in the process through the exporter's own
``torch.export`` -- whose peak is the export's peak on large models -- although no
fusionkit code runs there. Instead, each attribute an adapter replaces (a partitioner's
``partition``, a preprocess pass, a serializer method, torchao's conv + batch-norm fold) is
*armed*: as its module finishes importing, a trigger takes its place. The first call of any
trigger puts every original back (an adapter's patch set saves, wraps and later restores
what it finds, and must find stock's objects), installs the adapters, and calls what is
installed now, so that call and every later one run exactly what an adapter installed at
start-up would have run. Another thread reaching a trigger meanwhile waits for the
install; one calling an attribute already put back runs stock's code for that call (the
install takes about a second, and ExecuTorch's pipelines lower in one thread). A reference bound to a trigger (``from m import f`` after ``m`` was
imported) keeps working: it calls through to whatever the attribute holds.

:data:`PATCHED_BY` lists the attributes per backend; ``tests/test_exec_launcher.py`` holds
it to the adapters' own patch sets. The one patched dict (the Vulkan pattern registry) is
read only by functions listed here. This module imports only the standard library.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["PATCHED_BY", "InstallTriggers", "resolve"]

_FOLD = "torchao.quantization.pt2e.quantize_pt2e"
_QUANTIZE_STEP = ((_FOLD, "_fuse_conv_bn_"), (_FOLD, "_fuse_linear_bn_"),
                  (_FOLD, "_fuse_conv_bn_qat"))
_SERDE = (("executorch.exir.serde.serialize", "GraphModuleSerializer.serialize_lowered_module"),)
_VK = "executorch.backends.vulkan"
_XNN = "executorch.backends.xnnpack"
_VK_BUILDER = f"{_VK}.serialization.vulkan_graph_builder"
_XNN_VISITOR = f"{_XNN}.operators.node_visitor"

#: backend -> (module, attribute path) of every attribute its adapter replaces
PATCHED_BY: dict[str, tuple[tuple[str, str], ...]] = {
    "vulkan": (
        (f"{_VK}.partitioner.vulkan_partitioner", "VulkanPartitioner.partition"),
        (f"{_VK}.patterns", "get_all_fusable_subgraphs"),
        (f"{_VK}.patterns", "replace_all_fusable_subgraphs"),
        (_VK_BUILDER, "VkGraphBuilder.create_node_value"),
        (_VK_BUILDER, "VkGraphBuilder.get_or_create_scalar_value"),
        (_VK_BUILDER, "VkGraphBuilder.maybe_add_constant_tensor"),
        (_VK_BUILDER, "VkGraphBuilder.process_placeholder_node"),
        (f"{_VK}.serialization.vulkan_graph_serialize", "serialize_constant_tensors"),
        (f"{_VK}.vulkan_preprocess", "_transform"),
        (f"{_VK}.vulkan_preprocess", "apply_passes"),
        (f"{_VK}.vulkan_preprocess", "unsafe_remove_auto_functionalized_pass"),
        *_SERDE, *_QUANTIZE_STEP),
    "xnnpack": (
        (f"{_XNN}._passes", "XNNPACKPassManager.__init__"),
        (f"{_XNN}._passes", "XNNPACKPassManager.transform"),
        (f"{_XNN}._passes", "_transform"),
        (f"{_XNN}._passes.decompose_batch_norm", "DecomposeBatchNorm.can_decompose_batch_norm"),
        (_XNN_VISITOR, "NodeVisitor.convert_to_qc4w"),
        (_XNN_VISITOR, "NodeVisitor.get_quant_params"),
        (_XNN_VISITOR, "NodeVisitor.get_serialized_buffer_index"),
        (_XNN_VISITOR, "get_param_tensor"),
        (f"{_XNN}.operators.quant_params", "get_param_tensor"),
        (f"{_XNN}.partition.config.gemm_configs", "ConvolutionConfig.check_constraints"),
        (f"{_XNN}.partition.config.node_configs", "BatchNormConfig.check_constraints"),
        (f"{_XNN}.partition.xnnpack_partitioner", "XnnpackPartitioner.generate_partitions"),
        *_SERDE, *_QUANTIZE_STEP),
    "arm": (
        ("executorch.backends.arm._passes.arm_pass_manager", "ArmPassManager._transform"),
        ("executorch.backends.arm._passes.fold_scalar_mul_into_conv_pass",
         "FoldScalarMulIntoConvPass._set_get_attr_tensor"),
        *_QUANTIZE_STEP),
}


def resolve(module: Any, path: str) -> tuple[Any, str] | None:
    """``(owner, name)`` of ``module``'s attribute ``path`` (``"Class.method"`` or
    ``"function"``), or None when this version of the module has no such attribute."""
    *outer, name = path.split(".")
    owner = module
    for part in outer:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return (owner, name) if name in vars(owner) else None


class InstallTriggers:
    """Armed attributes; the first call of any of them runs ``install`` once."""

    def __init__(self, install: Callable[[], None]) -> None:
        self._install = install
        self._armed: list[tuple[Any, str, Any, Any]] = []  # owner, name, original, trigger
        self.fired = False
        #: the attribute whose call fired the triggers (``module.qualname``)
        self.fired_by: str | None = None
        self._lock = threading.RLock()

    def arm(self, owner: Any, name: str) -> bool:
        """Put a trigger in place of ``owner.name`` (a function, a static or class method);
        False when it is none of those or the triggers have fired."""
        with self._lock:
            original = vars(owner).get(name)
            if self.fired or original is None:
                return False
            kind: Any = type(original) if isinstance(original, (staticmethod, classmethod)) \
                else None
            function = original.__func__ if kind is not None else original
            if not callable(function):
                return False

            label = f"{getattr(function, '__module__', '?')}." \
                    f"{getattr(function, '__qualname__', name)}"

            @functools.wraps(function)
            def trigger(*args: Any, **kwargs: Any) -> Any:
                self.fire(label)
                now = vars(owner).get(name, original)
                if now is placed:  # nothing took the place back: the original it is
                    now = original
                call = now.__func__ if isinstance(now, (staticmethod, classmethod)) else now
                return call(*args, **kwargs)

            placed = kind(trigger) if kind is not None else trigger
            setattr(owner, name, placed)
            self._armed.append((owner, name, original, placed))
            return True

    def fire(self, by: str = "start-up") -> None:
        """Put every original back, then install (once; a caller of a trigger meanwhile
        waits for it)."""
        with self._lock:
            if self.fired:
                return
            self.fired = True
            self.fired_by = by
            self.disarm()
            self._install()

    def disarm(self) -> None:
        """Put every original back where its trigger still stands."""
        with self._lock:
            while self._armed:
                owner, name, original, placed = self._armed.pop()
                if vars(owner).get(name) is placed:
                    setattr(owner, name, original)

    @property
    def armed(self) -> int:
        return len(self._armed)
