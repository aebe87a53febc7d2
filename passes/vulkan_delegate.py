"""What fusionkit's core must know of ExecuTorch's Vulkan delegate, told it on import.

The core judges every op a replacement creates before the program changes
(:mod:`fusionkit.check.executable`); without a partitioner at hand it cannot know that
``et_vk.*`` exists only inside the Vulkan delegate (no CPU kernel by design), which module
registers those ops, or which other ops Vulkan's operator registry takes. That is Vulkan's
knowledge, so it lives here, not in the core: the Vulkan rules and the Vulkan adapter
import this module, and the ``fusionkit.delegates`` entry point (pyproject.toml) lets the
core find it when a user's own rule names ``et_vk`` ops with nothing but fusionkit imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fusionkit import register_delegate

#: the op namespace only the Vulkan delegate runs, and the module whose import registers it
NAMESPACES: dict[str, tuple[str, ...]] = {"et_vk": ("executorch.backends.vulkan.custom_ops_lib",)}


def supported_ops() -> Iterable[Any]:
    """The targets ExecuTorch's Vulkan operator registry lists (imported when first asked)."""
    from executorch.backends.vulkan.op_registry import vulkan_supported_ops

    return list(vulkan_supported_ops)


register_delegate("Vulkan", namespaces=NAMESPACES, supported_ops=supported_ops)

__all__ = ["NAMESPACES", "supported_ops"]
