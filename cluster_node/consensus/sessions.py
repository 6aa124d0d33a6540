"""Client sessions as the consensus module keeps them (core)

The leader decides who may connect, puts each session's life into the log (SessionOpenEvent,
SessionCloseEvent) and tells the client on its egress (SessionEvent, NewLeaderEvent). Followers
learn the same sessions from the committed log, so that whichever member leads next knows them.
Nothing here does I/O: every decision is an effect in :attr:`ClusterSessions.effects`, which the
consensus agent executes in order:

* :class:`AppendSessionEvent`: append a SessionOpenEvent/SessionCloseEvent to the log (leader);
* :class:`SendEgress`: send a SessionEvent/NewLeaderEvent to a client's egress channel;
* :class:`CloseEgress`: the session is gone, release its egress publication.

Session states (reference ``ClusterSession.State`` names and order)::

    INIT CONNECTING CONNECTED CHALLENGED AUTHENTICATED REJECTED OPEN CLOSING INVALID CLOSED

A connect request that passes the checks is CONNECTED (in :attr:`ClusterSessions.pending`) and
goes to the authenticator (``cluster_node.consensus.auth``), which may challenge it (CHALLENGED:
a Challenge on the session's egress, answered by a ChallengeResponse), accept it with a principal
(the session is OPEN at once: its SessionOpenEvent, carrying the principal, is appended and the
client told OK) or reject it (REJECTED: SessionEvent AUTHENTICATION_REJECTED with the reason,
nothing logged). A session still pending after the session timeout is rejected. An open session
is CLOSING when a close is decided, and forgotten once its SessionCloseEvent is appended. A
request refused before that (version, limit) never becomes a session: it gets SessionEvent ERROR.

Binding: a session id is in the log for all to read, so it is no capability. A session takes
session messages, keep-alives, close requests, challenge responses and admin requests only from
one ingress image (the publication of one client process), named by the image's session id: the
image its connect request came on. A message for it from any other image is dropped, counted
(:attr:`ClusterSessions.foreign_dropped`) and reported (:class:`ForeignMessage`). The check is one
integer comparison after the session lookup the hot path makes anyway. After an election every
session is unbound (its client moves its ingress to the new leader on a new image once it reads
the NewLeaderEvent), and is bound again to the first image that sends a message of the new term
for it from the host the session's response channel names; the connect request's source was
checked against that same host. What is left open: until its client's first message of the new
term, another process on the client's host (or one that can forge that host's address and
guess the session id and term) may take the session over; it then has the session's principal.

Rules (reference ``ConsensusModuleAgent.onSessionConnect``, ``checkSessions``):

* a connect request to a follower or a candidate is answered REDIRECT, detail = every member's
  ingress endpoint (``"0=h:p,1=h:p,..."``), with the leader's id (-1 while there is none);
* a client whose protocol major version differs gets ERROR "invalid client version";
* ``open + pending >= max_sessions`` gets ERROR "concurrent session limit";
* a session with no ingress message or keep-alive for ``session_timeout_ns`` is closed with
  reason TIMEOUT and told CLOSED; activity is reset for every session after an election;
* ingress and keep-alives carrying a leadership term other than the current one are dropped
  (the client has not seen the NewLeaderEvent yet); one of an earlier term is answered with the
  NewLeaderEvent again (at most every ``answer_interval_ns``), in case it was lost;
* after an election the new leader sends every open session a NewLeaderEvent; after a restart
  of the leader (a startup election: the whole cluster, or the leader alone) sessions from before
  are closed (TIMEOUT) instead, as the reference does, and their clients are told (SessionEvent
  CLOSED) in case they are still there, so they reconnect;
* rollback: a session whose open event is after the commit position when a new leadership is
  prepared never happened: it is dropped and its client is told (SessionEvent CLOSED, detail
  "election", as the reference's ``clearSessionsAfter``), so that it connects again at once; one
  whose close event is after the commit position is open again. Every other session's egress is
  released (the reference's ``ClusterSession.disconnect``): the next leader speaks to them;
* a member that does not lead never leaves a client's ingress unanswered when it can say
  something (beyond the reference, which ignores it): a session it dropped in a rollback is told
  CLOSED again (its client missed the first event), and a session it knows from the log is sent
  a NewLeaderEvent naming the leader it follows. At most one answer per session every
  ``answer_interval_ns``; a session it knows nothing of cannot be answered (no egress channel),
  and its client notices by itself that its requests go unanswered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster_node.codecs import (
    CLIENT_PROTOCOL_MAJOR_VERSION,
    CLIENT_PROTOCOL_VERSION,
    NULL_POSITION,
    NULL_VALUE,
    SCHEMA_ID,
    AdminRequest,
    AdminRequestType,
    AdminResponse,
    AdminResponseCode,
    Challenge,
    CloseReason,
    EventCode,
    NewLeaderEvent,
    SessionCloseEvent,
    SessionConnectRequest,
    SessionEvent,
    SessionOpenEvent,
    semantic_version_major,
)
from cluster_node.consensus.auth import DenyAllAuthorisation, NullAuthenticator
from cluster_node.consensus.cluster_session import NOT_IN_LOG, ClusterSession, GoneSession, SessionState
from cluster_node.consensus.response_channel import _response_host, response_channel_refusal
from cluster_node.consensus.session_effects import (
    AppendSessionEvent,
    AuthenticatorFailed,
    CloseEgress,
    ForeignMessage,
    SendEgress,
    TakeSnapshot,
)
from cluster_node.consensus.session_proxy import _Proxy

__all__ = [
    "SessionState",
    "ClusterSession",
    "ClusterSessions",
    "AppendSessionEvent",
    "NOT_IN_LOG",
    "SendEgress",
    "CloseEgress",
    "SessionSettings",
    "TakeSnapshot",
    "ForeignMessage",
    "AuthenticatorFailed",
    "response_channel_refusal",
]


@dataclass(frozen=True, slots=True)
class SessionSettings:
    session_timeout_ns: int = 10_000_000_000
    max_sessions: int = 10
    answer_interval_ns: int = 250_000_000
    """A member that does not lead answers one session's ingress at most this often: a client
    that pumps messages into it gets a few events, not one per message."""


ELECTION_CLOSE_DETAIL = "election"
"""The detail of the SessionEvent CLOSED that tells a client its session was rolled back with an
uncommitted tail (the reference's text): the session never happened, connect again."""

SUSPENDED_DETAIL = "suspended"
"""The detail of the SessionEvent OK a suspended leader sends its sessions now and then
(:meth:`ClusterSessions.remind_suspended`): alive, your requests wait until resume."""


_GONE_LIMIT = 256
"""Most sessions a member remembers having rolled back (the oldest are forgotten first)."""


@dataclass(slots=True)
class ClusterSessions:
    """The sessions of one member, and the leader's decisions about them."""

    member_id: int
    ingress_endpoints: str
    """``"0=h:p,1=h:p,..."``: the REDIRECT detail and NewLeaderEvent endpoints."""
    settings: SessionSettings = field(default_factory=SessionSettings)
    next_session_id: int = 1
    sessions: dict[int, ClusterSession] = field(default_factory=dict)
    closed_uncommitted: dict[int, ClusterSession] = field(default_factory=dict)
    gone: dict[tuple[int, int], GoneSession] = field(default_factory=dict)
    """Rolled-back sessions by (term opened in, session id): ids restart in a new term, the term
    tells them apart."""
    effects: list = field(default_factory=list)
    authenticator: Any = field(default_factory=NullAuthenticator)
    """Decides who may open a session (``cluster_node.consensus.auth.Authenticator``)."""
    authorisation: Any = field(default_factory=DenyAllAuthorisation)
    """Decides who may send admin requests (``auth.AuthorisationService``)."""
    image_source_host: Any = lambda image_session_id: ""
    """``image_source_host(image_session_id)``: the host an ingress image receives from (None
    for IPC, "" when there is no such image): binding an inherited session needs it."""
    pending: dict[int, ClusterSession] = field(default_factory=dict)
    """Leader: sessions being authenticated (CONNECTED, CHALLENGED), not in the log yet."""
    rejected: int = 0
    auth_rejected: int = 0
    foreign_dropped: int = 0
    rebound: int = 0
    admin_refused: int = 0
    timed_out: int = 0
    stale_term_dropped: int = 0
    rolled_back: int = 0
    answered_not_leading: int = 0

    # ------------------------------------------------------------------ connects (any role)

    def on_connect_request(
        self,
        req: SessionConnectRequest,
        *,
        is_leader: bool,
        leader_member_id: int,
        leadership_term_id: int,
        now_ns: int,
        image_session_id: int,
    ) -> ClusterSession | None:
        """A client asks to connect (on the ingress image ``image_session_id``, which the
        session is bound to). Returns the new session when it was opened at once (leader; a
        session the authenticator challenges opens later: :meth:`on_challenge_response`,
        :meth:`process_pending`)."""

        def answer(code: EventCode, detail: str, session_id: int = NULL_VALUE) -> None:
            self.effects.append(
                SendEgress(
                    session_id,
                    req.response_channel,
                    req.response_stream_id,
                    SessionEvent(
                        session_id,
                        req.correlation_id,
                        leadership_term_id,
                        leader_member_id,
                        code,
                        CLIENT_PROTOCOL_VERSION,
                        detail,
                    ),
                )
            )

        if not is_leader:
            answer(EventCode.REDIRECT, self.ingress_endpoints)
            return None
        if semantic_version_major(req.version) != CLIENT_PROTOCOL_MAJOR_VERSION:
            self.rejected += 1
            answer(EventCode.ERROR, f"invalid client version {req.version}")
            return None
        if len(self.sessions) + len(self.pending) >= self.settings.max_sessions:
            self.rejected += 1
            answer(EventCode.ERROR, "concurrent session limit")
            return None
        session = ClusterSession(
            self.next_session_id,
            req.correlation_id,
            req.response_stream_id,
            req.response_channel,
            SessionState.CONNECTED,
            now_ns,
            opened_log_position=NOT_IN_LOG,
            opened_term_id=leadership_term_id,
            bound_image=image_session_id,
        )
        self.next_session_id += 1
        self.pending[session.id] = session
        try:
            self.authenticator.on_connect_request(session.id, bytes(req.encoded_credentials), now_ns // 1_000_000)
        except Exception as e:  # noqa: BLE001 - the authenticator is the operator's code
            self._authenticator_failed(session, e, leadership_term_id, leader_member_id)
            return None
        self._decide(session, leadership_term_id, leader_member_id, now_ns)
        return session if session.state == SessionState.OPEN else None

    # ------------------------------------------------------------------ authentication (leader)

    def on_challenge_response(
        self,
        correlation_id: int,
        cluster_session_id: int,
        encoded_credentials: bytes,
        *,
        leadership_term_id: int,
        leader_member_id: int,
        now_ns: int,
        image_session_id: int,
    ) -> bool:
        """A client answers its challenge. Only a CHALLENGED session's own ingress image may
        answer, with the connect's correlation id; anything else is dropped. True when taken."""
        session = self.pending.get(cluster_session_id)
        if session is None or session.state != SessionState.CHALLENGED or session.correlation_id != correlation_id:
            return False
        if session.bound_image != image_session_id:
            self._foreign("challenge response", cluster_session_id)
            return False
        try:
            self.authenticator.on_challenge_response(session.id, bytes(encoded_credentials), now_ns // 1_000_000)
        except Exception as e:  # noqa: BLE001 - the operator's code
            self._authenticator_failed(session, e, leadership_term_id, leader_member_id)
            return True
        self._decide(session, leadership_term_id, leader_member_id, now_ns)
        return True

    def process_pending(self, leadership_term_id: int, leader_member_id: int, now_ns: int) -> int:
        """Leader, each duty cycle: ask the authenticator again about every session it has not
        decided on, and reject those undecided for longer than the session timeout."""
        if not self.pending:
            return 0
        timeout = self.settings.session_timeout_ns
        for session in list(self.pending.values()):
            if now_ns - session.time_of_last_activity_ns > timeout:
                self._forget_authenticating(session.id)
                self._reject(session, "authentication timed out", leadership_term_id, leader_member_id)
            else:
                self._decide(session, leadership_term_id, leader_member_id, now_ns)
        return 1

    def _decide(self, session: ClusterSession, term_id: int, leader_member_id: int, now_ns: int) -> None:
        proxy = _Proxy(self, session, term_id, leader_member_id, now_ns)
        try:
            if session.state == SessionState.CONNECTED:
                self.authenticator.on_connected_session(proxy, now_ns // 1_000_000)
            elif session.state == SessionState.CHALLENGED:
                self.authenticator.on_challenged_session(proxy, now_ns // 1_000_000)
        except Exception as e:  # noqa: BLE001 - the operator's code
            if session.state in (SessionState.CONNECTED, SessionState.CHALLENGED):
                self._authenticator_failed(session, e, term_id, leader_member_id)
        finally:
            proxy.session = None  # a proxy kept by the authenticator can do nothing more

    def _authenticator_failed(
        self, session: ClusterSession, error: Exception, term_id: int, leader_member_id: int
    ) -> None:
        self.effects.append(AuthenticatorFailed(f"{type(error).__name__}: {error}"))
        self._forget_authenticating(session.id)
        self._reject(session, "authenticator error", term_id, leader_member_id)

    def _forget_authenticating(self, session_id: int) -> None:
        forget = getattr(self.authenticator, "forget", None)
        if forget is not None:
            forget(session_id)

    def _challenge(self, session: ClusterSession, encoded_challenge: bytes) -> bool:
        if session.state not in (SessionState.CONNECTED, SessionState.CHALLENGED):
            return False
        session.state = SessionState.CHALLENGED
        self.effects.append(
            SendEgress(
                session.id,
                session.response_channel,
                session.response_stream_id,
                Challenge(session.correlation_id, session.id, bytes(encoded_challenge)),
            )
        )
        return True

    def _open(
        self, session: ClusterSession, principal: bytes, term_id: int, leader_member_id: int, now_ns: int
    ) -> bool:
        if session.state not in (SessionState.CONNECTED, SessionState.CHALLENGED):
            return False
        del self.pending[session.id]
        session.state = SessionState.OPEN
        session.encoded_principal = bytes(principal)
        session.time_of_last_activity_ns = now_ns
        self.sessions[session.id] = session
        self.effects.append(
            AppendSessionEvent(
                SessionOpenEvent(
                    term_id,
                    session.correlation_id,
                    session.id,
                    now_ns,
                    session.response_stream_id,
                    session.response_channel,
                    session.encoded_principal,
                ),
                session,
            )
        )
        self.effects.append(
            SendEgress(
                session.id,
                session.response_channel,
                session.response_stream_id,
                SessionEvent(
                    session.id,
                    session.correlation_id,
                    term_id,
                    leader_member_id,
                    EventCode.OK,
                    CLIENT_PROTOCOL_VERSION,
                    "",
                ),
            )
        )
        return True

    def _reject(self, session: ClusterSession, reason: str, term_id: int, leader_member_id: int) -> None:
        if self.pending.pop(session.id, None) is None:
            return
        # A session that was challenged has an egress publication (the Challenge went on it); one
        # rejected at once is answered as a refused connect request is, on a one-shot publication
        # whose rate the executor bounds: rejections cost the sender one datagram each.
        egress_id = session.id if session.state == SessionState.CHALLENGED else NULL_VALUE
        session.state = SessionState.REJECTED
        self.rejected += 1
        self.auth_rejected += 1
        self.effects.append(
            SendEgress(
                egress_id,
                session.response_channel,
                session.response_stream_id,
                SessionEvent(
                    session.id,
                    session.correlation_id,
                    term_id,
                    leader_member_id,
                    EventCode.AUTHENTICATION_REJECTED,
                    CLIENT_PROTOCOL_VERSION,
                    reason[:200],
                ),
            )
        )
        self.effects.append(CloseEgress(session.id))

    def _drop_pending(self) -> None:
        """This member stops leading: the sessions it was authenticating are forgotten (their
        clients' connects go unanswered and ask the next leader)."""
        for sid in list(self.pending):
            self._forget_authenticating(sid)
            del self.pending[sid]
            self.effects.append(CloseEgress(sid))

    # ------------------------------------------------------------------ binding (leader)

    def _bound(self, session: ClusterSession, image_session_id: int, kind: str) -> bool:
        """Whether ``image_session_id`` may speak for ``session``; an unbound session (one this
        leader inherited) is bound to it when the image comes from the host its response
        channel names. Otherwise the message is foreign: counted and reported."""
        bound = session.bound_image
        if bound == image_session_id:
            return True
        if bound is None:
            host = self.image_source_host(image_session_id)
            if host != "" and host == _response_host(session.response_channel):
                session.bound_image = image_session_id
                self.rebound += 1
                return True
        self._foreign(kind, session.id)
        return False

    def _foreign(self, kind: str, cluster_session_id: int) -> None:
        self.foreign_dropped += 1
        self.effects.append(ForeignMessage(kind, cluster_session_id))

    # ------------------------------------------------------------------ admin requests (leader)

    def on_admin_request(
        self, req: AdminRequest, *, current_term_id: int, now_ns: int, image_session_id: int, can_snapshot: bool
    ) -> bool:
        """An admin request of an open session (reference ``ConsensusModuleAgent.onAdminRequest``),
        answered with an AdminResponse on the session's egress: OK (and :class:`TakeSnapshot`),
        UNAUTHORISED_ACCESS, or ERROR (an unknown type; ``can_snapshot`` False: the leader is
        not ACTIVE). A request of another term or image is dropped. True when answered."""
        session = self.sessions.get(req.cluster_session_id)
        if session is None or session.state != SessionState.OPEN or req.leadership_term_id != current_term_id:
            return False
        if not self._bound(session, image_session_id, "admin request"):
            return False
        session.time_of_last_activity_ns = now_ns
        request_type = req.request_type

        def respond(code: AdminResponseCode, message: str) -> None:
            self.effects.append(
                SendEgress(
                    session.id,
                    session.response_channel,
                    session.response_stream_id,
                    AdminResponse(session.id, req.correlation_id, request_type, code, message),
                )
            )

        if request_type != AdminRequestType.SNAPSHOT:
            respond(AdminResponseCode.ERROR, f"unknown request type {request_type}")
            return True
        try:
            allowed = self.authorisation.is_authorised(
                SCHEMA_ID, AdminRequest.TEMPLATE_ID, AdminRequestType.SNAPSHOT, session.encoded_principal
            )
        except Exception as e:  # noqa: BLE001 - the operator's code
            self.effects.append(AuthenticatorFailed(f"authorisation service: {type(e).__name__}: {e}"))
            allowed = False
        if not allowed:
            self.admin_refused += 1
            respond(AdminResponseCode.UNAUTHORISED_ACCESS, "execution of the SNAPSHOT request was not authorised")
            return True
        if not can_snapshot:
            respond(AdminResponseCode.ERROR, "the cluster cannot take a snapshot now (not ACTIVE)")
            return True
        self.effects.append(TakeSnapshot(session.id))
        respond(AdminResponseCode.OK, "")
        return True

    # ------------------------------------------------------------------ activity (leader)

    def on_ingress(
        self,
        leadership_term_id: int,
        cluster_session_id: int,
        current_term_id: int,
        now_ns: int,
        image_session_id: int,
        count: int = 1,
        kind: str = "session message",
    ) -> bool:
        """A session message arrived (``count`` of them, all of that session and term, on the
        ingress image ``image_session_id``): True when they may be appended (open session,
        current term, the session's own image)."""
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state != SessionState.OPEN:
            return False
        if leadership_term_id != current_term_id:
            self.stale_term_dropped += count
            if leadership_term_id < current_term_id and self._answer_due(session, now_ns):
                # The client missed this leader's NewLeaderEvent (or has yet to read it): again.
                self.effects.append(
                    SendEgress(
                        session.id,
                        session.response_channel,
                        session.response_stream_id,
                        NewLeaderEvent(current_term_id, session.id, self.member_id, self.ingress_endpoints),
                    )
                )
            return False
        if session.bound_image != image_session_id and not self._bound(session, image_session_id, kind):
            if count > 1:
                self.foreign_dropped += count - 1
            return False
        session.time_of_last_activity_ns = now_ns
        return True

    def on_keep_alive(
        self, leadership_term_id: int, cluster_session_id: int, current_term_id: int, now_ns: int, image_session_id: int
    ) -> bool:
        return self.on_ingress(
            leadership_term_id, cluster_session_id, current_term_id, now_ns, image_session_id, kind="keep-alive"
        )

    def on_close_request(
        self, leadership_term_id: int, cluster_session_id: int, current_term_id: int, now_ns: int, image_session_id: int
    ) -> bool:
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state != SessionState.OPEN or leadership_term_id != current_term_id:
            return False
        if not self._bound(session, image_session_id, "close request"):
            return False
        self._close(session, CloseReason.CLIENT_ACTION, current_term_id, now_ns, tell_client=False)
        return True

    def on_service_close(self, cluster_session_id: int, current_term_id: int, now_ns: int) -> bool:
        """The service asked to close a session (CloseSession on stream 105)."""
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state != SessionState.OPEN:
            return False
        self._close(session, CloseReason.SERVICE_ACTION, current_term_id, now_ns, tell_client=True)
        return True

    def on_resume(self, now_ns: int) -> None:
        """The cluster was suspended: its leader read no client message meanwhile, keep-alives
        included, so no session's silence counts from before the resume (a session closed for
        it lost the request that waited in its ingress). Each gets a whole timeout from now."""
        for session in self.sessions.values():
            session.time_of_last_activity_ns = now_ns

    def remind_suspended(self, leadership_term_id: int) -> int:
        """Leader, suspended: tell each open session that the cluster is alive and its requests
        wait (SessionEvent OK, detail SUSPENDED_DETAIL). Beyond the reference: a client takes
        requests that go unanswered for its leader-silence timeout as a dead session and moves
        to another one, which would drop the replies to the requests that waited here. The
        caller sends it about once per leader heartbeat interval while suspended."""
        for session in self.sessions.values():
            if session.state == SessionState.OPEN:
                self.effects.append(
                    SendEgress(
                        session.id,
                        session.response_channel,
                        session.response_stream_id,
                        SessionEvent(
                            session.id,
                            NULL_VALUE,
                            leadership_term_id,
                            self.member_id,
                            EventCode.OK,
                            CLIENT_PROTOCOL_VERSION,
                            SUSPENDED_DETAIL,
                        ),
                    )
                )
        return len(self.sessions)

    def check_timeouts(self, current_term_id: int, now_ns: int) -> int:
        """Leader: close sessions silent for longer than the session timeout."""
        timeout = self.settings.session_timeout_ns
        expired = [
            s
            for s in self.sessions.values()
            if s.state == SessionState.OPEN and now_ns - s.time_of_last_activity_ns > timeout
        ]
        for session in expired:
            self.timed_out += 1
            self._close(session, CloseReason.TIMEOUT, current_term_id, now_ns, tell_client=True)
        return len(expired)

    def _close(
        self, session: ClusterSession, reason: CloseReason, term_id: int, now_ns: int, *, tell_client: bool
    ) -> None:
        session.state = SessionState.CLOSING
        session.close_reason = reason
        session.closed_log_position = NOT_IN_LOG
        self.effects.append(AppendSessionEvent(SessionCloseEvent(term_id, session.id, now_ns, reason), session))
        if tell_client:
            self.effects.append(
                SendEgress(
                    session.id,
                    session.response_channel,
                    session.response_stream_id,
                    SessionEvent(
                        session.id,
                        session.correlation_id,
                        term_id,
                        self.member_id,
                        EventCode.CLOSED,
                        CLIENT_PROTOCOL_VERSION,
                        reason.name,
                    ),
                )
            )
        self.effects.append(CloseEgress(session.id))
        del self.sessions[session.id]
        self.closed_uncommitted[session.id] = session

    # ------------------------------------------------------------------ the committed log (followers)

    def on_log_session_open(self, event: SessionOpenEvent, log_position: int) -> None:
        """A SessionOpenEvent applied from the log (follower, or leader replay)."""
        if event.cluster_session_id not in self.sessions:
            self.sessions[event.cluster_session_id] = ClusterSession(
                event.cluster_session_id,
                event.correlation_id,
                event.response_stream_id,
                event.response_channel,
                SessionState.OPEN,
                0,
                opened_log_position=log_position,
                encoded_principal=event.encoded_principal,
                opened_term_id=event.leadership_term_id,
            )
        if event.cluster_session_id >= self.next_session_id:
            self.next_session_id = event.cluster_session_id + 1

    def on_log_session_close(self, event: SessionCloseEvent) -> None:
        self.sessions.pop(event.cluster_session_id, None)
        self.closed_uncommitted.pop(event.cluster_session_id, None)

    def on_event_appended(self, effect: AppendSessionEvent, position: int) -> None:
        """The leader appended ``effect``'s event; ``position`` is the log position after it."""
        session = effect.session
        if session is None:
            return
        if type(effect.message) is SessionOpenEvent:
            session.opened_log_position = position
        else:
            session.closed_log_position = position

    def on_commit(self, commit_position: int) -> None:
        """Closes at or below the commit position are final."""
        if self.closed_uncommitted:
            for sid in [sid for sid, s in self.closed_uncommitted.items() if s.closed_log_position <= commit_position]:
                del self.closed_uncommitted[sid]

    # ------------------------------------------------------------------ leadership changes

    def rollback(self, commit_position: int, *, leadership_term_id: int = NULL_VALUE, now_ns: int = 0) -> None:
        """A new leadership is prepared: undo session changes the log will not keep. An event
        is kept when the commit position has reached the position after it (the log positions
        of the sessions are those, whether the leader appended the event or a follower applied
        it from the log: a follower that kept an open ending exactly at the commit position
        must not drop it).

        A dropped session's client is told at once (CLOSED "election") and the session is kept
        in :attr:`gone`; ``leadership_term_id`` is the term being left (for sessions whose own
        term is not known). The egress of every session kept is released: a member that no
        longer leads must not look like a live leader to the session's client."""
        self._forget_gone(now_ns)
        self._drop_pending()
        for sid in [sid for sid, s in self.sessions.items() if s.opened_log_position > commit_position]:
            session = self.sessions.pop(sid)
            self.rolled_back += 1
            if session.opened_term_id == NULL_VALUE:
                session.opened_term_id = leadership_term_id
            session.time_of_last_answer_ns = now_ns  # told now: the next answer waits its interval
            self.effects.append(
                SendEgress(
                    session.id,
                    session.response_channel,
                    session.response_stream_id,
                    self._closed_event(session, NULL_VALUE),
                )
            )
            self.effects.append(CloseEgress(session.id))
            self._remember_gone(session, now_ns)
        for sid, s in list(self.closed_uncommitted.items()):
            if s.closed_log_position > commit_position and s.opened_log_position <= commit_position:
                s.state = SessionState.OPEN
                s.closed_log_position = NULL_POSITION
                self.sessions[sid] = s
        self.closed_uncommitted.clear()
        for sid in self.sessions:
            self.effects.append(CloseEgress(sid))

    @staticmethod
    def _closed_event(session: ClusterSession, leader_member_id: int) -> SessionEvent:
        return SessionEvent(
            session.id,
            session.correlation_id,
            session.opened_term_id,
            leader_member_id,
            EventCode.CLOSED,
            CLIENT_PROTOCOL_VERSION,
            ELECTION_CLOSE_DETAIL,
        )

    def _remember_gone(self, session: ClusterSession, now_ns: int) -> None:
        self.gone[(session.opened_term_id, session.id)] = GoneSession(session, now_ns)
        while len(self.gone) > _GONE_LIMIT:
            del self.gone[next(iter(self.gone))]

    def _forget_gone(self, now_ns: int) -> None:
        """Sessions rolled back longer ago than the session timeout: their clients have given
        up on them by now (or notice unanswered requests by themselves)."""
        if self.gone:
            limit = self.settings.session_timeout_ns
            for key in [k for k, g in self.gone.items() if now_ns - g.dropped_at_ns > limit]:
                del self.gone[key]

    # ------------------------------------------------------------------ ingress while not leading

    def on_ingress_not_leading(
        self,
        leadership_term_id: int,
        cluster_session_id: int,
        *,
        leader_member_id: int,
        current_term_id: int,
        now_ns: int,
    ) -> bool:
        """A session message or keep-alive reached this member while it does not lead (a
        follower, a candidate, a leader still in its election). ``leader_member_id`` is the
        leader it knows of (NULL_VALUE in an election that has not found one). The client
        believes this member leads: tell it otherwise when possible (see the module docstring).
        True when an answer was decided."""
        gone = self.gone.get((leadership_term_id, cluster_session_id))
        if gone is not None:
            if now_ns - gone.dropped_at_ns > self.settings.session_timeout_ns:
                del self.gone[(leadership_term_id, cluster_session_id)]
                return False
            closed = gone.session
            if not self._answer_due(closed, now_ns):
                return False
            self.effects.append(
                SendEgress(
                    NULL_VALUE,
                    closed.response_channel,
                    closed.response_stream_id,
                    self._closed_event(closed, leader_member_id),
                )
            )
            return True
        session = self.sessions.get(cluster_session_id)
        if (
            session is None
            or session.state != SessionState.OPEN
            or leader_member_id == NULL_VALUE
            or leader_member_id == self.member_id
            or leadership_term_id > current_term_id
            or not self._answer_due(session, now_ns)
        ):
            return False
        self.effects.append(
            SendEgress(
                NULL_VALUE,
                session.response_channel,
                session.response_stream_id,
                NewLeaderEvent(current_term_id, session.id, leader_member_id, self.ingress_endpoints),
            )
        )
        return True

    def on_close_request_not_leading(self, leadership_term_id: int, cluster_session_id: int) -> None:
        """A client closing a session this member rolled back: nothing more to tell it."""
        self.gone.pop((leadership_term_id, cluster_session_id), None)

    def _answer_due(self, session: ClusterSession, now_ns: int) -> bool:
        if now_ns - session.time_of_last_answer_ns < self.settings.answer_interval_ns:
            return False
        session.time_of_last_answer_ns = now_ns
        self.answered_not_leading += 1
        return True

    def on_new_leadership(
        self, *, is_leader: bool, is_startup: bool, leadership_term_id: int, leader_member_id: int, now_ns: int
    ) -> None:
        """The election closed. The leader greets the sessions it inherited (or closes them after
        a full restart); every member restarts session timeouts."""
        for session in self.sessions.values():
            session.time_of_last_activity_ns = now_ns
            # Clients move their ingress to the new leader on a new image after the NewLeaderEvent
            # (see "Binding" in the module docstring).
            session.bound_image = None
        if not is_leader:
            return
        if is_startup:
            # Told (SessionEvent CLOSED, TIMEOUT): a client that is still there (this leader
            # restarted alone and won the election) reconnects instead of offering into a session
            # that no longer exists while the leader answers its ingress publication.
            for session in list(self.sessions.values()):
                self._close(session, CloseReason.TIMEOUT, leadership_term_id, now_ns, tell_client=True)
            return
        for session in self.sessions.values():
            self.effects.append(
                SendEgress(
                    session.id,
                    session.response_channel,
                    session.response_stream_id,
                    NewLeaderEvent(leadership_term_id, session.id, leader_member_id, self.ingress_endpoints),
                )
            )

    def drain_effects(self) -> list:
        effects = self.effects
        self.effects = []
        return effects
