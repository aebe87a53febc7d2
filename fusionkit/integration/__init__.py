"""ExecuTorch plumbing shared by the adapters (not part of the rule-authoring API).

* :mod:`.hooks` — :class:`~.hooks.PatchSet`: explicit, reversible, version-checked patches;
* :mod:`.tensor_bytes` — the exact bytes of a tensor, views and int4 packing included;
* :mod:`.compact_constants` — give every view constant a compact storage of its own.
"""
