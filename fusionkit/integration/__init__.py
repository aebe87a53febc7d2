"""ExecuTorch plumbing shared by the adapters (not part of the rule-authoring API).

* :mod:`.hooks` — :class:`~.hooks.PatchSet`: explicit, reversible, version-checked patches;
* :mod:`.tensor_bytes` — the exact bytes of a tensor, views and int4 packing included;
* :mod:`.compact_constants` — give every view constant a compact storage of its own;
* :mod:`.scoped`, :mod:`.pass_gating`, :mod:`.preprocess_takeover` — inside a backend's
  preprocess: hooks for a fusionkit partitioner's partitions only, stock passes skipped
  when they have nothing to do, stock passes run as rules (per-thread switches and counts:
  :mod:`.preprocess_state`);
* :mod:`.trace_residue` — let go of torch's last traced graph where a stock pass taken over
  would have.

The byte-level names are re-exported here (loaded on first use): they are what a
backend's serializer needs, not what a rule author writes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: name -> defining module
EXPORTS: dict[str, str] = {
    "CompactConstantsPass": "fusionkit.integration.compact_constants",
    "compact_tensor": "fusionkit.integration.compact_constants",
    "tensor_bytes": "fusionkit.integration.tensor_bytes",
    "pack_int4": "fusionkit.integration.tensor_bytes",
}

__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fusionkit.integration' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from fusionkit.integration.compact_constants import CompactConstantsPass as CompactConstantsPass
    from fusionkit.integration.compact_constants import compact_tensor as compact_tensor
    from fusionkit.integration.tensor_bytes import pack_int4 as pack_int4
    from fusionkit.integration.tensor_bytes import tensor_bytes as tensor_bytes
