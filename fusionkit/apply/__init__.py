"""Apply: accepted matches become replacements, all or nothing.

``rewrite`` (the apply step: each accepted match built with the graph-editing layer,
``fusionkit.edit``, rolled back on failure) and ``gate`` (which matches may apply:
``fusionkit bisect`` narrows them). Above the phase that finds matches.
"""
