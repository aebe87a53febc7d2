"""Quantize / dequantize nodes at a delegate boundary that XNNPACK would not serialize.

Why: ExecuTorch 1.5.1's XNNPACK partitioner marks the q/dq nodes around a quantized op as
*implicit* (``IS_IMPLICIT_Q_DQ_TAG``: the op reads the int8 tensor before the dq, or writes
the one after the q, so the node itself is not serialized) while it *evaluates* the op
(``GEMMConfig.get_deps``, ``GenericNodePartitionerConfig.get_node_and_deps``), before it
knows whether the op is taken: a convolution left on the CPU (its output feeds a batch norm
instead of a quantize, its weight is computed, ...) leaves its activation's dq, and its
output's q, marked. The q/dq pair is then delegated on its own (``QuantizedPerTensorConfig``,
``DeQuantizedPerTensorConfig``), and in ``XnnpackBackend.preprocess``:

- a marked **dq whose value leaves the delegate** is skipped (``OpDeQuantizePerTensor``): the
  delegate output gets no XNNPACK value (the payload's ``output_ids`` is empty), the runtime
  never writes it, and the CPU op reads whatever the planned memory held -- zeros on a first
  run, a wrong program with no error (a conv2d + batch norm whose weight is a graph input:
  1.96 off, ``tests/test_xnnpack_delegate_boundary.py``);
- a marked **q reading a delegate input** (a float tensor from the CPU) is skipped too: the
  int8 tensor the dq after it reads is never computed (XNNPACK's compile fails, or garbage).

What: the program ``XNNPACKPassManager`` is given (the first step of the preprocess, before
any XNNPACK pass reads the marks) loses the stale marks (:func:`clear_stale_marks`): a dq
read by the delegate's output is unmarked (or, when a node inside reads it too, the output
gets an unmarked copy of it), a q reading a user input is unmarked; each is then one
``XNNConvert`` and the delegate computes what the program says. Nothing changes outside the
delegate. A mark whose op is in the delegate is kept (the op reads / writes the int8
tensor). Why not a partition condition keeping the pair off the delegate: the pair is
XNNPACK's to compute; only the partitioner's bookkeeping is wrong.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from fusionkit.integration.hooks import PatchSet

__all__ = ["PATCHES", "StaleMark", "clear_stale_marks", "stale_marks"]

_PASSES_MODULE = "executorch.backends.xnnpack._passes"


@dataclass(frozen=True)
class StaleMark:
    """A q/dq node marked implicit whose quantized op is not in the delegate."""

    #: "dq read by the delegate's output" | "q of a delegate input"
    kind: str
    #: the node's name in the delegate's program
    name: str


def _user_input(ep: Any, node: Node) -> bool:
    from torch.export.graph_signature import InputKind

    if node.op != "placeholder":
        return False
    return any(s.kind == InputKind.USER_INPUT and getattr(s.arg, "name", None) == node.name
               for s in ep.graph_signature.input_specs)


def stale_marks(ep: Any) -> list[StaleMark]:
    """In a delegate's program (what ``XnnpackBackend.preprocess`` is given): the q/dq nodes
    marked implicit that XNNPACK must compute after all."""
    from executorch.backends.xnnpack.utils.quant_utils import (
        is_dequant,
        is_quant,
        is_tagged_as_implicit_q_dq,
    )

    found: list[StaleMark] = []
    for n in ep.graph_module.graph.nodes:
        if n.op != "call_function" or not is_tagged_as_implicit_q_dq(n):
            continue
        if is_dequant(n) and any(u.op == "output" for u in n.users):
            found.append(StaleMark("dq read by the delegate's output", n.name))
        elif (is_quant(n) and isinstance(n.args[0], Node) and _user_input(ep, n.args[0])):
            found.append(StaleMark("q of a delegate input", n.name))
    return found


def clear_stale_marks(ep: Any) -> list[StaleMark]:
    """Unmark the stale q/dq nodes of ``ep`` (in place; see the module doc); what was done."""
    from executorch.backends.xnnpack.utils.quant_utils import IS_IMPLICIT_Q_DQ_TAG
    from torch.export.graph_signature import OutputSpec, TensorArgument

    found = stale_marks(ep)
    if not found:
        return found
    graph = ep.graph_module.graph
    by_name = {n.name: n for n in graph.nodes}
    out_node = graph.output_node()
    for mark in found:
        node = by_name[mark.name]
        inside = [u for u in node.users if u.op != "output"]
        if mark.kind.startswith("q") or not inside:
            node.meta.pop(IS_IMPLICIT_Q_DQ_TAG, None)
            continue
        # read inside as int8 (marked) and by the output as float: an unmarked copy for the output
        with graph.inserting_after(node):
            copy = graph.call_function(node.target, node.args, node.kwargs)
        copy.meta = {k: v for k, v in node.meta.items() if k != IS_IMPLICIT_Q_DQ_TAG}
        out_node.replace_input_with(node, copy)
        specs = ep.graph_signature.output_specs
        for i, spec in enumerate(specs):
            if getattr(spec.arg, "name", None) == node.name:
                specs[i] = OutputSpec(spec.kind, TensorArgument(name=copy.name), spec.target)
    graph.lint()
    ep.graph_module.recompile()
    return found


def _pass_manager_init(self: Any, exported_program: Any, *args: Any, **kwargs: Any) -> None:
    module = importlib.import_module(_PASSES_MODULE)
    original = PATCHES.original(module.XNNPACKPassManager, "__init__")
    clear_stale_marks(exported_program)
    original(self, exported_program, *args, **kwargs)


def _patches() -> list[tuple[Any, str, Any]]:
    module = importlib.import_module(_PASSES_MODULE)
    return [(module.XNNPACKPassManager, "__init__", _pass_manager_init)]


#: ``XNNPACKPassManager`` (the first step of ``XnnpackBackend.preprocess``) begins with
#: :func:`clear_stale_marks`; part of the adapter's patch set
PATCHES = PatchSet(f"fusionkit.backends.xnnpack_adapter.boundary_qdq ({_PASSES_MODULE}."
                   "XNNPACKPassManager.__init__ after clear_stale_marks)", _patches)
