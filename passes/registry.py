"""Where rule sets are discoverable: every shipped rule factory registers itself here.

ExecuTorch registers its Vulkan detectors with a decorator; fusionkit does the
same for its rule factories, so a rule set is never listed by hand. A factory
says which sets it belongs to (``"builtin"``: every rule fusionkit ships;
``"vulkan"``: the Vulkan adapter's set; ``"xnnpack"``: the rewrites of XNNPACK's
preprocess; ``"arm"``: the Arm backend's TOSA pipeline fusions) and which stock ExecuTorch pattern or pass it takes over. Sets keep
registration order (the order the rule modules import).
A backend author registers a factory of their own the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

# what a rule module tells fusionkit.verify about its backend's ops and node metadata
from fusionkit.authoring.semantics import (
    OperandHint,
    Pick,
    register_kernel_reference,
    register_metadata_semantics,
    register_module_scope,
    register_node_semantics,
    register_op_context,
    register_operand_hints,
    register_program_form,
    register_reference_caveat,
)

if TYPE_CHECKING:
    from fusionkit.rule import Rule

__all__ = ["OperandHint", "Pick", "RuleFactory", "register_kernel_reference", "register_metadata_semantics",
           "register_module_scope", "register_node_semantics", "register_op_context",
           "register_operand_hints", "register_program_form",
           "register_reference_caveat",
           "register_rules", "registered", "rule_set", "rule_set_names", "rules_taking_over",
           "taken_over_patterns"]

#: the modules whose import registers every rule fusionkit ships
SHIPPED_RULE_MODULES: tuple[str, ...] = ("fusionkit.passes.rms_norm", "fusionkit.passes.vulkan",
                                         "fusionkit.passes.xnnpack", "fusionkit.passes.arm")

F = TypeVar("F", bound=Callable[[], "Rule | list[Rule]"])


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


def register_rules(*sets: str, takes_over: str | None = None,
                   roots: tuple[str, ...] | None = None,
                   needs: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Decorator: register a no-argument rule factory in the named rule sets.

    ``roots``: the op keys (``"aten.mul.Tensor"``) every rule it makes is rooted at, so
    that a program holding none of them never pays for building its patterns; ``needs``:
    op keys of which every match holds a node (checked against the patterns when built),
    so that a program holding none of them does not either."""

    def wrap(fn: F) -> F:
        qualname = f"{fn.__module__}.{fn.__qualname__}"
        _FACTORIES[qualname] = RuleFactory(qualname, frozenset(sets), takes_over, fn,
                                           None if roots is None else frozenset(roots),
                                           frozenset(needs))
        return fn

    return wrap


def _load_shipped() -> None:
    for module in SHIPPED_RULE_MODULES:
        importlib.import_module(module)


def registered(set_name: str | None = None) -> list[RuleFactory]:
    """Registered factories (of one set), in registration order."""
    _load_shipped()
    return [f for f in _FACTORIES.values() if set_name is None or set_name in f.sets]


def rule_set(name: str) -> list[Rule]:
    """Fresh rule objects of a registered set (``"builtin"``, ``"vulkan"``, ...)."""
    factories = registered(name)
    if not factories:
        raise KeyError(f"no rule set {name!r}; known: {rule_set_names()}")
    return [r for f in factories for r in f.rules()]


def rule_set_names() -> list[str]:
    """Every registered set name."""
    return sorted({s for f in registered() for s in f.sets})


def taken_over_patterns(set_name: str) -> dict[str, str]:
    """Stock pattern name -> qualified name of the factory in ``set_name`` replacing it."""
    return {f.takes_over: f.qualname for f in registered(set_name) if f.takes_over}


def rules_taking_over(set_name: str, stock_pass: str) -> list[Rule]:
    """Fresh rule objects of ``set_name`` from the factories registered as taking over
    ``stock_pass`` (a stock pattern or pass name), in registration order."""
    return [r for f in registered(set_name) if f.takes_over == stock_pass for r in f.rules()]
