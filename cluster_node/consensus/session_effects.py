"""What the session manager asks of its shell: append a session event, send or close an egress, take a snapshot (core).

The manager (``cluster_node.consensus.sessions``) decides; these values say what to do, and the
shell (the egress publisher, the log publisher) does it. Apart from the manager so that the
shell's modules import the outputs without the decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AppendSessionEvent:
    """Leader: append ``message`` (SessionOpenEvent or SessionCloseEvent) to the log, then tell
    :meth:`ClusterSessions.on_event_appended` the log position after it."""

    message: Any
    session: Any = None


@dataclass(frozen=True, slots=True)
class SendEgress:
    """Send ``message`` to the client's egress (``response_channel``/``response_stream_id``).

    ``cluster_session_id`` names the egress publication to use (NULL_VALUE for a rejected
    request, which has no session: the executor uses a short-lived publication)."""

    cluster_session_id: int
    response_channel: str
    response_stream_id: int
    message: Any


@dataclass(frozen=True, slots=True)
class CloseEgress:
    cluster_session_id: int


@dataclass(frozen=True, slots=True)
class TakeSnapshot:
    """Leader: an authorised admin request asks for a cluster-wide snapshot (as the operator's
    ``cluster-node tool snapshot`` does)."""

    cluster_session_id: int


@dataclass(frozen=True, slots=True)
class ForeignMessage:
    """A message for a session came from an ingress image other than the one bound to the
    session (``kind``: "session message", "keep-alive", "close request", "challenge response",
    "admin request"): dropped and counted; the executor says so once per kind."""

    kind: str
    cluster_session_id: int


@dataclass(frozen=True, slots=True)
class AuthenticatorFailed:
    """The authenticator or the authorisation service raised: the session is rejected (or the
    request refused); the executor says so once per kind of error."""

    error: str
