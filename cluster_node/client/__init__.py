"""Cluster clients: :class:`ClusterClient` (trio) and :class:`BlockingClusterClient` (threads)."""

from cluster_node.client.blocking import BlockingClusterClient
from cluster_node.client.cluster_client import (
    AuthenticationError,
    ClientClosedError,
    ClusterClient,
    ClusterClientError,
    ClusterRejectedError,
    ConnectTimeoutError,
    NullCredentialsSupplier,
    ServiceRequestError,
    SharedSecretCredentials,
    open_cluster_client,
)

__all__ = [
    "AuthenticationError",
    "BlockingClusterClient",
    "ClientClosedError",
    "ClusterClient",
    "ClusterClientError",
    "ClusterRejectedError",
    "ConnectTimeoutError",
    "NullCredentialsSupplier",
    "ServiceRequestError",
    "SharedSecretCredentials",
    "open_cluster_client",
]
