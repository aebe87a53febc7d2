"""Authoring: the tools that help a person write and debug rules.

``from_example`` (rules traced from the eager code they fuse; its jobs in
``example_trace``, ``wildcards``, ``graph_to_pattern``, ``multi_output`` and
``traced_replacement``), ``python_source`` (a rule printed as the DSL code that
builds it), ``near_miss`` (``why_not``: what one rule made of one node),
``vocabulary`` (the one table of value matchers and constraints shared by Python
and YAML).
"""
