"""The quantize step's conv + batch-norm fold as rules (``fusionkit.backends.quantize_step``).

On the generated zoo of ``tests/conv_batch_norm_zoo.py`` (21 models: conv1d / conv2d /
transposed conv2d, with and without a bias, the fold's operands parameters, graph inputs,
computed, shared between two convolutions, or the convolution read twice), through
``prepare_pt2e`` + ``convert_pt2e`` with XNNPACK's quantizer:

* stock crashes on every model whose batch norm or convolution reads a graph input or a
  computed value (``Expected get_attr node, got placeholder`` / ``got call_function``), and
  on the shared-weight and read-twice models it quantizes a model that is not the eager one;
* with ``xnnpack_adapter.install()`` every model quantizes, the fake-quantized model within
  quantization tolerance of eager, each declined batch norm with its reason;
* on the plain models the prepared graph's folded weights and biases are stock's, bit for bit;
* the user's module is never written.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conv_batch_norm_zoo import ZooModel, zoo

from fusionkit.backends import quantize_step, xnnpack_adapter

CRASHING = {"bn_weight_input", "mean_input", "bn_weight_computed", "conv_weight_computed"}
ZOO = zoo()
#: the default run: every operand mode once, the three convolution kinds in turn; the
#: whole zoo (every mode x kind) with -m pipeline_full
KINDS = ("conv1d", "conv2d", "conv_transpose2d")
_MODES = list(dict.fromkeys(z.mode for z in ZOO))
DEFAULT = {z.name for z in ZOO if KINDS.index(z.kind) == _MODES.index(z.mode) % 3}
CASES = [pytest.param(z, id=z.name, marks=() if z.name in DEFAULT else pytest.mark.pipeline_full)
         for z in ZOO]


def _quantizer() -> object:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


def _prepare(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    gm = torch.export.export(model, inputs).module(check_guards=False)
    return prepare_pt2e(gm, _quantizer())  # type: ignore[arg-type]


def _leaves(out: object) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else list(out)  # type: ignore[arg-type]


def _error(a: object, b: object) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(_leaves(a), _leaves(b), strict=True))


def _quantize(z: ZooModel) -> dict[str, object]:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    model, inputs = z.build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        eager = model(*inputs)
    out: dict[str, object] = {}
    try:
        stock = _prepare(model, inputs)
        stock(*inputs)
        out["stock_error"] = _error(convert_pt2e(stock)(*inputs), eager)
    except ValueError as e:
        out["stock_raised"] = str(e)
    with xnnpack_adapter.install():
        prepared = _prepare(model, inputs)
    out["report"] = prepared.meta[quantize_step.META_KEY]
    prepared(*inputs)
    out["error"] = _error(convert_pt2e(prepared)(*inputs), eager)
    out["eager_range"] = max(float(t.abs().max()) for t in _leaves(eager))
    out["unchanged"] = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    return out


@pytest.mark.parametrize("z", CASES)
def test_stock_fails_fusionkit_quantizes(z: ZooModel) -> None:
    r = _quantize(z)
    # int8 of a value range R is within a few steps of R / 127 per tensor quantized
    tolerance = 4 * float(r["eager_range"]) / 127  # type: ignore[arg-type]
    assert float(r["error"]) <= tolerance, r  # type: ignore[arg-type]
    assert r["unchanged"]
    report = r["report"]
    assert isinstance(report, quantize_step.FoldReport)
    if z.mode in CRASHING:
        assert "Expected get_attr node, got" in str(r["stock_raised"])
        assert not report.folded and report.declined
        assert all("not a constant" in d.reason for d in report.declined), report
    elif z.mode == "param":
        assert "stock_error" in r and len(report.folded) == 1 and not report.declined
    else:  # shared, conv_read_twice: stock quantizes another model than the eager one
        assert float(r["stock_error"]) > 5 * tolerance, r  # type: ignore[arg-type]
        why = "weight_not_shared" if z.mode == "shared" else "also used by"
        assert report.declined and any(why in d.step or why in d.reason
                                       for d in report.declined), report


def _conv_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """Each convolution's weight and bias tensors, in graph order (through observers)."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and "conv" in str(n.target):
            for arg in n.args[1:3]:
                while isinstance(arg, torch.fx.Node) and arg.op == "call_module":
                    arg = arg.args[0]
                assert isinstance(arg, torch.fx.Node) and arg.op == "get_attr"
                out.append(gm.get_parameter(arg.target) if "." in arg.target or hasattr(
                    gm, arg.target) else None)
    return out


@pytest.mark.parametrize("z", [z for z in ZOO if z.mode == "param"], ids=lambda z: z.name)
def test_plain_models_fold_as_stock_bit_for_bit(z: ZooModel) -> None:
    model, inputs = z.build()
    stock = _prepare(copy.deepcopy(model), inputs)
    with quantize_step.install():
        ours = _prepare(copy.deepcopy(model), inputs)
    got, want = _conv_constants(ours), _conv_constants(stock)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_stock_quantizer_untouched_without_install() -> None:
    """A stock quantizer, nothing installed: stock's fold (and its crash)."""
    z = next(z for z in ZOO if z.mode == "bn_weight_input")
    model, inputs = z.build()
    assert not quantize_step.is_installed()
    with pytest.raises(ValueError, match="Expected get_attr node, got placeholder"):
        _prepare(model, inputs)


def test_fusionkit_arm_quantizer_folds_with_the_rules() -> None:
    """fusionkit's TOSAQuantizer, nothing installed: prepare_pt2e folds with the rules."""
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from fusionkit.backends.arm_adapter.quantizer import TOSAQuantizer

    z = next(z for z in ZOO if z.mode == "mean_input")
    model, inputs = z.build()
    q = TOSAQuantizer(TosaCompileSpec("TOSA-1.0+INT"))
    q.set_global(get_symmetric_quantization_config())
    gm = torch.export.export(model, inputs).module(check_guards=False)
    prepared = prepare_pt2e(gm, q)
    report = prepared.meta[quantize_step.META_KEY]
    assert report.declined and "user input" in report.declined[0].reason


def test_a_module_with_exports_guard_call_folds() -> None:
    """``torch.export``'s ``.module()`` (guards checked, the default) holds a
    ``call_module`` node the lifted program's verifier refuses: the fold still reads the
    graph, folds, and keeps the guard call where export put it."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    z = next(m for m in ZOO if m.name.startswith("param-conv2d"))
    model, inputs = z.build()
    gm = torch.export.export(model, inputs).module()
    guards = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    with xnnpack_adapter.install():
        prepared = prepare_pt2e(gm, _quantizer())  # type: ignore[arg-type]
    report = prepared.meta[quantize_step.META_KEY]
    assert len(report.folded) == 1 and not report.declined, report
    assert guards and set(guards) <= {n.target for n in prepared.graph.nodes
                                      if n.op == "call_module"}
