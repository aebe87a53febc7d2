"""Section 8: lowering to Arm TOSA, stock ``TOSAPartitioner`` against the adapter's.

Small models (a conv+BN+relu net, a conv/hardtanh/relu net, a small MLP with clamps) are
lowered with ``to_edge_transform_and_lower`` through ExecuTorch's ``TOSAPartitioner`` and
through ``fusionkit.backends.arm_adapter.TOSAPartitioner`` (whose TOSA preprocess runs the
adapter's rules in the taken-over passes' place), in float (``TOSA-1.0+FP``) and int8
(``TOSA-1.0+INT``: the model quantized with Arm's quantizer first, untimed). Only the
lowering is timed (process CPU time); each lowering gets a freshly exported program
(exported untimed). One warm-up lowering per path and profile, then ``pairs`` interleaved
stock/adapter pairs per model, pair ``i`` of the ``m``-th model running stock first when
``i + m`` is even. Per model: the medians, the ratio fusionkit/stock (below 1: the adapter
is faster), each pair's ratio; per profile: the sums. What each path produced is kept
beside the times: the TOSA delegates, their flatbuffers' sizes and whether the two paths'
flatbuffers are byte-identical.

``python -m benchmarks --sections 8`` (``--quick``: one pair, float only);
``python -m benchmarks.arm_lowering [--quick] [--json PATH]`` runs it alone.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: float and integer TOSA profiles (the reference model's names)
FP = "TOSA-1.0+FP"
INT = "TOSA-1.0+INT"


class ConvBnRelu(torch.nn.Module):
    """conv -> batch norm -> relu, twice (FuseBatchNorm2dPass, conv+relu)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        for bn in (self.b1, self.b2):
            mean, var = bn.running_mean, bn.running_var
            assert mean is not None and var is not None  # track_running_stats
            mean.uniform_(-0.5, 0.5)
            var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(x)))


class ConvClamps(torch.nn.Module):
    """conv -> hardtanh -> relu (two clamps: FuseConsecutiveClampsPass), twice."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3)
        self.c2 = torch.nn.Conv2d(8, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(torch.nn.functional.hardtanh(self.c1(x), -1.0, 2.0))
        return torch.relu(torch.nn.functional.hardtanh(self.c2(x), -0.5, 1.0))


class MlpClamps(torch.nn.Module):
    """linear -> clamp -> clamp -> linear -> hardtanh(0, 1) -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = (torch.nn.Linear(16, 32), torch.nn.Linear(32, 32),
                                     torch.nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.clamp(torch.clamp(self.l1(x), -2.0, 3.0), min=-1.0, max=1.5)
        x = torch.nn.functional.hardtanh(self.l2(x), 0.0, 1.0)
        return self.l3(x)


#: name -> (factory, input shape)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...]]] = {
    "conv_bn_relu": (ConvBnRelu, (1, 3, 16, 16)),
    "conv_hardtanh_relu": (ConvClamps, (1, 3, 16, 16)),
    "mlp_clamps": (MlpClamps, (4, 16)),
}


def _prepare(name: str, spec: str) -> tuple[Callable[[], Any], tuple[Any, ...]]:
    """A function giving a fresh ``ExportedProgram`` of the model (quantized for INT)."""
    from fusionkit.backends.arm_adapter import reference_model as rm

    factory, shape = MODELS[name]
    torch.manual_seed(0)
    module = factory().eval()
    inputs = (torch.randn(*shape),)
    model: torch.nn.Module = rm.fake_quantized(module, inputs, spec) if "INT" in spec else module

    def export() -> Any:
        return torch.export.export(copy.deepcopy(model), inputs)

    return export, inputs


def _lower(export: Callable[[], Any], inputs: tuple[Any, ...], spec: str,
           fusionkit: bool) -> tuple[float, list[bytes]]:
    """One lowering of a freshly exported program: its CPU time and TOSA flatbuffers."""
    from fusionkit.backends.arm_adapter import reference_model as rm

    ep = export()
    gc.collect()
    t0 = time.process_time()
    edge = rm.lower(ep, inputs, fusionkit=fusionkit, spec=spec)
    dt = time.process_time() - t0
    return dt, rm.tosa_flatbuffers(edge)


def _digest(blobs: Sequence[bytes]) -> str:
    return hashlib.sha256(b"".join(blobs)).hexdigest()[:12]


def measure(specs: Sequence[str], pairs: int, models: Sequence[str] | None = None,
            warmup: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every model lowered ``pairs`` times per path and profile, interleaved."""
    names = list(models or MODELS)
    out: dict[str, Any] = {"pairs": pairs, "models": names, "specs": {}}
    for spec in specs:
        prepared = {n: _prepare(n, spec) for n in names}
        if warmup:  # imports, the Arm pass manager's first construction: untimed
            for adapter in (False, True):
                _lower(*prepared[names[0]], spec, adapter)
        rows: dict[str, Any] = {}
        for m, name in enumerate(names):
            times: dict[str, list[float]] = {"stock": [], "fusionkit": []}
            blobs: dict[str, list[bytes]] = {}
            pair_ratios = []
            for i in range(pairs):
                order = ("stock", "fusionkit") if (i + m) % 2 == 0 else ("fusionkit", "stock")
                got = {}
                for path in order:
                    dt, tosa = _lower(*prepared[name], spec, path == "fusionkit")
                    times[path].append(dt)
                    blobs.setdefault(path, tosa)
                    got[path] = dt
                pair_ratios.append(got["fusionkit"] / got["stock"])
            st, fk = statistics.median(times["stock"]), statistics.median(times["fusionkit"])
            rows[name] = {
                "stock_s": st, "fusionkit_s": fk, "ratio": fk / st,
                "stock_s_all": times["stock"], "fusionkit_s_all": times["fusionkit"],
                "pair_ratios": pair_ratios,
                "delegates": {p: len(b) for p, b in blobs.items()},
                "tosa_bytes": {p: sum(map(len, b)) for p, b in blobs.items()},
                "tosa_sha256_12": {p: _digest(b) for p, b in blobs.items()},
                "byte_identical": blobs["stock"] == blobs["fusionkit"],
            }
            if log:
                log(f"  ... {spec} {name} done")
        sum_st = sum(r["stock_s"] for r in rows.values())
        sum_fk = sum(r["fusionkit_s"] for r in rows.values())
        out["specs"][spec] = {"models": rows, "sum_stock_s": sum_st, "sum_fusionkit_s": sum_fk,
                              "ratio": sum_fk / sum_st}
    return out


def section(quick: bool, results: dict[str, Any], targets: Any) -> dict[str, Any]:
    from benchmarks.output import fmt_ms, fmt_ratio, fmt_spread, fmt_table

    print("\n== 8. lowering to Arm TOSA: stock TOSAPartitioner vs the adapter's ==")
    specs, pairs = ((FP,), 1) if quick else ((FP, INT), 6)
    out = measure(specs, pairs, log=lambda s: print(s, file=sys.stderr, flush=True))
    results["arm_lowering"] = out
    for spec, r in out["specs"].items():
        rows = []
        for name, m in r["models"].items():
            rows.append([name, fmt_ms(m["stock_s"]), fmt_ms(m["fusionkit_s"]),
                         fmt_ratio(m["ratio"]), fmt_spread(m["pair_ratios"]),
                         f"{m['delegates']['stock']}/{m['delegates']['fusionkit']}",
                         f"{m['tosa_bytes']['stock']}/{m['tosa_bytes']['fusionkit']}",
                         "yes" if m["byte_identical"] else "no"])
        rows.append(["sum", fmt_ms(r["sum_stock_s"]), fmt_ms(r["sum_fusionkit_s"]),
                     fmt_ratio(r["ratio"]), "", "", "", ""])
        print(f"  {spec}")
        print(fmt_table(rows, ["model", "stock ms", "fusionkit ms", "fk/stock", "pairs min-max",
                               "delegates st/fk", "TOSA bytes st/fk", "identical"]))
    print(f"  to_edge_transform_and_lower of a freshly exported program (export and, for INT, "
          f"quantization untimed); CPU time; medians of {pairs} interleaved pair(s) per model "
          "after one warm-up lowering per path; fk/stock below 1: the adapter is faster. "
          "identical: the TOSA flatbuffers of both paths are byte-identical.")
    judged = not quick
    worst = max(r["ratio"] for r in out["specs"].values())
    targets.add("Arm lowering no slower than stock (sum fusionkit/stock <= 1.0)",
                None if not judged else worst <= 1.0,
                ("--quick: float only, 1 pair; " if not judged else "")
                + ", ".join(f"{spec} {fmt_ratio(r['ratio'])} ({fmt_ms(r['sum_fusionkit_s'])} vs "
                            f"{fmt_ms(r['sum_stock_s'])} ms)" for spec, r in out["specs"].items()))
    return out


def main(argv: Sequence[str]) -> int:
    import argparse
    import logging
    import warnings

    from benchmarks.output import Targets

    ap = argparse.ArgumentParser(prog="python -m benchmarks.arm_lowering", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="float only, one pair")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.INFO)
    targets = Targets()
    results: dict[str, Any] = {}
    section(args.quick, results, targets)
    print()
    print(targets.render())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
