"""When two rules are the same fusion: equal pattern, constraints, replacement and settings.

Patterns, constraints and replacements compare structurally (dataclass
equality; a named value matcher by the arguments it was built with), so a rule
loaded from YAML can be checked against the Python rule it was dumped from. A
:class:`~fusionkit.rule.Rule` itself keeps identity equality and hashing: rule
sets use rules as dictionary keys on the matching hot path.
"""

from __future__ import annotations

from fusionkit.rule import Rule

__all__ = ["rule_differences", "rules_equal"]

_FIELDS = ("name", "pattern", "constraints", "replacement", "priority", "allow_escape",
           "description")


def rule_differences(a: Rule, b: Rule) -> list[str]:
    """The fields in which ``a`` and ``b`` differ (empty: the same fusion)."""
    return [f for f in _FIELDS if getattr(a, f) != getattr(b, f)]


def rules_equal(a: Rule, b: Rule) -> bool:
    """``a`` and ``b`` are the same fusion, field by field."""
    return not rule_differences(a, b)
