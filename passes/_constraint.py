"""The decorator both backends' rules write their Python checks with.

``constraint("bias_is_constant")(fn)`` is :class:`~fusionkit.Custom` ``(fn, name)``
spelt as a decorator, so a rule's list of constraints reads as the names of its checks.
Shared by the Vulkan and the XNNPACK preprocess rules (``passes/vulkan/_common.py`` and
``passes/xnnpack/_common.py`` re-export it; the rules import it from there).
"""

from __future__ import annotations

from collections.abc import Callable

from fusionkit.check.constraints import Custom, Hints
from fusionkit.result import MatchResult

__all__ = ["constraint"]


def constraint(name: str, hints: Hints | None = None
               ) -> Callable[[Callable[..., str | MatchResult | None]], Custom]:
    """Decorator: a :class:`~fusionkit.Custom` check ``fn(ctx, *captures) -> reason | None``.

    The captures it reads are its parameters after ``ctx``
    (``constraint("bias_is_constant")(fn)``): the signature is the only list of them.
    ``fn`` returns None, a sentence, or ``ctx.fail(reason, at=...)`` (a
    :class:`~fusionkit.MatchResult`) naming the capture at fault. ``hints``: how
    ``fusionkit.verify`` makes the operands it asks for (:attr:`Custom.hints
    <fusionkit.Custom>`).
    """

    def wrap(fn: Callable[..., str | MatchResult | None]) -> Custom:
        return Custom(fn, name, hints=hints)

    return wrap
