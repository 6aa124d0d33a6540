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

Only a few are used here: a connect request that passes the checks is AUTHENTICATED (there is no
authenticator beyond the protocol version), becomes OPEN when its SessionOpenEvent is appended,
CLOSING when a close is decided, and is forgotten once its SessionCloseEvent is appended. A
rejected request never becomes a session: it gets SessionEvent ERROR and nothing is logged.

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

import enum
from dataclasses import dataclass, field
from typing import Any

from cluster_node.codecs import (
    CLIENT_PROTOCOL_MAJOR_VERSION,
    CLIENT_PROTOCOL_VERSION,
    NULL_POSITION,
    NULL_VALUE,
    CloseReason,
    EventCode,
    NewLeaderEvent,
    SessionCloseEvent,
    SessionConnectRequest,
    SessionEvent,
    SessionOpenEvent,
    semantic_version_major,
)
from media.channel import reply_channel_refusal

__all__ = [
    "SessionState",
    "ClusterSession",
    "ClusterSessions",
    "AppendSessionEvent",
    "NOT_IN_LOG",
    "SendEgress",
    "CloseEgress",
    "SessionSettings",
    "response_channel_refusal",
]


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

def response_channel_refusal(channel: str, stream_id: int, source_host: str | None,
                             egress_stream_id: int) -> str | None:
    """Why a connect request's response channel is refused, or None when it may be used:
    ``media.channel.reply_channel_refusal`` (a plain UDP endpoint of the request's own source),
    and the cluster's egress stream. The kind of refusal is the text before the first colon."""
    refusal = reply_channel_refusal(channel, source_host)
    if refusal is None and stream_id != egress_stream_id:
        return f"stream: the response stream must be the cluster's egress stream {egress_stream_id}, not {stream_id}"
    return refusal


_GONE_LIMIT = 256
"""Most sessions a member remembers having rolled back (the oldest are forgotten first)."""


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


@dataclass(slots=True)
class GoneSession:
    """A session this member opened as leader and rolled back: kept for a while so that ingress
    still arriving from its client can be answered (the session's egress channel is known here
    and nowhere else)."""

    session: ClusterSession
    dropped_at_ns: int


NOT_IN_LOG = 2**63 - 1
"""A session event decided by the leader and not yet appended: beyond every commit position."""


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
    rejected: int = 0
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
    ) -> ClusterSession | None:
        """A client asks to connect. Returns the new session when it was opened (leader)."""

        def answer(code: EventCode, detail: str, session_id: int = NULL_VALUE) -> None:
            self.effects.append(SendEgress(
                session_id, req.response_channel, req.response_stream_id,
                SessionEvent(session_id, req.correlation_id, leadership_term_id, leader_member_id,
                             code, CLIENT_PROTOCOL_VERSION, detail),
            ))

        if not is_leader:
            answer(EventCode.REDIRECT, self.ingress_endpoints)
            return None
        if semantic_version_major(req.version) != CLIENT_PROTOCOL_MAJOR_VERSION:
            self.rejected += 1
            answer(EventCode.ERROR, f"invalid client version {req.version}")
            return None
        if len(self.sessions) >= self.settings.max_sessions:
            self.rejected += 1
            answer(EventCode.ERROR, "concurrent session limit")
            return None
        session = ClusterSession(
            self.next_session_id, req.correlation_id, req.response_stream_id, req.response_channel,
            SessionState.OPEN, now_ns, opened_log_position=NOT_IN_LOG, opened_term_id=leadership_term_id,
        )
        self.next_session_id += 1
        self.sessions[session.id] = session
        self.effects.append(AppendSessionEvent(SessionOpenEvent(
            leadership_term_id, req.correlation_id, session.id, now_ns,
            req.response_stream_id, req.response_channel,
        ), session))
        answer(EventCode.OK, "", session.id)
        return session

    # ------------------------------------------------------------------ activity (leader)

    def on_ingress(self, leadership_term_id: int, cluster_session_id: int, current_term_id: int, now_ns: int,
                   count: int = 1) -> bool:
        """A session message arrived (``count`` of them, all of that session and term): True
        when they may be appended (open session, current term)."""
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state != SessionState.OPEN:
            return False
        if leadership_term_id != current_term_id:
            self.stale_term_dropped += count
            if leadership_term_id < current_term_id and self._answer_due(session, now_ns):
                # The client missed this leader's NewLeaderEvent (or has yet to read it): again.
                self.effects.append(SendEgress(
                    session.id, session.response_channel, session.response_stream_id,
                    NewLeaderEvent(current_term_id, session.id, self.member_id, self.ingress_endpoints),
                ))
            return False
        session.time_of_last_activity_ns = now_ns
        return True

    def on_keep_alive(self, leadership_term_id: int, cluster_session_id: int, current_term_id: int, now_ns: int) -> bool:
        return self.on_ingress(leadership_term_id, cluster_session_id, current_term_id, now_ns)

    def on_close_request(self, leadership_term_id: int, cluster_session_id: int, current_term_id: int,
                         now_ns: int) -> bool:
        session = self.sessions.get(cluster_session_id)
        if session is None or session.state != SessionState.OPEN or leadership_term_id != current_term_id:
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
                self.effects.append(SendEgress(
                    session.id, session.response_channel, session.response_stream_id,
                    SessionEvent(session.id, NULL_VALUE, leadership_term_id, self.member_id, EventCode.OK,
                                 CLIENT_PROTOCOL_VERSION, SUSPENDED_DETAIL),
                ))
        return len(self.sessions)

    def check_timeouts(self, current_term_id: int, now_ns: int) -> int:
        """Leader: close sessions silent for longer than the session timeout."""
        timeout = self.settings.session_timeout_ns
        expired = [s for s in self.sessions.values()
                   if s.state == SessionState.OPEN and now_ns - s.time_of_last_activity_ns > timeout]
        for session in expired:
            self.timed_out += 1
            self._close(session, CloseReason.TIMEOUT, current_term_id, now_ns, tell_client=True)
        return len(expired)

    def _close(self, session: ClusterSession, reason: CloseReason, term_id: int, now_ns: int, *,
               tell_client: bool) -> None:
        session.state = SessionState.CLOSING
        session.close_reason = reason
        session.closed_log_position = NOT_IN_LOG
        self.effects.append(AppendSessionEvent(SessionCloseEvent(term_id, session.id, now_ns, reason), session))
        if tell_client:
            self.effects.append(SendEgress(
                session.id, session.response_channel, session.response_stream_id,
                SessionEvent(session.id, session.correlation_id, term_id, self.member_id, EventCode.CLOSED,
                             CLIENT_PROTOCOL_VERSION, reason.name),
            ))
        self.effects.append(CloseEgress(session.id))
        del self.sessions[session.id]
        self.closed_uncommitted[session.id] = session

    # ------------------------------------------------------------------ the committed log (followers)

    def on_log_session_open(self, event: SessionOpenEvent, log_position: int) -> None:
        """A SessionOpenEvent applied from the log (follower, or leader replay)."""
        if event.cluster_session_id not in self.sessions:
            self.sessions[event.cluster_session_id] = ClusterSession(
                event.cluster_session_id, event.correlation_id, event.response_stream_id,
                event.response_channel, SessionState.OPEN, 0, opened_log_position=log_position,
                encoded_principal=event.encoded_principal, opened_term_id=event.leadership_term_id,
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
        for sid in [sid for sid, s in self.sessions.items() if s.opened_log_position > commit_position]:
            session = self.sessions.pop(sid)
            self.rolled_back += 1
            if session.opened_term_id == NULL_VALUE:
                session.opened_term_id = leadership_term_id
            session.time_of_last_answer_ns = now_ns  # told now: the next answer waits its interval
            self.effects.append(SendEgress(
                session.id, session.response_channel, session.response_stream_id,
                self._closed_event(session, NULL_VALUE),
            ))
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
        return SessionEvent(session.id, session.correlation_id, session.opened_term_id, leader_member_id,
                            EventCode.CLOSED, CLIENT_PROTOCOL_VERSION, ELECTION_CLOSE_DETAIL)

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

    def on_ingress_not_leading(self, leadership_term_id: int, cluster_session_id: int, *, leader_member_id: int,
                               current_term_id: int, now_ns: int) -> bool:
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
            session = gone.session
            if not self._answer_due(session, now_ns):
                return False
            self.effects.append(SendEgress(
                NULL_VALUE, session.response_channel, session.response_stream_id,
                self._closed_event(session, leader_member_id),
            ))
            return True
        session = self.sessions.get(cluster_session_id)
        if (session is None or session.state != SessionState.OPEN or leader_member_id == NULL_VALUE
                or leader_member_id == self.member_id or leadership_term_id > current_term_id
                or not self._answer_due(session, now_ns)):
            return False
        self.effects.append(SendEgress(
            NULL_VALUE, session.response_channel, session.response_stream_id,
            NewLeaderEvent(current_term_id, session.id, leader_member_id, self.ingress_endpoints),
        ))
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

    def on_new_leadership(self, *, is_leader: bool, is_startup: bool, leadership_term_id: int,
                          leader_member_id: int, now_ns: int) -> None:
        """The election closed. The leader greets the sessions it inherited (or closes them after
        a full restart); every member restarts session timeouts."""
        for session in self.sessions.values():
            session.time_of_last_activity_ns = now_ns
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
            self.effects.append(SendEgress(
                session.id, session.response_channel, session.response_stream_id,
                NewLeaderEvent(leadership_term_id, session.id, leader_member_id, self.ingress_endpoints),
            ))

    def drain_effects(self) -> list:
        effects = self.effects
        self.effects = []
        return effects
