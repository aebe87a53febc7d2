"""The one place fusionkit changes a program's graph signature.

Why in place: torch's ``ExportedProgram.graph_signature`` has no setter, and the
signature is shared. ExecuTorch's ``ExportedProgramPassManager`` runs passes on a
shallow copy of the program (``copy.copy``: the same graph module, the same signature
object), and a graph-module pass that holds the program (``FusePatternsPass`` in
``VulkanBackend.preprocess``) rewrites that program while ExecuTorch re-reads the
signature from the copy (``_get_updated_graph_signature``: "Number of inputs changed
after transformation" if a new constant's spec is missing there). Changing the spec
lists themselves (``input_specs`` and ``output_specs`` are public lists) keeps every
program that shares the graph module consistent with it; installing a new signature
object would leave the copy describing placeholders that are gone. Deep copies share
nothing, so nothing else is affected.

:func:`reattach` is the only write of the private attributes, for a rollback after
something replaced the objects behind the journal (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, InputSpec, OutputSpec

__all__ = ["insert_input", "reattach", "set_specs"]


def set_specs(ep: ExportedProgram, inputs: Sequence[InputSpec] | None = None,
              outputs: Sequence[OutputSpec] | None = None) -> None:
    """The program's input specs become ``inputs`` and its output specs ``outputs`` (None:
    unchanged), in the signature's own lists (see the module: they may be shared)."""
    sig = ep.graph_signature
    if inputs is not None:
        sig.input_specs[:] = list(inputs)
    if outputs is not None:
        sig.output_specs[:] = list(outputs)


def insert_input(ep: ExportedProgram, index: int, spec: InputSpec) -> None:
    """``spec`` inserted at ``index`` of the input specs (a new placeholder's), in place:
    the same as :func:`set_specs` without copying the list per new constant."""
    ep.graph_signature.input_specs.insert(index, spec)


def reattach(ep: ExportedProgram, graph_module: torch.fx.GraphModule,
             signature: ExportGraphSignature) -> None:
    """Make ``graph_module`` and ``signature`` the program's again (a rollback).

    fusionkit never replaces these objects; a rule's replacement or a hook that did
    would leave the journal restoring lists nobody reads. torch's properties have no
    setters, so this writes ``_graph_module`` / ``_graph_signature``, as ExecuTorch's
    own pass manager does; only when they differ.
    """
    if ep.graph_module is not graph_module:
        ep._graph_module = graph_module
    if ep.graph_signature is not signature:
        ep._graph_signature = signature
