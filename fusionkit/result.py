"""One reasoned result: what a rule made of one place in a program, and why.

Every layer that says "why not" speaks this type: the matcher's near miss
(``Search.result``), a constraint's refusal (``Constraint.refuse``, ``CheckContext.fail``:
they also name the capture at fault), the finder's declines (``MatchSet.declined``),
``why_not``'s verdicts, a replacement that failed while a pass applied it
(``ApplyFailure.result()``), the pass report, ``fusionkit explain`` and its JSON. A result
has a
:class:`Status` (fused, part of another match, declined, the rule's own code raised,
never tried), the :class:`Step` that decided it (or the ``kind`` of the constraint that
refused it), the node at fault and a sentence saying why. One class with one JSON shape
(:meth:`MatchResult.record`) means a reason reads the same wherever it is shown.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field
from typing import Any

from torch.fx import Node

if sys.version_info >= (3, 11):  # noqa: UP036  (Python 3.10 is supported: docs/versions.md)
    from enum import StrEnum
else:  # Python 3.10 (docs/versions.md)

    class StrEnum(str, enum.Enum):  # noqa: UP042
        """``enum.StrEnum`` of Python 3.11: members are strings; ``str()`` and ``format()``
        give the value."""

        def __str__(self) -> str:
            return str(self.value)

__all__ = ["MatchResult", "Status", "Step"]


class Status(StrEnum):
    """The verdict of a result."""

    #: accepted (a pass applies every accepted match)
    FUSED = "fused"
    #: the node belongs to another rule's accepted match
    INSIDE = "inside"
    #: matched structurally, or nearly, and refused with a reason
    DECLINED = "declined"
    #: the rule's own code (a constraint, a predicate, a replacement) raised
    ERROR = "error"
    #: the node is not an op the rule's pattern is rooted at
    NOT_ROOT = "not_root"


class Step(StrEnum):
    """Which step decided a result. A constraint's refusal names its ``kind`` instead
    (``dtype``, ``prepackable_constant``, ``custom:NAME``): those are open-ended."""

    FUSED = "fused"
    #: the pattern's op tree did not match (a near miss: how far it got)
    STRUCTURE = "structure"
    #: the nodes are claimed by an earlier match
    OVERLAP = "overlap"
    #: an intermediate the replacement would remove is used outside the match
    ESCAPE = "escape"
    #: a multi-output match has no single point for its replacement
    PLACEMENT = "placement"
    #: the replacement creates an op the target could not run
    EXECUTABLE = "executable"
    #: the rule's own code raised
    ERROR = "error"
    #: the node is not the rule's root op
    ROOT = "root"


@dataclass(frozen=True)
class MatchResult:
    """What rule ``rule`` made of node ``root``: status, deciding step, node at fault, reason."""

    rule: str
    #: the node the rule was tried at (or asked about)
    root: Node
    status: Status
    #: a :class:`Step`, or the kind of the constraint that refused the match
    step: str
    #: the node at fault (None when the result names none)
    node: Node | None
    reason: str
    #: the nodes the rule had matched (the whole match when fused; for pictures)
    claimed: tuple[Node, ...] = field(default=(), compare=False, repr=False)
    #: the accepted match or finder result this one was derived from, if any
    source: Any = field(default=None, compare=False, repr=False)
    #: for status ``error``: the exception's type name
    error_type: str | None = None
    #: for a constraint's refusal: the capture at fault (None when it names none)
    capture: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.status, Status):
            object.__setattr__(self, "status", Status(self.status))

    @property
    def is_error(self) -> bool:
        return self.status is Status.ERROR

    @classmethod
    def fail(cls, rule: str, root: Node, step: str, reason: str, node: Node | None = None,
             claimed: tuple[Node, ...] = (), error_type: str | None = None) -> MatchResult:
        """A declined result (``error`` when ``step`` is ``error``)."""
        status = Status.ERROR if step == Step.ERROR else Status.DECLINED
        return cls(rule, root, status, step, node, reason, tuple(claimed), None, error_type)

    @classmethod
    def of(cls, result: MatchResult, *, rule: str | None = None, root: Node | None = None,
           claimed: tuple[Node, ...] | None = None) -> MatchResult:
        """The decline for a result another layer made (the matcher's near miss, a
        constraint's refusal, a replacement check's verdict): the same step, node and
        reason; rule, root and claimed nodes are the result's unless given (a constraint
        knows the node at fault, the finder the match it was checking)."""
        return cls.fail(result.rule if rule is None else rule,
                        result.root if root is None else root, result.step, result.reason,
                        result.node, result.claimed if claimed is None else claimed,
                        result.error_type)

    @classmethod
    def from_exception(cls, rule: str, root: Node, during: str, exc: BaseException,
                       node: Node | None = None) -> MatchResult:
        """The ``error`` result for ``exc``, raised by the rule's code ``during`` something."""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
        return cls.fail(rule, root, Step.ERROR, f"{during} raised {type(exc).__name__}: {message}",
                        node if node is not None else root, error_type=type(exc).__name__)

    def record(self) -> dict[str, Any]:
        """The one JSON shape of a result (``error_type`` only for status ``error``)."""
        out: dict[str, Any] = {
            "rule": self.rule, "root": self.root.name, "status": str(self.status),
            "step": str(self.step), "node": self.node.name if self.node is not None else None,
            "reason": self.reason, "nodes": [n.name for n in self.claimed]}
        if self.error_type is not None:
            out["error_type"] = self.error_type
        return out

    def __str__(self) -> str:
        at = f" [{self.node.name}]" if self.node is not None else ""
        return f"{self.rule} at `{self.root.name}`: {self.status} ({self.step}){at}: {self.reason}"

    def line(self) -> str:
        """A decline in a report's list: the rule, the root, the step (which says what
        failed), the node at fault and why."""
        at = f" [{self.node.name}]" if self.node is not None else ""
        return f"{self.rule} at `{self.root.name}`: {self.step}{at}: {self.reason}"
