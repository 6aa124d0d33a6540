"""Node and client configuration: TOML files -> validated, frozen config structs.

A node reads one TOML file (``configs/node0.toml``); a client reads ``configs/client.toml``. Every
value has the reference system's (Aeron Cluster's) default, so a file needs only what differs
(docs/architecture.md lists the departures). Loading is strict because a typo in a timeout is a
silent outage later:

* an unknown key is an error naming the key (with the closest known key as a hint);
* endpoints must be ``host:port``; two endpoints of the cluster (or of the client) on the same
  port of the same host are a clash;
* timeouts that contradict each other are errors (a heartbeat interval that is not shorter than
  the heartbeat timeout would make every follower start elections);
* every error is one line, ``<file>: <key>: <what is wrong>``, raised as :class:`ConfigError`, so
  the CLI can print it and exit non-zero.

Units
=====
Durations live in the structs as integer nanoseconds, fields ending in ``_ns``. In TOML either
form is accepted for such a field (not both)::

    election_timeout = "1s"                 # a string with a unit: ns, us, ms, s, min, h
    election_timeout_ns = 1_000_000_000     # an integer of nanoseconds

Sizes (term lengths, segment length, MTU, socket buffers) are integers of bytes or strings with a
binary suffix: ``"64k"``, ``"16m"``, ``"1g"`` (also ``"64KiB"``, ``"16MB"``: always powers of 1024).

Node file
=========
::

    [node]
    member_id = 0
    dir = "var/cluster/node0"        # relative paths are relative to the working directory
    service = "kv"                   # "echo", "kv", or "package.module:ClassName"
    service_errors = "record"        # or "stop": when a service callback raises applying an
                                     # entry (cluster_node.service.errors, docs/operations.md)
    leader_cpus = [0]                # optional, Linux: CPUs while leading (members sharing
    follower_cpus = [1]              # a machine; see cluster_node.affinity), and otherwise
    keep_cpus_awake = false          # optional, Linux: spin those CPUs (idle class) while the
                                     # log moves; see cluster_node.keep_awake

    [cluster]
    # The reference's member format (ClusterMember.parse), members separated by "|":
    #   id,ingress,consensus,log,catchup,archive
    members = "0,127.0.0.1:20110,127.0.0.1:20220,127.0.0.1:20330,127.0.0.1:0,127.0.0.1:8010|1,..."
    # ... or one table per member:
    # [[cluster.members]]
    # id = 0
    # ingress = "127.0.0.1:20110"  (and consensus, log, catchup, archive)
    appointed_leader_id = -1

    [timeouts]      election_timeout, leader_heartbeat_timeout, session_timeout, ...
    [driver]        dir, mtu, term_length, ipc_term_length, liveness and status timeouts
    [archive]       dir, segment_length, file_sync_level, frame_checksums, control stream ids
    [logging]       level, mode, file, max_file_bytes, max_files (rotation by size)

The catchup endpoint may use port 0 (an ephemeral port, as in the reference's examples); every
other endpoint needs a fixed port.

Client file
===========
::

    [client]
    ingress_endpoints = "0=127.0.0.1:20110,1=127.0.0.1:20111,2=127.0.0.1:20112"
    egress_endpoint = "127.0.0.1:0"     # port 0: pick a free port at connect time
    connect_timeout = "10s"             # the whole connect, elections included
    message_timeout = "1s"              # a connect request unanswered this long is sent again
    keep_alive_interval = "1s"
    leader_silence_timeout = "10s"

    [driver]        as for a node; dir empty = a private temporary directory

:func:`generate_loopback_cluster` builds the configs of an N-node cluster on 127.0.0.1 with free
ports (for ``cluster-node up`` and tests); :func:`node_config_to_toml` and
:func:`client_config_to_toml` write them back as TOML that loads to equal structs.

The parts live in modules of their own, gathered here so that ``from cluster_node.config import``
gives every name: ``config_schema`` (the tables, their defaults and docstrings), ``config_units``
(durations, sizes, ``ConfigError``), ``config_loading`` (TOML to Structs), ``config_validation``,
``config_toml`` (writing TOML back), ``ports`` (free UDP ports) and ``loopback_cluster``.
"""

from __future__ import annotations

from cluster_node.config_loading import (
    load_backup_config,
    load_client_config,
    load_node_config,
    parse_backup_config,
    parse_client_config,
    parse_node_config,
)
from cluster_node.config_schema import (
    _SIZE_FIELDS,  # noqa: F401 - scripts/config_doc.py shows sizes in their short form
    CLIENT_DRIVER_DEFAULTS,
    SERVICE_ERROR_POLICIES,  # noqa: F401
    ArchiveSection,
    AuthSection,
    BackupConfig,
    BackupSection,
    ClientConfig,
    ClientSection,
    ClusterMember,
    ClusterSection,
    DriverSection,
    LoggingSection,
    NodeConfig,
    NodeSection,
    TimeoutsSection,
    format_cluster_members,
    format_ingress_endpoints,
    parse_cluster_members,
    parse_ingress_endpoints,
)
from cluster_node.config_toml import client_config_to_toml, node_config_to_toml
from cluster_node.config_units import ConfigError, format_duration, format_size, parse_duration_ns, parse_size
from cluster_node.loopback_cluster import DEMO_DRIVER, DEMO_TIMEOUTS, generate_loopback_cluster, write_loopback_cluster
from cluster_node.ports import free_fixed_udp_ports, free_udp_ports

__all__ = [
    "ConfigError",
    "ClusterMember",
    "NodeSection",
    "ClusterSection",
    "TimeoutsSection",
    "DriverSection",
    "ArchiveSection",
    "LoggingSection",
    "AuthSection",
    "NodeConfig",
    "ClientSection",
    "ClientConfig",
    "BackupSection",
    "BackupConfig",
    "load_backup_config",
    "parse_backup_config",
    "parse_duration_ns",
    "parse_size",
    "format_duration",
    "format_size",
    "parse_cluster_members",
    "format_cluster_members",
    "parse_ingress_endpoints",
    "format_ingress_endpoints",
    "load_node_config",
    "load_client_config",
    "parse_node_config",
    "parse_client_config",
    "node_config_to_toml",
    "client_config_to_toml",
    "generate_loopback_cluster",
    "write_loopback_cluster",
    "DEMO_TIMEOUTS",
    "DEMO_DRIVER",
    "free_fixed_udp_ports",
    "free_udp_ports",
    "CLIENT_DRIVER_DEFAULTS",
]
