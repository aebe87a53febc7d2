"""Graph editing: how a replacement is built, under the probe and for real.

``builder`` (:class:`~fusionkit.edit.builder.Rewriter`, the replacement author's API),
``probe`` (the same replacement built in a scratch graph, so a check can see what it
would emit without changing the program), ``meta_cache`` (fake-tensor metadata of new
nodes), ``journal`` (the undo log behind per-match rollback), ``lazy_code`` (regenerate
a graph's code on first use). Below the one phase that finds matches, which builds
replacements in the probe; above the checks and the structural matcher.
"""
