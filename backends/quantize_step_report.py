"""What the quantize step's rules did to one graph module: folded (or rewritten) and declined.

Shared by the PTQ fold (:mod:`fusionkit.backends.quantize_step`) and QAT's rewrite
(:mod:`fusionkit.backends.quantize_step_qat`); the prepared module keeps its report in its
``meta`` and this thread's last one is :func:`last_report`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from torch.fx import GraphModule

__all__ = ["Decline", "FoldReport", "last_report", "record"]


@dataclass(frozen=True)
class Decline:
    """A batch norm left as it is: the rule, the batch norm, the node at fault, why."""

    rule: str
    batch_norm: str
    step: str
    node: str
    reason: str

    def __str__(self) -> str:
        return f"{self.rule} at `{self.batch_norm}`: {self.step}: `{self.node}`: {self.reason}"


@dataclass
class FoldReport:
    """One fold: the batch norms folded (into which convolution) and those declined."""

    folded: list[tuple[str, str]] = field(default_factory=list)
    declined: list[Decline] = field(default_factory=list)
    #: what was done to each accepted pair ("folded"; QAT's rewrite: "rewrote")
    verb: str = "folded"

    def __str__(self) -> str:
        joint = "into" if self.verb == "folded" else "with"
        lines = [f"{self.verb} {bn} {joint} {conv}" for bn, conv in self.folded]
        lines += [f"declined {d}" for d in self.declined]
        return "\n".join(lines) or "no convolution + batch norm"


_last = threading.local()


def last_report() -> FoldReport | None:
    """The report of this thread's last :func:`fuse_conv_bn_` or QAT rewrite."""
    return getattr(_last, "report", None)


def record(m: GraphModule, key: str, report: FoldReport) -> None:
    """``report`` as this thread's last and in ``m.meta[key]`` (the prepared module keeps it)."""
    _last.report = report
    m.meta[key] = report
