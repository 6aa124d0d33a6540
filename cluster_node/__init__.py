"""The cluster node: what a service author and a client application import.

Write a service by subclassing :class:`ClusteredService` (its callbacks get a :class:`Cluster`
handle and :class:`ClientSession` s); talk to a cluster with :func:`open_cluster_client` (trio)
or :class:`BlockingClusterClient` (threads), configured by :func:`load_client_config`::

    from cluster_node import ClusteredService, BlockingClusterClient, load_client_config

Everything else (the consensus module, the archive, the media driver, the CLI) is the node's own
machinery, imported from its modules by the node itself.

The names are looked up when first used (a module ``__getattr__``), so ``import cluster_node``
imports none of them: a service module that names only ``ClusteredService`` does not start
loading trio, the media driver and the client, and a client script does not load the service
container.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms at every start)

__version__ = "0.1.0"

_HOMES: dict[str, str] = {
    # writing a service
    "ClusteredService": "cluster_node.service.api",
    "Cluster": "cluster_node.service.api",
    "ClientSession": "cluster_node.service.api",
    "Role": "cluster_node.service.api",
    "SnapshotWriter": "cluster_node.service.api",
    "SnapshotReader": "cluster_node.service.api",
    "CloseReason": "cluster_node.service.api",
    "ClusterTimeUnit": "cluster_node.service.api",
    # using a cluster
    "open_cluster_client": "cluster_node.client.cluster_client",
    "ClusterClient": "cluster_node.client.cluster_client",
    "BlockingClusterClient": "cluster_node.client.blocking",
    "NullCredentialsSupplier": "cluster_node.client.credentials",
    "SharedSecretCredentials": "cluster_node.client.credentials",
    "ClusterClientError": "cluster_node.client.errors",
    "ConnectTimeoutError": "cluster_node.client.errors",
    "ClusterRejectedError": "cluster_node.client.errors",
    "AuthenticationError": "cluster_node.client.errors",
    "ClientClosedError": "cluster_node.client.errors",
    "ServiceRequestError": "cluster_node.client.errors",
    # configuration
    "load_client_config": "cluster_node.config_loading",
    "load_node_config": "cluster_node.config_loading",
    "ClientConfig": "cluster_node.config",
    "NodeConfig": "cluster_node.config",
    "ConfigError": "cluster_node.config",
    # supervising a node
    "ExitCode": "cluster_node.exit_codes",
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:  # what a type checker and an IDE see; at run time __getattr__ imports them
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
    from cluster_node.config import ClientConfig, ConfigError, NodeConfig
    from cluster_node.config_loading import load_client_config, load_node_config
    from cluster_node.exit_codes import ExitCode
    from cluster_node.service.api import (
        ClientSession,
        CloseReason,
        Cluster,
        ClusteredService,
        ClusterTimeUnit,
        Role,
        SnapshotReader,
        SnapshotWriter,
    )


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        # Not ours: AttributeError lets ``from cluster_node import codecs`` import the submodule.
        raise AttributeError(f"module 'cluster_node' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
