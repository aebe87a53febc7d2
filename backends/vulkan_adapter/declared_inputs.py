"""Every input the delegate call passes is an input the Vulkan graph declares.

ExecuTorch 1.5.1's ``VkGraphBuilder.process_placeholder_node`` skips a placeholder with
no users ("ignores any tensors that don't get used in any ops"). The delegate call is made
from the partition's inputs before preprocess runs, and preprocess can leave an input
unused: ``RemoveRedundantOpsTransform`` turns ``aten.copy.default(dst, src)`` into
``src`` (``export_llm``'s local/global attention writes its cache positions that way),
``RemoveAssertsTransform`` drops the only reader of an int. The serialized graph then
declares fewer inputs than the call passes, and the runtime aborts at the first call
(``VulkanBackend::execute``: ``args.size() == num_inputs + num_outputs``) — stock's
programs too: ``return aten.copy(z, w * 2) + 1`` lowers to one.

Here a user input (not a parameter, buffer or constant of the delegate) with no users is
still given its value and declared, in its place among the inputs: the runtime copies it
in and nothing reads it. An int input (a size another partition computed, whose value
the partition's program holds as a Python int) is declared as a SymInt, as the runtime
receives it; stock's builder raises on it (``Cannot create value for node sym_size with
spec of type <class 'int'>``) when a partition boundary falls after a size.
"""

from __future__ import annotations

import importlib
from typing import Any

from fusionkit.integration.hooks import PatchSet

__all__ = ["PATCHES", "create_node_value", "process_placeholder_node"]

_BUILDER = "executorch.backends.vulkan.serialization.vulkan_graph_builder"
_UTILS = "executorch.backends.vulkan.utils"


def process_placeholder_node(self: Any, node: Any) -> None:
    """``VkGraphBuilder.process_placeholder_node`` declaring every user input: unused ones
    and ints too."""
    utils = importlib.import_module(_UTILS)
    if utils.is_param_node(self.program, node):
        if node.users:
            self.create_node_value(node)
        return None  # a constant: nothing passes it
    ids = self.create_node_value(node)
    if isinstance(ids, int):
        self.input_ids.append(ids)
    else:
        self.input_ids += ids
    return None


def create_node_value(self: Any, node: Any) -> Any:
    """``VkGraphBuilder.create_node_value``, with an input or an op whose result the partition's
    program holds as a Python int (``sym_size`` of a dimension that is static there: a
    partition boundary after an op kept on the CPU can make it so) given a SymInt, as for a
    symbolic one: the op writes its int there when it runs. Stock raises ``Cannot create
    value for node sym_size with spec of type <class 'int'>``."""
    value = node.meta.get("val")
    # a placeholder: an int another partition computed (the call passes it as an Int)
    if (isinstance(value, int) and not isinstance(value, bool)
            and (node.op == "placeholder" or (node.op == "call_function"
                                              and isinstance(node.meta.get("spec"), int)))):
        new_id = self.create_symint_value()
        self.node_to_value_ids[node] = new_id
        return new_id
    stock = PATCHES.original(importlib.import_module(_BUILDER).VkGraphBuilder,
                             "create_node_value")
    return stock(self, node)


def _patches() -> list[tuple[Any, str, Any]]:
    builder = importlib.import_module(_BUILDER)
    return [(builder.VkGraphBuilder, "process_placeholder_node", process_placeholder_node),
            (builder.VkGraphBuilder, "create_node_value", create_node_value)]


#: the Vulkan serializer declares every input the delegate call passes; part of the
#: adapter's takeover
PATCHES = PatchSet(f"fusionkit.backends.vulkan_adapter.declared_inputs ({_BUILDER}."
                   "VkGraphBuilder.process_placeholder_node, create_node_value)", _patches)
