"""What an authenticator may do with one session, for the length of one call (the reference's ``SessionProxy``) (core).

Apart from the session manager so that the authenticator's interface (challenge, authenticate,
reject) is visible on its own: the plug-in authenticators see only this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster_node.codecs import (
    NULL_VALUE,
)
from cluster_node.consensus.cluster_session import SessionState

if TYPE_CHECKING:
    from cluster_node.consensus.cluster_session import ClusterSession
    from cluster_node.consensus.sessions import ClusterSessions


class _Proxy:
    """The reference's ``SessionProxy``: what an authenticator may do with one session, for the
    length of one call."""

    __slots__ = ("_sessions", "session", "_term_id", "_leader_member_id", "_now_ns")

    def __init__(
        self, sessions: ClusterSessions, session: ClusterSession, term_id: int, leader_member_id: int, now_ns: int
    ) -> None:
        self._sessions = sessions
        self.session: ClusterSession | None = session
        self._term_id = term_id
        self._leader_member_id = leader_member_id
        self._now_ns = now_ns

    @property
    def session_id(self) -> int:
        return self.session.id if self.session is not None else NULL_VALUE

    def challenge(self, encoded_challenge: bytes) -> bool:
        return self.session is not None and self._sessions._challenge(self.session, encoded_challenge)

    def authenticate(self, encoded_principal: bytes | None) -> bool:
        return self.session is not None and self._sessions._open(
            self.session, encoded_principal or b"", self._term_id, self._leader_member_id, self._now_ns
        )

    def reject(self, reason: str = "") -> None:
        if self.session is not None and self.session.state in (SessionState.CONNECTED, SessionState.CHALLENGED):
            self._sessions._reject(
                self.session, reason or "authentication rejected", self._term_id, self._leader_member_id
            )
