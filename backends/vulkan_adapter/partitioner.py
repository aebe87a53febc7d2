"""The adapter's VulkanPartitioner: ExecuTorch's, checked against fusionkit's fused nodes.

Use::

    from fusionkit.backends.vulkan_adapter import VulkanPartitioner, transform_passes
    prog = to_edge_transform_and_lower(ep, transform_passes=transform_passes(),
                                       partitioner=[VulkanPartitioner()])

Fusion happens in ``transform_passes()`` (fusionkit rules, every match decided
with its constraints, declined ones left alone). The partitioner is ExecuTorch's
own, with the same constructor, and changes nothing outside the lowering it is
part of: while it partitions, the stock detectors fusionkit reimplements are out
of ExecuTorch's pattern registry (they would mark nodes "fusable", skipping the
partitioner's support checks), and its partitions carry a marker compile spec so
that ``VulkanBackend.preprocess`` runs with fusionkit's takeover for those
partitions only (:class:`~fusionkit.integration.scoped.PreprocessScope`). A stock
``VulkanPartitioner`` in the same process is unaffected; a process-wide takeover
happens only through an explicit :func:`~.install.install`.
"""

from __future__ import annotations

import functools
from typing import Any

from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
    VulkanPartitioner as _StockVulkanPartitioner,
)
from executorch.exir.backend.partitioner import PartitionResult
from torch.export import ExportedProgram

from fusionkit import op_key
from fusionkit.integration.scoped import PreprocessScope

from .install import PATCHES

#: VulkanBackend.preprocess runs under the takeover for this adapter's partitions only
PREPROCESS_SCOPE = PreprocessScope("executorch.backends.vulkan.vulkan_preprocess",
                                   "VulkanBackend", b"vulkan", PATCHES)

__all__ = ["PREPROCESS_SCOPE", "FusedOpNotDelegatedError", "VulkanPartitioner"]


class FusedOpNotDelegatedError(RuntimeError):
    """A node fused for Vulkan was left out of every Vulkan partition.

    ``et_vk.*`` ops have no kernel in ExecuTorch's CPU runtime, so such a program
    would fail when loaded; failing at lowering time says where and why.
    """


class VulkanPartitioner(_StockVulkanPartitioner):
    """ExecuTorch's VulkanPartitioner (same arguments), fusionkit's takeover scoped to it.

    After partitioning it verifies that every ``et_vk`` node that fusionkit's
    ``transform_passes()`` created was delegated (:class:`FusedOpNotDelegatedError`
    otherwise, e.g. when the op is in ``operator_blocklist``). Ops the probed real
    runtime lacks are kept off the delegate, each with its reason in :attr:`kept_off`
    (``runtime=``, see :meth:`_keep_off_missing`).
    """

    def __init__(self, *args: Any, runtime: Any = "auto", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        PREPROCESS_SCOPE.mark(self.delegation_spec)
        #: op name -> why it is kept off the delegate (the probed runtime lacks it)
        self.kept_off: dict[str, str] = {}
        self._keep_off_missing(runtime)

    def _keep_off_missing(self, runtime: Any) -> None:
        """Ops the real runtime lacks go to the CPU instead (``operator_blocklist``).

        ``runtime``: a :class:`~.runtime_probe.RuntimeInventory`, None (trust the 1.5.1
        registry), or "auto": the inventory of the runtime ``scripts/vulkan-runtime``
        installed, when it was already probed (``python3 -m
        fusionkit.backends.vulkan_adapter.runtime_probe``). Kept off are the missing ops
        the CPU runtime can run and the Vulkan preprocess does not remove itself
        (``RemoveRedundantOpsTransform.redundant_ops``); any other missing op stays, and
        ``check(program, runtime=...)`` reports it if it reaches the payload.
        """
        if isinstance(runtime, str):
            from .runtime_probe import cached_inventory

            runtime = cached_inventory()
        if runtime is None:
            return
        from executorch.backends.vulkan._passes.remove_redundant_ops import (
            RemoveRedundantOpsTransform,
        )
        from executorch.backends.vulkan.op_registry import vulkan_supported_ops
        from executorch.extension.pybindings.portable_lib import _get_operator_names

        cpu = {n.split(".")[0] for n in _get_operator_names()}  # "aten::logical_not"
        removed = RemoveRedundantOpsTransform.redundant_ops
        for op in vulkan_supported_ops:
            name = getattr(op, "__name__", "")
            if runtime.has_operator(name) or op in removed:
                continue
            ns, _, rest = name.partition(".")
            if f"{ns}::{rest.split('.')[0]}" not in cpu:
                continue
            self.operator_blocklist.add(op)
            self.kept_off[name] = (f"the Vulkan runtime (probed, library sha256 "
                                   f"{runtime.library_sha256[:12]}) has no {name}: it runs on "
                                   "the CPU")

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        with PATCHES.install():
            result = super().partition(exported_program)
        stranded = [
            n for n in result.tagged_exported_program.graph_module.graph.nodes
            if n.op == "call_function" and "fusionkit_rule" in n.meta
            and (op_key(n.target) or "").startswith("et_vk.")
            and n.meta.get("delegation_tag") not in result.partition_tags
        ]
        if stranded:
            names = ", ".join(f"`{n.name}` ({op_key(n.target)})" for n in stranded)
            raise FusedOpNotDelegatedError(
                f"{names} created by fusionkit's Vulkan transform_passes() "
                "(rule {0!r}) was not delegated to Vulkan by this partitioner "
                "(operator_blocklist/allowlist, nn_module lists, texture or buffer limits?); "
                "et_vk ops have no CPU kernel, so the program could not be loaded. Give this "
                "partitioner to transform_passes(partitioner=...) so that fusions it would "
                "refuse are not made."
                .format(stranded[0].meta["fusionkit_rule"])
            )
        PREPROCESS_SCOPE.expect(len(result.partition_tags))
        return result


# the same signature and docs as ExecuTorch's constructor (inspect.signature follows __wrapped__)
functools.update_wrapper(VulkanPartitioner.__init__, _StockVulkanPartitioner.__init__)
