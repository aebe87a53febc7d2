"""One ExecuTorch XNNPACK op test, seeded, stock or with fusionkit: what each lowering gives.

``python3 tests/xnnpack_ops_seed_probe.py MODE SEED FILE::CLASS::TEST OUT.json [--warm]`` seeds
``random`` and ``torch`` with ``SEED``, installs fusionkit's XNNPACK adapter when ``MODE``
is ``fusionkit``, and runs the test method with the harness's ``Tester`` instrumented: for
each ``run_method_and_compare_outputs`` it records the sha256 of the serialized ``.pte``,
of the torch and Python RNG states before the random inputs are drawn, of those inputs, and
the max abs error against eager with the harness's pass/fail (a failure does not stop the
test here, so every configuration is seen). Two runs, stock and fusionkit, with the same
seed: the same ``.pte`` hashes mean the program is the same; equal RNG hashes mean the
same inputs are drawn. ``--warm`` lowers one module stock before seeding (see
:func:`_warm`): without it the two modes draw differently after the first lowering.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pickle
import random
import sys
from pathlib import Path
from typing import Any

import torch


def _h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _warm() -> None:
    """One stock lowering: ConvertToUpsampleBilinear2d and ConvertToSDPAPass trace their
    pattern graphs on the first preprocess of a process, drawing from the global torch RNG
    (cached after; fusionkit's takeover runs neither), so after this both modes draw alike."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(torch.nn.Linear(4, 5).eval(), (torch.randn(2, 4),))
    to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()


def main(mode: str, seed: int, nodeid: str, out: Path, warm: bool = False) -> None:
    from executorch.backends.test.harness import tester as harness
    from executorch.backends.test.harness.stages import StageType

    if warm:  # stock's pattern graphs traced (and the torch RNG drawn) before the seed
        _warm()
    if mode == "fusionkit":
        from fusionkit.backends import xnnpack_adapter

        xnnpack_adapter.install()
    records: list[dict[str, Any]] = []
    T = harness.Tester
    orig_run = T.run_method_and_compare_outputs
    orig_inputs = T.generate_random_inputs
    orig_assert = T._assert_outputs_equal

    def run_and_compare(self: Any, *args: Any, **kwargs: Any) -> Any:
        records.append({"pte": _h(self.stages[StageType.SERIALIZE].artifact),
                        "torch_rng": _h(torch.get_rng_state().numpy().tobytes()),
                        "py_rng": _h(pickle.dumps(random.getstate())), "errors": []})
        return orig_run(self, *args, **kwargs)

    def inputs(self: Any) -> Any:
        for tup in orig_inputs(self):
            records[-1]["inputs"] = _h(b"".join(t.contiguous().numpy().tobytes() for t in tup))
            records[-1]["input_shapes"] = [list(t.shape) for t in tup]
            yield tup

    def assert_equal(model_output: Any, ref_output: Any, atol: float = 1e-3,
                     rtol: float = 1e-3, statistics_callback: Any = None) -> None:
        err = max(float((m.float() - r.float()).abs().max()) for m, r in
                  zip(model_output, ref_output, strict=True))
        try:
            orig_assert(model_output, ref_output, atol=atol, rtol=rtol,
                        statistics_callback=statistics_callback)
            ok = True
        except AssertionError:
            ok = False
        records[-1]["errors"].append({"max_abs": err, "atol": atol, "passed": ok})

    T.run_method_and_compare_outputs = run_and_compare  # type: ignore[method-assign]
    T.generate_random_inputs = inputs  # type: ignore[method-assign]
    T._assert_outputs_equal = staticmethod(assert_equal)  # type: ignore[method-assign,assignment]
    file, cls, test = nodeid.split("::")
    module = importlib.import_module(
        "executorch.backends.xnnpack.test.ops." + file.removesuffix(".py"))
    case = getattr(module, cls)(test)
    random.seed(seed)
    torch.manual_seed(seed)
    getattr(case, test)()
    out.write_text(json.dumps({"mode": mode, "seed": seed, "warm": warm, "test": nodeid,
                               "lowerings": records}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]),
         warm="--warm" in sys.argv[5:])
