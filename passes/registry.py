"""Where rule sets are discoverable: every shipped rule factory registers itself here.

ExecuTorch registers its Vulkan detectors with a decorator; fusionkit does the
same for its rule factories, so a rule set is never listed by hand. A factory
says which sets it belongs to (``"vulkan_patterns"``: the ports of ExecuTorch's Vulkan
pattern registry and the portable RMSNorm; ``"vulkan"``: the Vulkan adapter's fusions;
``"vulkan_preprocess"``: the rewrites of Vulkan's preprocess; ``"xnnpack"``: the rewrites
of XNNPACK's preprocess; ``"arm"``: the Arm backend's TOSA pipeline fusions), which stock
ExecuTorch pattern or pass it takes over, and what its backend states about the ops its
rules create or match (``semantics``, an :class:`~fusionkit.rule.OpSemantics`, handed to
each rule it makes). ``rule_set("shipped")`` is every rule fusionkit ships. Sets keep
registration order (the order the rule modules import). A factory registered here makes
``shipped`` rules; a backend author registers a factory of their own the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

# what a rule module states for fusionkit.verify, on its rules and checks
from fusionkit.check.operand_hints import OperandHint, Pick
from fusionkit.rule import OpSemantics, ProgramForm, Rule

__all__ = ["ALL_SHIPPED", "OpSemantics", "OperandHint", "Pick", "ProgramForm", "RuleFactory",
           "register_rules", "registered", "rule_set", "rule_set_names", "rules_taking_over",
           "taken_over_patterns"]

#: the set name of every rule fusionkit ships (every registered factory's)
ALL_SHIPPED = "shipped"
#: older set names, and the set each one is
RENAMED_SETS: dict[str, str] = {"builtin": "vulkan_patterns"}

#: the modules whose import registers every rule fusionkit ships
SHIPPED_RULE_MODULES: tuple[str, ...] = ("fusionkit.passes.rms_norm", "fusionkit.passes.vulkan",
                                         "fusionkit.passes.xnnpack", "fusionkit.passes.arm")

F = TypeVar("F", bound=Callable[..., "Rule | list[Rule]"])


@dataclass(frozen=True)
class RuleFactory:
    """A registered factory: called with no arguments, returns fresh rule object(s)."""

    qualname: str
    sets: frozenset[str]
    takes_over: str | None
    make: Callable[[], Rule | list[Rule]]
    #: the op keys its rules are rooted at, when the factory states them: a pass list can
    #: then build its rules only for programs that hold one of these ops
    #: (:class:`fusionkit.find.finder.DeferredRules`; a test checks the statement)
    roots: frozenset[str] | None = None
    #: op keys of which every match of its rules holds a node (a quantized linear's
    #: quantize / dequantize): a program holding none of them never builds its rules
    needs: frozenset[str] = frozenset()

    def rules(self) -> list[Rule]:
        made = self.make()
        return list(made) if isinstance(made, (list, tuple)) else [made]


_FACTORIES: dict[str, RuleFactory] = {}


def _shipped(rule: Rule, semantics: OpSemantics | None) -> Rule:
    """``rule`` as its backend ships it: ``shipped``, with the backend's ``semantics``."""
    if semantics is None or semantics == rule.semantics:
        return rule if rule.shipped else dataclasses.replace(rule, shipped=True)
    return dataclasses.replace(rule, shipped=True, semantics=rule.semantics | semantics)


def register_rules(*sets: str, takes_over: str | None = None,
                   roots: tuple[str, ...] | None = None,
                   needs: tuple[str, ...] = (),
                   semantics: OpSemantics | None = None) -> Callable[[F], F]:
    """Decorator: register a rule factory in the named rule sets (called with no arguments).

    The factory (also when called directly) makes ``shipped`` rules carrying ``semantics``
    (what their backend states about the ops they create or match, for ``fusionkit.verify``).
    ``roots``: the op keys (``"aten.mul.Tensor"``) every rule it makes is rooted at, so
    that a program holding none of them never pays for building its patterns; ``needs``:
    op keys of which every match holds a node (checked against the patterns when built),
    so that a program holding none of them does not either."""
    if ALL_SHIPPED in sets or set(sets) & set(RENAMED_SETS):
        raise ValueError(f"rule set names {ALL_SHIPPED!r} and {sorted(RENAMED_SETS)} are reserved")

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def make(*args: Any, **kwargs: Any) -> Rule | list[Rule]:
            made = fn(*args, **kwargs)
            if isinstance(made, (list, tuple)):
                return [_shipped(r, semantics) for r in made]
            return _shipped(made, semantics)

        qualname = f"{fn.__module__}.{fn.__qualname__}"
        _FACTORIES[qualname] = RuleFactory(qualname, frozenset(sets), takes_over, make,
                                           None if roots is None else frozenset(roots),
                                           frozenset(needs))
        return make  # type: ignore[return-value]

    return wrap


def _load_shipped() -> None:
    for module in SHIPPED_RULE_MODULES:
        importlib.import_module(module)


def registered(set_name: str | None = None) -> list[RuleFactory]:
    """Registered factories (of one set; ``"shipped"`` or None: all), in registration order."""
    _load_shipped()
    name = RENAMED_SETS.get(set_name, set_name) if set_name is not None else None
    return [f for f in _FACTORIES.values() if name in (None, ALL_SHIPPED) or name in f.sets]


def rule_set(name: str) -> list[Rule]:
    """Fresh rule objects of a registered set (``"vulkan"``, ``"xnnpack"``, ...; ``"shipped"``:
    every rule fusionkit ships, each factory's once; ``"builtin"`` is the older name of
    ``"vulkan_patterns"``)."""
    factories = registered(name)
    if not factories:
        raise KeyError(f"no rule set {name!r}; known: {rule_set_names()}")
    return [r for f in factories for r in f.rules()]


def rule_set_names() -> list[str]:
    """Every registered set name, and ``"shipped"``."""
    return sorted({ALL_SHIPPED, *(s for f in registered() for s in f.sets)})


def taken_over_patterns(set_name: str) -> dict[str, str]:
    """Stock pattern name -> qualified name of the factory in ``set_name`` replacing it."""
    return {f.takes_over: f.qualname for f in registered(set_name) if f.takes_over}


def rules_taking_over(set_name: str, stock_pass: str) -> list[Rule]:
    """Fresh rule objects of ``set_name`` from the factories registered as taking over
    ``stock_pass`` (a stock pattern or pass name), in registration order."""
    return [r for f in registered(set_name) if f.takes_over == stock_pass for r in f.rules()]
