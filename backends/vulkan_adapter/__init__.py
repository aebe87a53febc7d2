"""Vulkan adapter: fusionkit's fusions for ExecuTorch's Vulkan backend, drop-in.

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes, check
    prog = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()])
    assert check(prog) == []

The adapter itself is thin:

* :mod:`.rules` — :func:`transform_passes`, fresh fusion passes for
  ``to_edge_transform_and_lower`` from the ``"vulkan"`` rule set
  (``fusionkit.passes.rule_set("vulkan")``);
* :mod:`.partitioner` — :class:`VulkanPartitioner`, ExecuTorch's (same arguments),
  which verifies that every fused node it is given is delegated;
* :func:`rule_sets`, :func:`execution_target`, :func:`oracle`, :func:`takeover_points`
  and the install trio make the module a :class:`fusionkit.BackendAdapter`;
* :mod:`.install` — :data:`PATCHES`, the adapter's one patch set (the reversible takeover
  of the stock patterns fusionkit reimplements, :mod:`.constant_serializer`, the
  preprocess rules and pass gates); :func:`install` / :func:`uninstall` /
  :func:`is_installed` are its methods.

Reading lowered programs lives in :mod:`.inspect`, imported only when used:
:func:`check` (what the runtime would abort on, :class:`Problem`), :func:`simulate`
(run a lowered program from its payloads), :func:`decode_payload`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fusionkit import Delegate, ExecutionTarget, Rule
from fusionkit.integration.adapter import Oracle
from fusionkit.integration.hooks import TESTED_EXECUTORCH
from fusionkit.passes import vulkan_delegate  # noqa: F401  (tells the core of et_vk, on import)

from .install import (
    PATCHES,
    TAKEN_OVER_PATTERNS,
    Installation,
    UnsupportedExecuTorchError,
    install,
    is_installed,
    uninstall,
)
from .partitioner import FusedOpNotDelegatedError, UnrunnableOpError, VulkanPartitioner
from .rules import transform_passes

#: names served from the inspect subpackage, imported on first use
_INSPECT: dict[str, str] = {
    "PREPACKED_ARGS": "prepack_check",
    "PrepackedArg": "prepack_check",
    "Problem": "prepack_check",
    "check": "prepack_check",
    "PayloadError": "payload",
    "VulkanPayload": "payload",
    "decode_payload": "payload",
    "simulate": "simulator",
}


def __getattr__(name: str) -> Any:
    module = _INSPECT.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.inspect.{module}"), name)
    globals()[name] = value
    return value


#: ETRecord delegate maps holding node positions, not debug handles: ExecuTorch 1.5.1's
#: ``VkGraphBuilder.process_node`` overwrites each node's ``debug_handle`` with its position
#: in the delegate's graph before mapping it (a number that may be an unrelated node's
#: handle), so :func:`fusionkit.integration.devtools.attribute_fusions` leaves them alone
POSITIONAL_DELEGATE_MAPS = frozenset({"VulkanBackend"})

def rule_sets() -> dict[str, list[Rule]]:
    """The adapter's rules (:class:`fusionkit.BackendAdapter`): the transform passes' and
    the ``FusePatternsPass`` stand-in's, and those run in place of preprocess passes."""
    from fusionkit.passes import rule_set

    return {name: rule_set(name) for name in ("vulkan", "vulkan_preprocess")}


def execution_target() -> ExecutionTarget:
    """What the Vulkan runtime cannot execute: a fused node that breaks one of its
    conditions (the simulator's own, read from the runtime's sources)."""
    from .delegation import runtime_condition_broken

    return ExecutionTarget([Delegate("Vulkan", runtime_condition_broken,
                                     frozenset({"et_vk"}))])


def oracle() -> Oracle:
    """The Vulkan payloads run on the CPU (:func:`simulate`), outputs flattened."""
    def run(program: Any, inputs: tuple[Any, ...]) -> list[Any]:
        import torch

        return list(torch.utils._pytree.tree_leaves(simulate(program, *inputs)))

    return run


def takeover_points() -> dict[str, str]:
    """Stock patterns and preprocess passes replaced while installed -> the rules' factory."""
    from .preprocess_rules import TAKEN_OVER_PASSES

    return {**TAKEN_OVER_PATTERNS, **TAKEN_OVER_PASSES}


if TYPE_CHECKING:
    from .inspect.payload import PayloadError as PayloadError
    from .inspect.payload import VulkanPayload as VulkanPayload
    from .inspect.payload import decode_payload as decode_payload
    from .inspect.prepack_check import PREPACKED_ARGS as PREPACKED_ARGS
    from .inspect.prepack_check import PrepackedArg as PrepackedArg
    from .inspect.prepack_check import Problem as Problem
    from .inspect.prepack_check import check as check
    from .inspect.simulator import simulate as simulate

__all__ = [
    "PATCHES",
    "POSITIONAL_DELEGATE_MAPS",
    "PREPACKED_ARGS",
    "TAKEN_OVER_PATTERNS",
    "TESTED_EXECUTORCH",
    "FusedOpNotDelegatedError",
    "Installation",
    "PayloadError",
    "PrepackedArg",
    "Problem",
    "UnrunnableOpError",
    "UnsupportedExecuTorchError",
    "VulkanPartitioner",
    "VulkanPayload",
    "check",
    "decode_payload",
    "execution_target",
    "install",
    "is_installed",
    "oracle",
    "rule_sets",
    "simulate",
    "takeover_points",
    "transform_passes",
    "uninstall",
]
