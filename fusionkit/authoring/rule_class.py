"""A rule written as one class: its pattern, its check and its rewrite side by side.

::

    class LinearWithConstantBias(RuleClass):
        pattern = op("aten.add.Tensor", op("aten.mm.default", capture("x"), capture("w")),
                     capture("bias"))
        constraints = [DtypeIn("x", frozenset({torch.float32}))]

        def check(self, ctx, w, bias):
            return None if ctx.inputs.constant(bias) else ctx.fail("not constant", at="bias")

        def rewrite(self, rw, x, w, bias):
            return rw.call("aten.addmm.default", bias, x, w)

    rule = LinearWithConstantBias.rule()

The methods' parameters after ``ctx`` / ``rw`` are the captures they read, as
for any :class:`~fusionkit.Custom` check or :class:`~fusionkit.PythonReplacement`
(the rule refuses one the pattern does not bind when it is built). ``check`` is
optional and runs after ``constraints``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from fusionkit.check.constraints import Constraint, Custom
from fusionkit.match.pattern import Pattern
from fusionkit.rule import PythonReplacement, Rule, RuleError

__all__ = ["RuleClass"]


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


class RuleClass:
    """Base of a rule written as a class; :meth:`rule` builds the :class:`~fusionkit.Rule`."""

    #: the rule's name (default: the class name in snake_case)
    name: ClassVar[str] = ""
    pattern: ClassVar[Pattern]
    constraints: ClassVar[Sequence[Constraint]] = ()
    priority: ClassVar[int] = 0
    allow_escape: ClassVar[bool] = False
    #: default: the first line of the class docstring
    description: ClassVar[str] = ""

    def check(self, ctx: Any) -> Any:
        """None, a reason, or ``ctx.fail(reason, at=capture)``; parameters after ``ctx`` are captures."""
        return None

    def rewrite(self, rw: Any) -> Any:
        """Build the replacement through ``rw``; parameters after ``rw`` are captures."""
        raise NotImplementedError

    @classmethod
    def rule(cls) -> Rule:
        name = cls.name or _snake(cls.__name__)
        if not isinstance(getattr(cls, "pattern", None), Pattern):
            raise RuleError(f"rule {name!r}: {cls.__name__}.pattern must be a pattern")
        if cls.rewrite is RuleClass.rewrite:
            raise RuleError(f"rule {name!r}: {cls.__name__} defines no rewrite")
        self = cls()
        constraints = list(cls.constraints)
        if cls.check is not RuleClass.check:
            constraints.append(Custom(self.check, f"{name}.check"))
        doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        return Rule(name, cls.pattern, PythonReplacement(self.rewrite), constraints,
                    priority=cls.priority, allow_escape=cls.allow_escape,
                    description=cls.description or doc)
