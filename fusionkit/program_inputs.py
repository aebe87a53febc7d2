"""Constant access shared by every rule and backend: what a placeholder *is*.

Only the ExportedProgram's graph signature can tell a parameter, a buffer or a
lifted tensor constant from a user input: in the graph they all look like
placeholders. This module answers that question once per program.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec

from fusionkit.targets import is_python_operator, schema_of, writes_to

__all__ = ["ConstantKind", "ConstantRef", "ProgramInputs"]


class ConstantKind(enum.Enum):
    PARAMETER = "parameter"
    BUFFER = "buffer"
    LIFTED_CONSTANT = "lifted constant"


@dataclass(frozen=True)
class ConstantRef:
    """A placeholder that the program binds to a fixed tensor."""

    node_name: str
    kind: ConstantKind
    target: str  # key in state_dict / constants
    tensor: torch.Tensor


class ProgramInputs:
    """Index of a program's placeholders by what the signature says they are."""

    def __init__(self, ep: ExportedProgram) -> None:
        self._ep = ep
        sig = ep.graph_signature
        self._spec = {
            spec.arg.name: spec for spec in sig.input_specs if hasattr(spec.arg, "name")
        }
        self._mutated = set(sig.buffers_to_mutate.values()) if sig.buffers_to_mutate else set()

    def add_spec(self, spec: InputSpec) -> None:
        """Index an input spec the caller just added to the signature (no rebuild)."""
        self._spec[spec.arg.name] = spec

    def kind_of(self, node: torch.fx.Node) -> InputKind | None:
        if node.op != "placeholder":
            return None
        spec = self._spec.get(node.name)
        return spec.kind if spec is not None else None

    def is_user_input(self, node: torch.fx.Node) -> bool:
        return self.kind_of(node) == InputKind.USER_INPUT

    def is_mutable_buffer(self, node: torch.fx.Node) -> bool:
        spec = self._spec.get(node.name)
        return (
            spec is not None
            and spec.kind == InputKind.BUFFER
            and spec.target in self._mutated
        )

    def is_written(self, node: torch.fx.Node) -> bool:
        """Whether the program writes this placeholder: a mutated buffer or user input, or
        one an in-place op takes (a call with no schema is assumed to write it)."""
        if node.op != "placeholder":
            return False
        if self.is_mutable_buffer(node):
            return True
        if node.name in self._ep.graph_signature.user_inputs_to_mutate.values():
            return True
        return any(writes_to(u, (node,)) or (
            u.op == "call_function" and schema_of(u.target) is None
            and not is_python_operator(u.target))
            for u in node.users)

    def constant(self, node: torch.fx.Node) -> ConstantRef | None:
        """The constant a placeholder stands for; None for inputs and mutable buffers."""
        if node.op != "placeholder":
            return None
        spec = self._spec.get(node.name)
        if spec is None or spec.target is None:
            return None
        ep = self._ep
        if spec.kind == InputKind.PARAMETER:
            kind, tensor = ConstantKind.PARAMETER, ep.state_dict.get(spec.target)
        elif spec.kind == InputKind.BUFFER:
            if spec.target in self._mutated:
                return None
            source = ep.state_dict if spec.persistent is not False else ep.constants
            tensor = source.get(spec.target)
            if tensor is None:
                tensor = ep.constants.get(spec.target)
            kind = ConstantKind.BUFFER
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            kind, tensor = ConstantKind.LIFTED_CONSTANT, ep.constants.get(spec.target)
        else:
            return None
        if not isinstance(tensor, torch.Tensor):
            return None
        return ConstantRef(node.name, kind, spec.target, tensor)

    def describe(self, node: torch.fx.Node) -> str:
        """Short phrase for messages: 'a parameter', 'a user input', 'computed by aten.add.Tensor'."""
        from fusionkit.targets import op_key

        if node.op == "placeholder":
            ref = self.constant(node)
            if ref is not None:
                return f"a {ref.kind.value}"
            if self.is_mutable_buffer(node):
                return "a mutable buffer"
            kind = self.kind_of(node)
            return "a user input" if kind == InputKind.USER_INPUT else f"an input ({kind})"
        if node.op == "call_function":
            return f"computed in the graph ({op_key(node.target) or node.target})"
        return f"a {node.op} node"
