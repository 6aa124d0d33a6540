"""The clustered service agent: applies the committed log to the user's service (core)

One :class:`ServiceAgent` per service thread. The container (``container.py``, the trio shell)
polls the log image bounded by the commit position and hands every fragment to
:meth:`ServiceAgent.on_log_fragment`; it polls the consensus module's messages (IPC stream 104)
and hands them to :meth:`ServiceAgent.on_consensus_message`. The agent decides what the service
sees and what goes back to the consensus module, and performs no I/O of its own: messages for the
consensus module leave through the ``send_to_consensus(bytes) -> int`` callable (an IPC
publication on stream 105 in the node), replies to clients through ``egress_offer``.

What a log entry does, in log order (the same on every member, so every service reaches the
same state):

==========================  ===========================================================
log entry                   effect
==========================  ===========================================================
session message (tid 1)     ``on_session_message(session or None, timestamp, payload)``;
                            a negative/unknown cluster session id is a service message
SessionOpenEvent            a :class:`ClientSession` is added; ``on_session_open``
SessionCloseEvent           ``on_session_close``; the session is removed
TimerEvent                  ``on_timer_event(correlation_id, timestamp)``
NewLeadershipTermEvent      the term and time unit change; ``on_new_leadership_term_event``
ClusterActionRequest        SNAPSHOT (live log, default flags): :attr:`snapshot_request` is
                            set and polling stops after this entry; the container takes
                            the snapshot and acks with its recording id (-1: failed)
==========================  ===========================================================

Every entry also moves :attr:`log_position` (the position *after* the entry) and cluster time
(the entry's timestamp: the leader's clock as written into the log, never the local clock).

The service's callbacks for an entry are called through one boundary: an entry whose position
is in the operator's skip list (``service.skips``) is not given to the service at all (the
agent's own bookkeeping above still follows it), and an exception a callback raises is handled
by the ``service_errors`` policy (``service.errors``): counted, reported and answered with a
ServiceErrorEvent (``record``), or raised out of the agent as ServiceErrorStop (``stop``).

Talking back (``Cluster`` handle, implemented here):

* ``offer(payload)``: a session message with ``cluster_session_id = service_id`` to the consensus
  module, which appends it to the log as a service message (exactly once, see the consensus
  module's pending-message tracker); it comes back to every service with ``session=None``.
* ``schedule_timer`` / ``cancel_timer`` / ``close_client_session``: ScheduleTimer, CancelTimer
  (each with the log position of the entry being applied: consensus.timers orders them by it),
  CloseSession messages to the consensus module.
* All four wait while the stream to the consensus module is full (:meth:`_send_accepted`):
  none is ever refused on one member and taken on another.
* ``ClientSession.offer``: on the leader, the container's egress publication to that client; on a
  follower :data:`MOCKED_OFFER` and nothing is sent (the reference does the same).

Acks: the consensus module waits for a ServiceAck after the service has started (and loaded its
snapshot), after a RequestServiceAck position is reached, after a snapshot (``relevant_id`` =
the snapshot's recording id, or -1 when it failed) and at termination.

Snapshots are taken only from the live log: a replay (``replaying``, set by the container while
it reads a replay's JoinLog) passes over ClusterActionRequests, as the state they describe is
already in a snapshot or is being rebuilt from an older one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from cluster_node.codecs import (
    CLUSTER_ACTION_FLAGS_DEFAULT,
    CONSENSUS_TO_SERVICE_CODEC,
    EGRESS_CODEC,
    LOG_CODEC,
    MAX_MESSAGE_LENGTH,
    NULL_VALUE,
    SERVICE_TO_CONSENSUS_CODEC,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    SESSION_PREFIX_WORD,
    CancelTimer,
    CloseReason,
    CloseSession,
    ClusterAction,
    ClusterActionRequest,
    ClusterTimeUnit,
    CodecError,
    JoinLog,
    NewLeadershipTermEvent,
    RequestServiceAck,
    ScheduleTimer,
    ServiceAck,
    ServiceErrorEvent,
    ServiceTerminationPosition,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
    decode_session_message,
    encode_session_message,
    unpack_session_header_from,
)
from cluster_node.media.outcomes import OfferResult, StopPolling
from cluster_node.service.api import MOCKED_OFFER, ClientSession, ClusteredService, Role
from cluster_node.service.errors import ServiceCallbackFailure, ServiceErrorPolicy, ServiceErrorStop, payload_prefix

__all__ = ["ServiceAgent", "ServiceAgentError", "ServiceStopping"]

EgressOffer = Callable[[ClientSession, bytes | bytearray | memoryview], int]


class ServiceAgentError(RuntimeError):
    """The log or the consensus module broke the agent's expectations (a bug, not bad input)."""


class ServiceStopping(BaseException):
    """A request of the service's waited for the consensus module while the node stops: the
    service thread ends here (a BaseException, so that no callback boundary records it as the
    service's error, which would apply the rest of the entry on this member only)."""


_SEND_PAUSE_MIN_S = 0.00005
_SEND_PAUSE_MAX_S = 0.001


class ServiceAgent:
    """Applies log entries to a :class:`ClusteredService` and is its ``Cluster`` handle."""

    def __init__(
        self,
        service: ClusteredService,
        *,
        member_id: int,
        service_id: int = 0,
        send_to_consensus: Callable[[bytes], int],
        egress_offer: EgressOffer | None = None,
        on_error: Callable[[str], None] | None = None,
        on_session_change: Callable[[ClientSession, bool], None] | None = None,
        service_errors: ServiceErrorPolicy | str = ServiceErrorPolicy.RECORD,
        on_service_error: Callable[[ServiceCallbackFailure], None] | None = None,
        egress_send: Callable[[ClientSession, bytes], int] | None = None,
        skip_positions: Collection[int] = (),
        on_skip: Callable[[int, str], None] | None = None,
        stopping: Callable[[], bool] | None = None,
        pause: Callable[[float], None] | None = None,
    ) -> None:
        self.service = service
        self._member_id = member_id
        self.service_id = service_id
        self._send = send_to_consensus
        self._egress_offer = egress_offer
        self._on_error = on_error or (lambda _msg: None)
        self._on_session_change = on_session_change
        """``(session, opened)`` before the service hears of it (the container's egress)."""
        self.service_errors_policy = ServiceErrorPolicy(service_errors)
        self._on_service_error = on_service_error
        """Told of every failure under ``record`` (the container counts and logs it)."""
        self._egress_send = egress_send
        """Sends an encoded egress message to a session's client (the ServiceErrorEvent)."""
        self.skip_positions: set[int] = set(skip_positions)
        """Log positions whose entries the service is not given (the operator's skip list,
        merged with the snapshot's)."""
        self._on_skip = on_skip
        self._stopping = stopping or (lambda: False)
        """True once the node stops: a request waiting for room gives up (ServiceStopping)."""
        self._pause = pause or (lambda _s: None)
        """``pause(seconds)`` between tries of a refused request (the container's time.sleep,
        which lets the consensus module's thread have the GIL)."""
        self.offer_waits = 0
        """Requests that found the stream to the consensus module full and waited for room."""
        self.service_errors = 0
        """Callback failures handled under ``record`` since this agent started."""
        self.entries_skipped = 0
        self._role = Role.FOLLOWER
        self._log_position = 0
        self._leadership_term_id = NULL_VALUE
        self._time = 0
        self._time_unit = ClusterTimeUnit.NANOS
        """Cluster time is the leader's wall clock in epoch nanoseconds on every member (the
        consensus module writes NANOS into every NewLeadershipTermEvent), so ``on_start`` already
        sees the unit the first entry will carry."""
        self._sessions: dict[int, ClientSession] = {}
        self.ack_id = 0
        self.started = False
        self.join_log: JoinLog | None = None
        self.termination_position: int | None = None
        self.terminated = False
        self.pending_ack_position: int | None = None
        self.malformed_entries = 0
        self.entries_applied = 0
        self.outbox_failures = 0
        self.replaying = False
        """Set by the container while it reads a replay: snapshot actions are passed over."""
        self.snapshot_request: tuple[int, int, int] | None = None
        """(log position, leadership term id, timestamp) of a SNAPSHOT action not yet taken."""
        self.snapshots_taken = 0

    # ------------------------------------------------------------------ life cycle

    def start(
        self,
        snapshot=None,
        log_position: int = 0,
        *,
        sessions=(),
        leadership_term_id: int = NULL_VALUE,
        time_unit: ClusterTimeUnit | None = None,
        skipped_positions: Collection[int] = (),
        role: Role | int | None = None,
    ) -> None:
        """Start the service (with its snapshot records, if any); the ack to the consensus
        module goes out with the next :meth:`check_positions` that finds it reachable.

        ``sessions`` are the snapshot's ClientSession records: they are open again before the
        service's ``on_start`` sees the snapshot; ``skipped_positions`` its skip list, kept on
        top of the operator's. ``role`` is the member's role now: ``on_role_change`` tells the
        service of it right after ``on_start``, so a service learns its first role as it learns
        every later one."""
        self._log_position = log_position
        if leadership_term_id != NULL_VALUE:
            self._leadership_term_id = leadership_term_id
        if time_unit is not None:
            self._time_unit = ClusterTimeUnit(time_unit)
        self.skip_positions.update(skipped_positions)
        for rec in sessions:
            session = ClientSession(
                rec.cluster_session_id,
                rec.response_stream_id,
                rec.response_channel,
                rec.encoded_principal,
                self._offer_to_client,
            )
            self._sessions[session.id] = session
            if self._on_session_change is not None:
                self._on_session_change(session, True)
        if role is not None and int(role) in (0, 1, 2):
            self._role = Role(role)
        self.service.on_start(self, snapshot)
        self.started = True
        self.pending_ack_position = log_position
        self.service.on_role_change(self._role)

    def ack_snapshot(self, recording_id: int) -> bool:
        """Tell the consensus module the snapshot asked for is taken (``recording_id``) or failed
        (-1); False when the message could not be sent yet (try again)."""
        request = self.snapshot_request
        if request is None:
            return True
        if not self._ack(request[0], recording_id):
            return False
        self.snapshot_request = None
        if recording_id != NULL_VALUE:
            self.snapshots_taken += 1
        return True

    def _ack(self, log_position: int, relevant_id: int = NULL_VALUE) -> bool:
        msg = ServiceAck(log_position, self._time, self.ack_id, relevant_id, self.service_id)
        if self._send(SERVICE_TO_CONSENSUS_CODEC.encode(msg)) > 0:
            self.ack_id += 1
            return True
        self.outbox_failures += 1
        return False

    def set_role(self, role: Role) -> None:
        """The node's role changed (the container reads it from the role counter)."""
        role = Role(role)
        if role != self._role:
            self._role = role
            self.service.on_role_change(role)

    # ------------------------------------------------------------------ consensus module -> service

    def on_consensus_message(self, buf) -> None:
        """A message on stream 104. Unknown or malformed ones are counted and dropped."""
        try:
            msg = CONSENSUS_TO_SERVICE_CODEC.decode(buf)
        except CodecError as e:
            self.malformed_entries += 1
            self._on_error(f"malformed consensus module message: {e}")
            return
        if isinstance(msg, JoinLog):
            self.join_log = msg
            self.set_role(Role(msg.role) if msg.role in (0, 1, 2) else Role.FOLLOWER)
        elif isinstance(msg, RequestServiceAck):
            self.pending_ack_position = msg.log_position
        elif isinstance(msg, ServiceTerminationPosition):
            self.termination_position = msg.log_position
        # ClusterMembersResponse etc.: not used by the agent.

    def check_positions(self) -> None:
        """Send the acks that are due now that the log has reached a position (none while a
        snapshot is being taken: its ack comes first)."""
        if self.snapshot_request is not None:
            return
        if self.pending_ack_position is not None and self._log_position >= self.pending_ack_position:
            if self._ack(self._log_position):
                self.pending_ack_position = None
        if (
            self.termination_position is not None
            and not self.terminated
            and self._log_position >= self.termination_position
        ):
            self.service.on_terminate(self)
            if self._ack(self._log_position):
                self.terminated = True

    # ------------------------------------------------------------------ the log

    def on_log_fragment(self, buf, offset: int, length: int, header: Any) -> None:
        """One committed log message (a FragmentHandler for ``Image.bounded_poll``)."""
        position = header.position
        if length >= SESSION_HEADER_LENGTH and buf[offset] == SESSION_MESSAGE_TEMPLATE_ID:
            # The hot path, on every member for every client message: the header read in place
            # (what decode_session_message checks, without building its objects); the payload is
            # a slice of the log buffer, as decode_session_message gives it.
            prefix, term_id, session_id, timestamp = unpack_session_header_from(buf, offset)
            if prefix == SESSION_PREFIX_WORD and term_id >= NULL_VALUE and length <= MAX_MESSAGE_LENGTH:
                self._log_position = position
                self._time = timestamp
                self.entries_applied += 1
                if self.skip_positions and position in self.skip_positions:
                    self._skip("on_session_message")
                    return
                session = self._sessions.get(session_id)
                payload = buf[offset + SESSION_HEADER_LENGTH : offset + length]
                try:
                    self.service.on_session_message(session, timestamp, payload)
                except Exception as e:  # noqa: BLE001 - the service_errors policy decides
                    self._failed("on_session_message", e, session, payload)
                return
        view = buf[offset : offset + length]
        try:
            if length and view[0] == SESSION_MESSAGE_TEMPLATE_ID:
                # Refused above, so malformed: decode_session_message raises, naming the fault.
                decode_session_message(view)
                raise CodecError("malformed session message")
            msg = LOG_CODEC.decode(view)
        except CodecError as e:
            self._log_position = position
            self.malformed_entries += 1
            self._on_error(f"malformed log entry at {position}: {e}")
            return
        self._log_position = position
        self.entries_applied += 1
        self._apply(msg)

    def _apply(self, msg) -> None:
        service = self.service
        if isinstance(msg, SessionOpenEvent):
            self._time = msg.timestamp
            session = ClientSession(
                msg.cluster_session_id,
                msg.response_stream_id,
                msg.response_channel,
                msg.encoded_principal,
                self._offer_to_client,
            )
            self._sessions[session.id] = session
            if self._on_session_change is not None:
                self._on_session_change(session, True)
            self._call("on_session_open", session, service.on_session_open, session, msg.timestamp)
        elif isinstance(msg, SessionCloseEvent):
            self._time = msg.timestamp
            session = self._sessions.pop(msg.cluster_session_id, None)
            if session is not None:
                self._call(
                    "on_session_close",
                    session,
                    service.on_session_close,
                    session,
                    msg.timestamp,
                    CloseReason(msg.close_reason),
                )
                if self._on_session_change is not None:
                    self._on_session_change(session, False)
        elif isinstance(msg, TimerEvent):
            self._time = msg.timestamp
            self._call("on_timer_event", None, service.on_timer_event, msg.correlation_id, msg.timestamp)
        elif isinstance(msg, NewLeadershipTermEvent):
            self._time = msg.timestamp
            self._leadership_term_id = msg.leadership_term_id
            self._time_unit = ClusterTimeUnit(msg.time_unit)
            self._call(
                "on_new_leadership_term_event",
                None,
                service.on_new_leadership_term_event,
                msg.leadership_term_id,
                msg.log_position,
                msg.timestamp,
                msg.term_base_log_position,
                msg.leader_member_id,
                msg.log_session_id,
                ClusterTimeUnit(msg.time_unit),
                msg.app_version,
            )
        elif isinstance(msg, ClusterActionRequest):
            self._time = msg.timestamp
            if (
                msg.action == ClusterAction.SNAPSHOT
                and msg.flags == CLUSTER_ACTION_FLAGS_DEFAULT
                and not self.replaying
            ):
                self.snapshot_request = (self._log_position, msg.leadership_term_id, msg.timestamp)
                raise StopPolling

    # ------------------------------------------------------------------ the callback boundary

    def _call(self, callback: str, session: ClientSession | None, fn: Callable[..., object], *args) -> None:
        """Call a service callback for the entry at :attr:`log_position`, unless it is skipped;
        an exception goes to the service_errors policy."""
        if self.skip_positions and self._log_position in self.skip_positions:
            self._skip(callback)
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - the service_errors policy decides
            self._failed(callback, e, session, None)

    def _skip(self, callback: str) -> None:
        self.entries_skipped += 1
        if self._on_skip is not None:
            self._on_skip(self._log_position, callback)

    def _failed(self, callback: str, error: Exception, session: ClientSession | None, payload) -> None:
        """A callback raised applying the entry at :attr:`log_position` (the same on every
        member): stop (ServiceErrorStop out of the agent) or record and answer the client."""
        failure = ServiceCallbackFailure(
            callback, self._log_position, None if session is None else session.id, payload_prefix(payload), error
        )
        if self.service_errors_policy is ServiceErrorPolicy.STOP:
            raise ServiceErrorStop(failure) from error
        self.service_errors += 1
        if self._on_service_error is not None:
            self._on_service_error(failure)
        hook = getattr(self.service, "on_callback_error", None)
        try:
            answered = hook is not None and hook(session, self._log_position, callback, error) is True
        except Exception as e:  # noqa: BLE001 - the hook's own failure: the client gets the event
            answered = False
            self._on_error(f"on_callback_error raised {type(e).__name__}: {e} at log position {self._log_position}")
        if (
            not answered
            and session is not None
            and payload is not None
            and self._role == Role.LEADER
            and self._egress_send is not None
        ):
            event = ServiceErrorEvent(
                session.id, self._leadership_term_id, self._log_position, failure.error_text, failure.payload_prefix
            )
            self._egress_send(session, EGRESS_CODEC.encode(event))

    def _offer_to_client(self, session: ClientSession, payload) -> int:
        if self._role != Role.LEADER or self._egress_offer is None:
            return MOCKED_OFFER
        return self._egress_offer(session, payload)

    # ------------------------------------------------------------------ Cluster handle

    @property
    def member_id(self) -> int:
        return self._member_id

    @property
    def role(self) -> Role:
        return self._role

    @property
    def log_position(self) -> int:
        return self._log_position

    @property
    def leadership_term_id(self) -> int:
        return self._leadership_term_id

    @property
    def time(self) -> int:
        return self._time

    @property
    def time_unit(self) -> ClusterTimeUnit:
        return self._time_unit

    @property
    def client_sessions(self) -> Collection[ClientSession]:
        return self._sessions.values()

    def get_client_session(self, cluster_session_id: int) -> ClientSession | None:
        return self._sessions.get(cluster_session_id)

    def close_client_session(self, cluster_session_id: int) -> bool:
        """False, and nothing sent, for a session that is not open (unknown, or closed already:
        a kick racing the client's own close is normal, and the same on every member)."""
        session = self._sessions.get(cluster_session_id)
        if session is None:
            return False
        if session.is_closing:
            return True
        self._send_accepted(SERVICE_TO_CONSENSUS_CODEC.encode(CloseSession(cluster_session_id)))
        session.is_closing = True
        return True

    def offer(self, payload) -> int:
        """Append a service message: waits until the consensus module's stream takes it (see
        :meth:`_send_accepted`), so every member gives the same message the same id. Returns the
        stream position (> 0). A payload longer than the stream's maximum message length raises
        ``MessageTooLongError`` (a ``ValueError``), alike on every member."""
        data = encode_session_message(self._leadership_term_id, self.service_id, 0, payload)
        return self._send_accepted(data)

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        """Always True: the request waits for room like :meth:`offer` (never "try again")."""
        self._send_accepted(
            SERVICE_TO_CONSENSUS_CODEC.encode(ScheduleTimer(correlation_id, deadline, self._log_position))
        )
        return True

    def cancel_timer(self, correlation_id: int) -> bool:
        """Always True (the request waits for room); cancelling an unknown timer does nothing."""
        self._send_accepted(SERVICE_TO_CONSENSUS_CODEC.encode(CancelTimer(correlation_id, self._log_position)))
        return True

    # ------------------------------------------------------------------ requests that must not be lost

    def _send_accepted(self, data: bytes) -> int:
        """Offer ``data`` to the consensus module until its stream takes it; the position.

        A request from a log callback must reach the consensus module on every member or on
        none: a service message refused on one member and taken on another would give the
        following messages different service session ids on the two (exactly-once across a
        failover rests on those ids), and a lost ScheduleTimer would leave the members' timer
        tables different. The stream between the two threads refuses only while it is full
        (back-pressure: the consensus module drains it on every pass) or not yet connected, so
        the service thread waits here, yielding the GIL to the consensus module. A node that is
        stopping ends the wait with :class:`ServiceStopping` (the thread ends; nothing after it
        is applied, as when the process dies)."""
        result = self._send(data)
        if result > 0:
            return result
        return self._wait_send(data, result)

    def _wait_send(self, data: bytes, result: int) -> int:
        self.offer_waits += 1
        pause_s = 0.0
        waited_s = 0.0
        warned_s = 5.0
        while result <= 0:
            if result in (OfferResult.CLOSED, OfferResult.MAX_POSITION_EXCEEDED):
                raise ServiceStopping(f"the stream to the consensus module is {OfferResult(result).name}")
            if self._stopping():
                raise ServiceStopping("the node is stopping")
            self._pause(pause_s)
            waited_s += pause_s
            pause_s = min(_SEND_PAUSE_MAX_S, pause_s * 2 or _SEND_PAUSE_MIN_S)
            if waited_s >= warned_s:
                warned_s += 5.0
                self._on_error(
                    f"the consensus module has not taken a request for {waited_s:.0f} s "
                    f"({OfferResult(result).name}); still waiting"
                )
            result = self._send(data)
        return result
