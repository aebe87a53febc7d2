"""Rules on a graph module whose constants are ``get_attr`` nodes (the quantize step's form).

``prepare_pt2e`` works on ``torch.export.export(model).module()``: a ``GraphModule`` whose
parameters and buffers are ``get_attr`` nodes and whose only placeholders are the user's
inputs. The engine decides a match with an ``ExportedProgram`` at hand (which placeholder is
a constant, what tensor it holds). :func:`lift` gives one: a copy of the graph whose tensor
``get_attr`` nodes are placeholders with a ``PARAMETER`` / ``BUFFER`` input spec (the
tensors are shared, never copied); the rules find, decline and apply there as on any
program. :func:`write_back` puts the result into the graph module, in place: each constant
placeholder a ``get_attr`` again (the attributes the module had; a constant a rule created
is bound to a new attribute of the module's own, never written into one it had), the
module's code generation kept. Nothing is written back when nothing was applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch._export.verifier import TrainingIRVerifier
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.fx import Graph, GraphModule, Node

__all__ = ["Lifted", "lift", "write_back"]


@dataclass
class Lifted:
    """A graph module's graph as an ``ExportedProgram`` (:func:`lift`)."""

    gm: GraphModule
    ep: ExportedProgram
    #: the lifted placeholders' names -> the attribute each ``get_attr`` read
    attributes: dict[str, str]
    #: ``call_module`` nodes whose value nothing reads (export's ``_guards_fn``), left out
    #: of the lifted program (its verifier refuses call_module) and put back by write_back
    side_calls: list[Node]


def _attribute(gm: GraphModule, target: str) -> tuple[torch.Tensor | None, bool]:
    """The tensor at ``target`` and whether it is a registered parameter."""
    *path, name = target.split(".")
    try:
        owner = gm.get_submodule(".".join(path))
    except AttributeError:
        return None, False
    value = getattr(owner, name, None)
    if not isinstance(value, torch.Tensor):
        return None, False
    return value, name in owner._parameters


def lift(gm: GraphModule) -> Lifted:
    """``gm``'s graph, copied, as an ``ExportedProgram`` whose constants are placeholders.

    ``gm`` is not changed. Every ``get_attr`` of a tensor becomes a placeholder of the same
    name (before the user inputs, in graph order), a ``PARAMETER`` where the attribute is a
    registered parameter, a ``BUFFER`` otherwise; other ``get_attr`` nodes (submodules) and
    ``call_module`` nodes stay as they are.
    """
    graph = Graph()
    env: dict[Node, Node] = {}
    state: dict[str, torch.Tensor] = {}
    attributes: dict[str, str] = {}
    specs: list[InputSpec] = []
    for node in gm.graph.find_nodes(op="get_attr"):
        tensor, is_param = _attribute(gm, str(node.target))
        if tensor is None:
            continue
        target = str(node.target)
        ph = graph.create_node("placeholder", node.name, name=node.name)
        ph.meta = dict(node.meta)
        env[node] = ph
        state[target] = tensor
        attributes[ph.name] = target
        kind = InputKind.PARAMETER if is_param else InputKind.BUFFER
        specs.append(InputSpec(kind, TensorArgument(ph.name), target,
                               None if is_param else True))
    for node in gm.graph.find_nodes(op="placeholder"):
        env[node] = graph.node_copy(node, env.__getitem__)
        specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(env[node].name), None))
    side_calls: list[Node] = []
    for node in gm.graph.nodes:
        if node in env:
            continue
        if node.op == "call_module" and not node.users:
            side_calls.append(node)
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
    outputs = []
    for v in torch.utils._pytree.tree_leaves(graph.output_node().args[0]):
        arg = TensorArgument(v.name) if isinstance(v, Node) else ConstantArgument("", v)
        outputs.append(OutputSpec(OutputKind.USER_OUTPUT, arg, None))
    sig = ExportGraphSignature(specs, outputs)
    root = GraphModule(gm, graph)
    # (torch.export's training-IR verifier: the graph is the one export made, in-place
    # updates included -- a training batch norm's ``num_batches_tracked.add_(1)``)
    ep = ExportedProgram(root, graph, sig, state, {}, [], verifiers=[TrainingIRVerifier])
    return Lifted(gm, ep, attributes, side_calls)


def _fresh_attribute(gm: GraphModule, name: str) -> str:
    base = re.sub(r"\W", "_", name) or "_folded"
    unique, i = base, 0
    while hasattr(gm, unique):
        i += 1
        unique = f"{base}_{i}"
    return unique


def write_back(lifted: Lifted) -> None:
    """Put the lifted program's graph into the graph module, in place (see the module)."""
    gm, ep = lifted.gm, lifted.ep
    lifted_graph = ep.graph_module.graph
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    graph = Graph()
    env: dict[Node, Node] = {}
    placeholders = list(lifted_graph.find_nodes(op="placeholder"))
    for ph in placeholders:  # the constants: get_attr nodes, first, as export writes them
        spec = specs.get(ph.name)
        if spec is None or spec.kind == InputKind.USER_INPUT or not ph.users:
            continue
        target = lifted.attributes.get(ph.name)
        if target is None:  # a constant a rule created: an attribute of the module's own
            value = ep.constants.get(str(spec.target))
            if value is None:
                value = ep.state_dict.get(str(spec.target))
            assert isinstance(value, torch.Tensor), f"no tensor for `{ph.name}`"
            target = _fresh_attribute(gm, ph.name)
            gm.register_parameter(target, torch.nn.Parameter(value.detach(),
                                                             requires_grad=False))
        node = graph.create_node("get_attr", target, name=ph.name)
        node.meta = dict(ph.meta)
        env[ph] = node
    for node in lifted_graph.nodes:
        if node in env:
            continue
        if node.op == "placeholder" and specs.get(node.name) is not None \
                and specs[node.name].kind != InputKind.USER_INPUT:
            continue  # an unused constant
        env[node] = graph.node_copy(node, env.__getitem__)
    by_name = {n.name: n for n in graph.nodes}
    first_op = next((n for n in graph.nodes if n.op not in ("placeholder", "get_attr")), None)
    for call in lifted.side_calls:  # back where export put them: after the inputs
        if first_op is None:
            break
        with graph.inserting_before(first_op):
            graph.node_copy(call, lambda a: by_name[a.name])
    graph._codegen = gm.graph._codegen
    gm.graph = graph
    gm.recompile()
