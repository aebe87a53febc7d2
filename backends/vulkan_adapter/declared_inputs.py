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
in and nothing reads it.
"""

from __future__ import annotations

import importlib
from typing import Any

from fusionkit.integration.hooks import PatchSet

__all__ = ["PATCHES", "process_placeholder_node"]

_BUILDER = "executorch.backends.vulkan.serialization.vulkan_graph_builder"
_UTILS = "executorch.backends.vulkan.utils"


def process_placeholder_node(self: Any, node: Any) -> None:
    """``VkGraphBuilder.process_placeholder_node`` declaring unused user inputs too."""
    utils = importlib.import_module(_UTILS)
    if len(node.users) == 0 and utils.is_param_node(self.program, node):
        return None  # an unused constant: nothing passes it
    ids = self.create_node_value(node)
    if not utils.is_param_node(self.program, node):
        if isinstance(ids, int):
            self.input_ids.append(ids)
        else:
            self.input_ids += ids
    return None


def _patches() -> list[tuple[Any, str, Any]]:
    builder = importlib.import_module(_BUILDER)
    return [(builder.VkGraphBuilder, "process_placeholder_node", process_placeholder_node)]


#: the Vulkan serializer declares every input the delegate call passes; part of the
#: adapter's takeover
PATCHES = PatchSet(f"fusionkit.backends.vulkan_adapter.declared_inputs ({_BUILDER}."
                   "VkGraphBuilder.process_placeholder_node)", _patches)
