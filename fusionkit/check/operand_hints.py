"""How to make the operands a constraint asks for: what a check says of its own captures.

``fusionkit.verify`` draws operands for a rule's pattern; a check it cannot satisfy by
chance (a zero point that must be all zeros, a group size that tiles a dimension) says
how to make them. A constraint carries that itself (:meth:`Constraint.operand_hints
<fusionkit.check.constraints.Constraint.operand_hints>`): a built-in one from its own
fields (a :class:`~fusionkit.check.constraints.PrepackableConstant` asks for a constant),
a :class:`~fusionkit.check.constraints.Custom` check from its ``hints``. Renaming a check
keeps its hints: they are not looked up by its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Hints", "OperandHint", "Pick", "merged"]


@dataclass(frozen=True)
class OperandHint:
    """How the verifier's generator makes one capture, for a check it cannot satisfy by chance.

    ``constant``: a parameter/buffer (True) or a user input (False); ``fill``: ``"zeros"``
    (a symmetric zero point), ``"positive"`` (a scale) or ``"int8"`` (values over the whole
    int8 range); ``int_range``: integer values drawn in ``[lo, hi]`` (a 4-bit weight's
    ``(-8, 7)``, an index below a table's size); ``dtype``: the tensor's dtype (a
    ``torch.dtype``); ``dtypes``: the dtypes to draw it from (the first most often);
    ``ranks``: the ranks its shape may have; ``producer``: the capture is the result of an op
    on fresh operands, not a leaf: ``"transpose"`` (``permute_copy(constant, [1, 0])`` of the
    drawn shape, a weight a matmul reads transposed), ``"linear"`` (``linear(x, constant
    w)``), ``"conv"`` (a 1x1 ``convolution`` of a rank-4 operand),
    ``"dequantize_per_tensor"`` (of an int8 tensor, scale 0.5, zero point 0) or
    ``"quantize_per_tensor"`` (int8, scale 0.5, zero point 0, of float values on that grid:
    the quantization loses nothing); or a backend's function ``producer(make)`` building it
    from ops (``make.capture(name)``, ``make.input(part, shape, dtype, values)``,
    ``make.call(op_key, *args)``, ``make.item(ref, i)``, ``make.bind(name, ref)``,
    ``make.shape``, ``make.op``, ``make.randint(lo, hi, shape)``: see
    ``fusionkit.authoring.verify._Making``). ``values``: for a capture that is a literal, the
    values to draw it from; ``bounds``: literals to try besides the usual ones (a range's
    edges); ``shapes``: for a tensor, the shapes to draw it from. A hint keyed ``"*<argument
    name>"`` (``verify``'s ``hints``) makes every wildcard argument of that name (an argument
    a ``strict_defaults=False`` op leaves out of its pattern).
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
    #: for a tensor capture: the dtypes to draw it from, the first most often
    dtypes: tuple[Any, ...] = ()
    #: for a tensor capture: the ranks its shape may have
    ranks: tuple[int, ...] = ()
    #: for a literal capture: values to try besides the usual candidates (a range's edges)
    bounds: tuple[Any, ...] = ()


#: ``pick(options)``: one of ``options``, drawn by the generator (so a failing case shrinks)
Pick = Callable[[Sequence[Any]], Any]

#: what a constraint says of its captures: capture -> hint; or ``draw(pick) -> {capture:
#: hint}``, called once per case, for captures that must agree with each other (a block size
#: drawn first, the dims it tiles after)
Hints = Mapping[str, OperandHint] | Callable[[Pick], Mapping[str, OperandHint]]


def merged(a: OperandHint, b: OperandHint) -> OperandHint:
    """``a`` with the fields ``b`` sets (``b`` wins where both do)."""
    unset = OperandHint()
    return dataclasses.replace(a, **{f.name: getattr(b, f.name) for f in dataclasses.fields(b)
                                     if getattr(b, f.name) != getattr(unset, f.name)})
