"""The client's errors: one base class, and one subclass per way a session cannot go on.

They sit apart from the client so that the blocking client, the credentials and the connect
logic raise the same classes without importing the whole client.
"""

from __future__ import annotations

from cluster_node.codecs import ServiceErrorEvent

__all__ = [
    "ClusterClientError",
    "ConnectTimeoutError",
    "ClusterRejectedError",
    "AuthenticationError",
    "ClientClosedError",
    "ServiceRequestError",
]


class ClusterClientError(Exception):
    """Base of the client's errors. Messages are one line."""


class ConnectTimeoutError(ClusterClientError):
    """No member led (or none answered) within the connect timeout. ``members`` says what each
    member last said ("unreachable", "no answer", "no leader", "leader 2, term 7", ...)."""

    def __init__(self, message: str, members: str = "") -> None:
        super().__init__(message)
        self.members = members


class ClusterRejectedError(ClusterClientError):
    """The cluster answered a connect with SessionEvent ERROR (detail in the message)."""


class AuthenticationError(ClusterClientError):
    """The cluster answered AUTHENTICATION_REJECTED (``reason`` is its detail), or asked for a
    challenge this client cannot answer."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class ClientClosedError(ClusterClientError):
    """The client is closed (by the application, by the cluster, or after failing to reconnect)."""


class ServiceRequestError(ClusterClientError):
    """The service raised while applying one of this session's messages (a ServiceErrorEvent):
    no reply will come for it. The message was committed and applied (up to the error) on every
    member alike; sending it again raises again, unless the service changed."""

    def __init__(self, event: ServiceErrorEvent) -> None:
        super().__init__(f"the service failed on the message at log position {event.log_position}: {event.error}")
        self.log_position = event.log_position
        self.leadership_term_id = event.leadership_term_id
        self.error = event.error
        self.payload_prefix = event.payload_prefix

    def is_for(self, payload: bytes | bytearray | memoryview) -> bool:
        """Whether ``payload`` may be the message that failed (it starts with the bytes the
        event carries back)."""
        return bytes(payload[: len(self.payload_prefix)]) == self.payload_prefix
