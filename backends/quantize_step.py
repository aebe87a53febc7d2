"""The quantize step's conv + batch-norm fold as fusionkit rules, for every PT2E quantizer.

torchao's ``prepare_pt2e`` (``torchao/quantization/pt2e/quantize_pt2e.py``), which every
PT2E quantizer's flow runs (XNNPACK's, Vulkan's, Arm's), first calls ``_fuse_conv_bn_``
on the graph module it was given, before any quantizer method. That call site is the one
this module replaces: :func:`fuse_conv_bn_` runs the rules of
:mod:`fusionkit.passes.families.conv_batch_norm_graph_module` on the graph module
(lifted into an ``ExportedProgram``, :mod:`fusionkit.integration.graph_module_program`),
in place as the stock function works, and leaves every declined batch norm as it is for
the quantizer to annotate. The call right after it, ``_fuse_linear_bn_`` (linear + batch
norm), is replaced the same way (:func:`fuse_linear_bn_`, the family's ``linear_rules``).
What was folded and what was declined, with the reasons, is in
the prepared module's ``meta[META_KEY]`` (a :class:`FoldReport`; ``prepare_pt2e`` keeps
the module's meta) and in :func:`last_report`.

Who gets it:

* :data:`PATCHES` (``install()`` / ``uninstall()``, idempotent, reversible) puts the call
  site in place process-wide; each backend adapter's ``install()`` includes it;
* fusionkit's quantizers (``fusionkit.backends.arm_adapter.quantizer``) carry
  ``fusionkit_quantize_step = True``; constructing one puts the call site in place
  (:func:`ensure_call_site`), and the call site runs the rules when the ``prepare_pt2e``
  calling it was given such a quantizer (``prepare_pt2e`` names its quantizer in a context
  variable, :func:`prepare_with`: the fold runs before it hands the quantizer anything),
  stock's fold otherwise.

QAT: ``prepare_qat_pt2e`` calls no fold; its ``_fuse_conv_bn_qat`` rewrites each
convolution + batch norm into torchao's training subgraph, which ``convert_pt2e`` folds.
That call site is taken over the same way (the same patch set, the same quantizer test):
:func:`fusionkit.backends.quantize_step_qat.fuse_conv_bn_qat` lets the rules of
:mod:`fusionkit.passes.families.conv_batch_norm_qat` decide which pairs torchao rewrites.
"""

from __future__ import annotations

import importlib
import threading
import types
from contextvars import ContextVar
from typing import Any

from torch.fx import GraphModule

from fusionkit.backends.quantize_step_report import Decline, FoldReport, last_report, record
from fusionkit.integration.hooks import Patch, PatchSet

__all__ = ["META_KEY", "PATCHES", "Decline", "FoldReport", "ensure_call_site",
           "fuse_conv_bn_", "fuse_linear_bn_", "install", "is_installed", "last_report", "prepare_qat_with",
           "prepare_with", "record", "rule_names", "uninstall"]

_MODULE = "torchao.quantization.pt2e.quantize_pt2e"
_NAME = "_fuse_conv_bn_"
_QAT_NAME = "_fuse_conv_bn_qat"
_LINEAR_NAME = "_fuse_linear_bn_"
#: the prepared module's meta key holding the :class:`FoldReport`
META_KEY = "fusionkit_conv_batch_norm"


_LOCK = threading.Lock()
_rules: dict[str, list[Any]] = {}


def _the_rules(kind: str = "conv") -> list[Any]:
    if kind not in _rules:
        from fusionkit.passes.families import conv_batch_norm_graph_module as family

        _rules[kind] = family.rules() if kind == "conv" else family.linear_rules()
    return _rules[kind]


def rule_names() -> frozenset[str]:
    """Names of the rules the quantize step runs (the convolutions' and linears' folds, the
    QAT rewrite), so that a report counts their fusions under the adapter that installed the
    step, not as a user's rules."""
    from fusionkit.backends import quantize_step_qat

    return frozenset(r.name for r in (*_the_rules("conv"), *_the_rules("linear"),
                                      *quantize_step_qat._the_rules()))


def _has_batch_norm(m: GraphModule) -> bool:
    from torchao.quantization.pt2e.utils import _is_bn_node

    return any(_is_bn_node(n) for n in m.graph.nodes)


def fuse_conv_bn_(m: GraphModule) -> None:
    """torchao's ``_fuse_conv_bn_(m)`` as rules: in place, every operand checked."""
    report = FoldReport()
    record(m, META_KEY, report)
    _fold(m, "conv", report)


def fuse_linear_bn_(m: GraphModule) -> None:
    """torchao's ``_fuse_linear_bn_(m)`` as rules (``prepare_pt2e`` calls it right after
    the convolutions' fold): in place, every operand checked; its lines join the report
    the convolutions' fold began in ``m.meta``."""
    report = m.meta.get(META_KEY)
    if not isinstance(report, FoldReport):
        report = FoldReport()
        record(m, META_KEY, report)
    _fold(m, "linear", report)


def _fold(m: GraphModule, kind: str, report: FoldReport) -> None:
    from fusionkit import run_rules
    from fusionkit.integration.graph_module_program import lift, write_back

    if not _has_batch_norm(m):
        return
    try:
        lifted = lift(m)
    except Exception as e:  # a graph the rules cannot read: the quantize step as stock runs it
        report.declined.append(Decline(f"{kind}_batch_norm", "(graph)", "error", "(graph)",
                                       f"the graph could not be read ({type(e).__name__}: "
                                       f"{e}); stock's fold ran instead"))
        _stock(kind)(m)
        return
    # one round, every operand checked (the graph is the quantizer's: nothing is delegated)
    run = run_rules(lifted.ep, _the_rules(kind), check_replacements=False,
                    drop_dead_constants=True)
    for d in run.matches.declined:  # declined, then the replacements that failed (error)
        report.declined.append(Decline(d.rule, d.root.name, d.step,
                                       getattr(d.node, "name", str(d.node)), d.reason))
    if run.applied:
        write_back(lifted)
    for match, root in zip(run.applied, run.new_roots, strict=True):
        report.folded.append((match.root.name, root.name))
    m.graph.eliminate_dead_code()  # as stock: the batch norms' unused constants go
    m.recompile()


def _stock(kind: str = "conv") -> Any:
    from torchao.quantization.pt2e import utils

    return utils._fuse_conv_bn_ if kind == "conv" else utils._fuse_linear_bn_


#: the quantizer of the ``prepare_pt2e`` under way in this context (set by
#: :func:`prepare_with`, read by the call site)
_QUANTIZER: ContextVar[Any] = ContextVar("fusionkit_quantize_step_quantizer", default=None)


def _by_fusionkit_quantizer() -> bool:
    """Whether the ``prepare_pt2e`` under way was given a fusionkit quantizer."""
    return bool(getattr(_QUANTIZER.get(), "fusionkit_quantize_step", False))


def _call_site(m: GraphModule) -> None:
    """What ``prepare_pt2e`` calls: the rules where fusionkit is asked for, stock otherwise."""
    if PATCHES.is_installed() or _by_fusionkit_quantizer():
        fuse_conv_bn_(m)
    else:
        _stock()(m)


def _linear_call_site(m: GraphModule) -> None:
    """What ``prepare_pt2e`` calls next: the linear + batch-norm fold, likewise."""
    if PATCHES.is_installed() or _by_fusionkit_quantizer():
        fuse_linear_bn_(m)
    else:
        _stock("linear")(m)


def _qat_call_site(m: GraphModule) -> GraphModule:
    """What ``prepare_qat_pt2e`` calls: the rules decide where fusionkit is asked for."""
    from fusionkit.backends import quantize_step_qat

    if PATCHES.is_installed() or _by_fusionkit_quantizer():
        return quantize_step_qat.fuse_conv_bn_qat(m)
    result: GraphModule = quantize_step_qat._stock()(m)
    return result


def _with_quantizer(name: str, model: Any, quantizer: Any) -> Any:
    token = _QUANTIZER.set(quantizer)
    try:
        return _STOCK_PREPARE[name](model, quantizer)
    finally:
        _QUANTIZER.reset(token)


def prepare_with(model: Any, quantizer: Any) -> Any:
    """torchao's ``prepare_pt2e(model, quantizer)``, its quantizer named to the call site
    (what ``prepare_pt2e`` runs once :func:`ensure_call_site` put it in place)."""
    return _with_quantizer("prepare_pt2e", model, quantizer)


def prepare_qat_with(model: Any, quantizer: Any) -> Any:
    """torchao's ``prepare_qat_pt2e(model, quantizer)``, its quantizer named to the call
    site (what ``prepare_qat_pt2e`` runs once :func:`ensure_call_site` put it in place)."""
    return _with_quantizer("prepare_qat_pt2e", model, quantizer)


def _prepare_pt2e(model: Any, quantizer: Any) -> Any:  # pragma: no cover - its code is lent
    """The code ``prepare_pt2e``'s function object runs in stock's place: it has stock's
    arguments and no closure, and finds :func:`prepare_with` from torchao's module."""
    return __import__("fusionkit.backends.quantize_step",
                      fromlist=["prepare_with"]).prepare_with(model, quantizer)


def _prepare_qat_pt2e(model: Any, quantizer: Any) -> Any:  # pragma: no cover - lent code
    """The code ``prepare_qat_pt2e``'s function object runs in stock's place."""
    return __import__("fusionkit.backends.quantize_step",
                      fromlist=["prepare_qat_with"]).prepare_qat_with(model, quantizer)


#: copies of stock ``prepare_pt2e`` / ``prepare_qat_pt2e`` (their own code, their module's
#: globals), once replaced
_STOCK_PREPARE: dict[str, Any] = {}
#: the function objects whose code is lent, and the code each runs instead
_LENT = {"prepare_pt2e": _prepare_pt2e, "prepare_qat_pt2e": _prepare_qat_pt2e}


def ensure_call_site() -> None:
    """Put :func:`_call_site` at ``prepare_pt2e``'s fold call (and the QAT call site at
    ``prepare_qat_pt2e``'s rewrite), and :func:`prepare_with` / :func:`prepare_qat_with` in
    those two functions (a fusionkit quantizer was made; a stock quantizer still gets
    stock's code). Each function object itself runs the wrapper (its ``__code__``), so a
    reference bound before -- ``from ... import prepare_pt2e`` in a module or a function --
    names its quantizer too; stock's code runs unchanged inside."""
    module = importlib.import_module(_MODULE)
    for name, site in ((_NAME, _call_site), (_LINEAR_NAME, _linear_call_site),
                       (_QAT_NAME, _qat_call_site)):
        if callable(getattr(module, name, None)) and getattr(module, name) is not site:
            setattr(module, name, site)
    with _LOCK:
        for name, lent in _LENT.items():
            stock: Any = getattr(module, name, None)
            code = getattr(stock, "__code__", None)
            if name in _STOCK_PREPARE or code is None \
                    or code.co_varnames[:2] != ("model", "quantizer") \
                    or code.co_freevars or code.co_argcount != 2:
                continue  # in place already, or not the function this was written against
            _STOCK_PREPARE[name] = types.FunctionType(code, stock.__globals__, stock.__name__,
                                                      stock.__defaults__)
            stock.__code__ = lent.__code__


def _patches() -> list[Patch]:
    module = importlib.import_module(_MODULE)
    if not callable(getattr(module, _NAME, None)):
        from fusionkit.integration.hooks import UnsupportedExecuTorchError

        raise UnsupportedExecuTorchError(
            f"{_MODULE} has no {_NAME}; this torchao does not look like the one this patch "
            "was written against")
    patches: list[Patch] = [(module, _NAME, _call_site)]
    for name, site in ((_LINEAR_NAME, _linear_call_site), (_QAT_NAME, _qat_call_site)):
        if callable(getattr(module, name, None)):  # where this torchao has the call
            patches.append((module, name, site))
    return patches


PATCHES = PatchSet(f"fusionkit.backends.quantize_step ({_MODULE}.{_NAME}: the conv + batch "
                   "norm fold as rules)", _patches)

install = PATCHES.install
uninstall = PATCHES.uninstall
is_installed = PATCHES.is_installed
