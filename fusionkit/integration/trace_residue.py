"""Let go of the last graph torch traced, where a stock pass would have replaced it.

torch keeps ``{id(fake tensor): node}`` of the last graph ``make_fx`` traced in a module
global (``torch.fx.experimental.proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT``):
export's check for leaked fake tensors reads it right after that trace, and the next
trace overwrites it. Until then its nodes keep their graph alive, and the graph every fake
tensor of its metadata. After ``to_edge``'s decompositions that graph is the whole edge
program's.

Stock preprocess passes trace their pattern graphs (XNNPACK's ``ConvertToSDPAPass`` and
``ConvertToUpsampleBilinear2d``, Vulkan's rope patterns in ``FusePatternsPass``), which
overwrites the global on the first partition. fusionkit's rules in their place trace
nothing, so without this the edge graph lives on until the process traces again: through
serialization, the peak of an export (at the end of a 4-layer ``export_llm`` on XNNPACK,
2730 more live nodes than stock's).
"""

from __future__ import annotations

import importlib

__all__ = ["release_last_trace"]

_MODULE = "torch.fx.experimental.proxy_tensor"
_GLOBAL = "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT"


def release_last_trace() -> int:
    """Empty torch's map of the last trace (nothing reads it after that trace's export);
    returns how many nodes it held. A torch without the map: 0, nothing done."""
    try:
        module = importlib.import_module(_MODULE)
    except ImportError:
        return 0
    held = getattr(module, _GLOBAL, None)
    if not isinstance(held, dict):
        return 0
    n = len(held)
    held.clear()
    return n
