"""The cluster node: consensus module, clustered service, client and the ``cluster-node`` CLI."""

__version__ = "0.1.0"
