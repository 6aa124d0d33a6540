"""The archive: records streams to segment files, replays and replicates them.

Imports from ``media`` only, never from ``cluster_node`` (``tests/test_layering.py``).
"""
