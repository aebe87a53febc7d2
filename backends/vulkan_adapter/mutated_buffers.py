"""A mutated buffer the Vulkan delegate cannot write back stays with the CPU program.

ExecuTorch 1.5.1's ``VulkanPartitioner`` ends with ``tag_mutated_buffer``: every mutated
buffer whose users are delegated moves into the delegate. The Vulkan serializer then
leaves the buffer's new value out of the delegate's outputs only when that value *is* the
buffer (``is_mutable_buffer_node``): true of an in-place custom op once preprocess
re-inplaces it (``auto_functionalized`` → the op itself: the KV caches of
``update_cache`` / ``sdpa_with_kv_cache``), false of a plain ``buffer.copy_(new)``, whose
new value is another node. That value is then serialized as one more graph output that
the delegate call does not supply, and the runtime aborts at the first call
(``VulkanBackend::execute: args.size() == num_inputs + num_outputs``) — LFM2's short-conv
state through ``export_llm``, stock and with fusionkit alike. (The opt-in
``alias_buffer_mutations`` compile option fails earlier for the same graph: "Cannot alias a
buffer mutation before its input is serialized".)

Here such a buffer is left out of the partition: the delegate reads it as an input and
returns its new value as an ordinary output, and ExecuTorch's program writes it back, as
for any CPU buffer. Buffers written in place by a re-inplaced op keep stock's placement.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from fusionkit import events

__all__ = ["KeptBuffer", "keep_cpu_read_updates_on_cpu", "keep_unwritable_buffers_on_cpu",
           "partition_keeping_buffers"]


@dataclass(frozen=True)
class KeptBuffer:
    """A mutated buffer kept out of a Vulkan partition, and why."""

    placeholder: str
    buffer: str
    written_from: str
    #: why, when not the write-back's extra output (the default reason)
    why: str = ""

    @property
    def reason(self) -> str:
        if self.why:
            return self.why
        return (f"buffer `{self.buffer}` is written back from `{self.written_from}`, which the "
                "Vulkan serializer would declare as a delegate output the call does not "
                "supply (the runtime aborts at execute): kept on the CPU, written back there")


def _written_in_place(value: Node) -> bool:
    """Whether Vulkan's preprocess turns the write into the op's own in-place update
    (``getitem`` of ``auto_functionalized``: re-inplaced, the value becomes the buffer)."""
    if value.op != "call_function" or value.target is not operator.getitem:
        return False
    source = value.args[0]
    return isinstance(source, Node) and _is_in_place_update(source)


def keep_unwritable_buffers_on_cpu(exported_program: Any) -> list[KeptBuffer]:
    """Untag every mutated buffer the delegate would write through an extra output."""
    sig = exported_program.graph_signature
    graph = exported_program.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    written: dict[str, Any] = {}
    for spec, value in zip(sig.output_specs, output.args[0], strict=False):
        if spec.kind.name == "BUFFER_MUTATION" and spec.target is not None:
            written[spec.target] = value
    kept: list[KeptBuffer] = []
    for node in graph.nodes:
        if node.op != "placeholder" or "delegation_tag" not in node.meta:
            continue
        buffer = sig.inputs_to_buffers.get(node.name)
        value = written.get(buffer) if buffer is not None else None
        if not isinstance(value, Node) or value is node or _written_in_place(value):
            continue
        del node.meta["delegation_tag"]
        kept.append(KeptBuffer(node.name, str(buffer), value.name))
    return kept


def _is_in_place_update(node: Node) -> bool:
    """An ``auto_functionalized`` call (an in-place custom op, e.g. ``llama.update_cache``)."""
    name = getattr(node.target, "__name__", "")
    return node.op == "call_function" and name.startswith("auto_functionalized")


def keep_cpu_read_updates_on_cpu(exported_program: Any, partition_tags: Any
                                 ) -> list[KeptBuffer]:
    """Untag each delegated in-place update whose new value only the CPU program reads
    (with its ``getitem`` results and the buffers it writes).

    Why: ExecuTorch's ``_unsafe_adjust_original_program`` takes a delegated update's
    results as the delegate's own (its buffer mutation) and erases them from the program,
    and fails when a CPU node still reads one (``Tried to erase Node getitem_5 but it still
    had 1 users``: ``export_llm``'s ``model.quantize_kv_cache=True``, whose quantized sdpa
    runs on the CPU and reads the cache scales the delegated ``update_cache`` wrote). On
    the CPU the update runs with its own kernel, as the sdpa reading it does. An update
    whose results the partition itself also reads stays (untagging it would split the
    partition)."""
    graph = exported_program.graph
    sig = exported_program.graph_signature
    kept: list[KeptBuffer] = []
    for node in list(graph.nodes):
        tag = node.meta.get("delegation_tag")
        if tag not in partition_tags or not _is_in_place_update(node):
            continue
        results = [u for u in node.users if u.op == "call_function"
                   and u.target is operator.getitem]
        readers = [r for g in results for r in g.users if r.op != "output"]
        if not readers or any(r.meta.get("delegation_tag") == tag for r in readers):
            continue
        bases = [b for b in node.kwargs.get("_all_bases", []) if isinstance(b, Node)]
        for n in (node, *results, *[b for b in bases if b.op == "placeholder"]):
            n.meta.pop("delegation_tag", None)
        for b in bases:
            buffer = sig.inputs_to_buffers.get(b.name, b.name)
            kept.append(KeptBuffer(
                b.name, str(buffer), node.name,
                f"buffer `{buffer}` is updated in place by `{node.name}`, whose new value "
                f"{', '.join(f'`{r.name}`' for r in readers)} on the CPU read(s): ExecuTorch "
                "cannot leave a delegated update's result to the CPU program; the update "
                "runs on the CPU"))
    return kept


_LOG = logging.getLogger(__name__)

#: what the last partitions kept on the CPU (for reports and tests), newest last
KEPT: list[KeptBuffer] = []


def partition_keeping_buffers(stock_partition: Callable[..., Any]) -> Callable[..., Any]:
    """``VulkanPartitioner.partition``, then :func:`keep_cpu_read_updates_on_cpu` and
    :func:`keep_unwritable_buffers_on_cpu`."""

    @functools.wraps(stock_partition)
    def partition(self: Any, exported_program: Any) -> Any:
        result = stock_partition(self, exported_program)
        ep = result.tagged_exported_program
        kept = [*keep_cpu_read_updates_on_cpu(ep, result.partition_tags),
                *keep_unwritable_buffers_on_cpu(ep)]
        for k in kept:
            _LOG.info("fusionkit: %s", k.reason)
            events.placed("vulkan", f"kept on the CPU: buffer {k.buffer}", k.reason)
        KEPT.extend(kept)
        return result

    return partition
