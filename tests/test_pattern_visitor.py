"""Pattern nodes carry their behaviour: ``accept`` routes to the visitor's method for the
node's kind, ``children()`` is every sub-pattern, ``always_captures()`` what every match binds.
"""

from __future__ import annotations

from typing import Any

import pytest

from fusionkit.match import pattern as P
from fusionkit.match.pattern import PatternVisitor, also, capture, lit, op, outputs, seq, through

X, Y = capture("x"), capture("y")
ADD = op("aten.add.Tensor", X, Y)
#: one node of every kind, with the visitor method it must reach
NODES: dict[str, P.Pattern] = {
    "visit_capture": X,
    "visit_value": lit(1.0, name="one"),
    "visit_named": ADD.bind("out"),
    "visit_alt": ADD | op("aten.sub.Tensor", X, Y),
    "visit_through": through(P.CASTS, X),
    "visit_seq": seq(X, Y),
    "visit_also": also("z", op("aten.relu.default", X), near="x"),
    "visit_outputs": outputs(ADD, also("z", op("aten.relu.default", X), near="x")),
    "visit_op": ADD,
}


class _Which(PatternVisitor[str]):
    def generic(self, p: P.Pattern) -> str:
        return "generic"

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("visit_"):
            return lambda p: name
        return super().__getattribute__(name)


def test_every_node_class_is_covered() -> None:
    classes = {type(p) for p in NODES.values()}
    assert {c.__name__ for c in classes} == {"Capture", "Value", "Named", "Alt", "Through",
                                              "Seq", "Also", "Outputs", "Op"}


@pytest.mark.parametrize("method", NODES)
def test_accept_calls_the_method_of_the_nodes_kind(method: str) -> None:
    assert NODES[method].accept(_Which()) == method


@pytest.mark.parametrize("method", NODES)
def test_a_kind_a_visitor_does_not_handle_goes_to_generic(method: str) -> None:
    class Nothing(PatternVisitor[str]):
        pass

    with pytest.raises(NotImplementedError, match=f"Nothing has no case for {type(NODES[method]).__name__}"):
        NODES[method].accept(Nothing())


@pytest.mark.parametrize("method", NODES)
def test_children_hold_every_capture_below_the_node(method: str) -> None:
    p = NODES[method]
    below: set[str] = set().union(*(c.captures() for c in p.children()))
    assert below <= p.captures()
    own = p.captures() - below
    assert own <= {"x", "y", "one", "out", "z"}  # what the node itself names


def test_always_captures_leave_out_what_only_some_alternatives_bind() -> None:
    p = op("aten.addmm.default", capture("b"), X, Y) | op("aten.mm.default", X, Y)
    assert p.captures() == {"b", "x", "y"} and p.always_captures() == {"x", "y"}
    assert op("aten.relu.default", p).bind("r").always_captures() == {"x", "y", "r"}
    assert NODES["visit_outputs"].always_captures() == {"x", "y", "z"}


def test_capture_name_is_only_a_plain_captures() -> None:
    assert [p.capture_name() for p in NODES.values()] == ["x"] + [None] * (len(NODES) - 1)
