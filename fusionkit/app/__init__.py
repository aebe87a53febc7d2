"""The application on top of the library: the ``fusionkit`` command and its jobs.

* :mod:`.cli` — the command line (``fusionkit lower|explain|check|simulate|specs|schema|demo``);
* :mod:`.present` — tables and JSON of matches and reports;
* :mod:`.lowering` — ``explain`` and ``lower`` through an adapter;
* :mod:`.model_loader` — the CLI's MODEL argument (a ``.pt2`` or ``module:factory``);
* :mod:`.demo_model`, :mod:`.demo_job` — the built-in demo model and the main job;
* :mod:`.simulate_job` — ``fusionkit simulate``: lower for Vulkan, simulate, compare with eager;
* :mod:`.runtime` — run a ``.pte`` with ExecuTorch's portable runtime;
* :mod:`.term` — terminal styling.
"""
