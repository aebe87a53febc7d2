"""The one phase that has the ExportedProgram: each candidate searched, checked, decided.

``finder`` is the phase as one pipeline (:func:`~fusionkit.find.finder.find_matches`):
the structural matcher (``fusionkit.match``) proposes candidates, the checks
(``fusionkit.check``) and ``executable`` (the replacement built in the probe, its ops
asked of the target) and ``returned_values`` judge them, and ``decide`` turns each into
an accepted :class:`~fusionkit.find.decide.Match` or a declined result with a reason.
"""
