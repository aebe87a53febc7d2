"""QAT through XNNPACK's quantizer on the conv + batch-norm zoo (issue 45's checks).

``prepare_qat_pt2e`` with ``get_symmetric_quantization_config(is_qat=True)`` rewrites each
convolution + batch norm into torchao's training subgraph (``_fuse_conv_bn_qat``: the
weight scaled by the batch norm's statistics, fake-quantized, the batch norm kept), and
``convert_pt2e`` folds it (``_fold_conv_bn_qat`` -> ``fold_bn_weights_into_conv_node``).
Under ``install()`` fusionkit's rules decide which pairs are rewritten
(:mod:`fusionkit.backends.quantize_step_qat`); stock rewrites every pair.

* Plain models (every operand a parameter): rewritten on both paths; the QAT-prepared
  model in train mode, after ``move_exported_model_to_eval`` and converted computes within
  fake-quantization tolerance of eager (the QAT start is a copy of the model whose batch
  norms hold their batch's statistics, as training leaves them: see ``_converged``), and
  the ``.pte`` lowered with the XNNPACK partitioner computes the converted model.
* A batch-norm or convolution operand that is a graph input or computed: stock rewrites it
  and ``convert_pt2e``'s fold crashes (``Expected get_attr node, got placeholder`` / ``got
  call_function``) after the training; where the batch norm is ``F.batch_norm(...,
  training=False)`` stock's subgraph also makes it a training batch norm (another model
  than eager). Under ``install()`` the pair is declined with its reason: the model trains,
  converts and runs as eager within tolerance.
* Two convolutions sharing one weight: stock's converted model folds both batch norms into
  the one weight (another model); under ``install()`` both are declined and it converts right.
* The convolution's output read beside the batch norm: not rewritten on either path (its
  output escapes); stock's partitioner lowers the batch norm of a dequantized tensor into a
  wrong program, fusionkit's keeps it on the CPU and the ``.pte`` computes the converted
  model.

The user's module is never written. Default run: one plain model and one graph-input model,
fusionkit's path (about a minute each on a loaded 2-core machine); the whole matrix, both
paths, with ``-m pipeline_full``.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
from conv_batch_norm_zoo import ZooModel, zoo
from torch.utils import _pytree as pytree

from fusionkit.backends import quantize_step_qat, xnnpack_adapter

pytest.importorskip("executorch.extension.pybindings.portable_lib")

ZOO = zoo()
CRASHING = {"bn_weight_input", "mean_input", "bn_weight_computed", "conv_weight_computed"}
#: the batch norm called as F.batch_norm(..., training=False) on a non-constant operand
FUNCTIONAL = {"bn_weight_input", "mean_input", "bn_weight_computed"}
#: the default run: a plain model on fusionkit's path, a graph-input one on both (the whole
#: matrix under -m pipeline_full)
DEFAULT = {("param-conv2d-nobias", "fusionkit"), ("bn_weight_input-conv2d-bias", "fusionkit"),
           ("bn_weight_input-conv2d-bias", "stock")}
CASES = [pytest.param(z, path, id=f"{z.name}-{path}",
                      marks=() if (z.name, path) in DEFAULT else pytest.mark.pipeline_full)
         for z in ZOO for path in ("stock", "fusionkit")]
#: training steps before eval
STEPS = 3


def _leaves(out: object) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _error(a: object, b: object) -> float:
    return max(float((x - y).detach().abs().max())
               for x, y in zip(_leaves(a), _leaves(b), strict=True))


def _converged(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.nn.Module:
    """A copy of ``model`` as QAT leaves it once trained on ``inputs``: each batch-norm
    module's running statistics its input batch's, its momentum 0 (training keeps them), so
    train and eval mode compute the same model and the observers see one range. (Started
    from statistics far from the batch's, forty steps leave the per-channel weight
    observers' moving averages behind the scaled weight, which clamps: 6 to 16 output steps
    off eager, the fake quantization's behaviour, not the fold's.)"""
    model = copy.deepcopy(model).eval()
    seen: dict[torch.nn.Module, torch.Tensor] = {}
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    hooks = [m.register_forward_pre_hook(lambda m, a: seen.setdefault(m, a[0])) for m in bns]
    with torch.no_grad():
        model(*inputs)
    for h in hooks:
        h.remove()
    for m in bns:
        if m not in seen:  # read by F.batch_norm(training=False): its statistics as they are
            continue
        y = seen[m]
        dims = [d for d in range(y.dim()) if d != 1]
        m.running_mean.copy_(y.mean(dims))  # type: ignore[operator]
        # training updates the running variance with the batch's unbiased one: a fixed point
        m.running_var.copy_(y.var(dims, unbiased=True))  # type: ignore[operator]
    return model


def _run_pte(converted: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
             partitioner: Any) -> list[torch.Tensor]:
    import executorch.kernels.quantized  # noqa: F401  (the portable q/dq kernels)
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    lowered = to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                          partitioner=[partitioner])
    pte = lowered.to_executorch().buffer  # held while it runs: the runtime does not copy it
    module = _load_for_executorch_from_buffer(pte)
    out = list(module.forward(inputs))
    del module
    return out


def _qat(z: ZooModel, path: str) -> dict[str, Any]:
    """The QAT flow on ``z`` (``path``: "stock" or "fusionkit", under install()): each
    stage's error against eager, or the stage that raised and its message."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    user, inputs = z.build()
    before = {k: v.clone() for k, v in user.state_dict().items()}
    model = _converged(user, inputs)
    installed = path == "fusionkit"
    out: dict[str, Any] = {}
    was_installed = xnnpack_adapter.is_installed()
    ctx = xnnpack_adapter.install() if installed else contextlib.nullcontext()
    with ctx:
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True))
        gm = torch.export.export(copy.deepcopy(model).train(), inputs).module(check_guards=False)
        prepared = prepare_qat_pt2e(gm, quantizer)  # type: ignore[arg-type]
        out["report"] = prepared.meta.get(quantize_step_qat.META_KEY)
        eager = copy.deepcopy(model).train()  # the reference, trained the same steps
        with torch.no_grad():
            out["train"] = _error(prepared(*inputs), eager(*inputs))
            out["range"] = max(float(t.abs().max()) for t in _leaves(eager(*inputs)))
            for _ in range(STEPS):
                prepared(*inputs), eager(*inputs)
            move_exported_model_to_eval(prepared)
            eager.eval()
            want = eager(*inputs)
            out["eval"] = _error(prepared(*inputs), want)
        try:
            converted = convert_pt2e(prepared)
        except ValueError as e:
            out["raised"] = str(e)
        else:
            with torch.no_grad():
                fake = converted(*inputs)
            out["converted"] = _error(fake, want)
            partitioner = xnnpack_adapter.XnnpackPartitioner() if installed else \
                XnnpackPartitioner()
            try:
                out["pte"] = _error(_run_pte(converted, inputs, partitioner), fake)
            except Exception as e:  # stock's partitioner on a batch norm of an int8 tensor
                out["pte_raised"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    assert xnnpack_adapter.is_installed() == was_installed
    out["unchanged"] = all(torch.equal(before[k], v) for k, v in user.state_dict().items())
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("z", "path"), CASES)
def test_qat_conv_batch_norm(z: ZooModel, path: str) -> None:
    r = _qat(z, path)
    assert r["unchanged"], r
    # int8 of a value range R is within a few steps of R / 127 per tensor quantized; in eval
    # mode and converted, twice that: the per-tensor weight's fake quantization is no longer
    # absorbed by the batch's statistics (measured: 4.9 steps on conv1d, 9 products an output)
    tolerance = 4 * r["range"] / 127
    if path == "fusionkit":
        report = r["report"]
        if z.mode == "param":
            assert len(report.folded) == 1 and not report.declined, report
        else:  # declined, each batch norm with its reason, and nothing rewritten
            steps = {"shared": "custom:weight_not_shared", "conv_read_twice": "escape"}
            assert not report.folded and report.declined, report
            assert {d.step for d in report.declined} == {
                steps.get(z.mode, "custom:operands_constant")}, report
    else:
        assert r["report"] is None, r  # stock's code: no report
    if z.mode in FUNCTIONAL and path == "stock":
        # stock's _fuse_conv_bn_qat rewrites the F.batch_norm(training=False) into a training
        # batch norm: the prepared model normalizes by the batch's statistics, not the ones
        # it was given (measured 1.39 off eager on bn_weight_input conv2d, range 2.4)
        assert r["train"] > 2 * tolerance, r
    else:
        assert r["train"] <= tolerance, r
        assert r["eval"] <= 2 * tolerance, r
    if z.mode in CRASHING and path == "stock":  # QAT's own fold, at convert: stock's crash
        assert "raised" in r and "Expected get_attr node, got" in r["raised"], r
        return
    assert "raised" not in r, r
    if z.mode == "shared" and path == "stock":  # both batch norms folded into the one weight
        assert r["converted"] > 10 * tolerance, r
    else:
        assert r["converted"] <= 2 * tolerance, r
    if z.mode == "conv_read_twice" and path == "stock":
        # the batch norm of a dequantized tensor, delegated by stock's partitioner: a wrong
        # program (measured: 4.3 off on conv2d) or a lowering / run-time error
        assert "pte_raised" in r or r["pte"] > 5 * tolerance, r
    else:
        # within two output steps of the converted model (measured: 0 on the plain models,
        # 0.02 on the shared conv2d one, range 2.95)
        assert "pte_raised" not in r and r["pte"] <= 2 * r["range"] / 127, r
