"""Phase 3, apply: accepted matches become replacements, all or nothing.

``builder`` (:class:`~fusionkit.apply.builder.Rewriter`, the replacement author's
API), ``rewrite`` (the apply step), ``journal`` (the undo log behind per-match
rollback), ``meta_cache`` (fake-tensor metadata of new nodes), ``lazy_code``
(regenerate a graph's code on first use).
"""
