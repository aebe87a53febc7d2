"""A rule whose op's kernel aborts the process on some operands (``tests/test_verify_trust.py``).

``fusionkit_crash_test::neg_or_abort`` negates a tensor of one element and calls
``os.abort()`` on any larger one, as a native kernel that crashes on odd operands does.
The op exists for these tests only: its namespace is no backend's.
"""

from __future__ import annotations

import os

import torch

from fusionkit import DtypeIn, Rule, capture, op, ref, replace_with


@torch.library.custom_op("fusionkit_crash_test::neg_or_abort", mutates_args=())
def neg_or_abort(x: torch.Tensor) -> torch.Tensor:
    if x.numel() > 1:
        os.abort()
    return -x


@neg_or_abort.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def aborting_rule() -> Rule:
    """``neg_or_abort(x)`` -> ``neg(x)``: right, but its pattern's kernel aborts on most draws."""
    return Rule("neg_or_abort_as_neg", op("fusionkit_crash_test.neg_or_abort.default", capture("x")),
                replace_with("aten.neg.default", ref("x")), [DtypeIn("x", {torch.float32})])


def rules() -> list[Rule]:
    """The aborting rule between two that verify: the worker is restarted after it."""
    right = Rule("abs_as_abs", op("aten.abs.default", capture("x")), replace_with("aten.abs.default", ref("x")),
                 [DtypeIn("x", {torch.float32})])
    neg = Rule("neg_as_mul", op("aten.neg.default", capture("x")),
               replace_with("aten.mul.Scalar", ref("x"), -1.0), [DtypeIn("x", {torch.float32})])
    return [right, aborting_rule(), neg]
