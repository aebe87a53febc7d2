"""Structural matching: where a rule's op tree is found in a graph.

``pattern`` (the DSL's node classes), ``matcher`` (one pattern at one value, compiled
once), ``gates`` (cheap necessary conditions that skip most searches),
``required_ops`` (the ops a pattern cannot match without), ``shape_guards`` and
``memo`` (per-object caches). The bottom layer above the ground modules: it knows
graphs and patterns, not rules, checks or edits.
"""
