"""What the verifier must be told of a backend: the node metadata its replacements use to
say what a node computes, the ops whose CPU reference is not what the kernel computes, the
context its ops run in, the form its pipeline gives a program where a rule runs and what a
node means there, and how to make the operands a backend's checks ask for
(:class:`OperandHint`, drawn jointly when a check relates several captures: a group size
that tiles a dimension).

Backends register these (their own code, so the core names no backend); the registries are
plain dicts, light to import, read by :mod:`fusionkit.authoring.verify`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORM_NAMESPACES",
    "KERNEL_REFERENCES",
    "METADATA_SEMANTICS",
    "MODULE_SCOPES",
    "NODE_SEMANTICS",
    "NODE_SEMANTICS_CHECKS",
    "OPERAND_HINTS",
    "OP_CONTEXTS",
    "PROGRAM_FORMS",
    "REFERENCE_IS_NOT_THE_KERNEL",
    "OperandHint",
    "Pick",
    "register_kernel_reference",
    "register_metadata_semantics",
    "register_module_scope",
    "register_node_semantics",
    "register_op_context",
    "register_operand_hints",
    "register_program_form",
    "register_reference_caveat",
]


@dataclass(frozen=True)
class OperandHint:
    """How the verifier's generator makes one capture, for a check it cannot satisfy by chance.

    ``constant``: a parameter/buffer (True) or a user input (False); ``fill``: ``"zeros"``
    (a symmetric zero point), ``"positive"`` (a scale) or ``"int8"`` (values over the whole
    int8 range); ``int_range``: integer values drawn in ``[lo, hi]`` (a 4-bit weight's
    ``(-8, 7)``, an index below a table's size); ``dtype``: the tensor's dtype (a
    ``torch.dtype``); ``producer``: the capture is the result of an op on fresh operands, not
    a leaf: ``"transpose"`` (``permute_copy(constant, [1, 0])`` of the drawn shape, a weight a
    matmul reads transposed), ``"linear"`` (``linear(x, constant w)``), ``"conv"`` (a 1x1
    ``convolution`` of a rank-4 operand), ``"dequantize_per_tensor"`` (of an int8 tensor,
    scale 0.5, zero point 0) or ``"quantize_per_tensor"`` (int8, scale 0.5, zero point 0, of
    float values on that grid: the quantization loses nothing); or a backend's function
    ``producer(make)`` building it from ops (``make.capture(name)``, ``make.input(part,
    shape, dtype, values)``, ``make.call(op_key, *args)``, ``make.item(ref, i)``,
    ``make.bind(name, ref)``, ``make.shape``, ``make.op``, ``make.randint(lo, hi, shape)``: see
    ``fusionkit.authoring.verify._Making``). ``values``: for a capture that is a literal, the values to draw
    it from; ``shapes``: for a tensor, the shapes to draw it from. A hint keyed
    ``"*<argument name>"`` makes every wildcard argument of that name (an argument a
    ``strict_defaults=False`` op leaves out of its pattern).
    """

    constant: bool | None = None
    fill: str | None = None
    dtype: Any = None
    producer: str | Callable[[Any], Any] | None = None
    #: for a literal capture: the values to draw it from (still filtered by its matcher)
    values: tuple[Any, ...] = ()
    #: for a tensor capture: the shapes to draw it from
    shapes: tuple[tuple[int, ...], ...] = ()
    #: for an integer tensor: its values are drawn in [lo, hi]
    int_range: tuple[int, int] | None = None


#: ``pick(options)``: one of ``options``, drawn by the generator (so a failing case shrinks)
Pick = Callable[[Sequence[Any]], Any]

#: hints by check name (a ``Custom``'s name): capture -> hint, for the captures the check
#: reads; or ``draw(pick) -> {capture: hint}``, called once per case, for a check whose
#: captures must agree with each other (a block size drawn first, the dims it tiles after)
OPERAND_HINTS: dict[str, Mapping[str, OperandHint] | Callable[[Pick], Mapping[str, OperandHint]]] = {}

#: node metadata whose meaning the verifier applies when it runs the rewritten program: the
#: key, and what it does to the node's result (``apply(recorded value, result)``)
METADATA_SEMANTICS: dict[str, Callable[[Any, Any], Any]] = {}

#: backend ops (``namespace.name.overload``) whose registered CPU reference does not
#: compute what the kernel computes from what the rules feed it, and why: a rule is never
#: judged through it
REFERENCE_IS_NOT_THE_KERNEL: dict[str, str] = {}

#: backend ops (``namespace.name.overload``) the verifier runs through a function the
#: backend states computes what its kernel computes (checked against the kernel, the runtime
#: or the reference model by the backend's own tests), in place of torch's registered one:
#: ``fn(*args, **kwargs)`` with the node's evaluated arguments
KERNEL_REFERENCES: dict[str, Callable[..., Any]] = {}


#: ops (``namespace.name.overload``) whose meaning at a backend's pipeline position depends on
#: node metadata an earlier pass wrote, not on the op and its operands alone (an ``aten.tanh``
#: on int8 codes with the qparams ``FoldAndAnnotateQParamsPass`` writes is a requantized tanh,
#: not ``torch.tanh``): ``fn(node, args, kwargs)`` with the node's evaluated arguments returns
#: what the node computes, or ``NotImplemented`` where the node carries nothing it reads (the
#: op then runs as usual)
NODE_SEMANTICS: dict[str, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = {}

#: the checks (a ``Custom``'s name) whose rules a node semantics of :data:`NODE_SEMANTICS`
#: is for, by op; an op not here: every rule with a program form. A node means more than
#: its op only at the pipeline position a program form gives: a rule without one (another
#: backend's, or one that sees the program ``torch.export`` gives) never runs through it,
#: so its check never imports that backend's modules
NODE_SEMANTICS_CHECKS: dict[str, frozenset[str]] = {}


def register_node_semantics(op: str, fn: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
                            checks: Sequence[str] = ()) -> None:
    """Tell the verifier what a node of ``op`` computes from its metadata: ``fn(node, args,
    kwargs)``, consulted before :data:`KERNEL_REFERENCES` and torch's kernel; ``NotImplemented``
    where it does not apply. It applies to the rules of ``checks`` (check names whose program
    form, :func:`register_program_form`, gives that pipeline position), or without
    ``checks`` to every rule with a program form; never to a rule without one."""
    NODE_SEMANTICS[op] = fn
    if checks:
        NODE_SEMANTICS_CHECKS[op] = frozenset(checks)
    else:
        NODE_SEMANTICS_CHECKS.pop(op, None)


#: op namespace (``tosa``) -> a factory of the context its ops run in: a backend whose ops
#: check operands against a lowering setting (the TOSA dialect's ops read the active TOSA
#: specification) states it, and the verifier opens it around building, exporting,
#: rewriting and running a rule whose pattern has ops of that namespace
OP_CONTEXTS: dict[str, Callable[[], AbstractContextManager[Any]]] = {}


def register_op_context(namespace: str, factory: Callable[[], AbstractContextManager[Any]]) -> None:
    """Tell the verifier to run the ops of ``namespace`` inside ``factory()``."""
    OP_CONTEXTS[namespace] = factory


#: checks (a ``Custom``'s name) that read which module a matched op ran in (its source
#: partition, from ``nn_module_stack``), and the module type: the verifier runs the pattern's
#: ops inside an instance of it, as a model's module runs them
MODULE_SCOPES: dict[str, type[Any]] = {}


def register_module_scope(check: str, module_type: type[Any]) -> None:
    """Tell the verifier that the check named ``check`` asks for the pattern's ops to run
    inside a ``module_type`` module (an ``nn.Linear`` source partition)."""
    MODULE_SCOPES[check] = module_type


def register_metadata_semantics(key: str, apply: Callable[[Any, Any], Any]) -> None:
    """Tell the verifier what a node's ``meta[key]`` does to its result."""
    METADATA_SEMANTICS[key] = apply


def register_reference_caveat(op: str, why: str) -> None:
    """Tell the verifier that ``op``'s CPU reference is not its kernel (``why``)."""
    REFERENCE_IS_NOT_THE_KERNEL[op] = why


def register_kernel_reference(op: str, fn: Callable[..., Any]) -> None:
    """Tell the verifier to run ``op`` through ``fn``: what the kernel computes, stated by the
    backend that owns it (and tested there against the kernel), where torch has no CPU
    implementation of it or one that is not the kernel's math."""
    KERNEL_REFERENCES[op] = fn
    REFERENCE_IS_NOT_THE_KERNEL.pop(op, None)


def register_operand_hints(check: str,
                           hints: Mapping[str, OperandHint] | Callable[[Pick], Mapping[str, OperandHint]]
                           ) -> None:
    """Tell the verifier how to make the operands the check named ``check`` asks for: a
    mapping capture -> :class:`OperandHint`, or a function drawing them jointly per case."""
    OPERAND_HINTS[check] = hints


#: checks (a ``Custom``'s name) whose rule runs where the program has another form than
#: ``torch.export`` gives (a backend's pass pipeline before the rule: in-place ops where export
#: writes functional ones, edge-dialect op objects, metadata earlier passes write), and
#: ``form(ep)``, which puts the exported pattern program in that form: in place (returning
#: None), or returning the program in that form (a pipeline that makes a new one)
PROGRAM_FORMS: dict[str, Callable[[Any], Any]] = {}

#: checks whose site holds ops of these namespaces beyond the pattern's own (an operand built
#: from a backend's ops): the verifier opens their contexts (:data:`OP_CONTEXTS`) too
FORM_NAMESPACES: dict[str, frozenset[str]] = {}

def register_program_form(check: str, form: Callable[[Any], Any],
                          namespaces: Sequence[str] = ()) -> None:
    """Tell the verifier that the rule of the check named ``check`` sees programs in the form
    ``form(ep)`` gives an exported program (edited in place, or returned): the verifier
    applies it to the pattern's program after exporting it, before the rule rewrites a
    copy. ``namespaces``: the op namespaces the site holds beyond the pattern's (their
    contexts are opened)."""
    PROGRAM_FORMS[check] = form
    if namespaces:
        FORM_NAMESPACES[check] = frozenset(namespaces)
