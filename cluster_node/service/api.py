"""The clustered service API: what a user implements, and the handle the cluster gives it.

A **ClusteredService** is a deterministic state machine. The service container calls it, on one
thread, with every committed log entry in log order: session opened, session message, timer
fired, session closed, new leadership term. Every member runs the same service over the same log,
so every member reaches the same state. To stay deterministic a service must use only what the
log gives it: ``timestamp`` arguments and ``cluster.time`` (the leader's clock as written into the
log), never the local clock, randomness, threads or I/O of its own.

The **Cluster** handle is how the service acts:

* ``offer(payload)``: append a message to the log (as a service message, delivered back to every
  member's service with ``session=None``). The consensus module keeps it pending until it is
  committed, so it takes effect exactly once even across a leader failover. It waits while the
  stream to the consensus module is full and never fails for back-pressure (a refusal on one
  member only would break exactly-once).
* ``schedule_timer(correlation_id, deadline)`` / ``cancel_timer(correlation_id)``: timers live in
  the consensus module; on expiry the leader appends a TimerEvent and every member's service gets
  ``on_timer_event``. Schedule and cancel only from inside a log callback; a request counts at
  the log position of the entry that made it (re-arming a timer inside its own
  ``on_timer_event`` works on every member).

docs/service.md is the whole contract: what runs on every member, what may fail, cluster time.
* ``client_sessions`` / ``get_client_session(id)`` / ``close_client_session(id)`` and, per
  session, ``ClientSession.offer(payload)`` to reply on the client's egress. Only the leader
  really sends; on followers ``offer`` returns :data:`MOCKED_OFFER` and sends nothing.

Snapshots: ``on_take_snapshot(writer)`` writes the service's state as a sequence of records with
``writer.write(bytes)``; on restart ``on_start(cluster, snapshot)`` gets a reader that yields the
same records in order (``None`` when starting without a snapshot). The container puts the records
in an archive recording between its own markers; the service only sees its own bytes.

Names, callbacks and codes follow the reference (``ClusteredService``, ``Cluster``,
``ClientSession``, ``Cluster.Role``); the signatures are Python's own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterator
from typing import Protocol, runtime_checkable

from cluster_node.codecs import CloseReason, ClusterTimeUnit
from cluster_node.plugins import find_class

__all__ = [
    "Role",
    "CloseReason",
    "ClusterTimeUnit",
    "MOCKED_OFFER",
    "ClientSession",
    "Cluster",
    "SnapshotWriter",
    "SnapshotReader",
    "BytesSnapshotWriter",
    "BytesSnapshotReader",
    "ClusteredService",
    "SERVICES",
    "load_service",
    "ServiceLoadError",
]

MOCKED_OFFER = 1
"""What ``ClientSession.offer`` returns on a follower: success, nothing sent (reference value)."""


class Role(enum.IntEnum):
    """A member's role (reference ``Cluster.Role`` codes)."""

    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


class ClientSession:
    """A client connected to the cluster, as the service sees it.

    Created by the container when a SessionOpenEvent is applied (or a snapshot is loaded), so
    every member has the same sessions. ``offer`` replies on the client's egress: the position,
    or a negative ``cluster_node.media.publication.OfferResult`` (back-pressure, not connected); on a follower,
    :data:`MOCKED_OFFER`. A reply that must not be lost is the service's to retry.
    """

    __slots__ = (
        "id",
        "response_stream_id",
        "response_channel",
        "encoded_principal",
        "is_closing",
        "_offer_fn",
    )

    def __init__(
        self,
        cluster_session_id: int,
        response_stream_id: int,
        response_channel: str,
        encoded_principal: bytes = b"",
        offer_fn: Callable[[ClientSession, bytes | memoryview], int] | None = None,
    ) -> None:
        self.id = cluster_session_id
        self.response_stream_id = response_stream_id
        self.response_channel = response_channel
        self.encoded_principal = encoded_principal
        self.is_closing = False
        """Set once the service asked to close it (``Cluster.close_client_session``)."""
        self._offer_fn = offer_fn

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        """Send ``payload`` to the client's egress; position, MOCKED_OFFER, or a negative result."""
        fn = self._offer_fn
        return MOCKED_OFFER if fn is None else fn(self, payload)

    def __repr__(self) -> str:
        return f"ClientSession(id={self.id}, channel={self.response_channel!r}, stream={self.response_stream_id})"


@runtime_checkable
class Cluster(Protocol):
    """The handle a service gets in ``on_start``; implemented by the service container."""

    @property
    def member_id(self) -> int: ...

    @property
    def role(self) -> Role: ...

    @property
    def log_position(self) -> int:
        """Position in the log after the entry being processed."""
        ...

    @property
    def leadership_term_id(self) -> int: ...

    @property
    def time(self) -> int:
        """The log timestamp of the entry being processed, in ``time_unit`` (deterministic)."""
        ...

    @property
    def time_unit(self) -> ClusterTimeUnit:
        """NANOS (epoch nanoseconds), from ``on_start`` on."""
        ...

    @property
    def client_sessions(self) -> Collection[ClientSession]: ...

    def get_client_session(self, cluster_session_id: int) -> ClientSession | None: ...

    def close_client_session(self, cluster_session_id: int) -> bool:
        """Ask the consensus module to close the session (SessionCloseEvent SERVICE_ACTION);
        False, and nothing done, for a session that is not open (closed already, or unknown)."""
        ...

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        """Append a service message to the log; waits for room, returns a positive value.
        Raises ``ValueError`` (MessageTooLongError) for a payload over the maximum length."""
        ...

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        """Schedule (or reschedule) a timer at ``deadline`` in cluster time (epoch ns); waits for
        room, returns True."""
        ...

    def cancel_timer(self, correlation_id: int) -> bool: ...


@runtime_checkable
class SnapshotWriter(Protocol):
    """Where ``on_take_snapshot`` writes its records (each ``write`` is one record, kept whole)."""

    def write(self, record: bytes | bytearray | memoryview) -> None: ...


@runtime_checkable
class SnapshotReader(Protocol):
    """The records a service wrote in ``on_take_snapshot``, in order."""

    def __iter__(self) -> Iterator[bytes]: ...


class BytesSnapshotWriter:
    """A SnapshotWriter that keeps records in memory (tests; the container's staging buffer)."""

    def __init__(self, max_record_length: int = 16 * 1024 * 1024) -> None:
        self.records: list[bytes] = []
        self.max_record_length = max_record_length

    def write(self, record: bytes | bytearray | memoryview) -> None:
        if len(record) > self.max_record_length:
            raise ValueError(f"snapshot record of {len(record)} bytes exceeds {self.max_record_length}")
        self.records.append(bytes(record))


class BytesSnapshotReader:
    """A SnapshotReader over records in memory."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = records

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.records)


class ClusteredService:
    """Base class of a service: override the callbacks you need (the others do nothing).

    Every callback runs on the service thread, in log order, and must not block for long: the
    service is behind the commit position only as long as its callbacks take.
    """

    def on_start(self, cluster: Cluster, snapshot: SnapshotReader | None) -> None:
        """Once, before any other callback. Load state from ``snapshot`` when there is one."""

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        pass

    def on_session_close(self, session: ClientSession, timestamp: int, close_reason: CloseReason) -> None:
        pass

    def on_session_message(self, session: ClientSession | None, timestamp: int, payload: bytes | memoryview) -> None:
        """A committed message. ``session`` is None for a service message (``Cluster.offer``).
        ``payload`` may be a view into the log buffer, valid only during this call."""

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        pass

    def on_take_snapshot(self, writer: SnapshotWriter) -> None:
        """Write the whole state; it must be enough for ``on_start`` to rebuild it."""

    def on_role_change(self, new_role: Role) -> None:
        """Right after ``on_start`` with the first role, then at every change (not from the log:
        no state changes)."""

    def on_terminate(self, cluster: Cluster) -> None:
        pass

    def on_new_leadership_term_event(
        self,
        leadership_term_id: int,
        log_position: int,
        timestamp: int,
        term_base_log_position: int,
        leader_member_id: int,
        log_session_id: int,
        time_unit: ClusterTimeUnit,
        app_version: int,
    ) -> None:
        pass

    def on_callback_error(
        self, session: ClientSession | None, log_position: int, callback: str, error: Exception
    ) -> bool:
        """A callback that applied the entry ending at ``log_position`` raised ``error`` and the
        node's ``service_errors`` policy is ``record``: called on every member, right after,
        like a log callback (deterministic; it may change state). ``session`` is the client
        whose message it was, or None. Return True when the service answered the client itself
        (``session.offer``); otherwise the cluster sends it a ServiceErrorEvent."""
        return False

    def do_background_work(self, now_ns: int) -> int:
        """Called every duty cycle of the service thread (not deterministic: no state changes)."""
        return 0


# --------------------------------------------------------------------------------------------
# Loading a service by name
# --------------------------------------------------------------------------------------------

SERVICES = {
    "echo": "cluster_node.service.examples.echo:EchoService",
    "kv": "cluster_node.service.examples.kv:KeyValueService",
}
"""Short names accepted by ``node.service`` in the config."""


class ServiceLoadError(ValueError):
    """``node.service`` names nothing loadable (one-line message)."""


def load_service(name: str) -> ClusteredService:
    """A new service instance from a short name (``echo``, ``kv``) or ``package.module:ClassName``."""
    spec = SERVICES.get(name, name)
    cls = find_class(
        spec,
        f"service {name!r}",
        f"use one of {', '.join(sorted(SERVICES))} or package.module:ClassName",
        ServiceLoadError,
    )
    class_name = spec.partition(":")[2]
    try:
        service = cls()
    except Exception as ex:  # noqa: BLE001 - any failure of user code becomes one line
        raise ServiceLoadError(f"service {name!r}: {class_name}() failed: {ex}") from None
    if not isinstance(service, ClusteredService):
        raise ServiceLoadError(f"service {name!r}: {class_name} is not a ClusteredService")
    return service
