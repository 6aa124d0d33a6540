"""The echo service: every client message is sent straight back to its sender.

Used by the benchmarks (round trip through ingress, replication, commit, service and egress) and
by tests. It keeps no state besides counters, so its snapshot is one small record.
"""

from __future__ import annotations

import struct

from cluster_node.service.api import ClientSession, Cluster, ClusteredService, SnapshotReader, SnapshotWriter

__all__ = ["EchoService"]

_COUNTS = struct.Struct("<qq")


class EchoService(ClusteredService):
    def __init__(self) -> None:
        self.cluster: Cluster | None = None
        self.messages = 0
        """Session messages applied (deterministic: the same on every member)."""
        self.service_messages = 0
        self.echo_failures = 0
        """Replies the egress did not take (back-pressure, client gone); local, not replicated."""

    def on_start(self, cluster: Cluster, snapshot: SnapshotReader | None) -> None:
        self.cluster = cluster
        if snapshot is not None:
            for record in snapshot:
                self.messages, self.service_messages = _COUNTS.unpack(record)

    def on_session_message(self, session: ClientSession | None, timestamp: int, payload: bytes | memoryview) -> None:
        if session is None:
            self.service_messages += 1
            return
        self.messages += 1
        if session.offer(payload) < 0:
            self.echo_failures += 1

    def on_take_snapshot(self, writer: SnapshotWriter) -> None:
        writer.write(_COUNTS.pack(self.messages, self.service_messages))
