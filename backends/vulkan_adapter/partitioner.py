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

import contextlib
from collections.abc import Iterator
from typing import Any

from executorch.backends.vulkan.partitioner.vulkan_partitioner import (
    VulkanPartitioner as _StockVulkanPartitioner,
)
from executorch.exir.backend.partitioner import PartitionResult
from torch.export import ExportedProgram

from fusionkit import op_key
from fusionkit.integration.adapter import ScopedPartitioner

from .boundary_dim_order import BoundaryDimOrder, partition_boundaries
from .install import ADAPTER, PATCHES
from .int_only_partitions import leave_int_only_partitions
from .missing_operators import missing_operator_blocklist, preprocess_pattern_ops
from .runtime_support import (
    KeptOff,
    RuntimeSupport,
    Unrunnable,
    data_movement_islands,
    keep_partitions_off,
    support_check_refusing,
)

#: VulkanBackend.preprocess runs under the takeover for this adapter's partitions only
PREPROCESS_SCOPE = ADAPTER.preprocess_scope

__all__ = ["PREPROCESS_SCOPE", "FusedOpNotDelegatedError", "KeptOff", "Unrunnable",
           "UnrunnableOpError", "VulkanPartitioner"]


class FusedOpNotDelegatedError(RuntimeError):
    """A node fused for Vulkan was left out of every Vulkan partition.

    ``et_vk.*`` ops have no kernel in ExecuTorch's CPU runtime, so such a program
    would fail when loaded; failing at lowering time says where and why.
    """


class UnrunnableOpError(RuntimeError):
    """A delegated node's op is one neither the probed Vulkan runtime nor ExecuTorch's CPU
    runtime has, and the Vulkan preprocess would not fuse it away: the program would be
    refused at load (``Missing operator: ...``). Raised by :meth:`VulkanPartitioner.partition`
    before the lowering changes the program; :attr:`nodes` holds one :class:`Unrunnable`
    per node, each naming the node, the op and why (the preprocess rules' declines)."""

    def __init__(self, nodes: list[Unrunnable]) -> None:
        self.nodes = nodes
        super().__init__(
            "the program cannot run on this Vulkan runtime, nor can these nodes run on the CPU "
            "instead: " + "; ".join(str(n) for n in nodes))


class VulkanPartitioner(ScopedPartitioner, _StockVulkanPartitioner):
    """ExecuTorch's VulkanPartitioner (same arguments), fusionkit's takeover scoped to it.

    After partitioning it verifies that every ``et_vk`` node that fusionkit's
    ``transform_passes()`` created was delegated (:class:`FusedOpNotDelegatedError`
    otherwise, e.g. when the op is in ``operator_blocklist``). What the probed real
    runtime would refuse is kept off the delegate (``runtime=``, see
    :meth:`_keep_off_missing`): an operator it lacks everywhere (:attr:`kept_off`, by
    op), and, node by node as it partitions, what :class:`~.runtime_support.RuntimeSupport`
    finds with ``check()``'s own facts (a shader variant it lacks, an argument it prepacks
    that is not a constant, a broken runtime condition, an op a preprocess fusion
    declines to remove): :attr:`kept_off_nodes`, one :class:`KeptOff` per node. A tensor
    crossing a partition's boundary in a non-contiguous dim order, which the runtime would
    copy in contiguous order, is converted inside the delegate (:mod:`.boundary_dim_order`):
    :attr:`boundary_dim_orders`.
    """

    fusionkit_adapter = ADAPTER

    def __init__(self, *args: Any, runtime: Any = "auto", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # the stock constructor, then the adapter's mark
        #: op name -> why it is kept off the delegate (the probed runtime lacks it)
        self.kept_off: dict[str, str] = {}
        #: the nodes of the last :meth:`partition` kept off, each with the runtime fact
        self.kept_off_nodes: list[KeptOff] = []
        #: the nodes of the last :meth:`partition` no runtime runs (:class:`UnrunnableOpError`)
        self._unrunnable: dict[str, Unrunnable] = {}
        #: the last :meth:`partition`'s boundary tensors whose dim order is not contiguous,
        #: converted inside the delegate by its preprocess (:mod:`.boundary_dim_order`)
        self.boundary_dim_orders: list[BoundaryDimOrder] = []
        self.runtime: Any = None
        self._keep_off_missing(runtime)

    def _keep_off_missing(self, runtime: Any) -> None:
        """Ops the real runtime lacks go to the CPU instead (``operator_blocklist``).

        ``runtime``: a :class:`~.runtime_probe.RuntimeInventory`, or "auto": the inventory
        of the runtime ``scripts/vulkan-runtime`` installed, when it was already probed
        (``python3 -m fusionkit.backends.vulkan_adapter.runtime_probe``); with none (or
        ``None``), what the installed wheel implies (:func:`~.wheel_inventory.wheel_inventory`:
        its shader templates, its registry less the ops whose shaders it lacks), so that
        every fact known without a probe steers the partition alike with or without a
        runtime; a probe only adds facts. Blocklisted here are the
        missing ops the CPU runtime can run that no preprocess removes: neither
        ``RemoveRedundantOpsTransform.redundant_ops`` nor an op a preprocess rule's
        pattern consumes (``dequantize_per_channel`` is fused into the weight-only
        kernels: whether a given node is, is decided per node in :meth:`partition`). Any
        other missing op stays, and ``check(program, runtime=...)`` reports it if it
        reaches the payload.
        """
        self.runtime, blocked = missing_operator_blocklist(runtime)
        for op, why in blocked.items():
            self.operator_blocklist.add(op)
            self.kept_off[getattr(op, "__name__", "")] = why

    def _texture_limits(self) -> Any:
        from executorch.backends.vulkan import utils as vk_utils

        options = self.options or {}
        if "texture_limits" in options:  # the precedence of the stock partition()
            return options["texture_limits"]
        if options.get("small_texture_limits", False):
            return vk_utils.SMALL_TEXTURE_LIMITS
        return vk_utils.DEFAULT_TEXTURE_LIMITS

    @contextlib.contextmanager
    def _runtime_aware(self, ep: ExportedProgram) -> Iterator[None]:
        """While the stock partition() runs, its per-node support check also asks the
        probed runtime (:class:`~.runtime_support.RuntimeSupport`)."""
        self.kept_off_nodes = []
        self._unrunnable = {}
        support = RuntimeSupport(self.runtime, self._texture_limits())
        support.prepare(ep, preprocess_pattern_ops())
        self._unrunnable = support.unrunnable
        with support_check_refusing(support.refusal) as kept:
            try:
                yield
            finally:
                self.kept_off_nodes = list(kept.values())

    def _partitioning(self, exported_program: ExportedProgram) -> contextlib.ExitStack[Any]:
        """The stock partition() runs with the adapter's patch set (the stock detectors out
        of the registry) and the runtime-aware support check."""
        with contextlib.ExitStack() as stack:  # undone at once if entering either fails
            stack.enter_context(PATCHES.install())
            stack.enter_context(self._runtime_aware(exported_program))
            return stack.pop_all()

    def _partitioned(self, result: PartitionResult) -> PartitionResult:
        """Islands undelegated, unrunnable nodes refused, every fused node delegated; then
        :meth:`~fusionkit.integration.adapter.ScopedPartitioner.partition` has the
        partitions preprocessed under the adapter's patch set."""
        self._undelegate_islands(result)
        self._undelegate_int_only(result)
        self._refuse_unrunnable(result)
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
        self.boundary_dim_orders = partition_boundaries(result.tagged_exported_program,
                                                        result.partition_tags)
        return result

    def _undelegate_islands(self, result: PartitionResult) -> None:
        """A partition that only moves data between nodes on the CPU is not delegated
        (:func:`~.runtime_support.data_movement_islands`): its nodes are untagged, each
        noted in :attr:`kept_off_nodes` (fact ``data_movement_only``)."""
        ep = result.tagged_exported_program
        for partition_nodes in keep_partitions_off(
                ep.graph_module, result.partition_tags,
                data_movement_islands(ep, result.partition_tags), "data_movement_only",
                lambda what: (f"its partition ({what}) only moves data, between values "
                              "computed on the CPU and read on the CPU: a delegate call would "
                              "copy them to the GPU and back for nothing: it runs on the CPU")):
            self.kept_off_nodes.extend(partition_nodes)

    def _undelegate_int_only(self, result: PartitionResult) -> None:
        """A partition giving the CPU ints only is not delegated
        (:mod:`.int_only_partitions`: ExecuTorch cannot lower it): its
        nodes are untagged, each noted in :attr:`kept_off_nodes` (fact ``int_only``)."""
        gm = result.tagged_exported_program.graph_module
        for partition_nodes in leave_int_only_partitions(gm, result.partition_tags):
            self.kept_off_nodes.extend(partition_nodes)

    def _refuse_unrunnable(self, result: PartitionResult) -> None:
        """:class:`UnrunnableOpError` when a delegated node is one no runtime runs (the
        tags are on ExecuTorch's copy of the program: nothing of the user's changed yet)."""
        bad = [u for n in result.tagged_exported_program.graph_module.graph.nodes
               if (u := self._unrunnable.get(n.name)) is not None
               and n.meta.get("delegation_tag") in result.partition_tags]
        if bad:
            raise UnrunnableOpError(bad)
