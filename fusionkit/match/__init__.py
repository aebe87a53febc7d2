"""Phase 1, match: where a rule's op tree is found in a graph.

``pattern`` (the DSL's node classes), ``targets`` (one key per op), ``matcher``
(one pattern at one value, compiled once), ``gates`` (cheap necessary conditions
that skip most searches), ``memo`` (per-object caches), ``finder`` (every rule at
every node, each match decided in one phase: accepted or declined with a reason).
"""
