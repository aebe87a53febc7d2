"""Rules from example code: trace the PyTorch code a fusion replaces into a pattern.

A backend author has the model code (``LlamaRMSNorm.forward``, a RoPE helper),
not the edge-dialect op names it lowers to. :func:`rule_from_functions` runs
that code through ``torch.export`` (and ``to_edge`` for the edge dialect) and
turns the traced graph into the same :mod:`fusionkit.match.pattern` objects a
hand-written rule is made of, so the result prints as DSL code
(:func:`fusionkit.authoring.python_source.to_python`) and as YAML, and is matched,
explained and rewritten like any other rule.

Choices that differ from Inductor's ``register_replacement``:

* literals stay exact: a traced ``[-1]``, ``2`` or ``1e-6`` matches only that
  value. Inductor's serialized patterns turned int literals into wildcards and
  silently rewrote attention with other arguments (pytorch#195320). A wildcard
  is an explicit opt-in (``wildcards={"eps"}``): the named input is traced a
  second time with another value and exactly the literals that changed become
  one named capture;
* operand order and dtype casts are the DSL's job (commutative ops match both
  orders; casts are ``through(CASTS, ...)``), so one pattern is traced, not one
  per permutation;
* ``0-d`` constants that ``to_edge`` lifts out of scalars are literals that also
  accept such a constant, so one pattern serves both dialects' spellings.

This module is the entry point; each job has its own module:
:mod:`~fusionkit.authoring.example_trace` (export the example, name its inputs),
:mod:`~fusionkit.authoring.wildcards` (which literals a wildcard is),
:mod:`~fusionkit.authoring.graph_to_pattern` (the traced graph as DSL objects),
:mod:`~fusionkit.authoring.multi_output` (further outputs, alternatives merged) and
:mod:`~fusionkit.authoring.traced_replacement` (a replacement function, replayed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from fusionkit.authoring.example_trace import (
    Dialect,
    ExampleError,
    bind_inputs,
    get_attr_path,
    has_attr,
    output_nodes,
    signature_of,
)
from fusionkit.authoring.graph_to_pattern import TracedPattern, pattern_of
from fusionkit.authoring.multi_output import merge_alternatives
from fusionkit.authoring.traced_replacement import (
    ShapeSpecializedWarning,
    replacement_from_function,
)
from fusionkit.authoring.wildcards import is_selector, wildcard_names
from fusionkit.check.constraints import Constraint, PrepackableConstant
from fusionkit.match.pattern import CASTS, Pattern
from fusionkit.rule import CallOp, Ref, Replacement, Rule

__all__ = ["ExampleError", "ShapeSpecializedWarning", "TraceOptions", "pattern_from_function",
           "rule_from_functions"]

ParamPolicy = Literal["constant", "foldable", "any"]


@dataclass(frozen=True)
class TraceOptions:
    """How example code is read into a rule: the tracing keywords of
    :func:`rule_from_functions` as one value, to share between rules.

    ``rule_from_functions(f, rep, ex, name="r", options=opts)`` is the same as
    passing each field as a keyword; options together with a keyword set to something
    other than its default is refused (which one should win is not for us to guess).
    """

    #: inputs, module attributes (``"eps"``) or ``"op.arg"`` selectors left open;
    #: a mapping names the capture each becomes
    wildcards: Iterable[str] | Mapping[str, str] = ()
    #: the dialect the rule matches: ``"edge"`` (after ``to_edge``) or ``"aten"``
    dialect: Dialect = "edge"
    #: ops every operand may pass through (``()`` keeps casts as traced)
    casts: Iterable[str] = CASTS
    #: pass narrowing casts (fp32 -> fp16) too
    narrowing: bool = False
    #: what a module's parameters and buffers must be: a program constant,
    #: foldable into one, or anything
    parameters: ParamPolicy = "constant"
    #: capture names of the outputs (default: ``out0``, ``out1``, ... for several)
    output_names: Sequence[str] | None = None


_DEFAULTS = TraceOptions()


def _options(options: TraceOptions | None, **keywords: Any) -> TraceOptions:
    """``options``, or the keywords as options; both at once is ambiguous."""
    if options is None:
        return TraceOptions(**keywords)
    given = sorted(k for k, v in keywords.items() if v != getattr(_DEFAULTS, k))
    if given:
        raise ExampleError(f"pass the tracing choices as options= or as keywords, not both "
                           f"(also given: {', '.join(given)})")
    return options


def _search_functions(search_fn: Callable[..., Any] | Sequence[Callable[..., Any]]
                      ) -> list[Callable[..., Any]]:
    fns: list[Callable[..., Any]] = (
        list(search_fn) if isinstance(search_fn, (list, tuple))
        else [search_fn])  # type: ignore[list-item]
    if not fns:
        raise ExampleError("rule_from_functions needs at least one search function")
    return fns


def _inputs_per_function(example_inputs: Sequence[Any], n: int) -> list[Any]:
    """One example per search function: a list of tuples (or dicts) given one each, else
    the same example for all."""
    if (isinstance(example_inputs, list)
            and all(isinstance(e, (tuple, dict)) for e in example_inputs)
            and len(example_inputs) == n and n > 1):
        return list(example_inputs)
    return [example_inputs] * n


def _wildcard_examples(fn: Callable[..., Any], examples: dict[str, Any],
                       wild: Mapping[str, str]) -> set[str]:
    """The capture names of the input and attribute wildcards (selectors bind nothing);
    their example values are added to ``examples`` under the capture name."""
    names: set[str] = set()
    for w, cap in wild.items():
        if w in examples or not is_selector(w, fn):
            names.add(cap)
            if w in examples:
                examples[cap] = examples[w]
            elif isinstance(fn, nn.Module) and has_attr(fn, w):
                examples[cap] = get_attr_path(fn, w)
    return names


def _op_replacement(opname: str, fn: Callable[..., Any], example: Any,
                    wild: Mapping[str, str]) -> CallOp:
    """An op called with the search function's parameters, in order."""
    if isinstance(fn, nn.Module):
        raise ExampleError("an op-name replacement needs a search *function* (its parameters "
                           "are the op's arguments); for a module pass a function or "
                           "replace_with(...)")
    params = list(signature_of(fn).parameters)
    values = bind_inputs(fn, example)
    args = [Ref(p) if isinstance(values[p], torch.Tensor)
            else Ref(wild[p]) if p in wild else values[p] for p in params]
    return CallOp(opname, tuple(args))


def _param_constraints(names: Sequence[str], policy: ParamPolicy) -> list[Constraint]:
    if policy == "any":
        return []
    return [PrepackableConstant(n, fold=(policy == "foldable")) for n in names]


def rule_from_functions(
    search_fn: Callable[..., Any] | Sequence[Callable[..., Any]],
    replacement: str | Callable[..., Any] | Replacement,
    example_inputs: Sequence[Any],
    *,
    name: str,
    constraints: Iterable[Constraint] = (),
    wildcards: Iterable[str] | Mapping[str, str] = (),
    dialect: Dialect = "edge",
    casts: Iterable[str] = CASTS,
    narrowing: bool = False,
    parameters: ParamPolicy = "constant",
    output_names: Sequence[str] | None = None,
    priority: int = 0,
    description: str = "",
    options: TraceOptions | None = None,
) -> Rule:
    """A :class:`~fusionkit.rule.Rule` whose pattern is traced from example code.

    ``search_fn``: a function or ``nn.Module`` computing what to find, or a list
    of them (alternatives, e.g. ``x * x`` and ``x.pow(2)`` spellings).
    ``example_inputs``: its arguments (a tuple, or a list of tuples, one per
    search function); tensor arguments become captures named after the
    parameters, other arguments exact literals unless named in ``wildcards``.
    A module's parameters and buffers become captures named after them
    (dots -> ``_``) with ``parameters``: ``"constant"`` (must be a constant of
    the program), ``"foldable"`` (or foldable into one), ``"any"``.
    ``wildcards``: parameter or module-attribute names (``"eps"``) whose value
    becomes a capture of that name, or ``"op.arg"`` selectors
    (``"view_copy.size"``) whose literals match any value.
    ``replacement``: an op name (called with the search function's parameters in
    order), a function of capture names to trace, or a Replacement.
    ``casts``: ops every operand may pass through (``()`` keeps casts as traced);
    value-preserving ones only, unless ``narrowing`` (fp32 -> fp16 too: right when
    the fused op computes in the input's dtype, as the RMSNorm kernel does).
    ``options``: the tracing keywords as one :class:`TraceOptions` instead.
    """
    opts = _options(options, wildcards=wildcards, dialect=dialect, casts=casts,
                    narrowing=narrowing, parameters=parameters, output_names=output_names)
    fns = _search_functions(search_fn)
    per_fn = _inputs_per_function(example_inputs, len(fns))
    wild = wildcard_names(opts.wildcards)
    traced = [_traced(f, bind_inputs(f, ex), wild, opts) for f, ex in zip(fns, per_fn, strict=True)]
    pattern = merge_alternatives([t.pattern for t in traced])
    first = traced[0].trace
    examples = dict(first.examples)
    wild_names = _wildcard_examples(fns[0], examples, wild)
    n_out = max(1, len(output_nodes(first.ep)))
    rep: Replacement
    if isinstance(replacement, Replacement):
        rep = replacement
    elif isinstance(replacement, str):
        rep = _op_replacement(replacement, fns[0], per_fn[0], wild)
    elif callable(replacement):
        rep = replacement_from_function(replacement, examples, wild_names, n_out, opts.dialect)
        for arg, dims in (getattr(rep, "specialized", None) or {}).items():
            fixed = ", ".join(f"dim {d} must be {n}" for d, n in sorted(dims.items()))
            warnings.warn(ShapeSpecializedWarning(
                f"rule {name!r}: the replacement's argument {arg!r} is shape-specialized "
                f"({fixed}: its code fixes that size); a match of another size is declined "
                "(step error), not fused"), stacklevel=2)
    else:
        raise ExampleError(f"replacement must be an op name, a function or a Replacement, "
                           f"not {type(replacement).__name__}")
    needed = rep.captures()
    for t in traced:
        missing = needed - t.pattern.captures()
        if missing:
            raise ExampleError(f"the replacement reads {sorted(missing)}, which not every "
                               "search function binds")
    module_tensors = list(dict.fromkeys(n for t in traced for n in t.trace.module_tensors))
    cons = [*_param_constraints(module_tensors, opts.parameters), *constraints]
    return Rule(name=name, pattern=pattern, replacement=rep, constraints=cons,
                priority=priority, description=description or
                f"traced from {', '.join(getattr(f, '__name__', type(f).__name__) for f in fns)}")


def _traced(fn: Callable[..., Any], values: Mapping[str, Any], wild: Mapping[str, str],
            opts: TraceOptions) -> TracedPattern:
    return pattern_of(fn, values, dialect=opts.dialect, wildcards=wild, casts=opts.casts,
                      output_names=opts.output_names, narrowing=opts.narrowing)


def pattern_from_function(fn: Callable[..., Any], example_inputs: Sequence[Any],
                          *, dialect: Dialect = "edge",
                          wildcards: Iterable[str] | Mapping[str, str] = (),
                          casts: Iterable[str] = CASTS,
                          output_names: Sequence[str] | None = None,
                          options: TraceOptions | None = None) -> Pattern:
    """The pattern of one example function (see :func:`rule_from_functions`)."""
    opts = _options(options, dialect=dialect, wildcards=wildcards, casts=casts,
                    output_names=output_names)
    return _traced(fn, bind_inputs(fn, example_inputs), wildcard_names(opts.wildcards),
                   opts).pattern

