"""Phase 1, match: where a rule's op tree is found in a graph, and each match decided.

``finder`` is the phase as one pipeline (:func:`~fusionkit.match.finder.find_matches`);
its stages, called in this order and never calling back: ``targets`` (one key per op:
the rules rooted at each node), ``gates`` (cheap necessary conditions that skip most
searches), ``matcher`` (one pattern at one value, compiled once), ``decide`` (each
candidate searched and decided: accepted, or declined with a reason). ``pattern`` (the
DSL's node classes) and ``memo`` (per-object caches) are what the stages share.
"""
