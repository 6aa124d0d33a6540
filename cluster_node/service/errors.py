"""What happens when a service callback raises while applying a log entry (``service_errors``).

Every member applies the same entries to the same service code, so an entry that makes the
service raise on one member raises on all of them: the failure is part of the replicated state
machine, not a fault of one node. Two policies, chosen in ``[node] service_errors``:

* ``record`` (the default): the exception is caught where the container calls the service, on
  every member alike, and the cluster goes on. Whatever the callback changed before it raised
  stays changed, on every member the same way, so the states stay equal. Each member counts it
  (the ``service errors`` counter, type :data:`SERVICE_ERRORS_TYPE_ID`), logs the first of each
  distinct error (type and message) with the log position, the session and the message's first
  bytes, and the leader answers the client whose message it was with a ``ServiceErrorEvent``
  (the client raises it as ``ServiceRequestError``), unless the service's
  ``on_callback_error`` hook answered it itself.
* ``stop``: the member stops at that entry with exit code ``SERVICE_ERROR_STOP`` (8) and one line
  naming the log position and the error; an operator decides what to do, and can have every
  member pass over that entry (``cluster-node tool skip-entry``, see ``service.skips``).

The exception must be deterministic for ``record`` to keep the members equal: a ``MemoryError``
or a ``RecursionError`` that depends on one process's memory or stack is not, and neither is
a service that reads the clock or the disk. Such a service's states may part under either
policy; ``stop`` at least stops at the first sign.

Only the callbacks that apply a log entry are covered: ``on_session_open``,
``on_session_message``, ``on_timer_event``, ``on_session_close``,
``on_new_leadership_term_event``. Others keep their own rules (see docs/operations.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cluster_node.codecs import MAX_ERROR_PAYLOAD_PREFIX, MAX_TEXT_LENGTH
from cluster_node.identifiers import CounterTypes

__all__ = [
    "ServiceErrorPolicy",
    "SERVICE_ERRORS_TYPE_ID",
    "service_errors_label",
    "ServiceCallbackFailure",
    "ServiceErrorStop",
    "ErrorDeduper",
    "payload_prefix",
]

SERVICE_ERRORS_TYPE_ID = CounterTypes.SERVICE_ERRORS
"""Counter type of a member's count of service callback errors (the reference's clustered
service error count type)."""


def service_errors_label(member_id: int) -> str:
    return f"cluster service-errors: member {member_id}"


class ServiceErrorPolicy(str, enum.Enum):
    RECORD = "record"
    STOP = "stop"


@dataclass(frozen=True)
class ServiceCallbackFailure:
    """One exception a service callback raised while applying a log entry."""

    callback: str
    log_position: int
    """The position after the entry (``Cluster.log_position`` during the callback)."""
    session_id: int | None
    """The client session of the entry, when it has one."""
    payload_prefix: bytes
    """The message's first bytes (session messages only)."""
    error: BaseException

    @property
    def error_text(self) -> str:
        """``"<type>: <message>"`` on one line, cut to fit a ServiceErrorEvent."""
        message = str(self.error).replace("\n", " ").strip()
        text = f"{type(self.error).__name__}: {message}" if message else type(self.error).__name__
        return text if len(text) <= MAX_TEXT_LENGTH else text[: MAX_TEXT_LENGTH - 3] + "..."

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes two failures the same error (logged once): callback, type, message."""
        return self.callback, type(self.error).__name__, str(self.error)

    def describe(self) -> str:
        """One line for the operator."""
        where = f"log position {self.log_position}"
        if self.session_id is not None:
            where += f", session {self.session_id}"
        if self.payload_prefix:
            where += f", message starting {self.payload_prefix!r}"
        return f"the service's {self.callback} raised {self.error_text} at {where}"


def payload_prefix(payload) -> bytes:
    return bytes(payload[:MAX_ERROR_PAYLOAD_PREFIX]) if payload is not None else b""


class ServiceErrorStop(Exception):
    """Raised out of the agent under ``service_errors = "stop"``: the service thread ends and
    the node exits with SERVICE_ERROR_STOP."""

    def __init__(self, failure: ServiceCallbackFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class ErrorDeduper:
    """Which failures to log: the first of each distinct error, up to ``max_distinct`` of them
    (a message that names the bad input makes every bad request distinct: the count goes on,
    the log stops growing)."""

    def __init__(self, max_distinct: int = 256) -> None:
        self.max_distinct = max_distinct
        self.counts: dict[tuple[str, str, str], int] = {}
        self.unlogged = 0
        """Failures not logged because ``max_distinct`` distinct ones were already seen."""

    def first(self, failure: ServiceCallbackFailure) -> bool | None:
        """True: a new error, log it. False: seen before. None: new, but one too many to log
        (only the first of those returns None; later ones return False)."""
        key = failure.key
        n = self.counts.get(key)
        if n is not None:
            self.counts[key] = n + 1
            return False
        if len(self.counts) >= self.max_distinct:
            self.unlogged += 1
            return None if self.unlogged == 1 else False
        self.counts[key] = 1
        return True
