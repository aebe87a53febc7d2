"""Peak resident memory of one lowering, in this (fresh) process: ``python -m benchmarks.peak_memory
BACKEND stock|adapter LAYERS`` prints one JSON line.

The baseline is taken after the imports and the model are ready; the kernel's
high-water mark (VmHWM) is then reset (``/proc/self/clear_refs``), the model is
exported, lowered and serialized, and the new high-water mark is read: the
difference is what the lowering itself needed at its peak. Linux only.
"""

from __future__ import annotations

import json
import logging
import sys
import warnings


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def main(argv: list[str]) -> int:
    backend, label, layers = argv[0], argv[1], int(argv[2])
    warnings.simplefilter("ignore")
    logging.disable(logging.INFO)
    import gc

    import torch
    from executorch.exir import to_edge_transform_and_lower

    from benchmarks.harness import load_adapter, stock_partitioner
    from benchmarks.models import TinyLlama

    adapter, _ = load_adapter(backend)
    torch.manual_seed(0)
    model = TinyLlama(layers).eval()
    example = (torch.randn(1, 8, 64),)
    if label == "stock":
        passes, part = None, stock_partitioner(backend)
    else:
        assert adapter is not None
        passes, part = adapter.passes(), adapter.partitioner()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _status_kib("VmRSS")
    ep = torch.export.export(model, example)
    edge = to_edge_transform_and_lower(ep, transform_passes=passes, partitioner=[part])
    pte = edge.to_executorch().buffer
    peak = _status_kib("VmHWM")
    print(json.dumps({"backend": backend, "path": label, "layers": layers,
                      "baseline_kib": base, "peak_kib": peak, "peak_delta_kib": peak - base,
                      "pte_bytes": len(pte)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
