"""The media driver: reliable UDP unicast, UDP multi-destination-cast, shared-memory IPC, counters.

Nothing here imports from ``archive`` or ``cluster_node`` (``tests/test_layering.py``).
"""
