"""One client session as a member knows it (the reference's ``ClusterSession``), and its states (core).

The record the session manager (``cluster_node.consensus.sessions``) keeps per session, the
snapshot writes and reads back, and the egress side addresses; apart from the manager so that
those can use the record without the manager's decisions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cluster_node.codecs import (
    NULL_POSITION,
    NULL_VALUE,
    CloseReason,
)


class SessionState(enum.IntEnum):
    INIT = 0
    CONNECTING = 1
    CONNECTED = 2
    CHALLENGED = 3
    AUTHENTICATED = 4
    REJECTED = 5
    OPEN = 6
    CLOSING = 7
    INVALID = 8
    CLOSED = 9


@dataclass(slots=True)
class ClusterSession:
    id: int
    correlation_id: int
    response_stream_id: int
    response_channel: str
    state: SessionState
    time_of_last_activity_ns: int
    opened_log_position: int = NULL_POSITION
    """The log position just after the session's SessionOpenEvent (the reference's
    ``openedLogPosition``): the open is committed once the commit position reaches it.
    :data:`NOT_IN_LOG` while a leader's open waits to be appended."""
    closed_log_position: int = NULL_POSITION
    """Likewise for its SessionCloseEvent, once a close is decided."""
    close_reason: CloseReason = CloseReason.CLIENT_ACTION
    encoded_principal: bytes = b""
    opened_term_id: int = NULL_VALUE
    """The leadership term the session was opened in (the term its client sends with), when known."""
    time_of_last_answer_ns: int = 0
    """When a member that does not lead last answered this session's ingress."""
    bound_image: int | None = None
    """The session id of the ingress image this session takes messages from on this leader
    (see "Binding" in ``cluster_node.consensus.sessions``); None: not bound yet."""


@dataclass(slots=True)
class GoneSession:
    """A session this member opened as leader and rolled back: kept for a while so that ingress
    still arriving from its client can be answered (the session's egress channel is known here
    and nowhere else)."""

    session: ClusterSession
    dropped_at_ns: int


NOT_IN_LOG = 2**63 - 1
"""A session event decided by the leader and not yet appended: beyond every commit position."""
