"""Cluster clients: :class:`ClusterClient` (trio) and :class:`BlockingClusterClient` (threads)."""

from cluster_node.client.blocking import BlockingClusterClient
from cluster_node.client.cluster_client import ClusterClient, open_cluster_client
from cluster_node.client.credentials import NullCredentialsSupplier, SharedSecretCredentials
from cluster_node.client.errors import (
    AuthenticationError,
    ClientClosedError,
    ClusterClientError,
    ClusterRejectedError,
    ConnectTimeoutError,
    ServiceRequestError,
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
