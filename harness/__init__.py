"""Real-process harnesses shared by the tests and the benchmark scripts: a cluster of
``cluster-node run`` processes on loopback (``cluster``), members in network namespaces of their
own (``netns``), process CPU accounting (``procs``), synthetic archives (``synthetic_archive``)
and a ``cluster-node backup`` process (``backup``).

Not part of the installed package: it lives beside ``tests/`` so that ``scripts/`` need import
nothing from ``tests/``; ``tests.support`` keeps the old names as aliases of these modules.
"""
