"""ClusterClient: a client session with the cluster, over its own media driver (trio).

Protocol (the reference's ``AeronCluster``; message fields in ``cluster_node.codecs``)
=====================================================================================
::

    client                                            cluster member (ingress 101 / egress 102)
      |-- SessionConnectRequest(correlation_id, egress stream, version, egress channel) -->|
      |<-------------- SessionEvent(correlation_id, code, session id, term, leader) --------|
      |      OK                      connected: cluster_session_id, leadership_term_id, leader
      |      REDIRECT                the member is a follower; detail = "0=h:p,1=h:p,...",
      |                              leader_member_id names the leader (-1: none yet, retry)
      |      ERROR / AUTHENTICATION_REJECTED   raised to the caller (e.g. "invalid client version")
      |<-------------- Challenge(correlation_id, session id, challenge) (an authenticating leader)
      |-- ChallengeResponse(correlation_id, session id, credentials.on_challenge(challenge)) ->|
      |      ... then SessionEvent OK or AUTHENTICATION_REJECTED (with the cluster's reason)
      |-- session message [32-byte header: term, session id, timestamp -1][payload] ------->|
      |<----------------- session message [header][reply payload] (from the leader's service)|
      |-- SessionKeepAlive(term, session id)  every keep_alive_interval when otherwise idle ->|
      |<------- NewLeaderEvent(term, session id, leader, ingress endpoints) (after elections)|
      |<------- SessionEvent CLOSED (session timed out or closed by the service)            |
      |<------- ServiceErrorEvent (the service raised on one of our messages: no reply)     |
      |-- SessionCloseRequest(term, session id)  on close --------------------------------->|

Connecting (the reference's ``AsyncConnect``: ask every member, follow REDIRECTs, one deadline)
is described where it lives, in ``cluster_node.client.connect``.

After connecting, a background task (the client's duty cycle) polls egress, hands session
messages to the handler, sends keep-alives and watches the leader:

* **NewLeaderEvent** for this session: the term and leader are updated and the ingress
  publication moves to the new leader's endpoint. The session continues; messages offered while
  the new publication connects are refused with NOT_CONNECTED (the caller retries).
* **Leader silence**: the ingress publication is not connected, or the egress stream from the
  leader is gone, for ``leader_silence_timeout`` with no NewLeaderEvent. The leader is taken to
  be gone for good (the cluster restarted, or the event was lost): the client connects anew to
  whichever member leads now, and gets a new session (``on_reconnect`` tells the application).
  It keeps trying for ``reconnect_timeout`` (a refusal for the session limit included: the new
  leader may still hold sessions of clients that have moved on), then closes with ``error`` set.
* **Unanswered requests**: messages were offered and nothing at all came back on egress for
  this session (no reply, no event) for ``leader_silence_timeout``, while the ingress stays
  connected. The member taken for the leader no longer leads for this session (it stepped down
  and its open was never committed, and the event telling us was lost): the client connects anew,
  as after a silent leader. This assumes the service answers requests; a client of a service
  that never answers passes ``reconnect_when_unanswered=False``.
* **SessionEvent CLOSED**: closed by the service (SERVICE_ACTION), the client closes, as the
  reference's does. Closed for TIMEOUT (the client was silent longer than the session timeout,
  or a leader that restarted closed the sessions it inherited from the log) or for "election"
  (the leader stepped down before the session's open was committed: the session never
  happened), the client is still here: it connects anew and gets a new session, as after a
  silent leader (the reference's client closes here too, and every application has to
  reconnect by hand). An event of an earlier term than the session's is for an older session
  with the same id (ids start again with each leader) and is ignored.

**Credentials** (the reference's ``CredentialsSupplier``): ``credentials=`` an object with
``encoded_credentials() -> bytes`` (sent in every connect request) and ``on_challenge(
encoded_challenge) -> bytes`` (the answer to a Challenge); :class:`SharedSecretCredentials` is
the one for the cluster's shared-secret authenticator, read from ``client.credentials_file``
when the config names one. A refusal raises :class:`AuthenticationError` with the cluster's
reason. A reconnect authenticates again.

**Admin requests**: :meth:`ClusterClient.request_snapshot` sends an AdminRequest SNAPSHOT and
returns the AdminResponse (OK, UNAUTHORISED_ACCESS, ERROR with a message).

Across a reconnect nothing is sent again: a message offered to the old session was applied once
or not at all, and only the application knows whether to offer it again (``on_reconnect``).

``offer`` never waits: it returns the new ingress position (> 0) or a negative
``cluster_node.media.publication.OfferResult`` (NOT_CONNECTED while connecting or switching leader,
BACK_PRESSURED when the window is full, CLOSED after close). ``offer_wait`` retries until
accepted or a deadline.

**ServiceErrorEvent** (this project's): the service raised while applying one of this session's
messages (``service_errors = "record"`` on the cluster), so no reply will come for it. It carries
the log position, the error text and the message's first bytes. With an ``on_message`` handler
it goes to ``on_service_error`` (or is logged and counted when there is none); otherwise it
takes its place among the replies, and ``receive()`` raises it as :class:`ServiceRequestError`
when its turn comes. ``service_errors_received`` counts them.

Bad egress input (undecodable messages, messages for other sessions) is counted in
``egress_errors`` / ``foreign_messages`` and dropped, never raised.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import random
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from cluster_node.client.connect import POLL_S, AsyncConnect, udp_channel
from cluster_node.client.credentials import FixedCredentials, NullCredentialsSupplier, SharedSecretCredentials
from cluster_node.client.errors import (
    ClientClosedError,
    ClusterClientError,
    ServiceRequestError,
)
from cluster_node.codecs import (
    CLIENT_PROTOCOL_VERSION,
    NULL_VALUE,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    SESSION_PREFIX_WORD,
    AdminRequest,
    AdminRequestType,
    AdminResponse,
    Challenge,
    CloseReason,
    CodecError,
    EventCode,
    NewLeaderEvent,
    ServiceErrorEvent,
    SessionCloseRequest,
    SessionEvent,
    SessionKeepAlive,
    SessionMessageHeader,
    decode_egress,
    encode_ingress,
    session_header,
    unpack_session_header_from,
)
from cluster_node.config import ClientConfig, ClientSection, ConfigError, parse_ingress_endpoints
from cluster_node.media.channel import parse_endpoint
from cluster_node.media.driver import MediaDriver, open_media_driver
from cluster_node.media.library_log import library_logger
from cluster_node.media.publication import ExclusivePublication, OfferResult

__all__ = [
    "ClusterClient",
    "open_cluster_client",
    "MessageHandler",
]

log = library_logger("cluster_node.client")

MessageHandler = Callable[[memoryview, SessionMessageHeader], None]
"""``handler(payload, header)``: payload is a view valid only during the call (copy to keep)."""

_EGRESS_FRAGMENT_LIMIT = 256
_LIVENESS_CHECK_S = 0.1


def _free_udp_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ClusterClient(AsyncConnect):
    """One client session. Create with :func:`open_cluster_client`.

    Attributes a caller may read: ``cluster_session_id``, ``leadership_term_id``,
    ``leader_member_id``, ``ingress_endpoints``, ``is_connected``, ``is_closed``, ``error``,
    and the counters ``messages_received``, ``egress_errors``, ``foreign_messages``,
    ``keep_alives_sent``, ``reconnects``, ``new_leader_events``.
    """

    def __init__(
        self,
        config: ClientConfig,
        driver: MediaDriver,
        *,
        on_message: MessageHandler | None = None,
        on_new_leader: Callable[[int, int], None] | None = None,
        on_reconnect: Callable[[int], None] | None = None,
        protocol_version: int = CLIENT_PROTOCOL_VERSION,
        encoded_credentials: bytes = b"",
        on_service_error: Callable[[ServiceRequestError], None] | None = None,
        reconnect_when_unanswered: bool = True,
        credentials=None,
    ) -> None:
        c: ClientSection = config.client
        self.config = config
        self.driver = driver
        self._on_message = on_message
        self.on_new_leader = on_new_leader
        """``on_new_leader(leadership_term_id, leader_member_id)`` after a NewLeaderEvent."""
        self.on_reconnect = on_reconnect
        """``on_reconnect(cluster_session_id)`` after a new session replaced a silent one."""
        self.on_service_error = on_service_error
        """``on_service_error(error)`` for a ServiceErrorEvent, when ``on_message`` is used."""
        self._protocol_version = protocol_version
        if credentials is None and encoded_credentials:
            credentials = FixedCredentials(bytes(encoded_credentials))
        if credentials is None and c.credentials_file:
            credentials = SharedSecretCredentials.from_file(c.credentials_file)
        self.credentials = credentials if credentials is not None else NullCredentialsSupplier()
        """The credentials supplier (see the module docstring)."""
        self._admin_responses: dict[int, AdminResponse | None] = {}
        self._admin_lot = trio.lowlevel.ParkingLot()
        self.ingress_endpoints: dict[int, str] = parse_ingress_endpoints(
            c.ingress_endpoints, "client.ingress_endpoints"
        )
        self._ingress_stream_id = c.ingress_stream_id
        self._egress_stream_id = c.egress_stream_id
        host, port = parse_endpoint(c.egress_endpoint)
        if port == 0:
            port = _free_udp_port(host)
        self.egress_channel = udp_channel(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        self._message_timeout_ns = c.message_timeout_ns
        self._connect_timeout_ns = c.connect_timeout_ns
        self._keep_alive_interval_ns = c.keep_alive_interval_ns
        self._silence_timeout_ns = c.leader_silence_timeout_ns
        self._reconnect_timeout_ns = c.reconnect_timeout_ns

        self.cluster_session_id = NULL_VALUE
        self.leadership_term_id = NULL_VALUE
        self.leader_member_id = NULL_VALUE
        self._ingress: ExclusivePublication | None = None
        self._header = b""
        self._correlation_ids = itertools.count(random.getrandbits(62) + 1)
        self._connect_ids: dict[int, int] = {}
        """Correlation id -> member id of the connect requests of the latest connect: its replies,
        and after it any second OK, whose session is closed."""
        self._connect_replies: list[tuple[int, SessionEvent | Challenge]] = []
        self._connecting = False
        self._closed = False
        self.error: str | None = None
        """Why the client closed, when it was not the application's choice."""

        self._egress = driver.add_subscription(self.egress_channel, self._egress_stream_id)
        self._inbox: collections.deque[tuple[bytes, SessionMessageHeader] | ServiceRequestError] = collections.deque(
            maxlen=c.egress_buffer_messages
        )
        self._inbox_lot = trio.lowlevel.ParkingLot()
        self._offers_since_keep_alive = 0
        self._next_keep_alive_ns = 0
        self._last_leader_sign_ns = time.monotonic_ns()
        self._reconnect_when_unanswered = reconnect_when_unanswered
        self._offers_since_answer = 0
        self._unanswered_since_ns = 0
        """When the duty cycle first saw offers with no answer since (0: everything answered)."""

        self.messages_received = 0
        self.service_errors_received = 0
        self.egress_errors = 0
        self.foreign_messages = 0
        self.inbox_dropped = 0
        self.keep_alives_sent = 0
        self.reconnects = 0
        self._reconnect_wanted = False
        self.new_leader_events = 0
        self.unanswered_reconnects = 0
        self.connect_requests_sent = 0
        self.spare_sessions_closed = 0

    # ---------------------------------------------------------------- state

    @property
    def is_connected(self) -> bool:
        """Connected to a leader with an open session (its ingress may still be connecting)."""
        return not self._closed and not self._connecting and self.cluster_session_id != NULL_VALUE

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def ingress_position(self) -> int:
        return self._ingress.position if self._ingress is not None else NULL_VALUE

    def __repr__(self) -> str:
        return (
            f"<ClusterClient session={self.cluster_session_id} term={self.leadership_term_id}"
            f" leader={self.leader_member_id} {'closed' if self._closed else 'open'}>"
        )

    # ---------------------------------------------------------------- sending

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        """Send ``payload`` to the cluster; the new position (> 0) or a negative OfferResult."""
        pub = self._ingress
        if pub is None or self._connecting or self._reconnect_wanted:
            return OfferResult.CLOSED if self._closed else OfferResult.NOT_CONNECTED
        result = pub.offer(self._header + payload)
        if result > 0:
            self._offers_since_keep_alive += 1
            self._offers_since_answer += 1
        return result

    async def offer_wait(self, payload: bytes | bytearray | memoryview, timeout: float = 5.0) -> int:
        """Offer until accepted (waiting out back-pressure, a connect or a leader change); the
        position. Raises ClientClosedError, or trio.TooSlowError after ``timeout`` seconds."""
        with trio.fail_after(timeout):
            delay = 0.0005
            while True:
                result = self.offer(payload)
                if result > 0:
                    return result
                if result == OfferResult.CLOSED or self._closed:
                    raise ClientClosedError(f"client is closed{': ' + self.error if self.error else ''}")
                if result == OfferResult.MAX_POSITION_EXCEEDED:
                    raise ClusterClientError("ingress publication reached its maximum position")
                await trio.sleep(delay)
                delay = min(delay * 2, 0.02)

    def send_keep_alive(self) -> bool:
        """One SessionKeepAlive (3 attempts, as the reference); True when sent."""
        pub = self._ingress
        if pub is None or self._connecting or self.cluster_session_id == NULL_VALUE:
            return False
        msg = encode_ingress(SessionKeepAlive(self.leadership_term_id, self.cluster_session_id))
        for _ in range(3):
            if pub.offer(msg) > 0:
                self.keep_alives_sent += 1
                return True
        return False

    def _set_session(self, session_id: int, term_id: int, leader_id: int) -> None:
        self.cluster_session_id = session_id
        self.leadership_term_id = term_id
        self.leader_member_id = leader_id
        # The timestamp is the leader's to set when it appends the message to the log.
        self._header = session_header(term_id, session_id, NULL_VALUE)

    # ---------------------------------------------------------------- receiving

    def poll_egress(self, fragment_limit: int = _EGRESS_FRAGMENT_LIMIT) -> int:
        """Handle up to ``fragment_limit`` egress messages; how many were handled. The client's
        background task calls this; an application need not."""
        return self._egress.poll(self._on_fragment, fragment_limit)

    def _on_fragment(self, buf: memoryview, offset: int, length: int, header) -> None:
        if length >= SESSION_HEADER_LENGTH and buf[offset] == SESSION_MESSAGE_TEMPLATE_ID:
            try:
                prefix, term_id, session_id, timestamp = unpack_session_header_from(buf, offset)
            except struct.error:
                self.egress_errors += 1
                return
            if prefix != SESSION_PREFIX_WORD:
                self.egress_errors += 1
                return
            if session_id != self.cluster_session_id:
                self.foreign_messages += 1
                return
            self._offers_since_answer = 0  # _answered(), inline on the hot path
            self._unanswered_since_ns = 0
            self.messages_received += 1
            msg_header = SessionMessageHeader(term_id, session_id, timestamp)
            payload = buf[offset + SESSION_HEADER_LENGTH : offset + length]
            handler = self._on_message
            if handler is not None:
                handler(payload, msg_header)
            else:
                self._enqueue((bytes(payload), msg_header))
            return
        try:
            msg = decode_egress(buf[offset : offset + length])
        except CodecError as ex:
            self.egress_errors += 1
            log.debug("bad egress message dropped", error=str(ex))
            return
        t = type(msg)
        if t is SessionEvent:
            self._on_session_event(msg, header.session_id)
        elif t is NewLeaderEvent:
            self._on_new_leader_event(msg, header.session_id)
        elif t is Challenge:
            member_id = self._connect_ids.get(msg.correlation_id)
            if member_id is not None and self._connecting:
                self._connect_replies.append((member_id, msg))
        elif t is AdminResponse:
            if msg.cluster_session_id == self.cluster_session_id and msg.correlation_id in self._admin_responses:
                self._admin_responses[msg.correlation_id] = msg
                self._answered()
                self._admin_lot.unpark_all()
            else:
                self.foreign_messages += 1
        elif t is ServiceErrorEvent:
            self._on_service_error_event(msg)
        else:
            self.foreign_messages += 1

    def _on_session_event(self, event: SessionEvent, image_session_id: int) -> None:
        member_id = self._connect_ids.get(event.correlation_id)
        # The cluster sends every event of a session with its connect request's correlation id:
        # one for the session we hold (CLOSED, ERROR) is that session's, below, not a connect reply.
        if member_id is not None and (self._connecting or event.cluster_session_id != self.cluster_session_id):
            if self._connecting:
                self._connect_replies.append((member_id, event))
            elif (
                event.code == EventCode.OK
                and event.cluster_session_id != self.cluster_session_id
                and member_id == self.leader_member_id
                and self._ingress is not None
            ):
                # A second request of ours reached the leader (its first answer came late): one
                # session is enough.
                self._send_close(self._ingress, event.leadership_term_id, event.cluster_session_id)
            return
        if (
            event.cluster_session_id != self.cluster_session_id
            or self.cluster_session_id == NULL_VALUE
            or event.leadership_term_id < self.leadership_term_id
        ):
            self.foreign_messages += 1
            return
        self._answered()
        if event.code == EventCode.CLOSED:
            if event.detail == CloseReason.SERVICE_ACTION.name:  # the sessions core sends the reason's name
                self._close_locally(f"the cluster closed the session: {event.detail}")
            else:
                # TIMEOUT: the cluster stopped counting on us (we were silent too long, or a
                # leader that restarted closed the sessions it inherited from the log). We are
                # here, so we open a new session, as after a silent leader.
                log.warning(
                    "the cluster closed the session, reconnecting",
                    session=self.cluster_session_id,
                    detail=event.detail,
                    leader=event.leader_member_id,
                )
                if event.leader_member_id != NULL_VALUE and event.leader_member_id in self.ingress_endpoints:
                    self.leader_member_id = event.leader_member_id  # asked first
                self._reconnect_wanted = True
        elif event.code == EventCode.ERROR:
            # e.g. a message with a stale term; the session goes on.
            self.egress_errors += 1
            log.warning("cluster reported an error", detail=event.detail, session=self.cluster_session_id)

    def _on_service_error_event(self, event: ServiceErrorEvent) -> None:
        if event.cluster_session_id != self.cluster_session_id or self.cluster_session_id == NULL_VALUE:
            self.foreign_messages += 1
            return
        self._answered()  # an error reply is an answer: the session is alive
        self.service_errors_received += 1
        error = ServiceRequestError(event)
        if self._on_message is None:
            self._enqueue(error)
        elif self.on_service_error is not None:
            self.on_service_error(error)
        else:
            log.warning(
                "the service failed on a message of this session",
                session=self.cluster_session_id,
                log_position=event.log_position,
                error=event.error,
            )

    def _enqueue(self, item) -> None:
        if len(self._inbox) == self._inbox.maxlen:
            self.inbox_dropped += 1
        self._inbox.append(item)
        self._inbox_lot.unpark_all()

    def _on_new_leader_event(self, event: NewLeaderEvent, image_session_id: int) -> None:
        if event.cluster_session_id != self.cluster_session_id or self.cluster_session_id == NULL_VALUE:
            self.foreign_messages += 1
            return
        if event.leadership_term_id < self.leadership_term_id:
            return  # a stale event from an earlier election
        if (
            event.leadership_term_id == self.leadership_term_id
            and event.leader_member_id == self.leader_member_id
            and self._ingress is not None
        ):
            self._answered()  # told again (a message of ours crossed the first one): nothing new
            return
        try:
            endpoints = parse_ingress_endpoints(event.ingress_endpoints, "NewLeaderEvent.ingress_endpoints")
        except ConfigError:
            endpoints = self.ingress_endpoints
            self.egress_errors += 1
        if event.leader_member_id not in endpoints:
            self.egress_errors += 1
            log.warning("new leader without an ingress endpoint", leader=event.leader_member_id)
            return
        self.new_leader_events += 1
        self._answered()
        self.ingress_endpoints = endpoints
        old_leader = self.leader_member_id
        self._set_session(self.cluster_session_id, event.leadership_term_id, event.leader_member_id)
        self._last_leader_sign_ns = time.monotonic_ns()
        if old_leader != event.leader_member_id or self._ingress is None:
            self._replace_ingress(self._add_ingress(endpoints[event.leader_member_id]))
        log.info(
            "new leader", leader=event.leader_member_id, term=event.leadership_term_id, session=self.cluster_session_id
        )
        if self.on_new_leader is not None:
            self.on_new_leader(event.leadership_term_id, event.leader_member_id)

    def _answered(self) -> None:
        """Something came back for this session: every request offered so far is accounted for
        (answered, or the cluster is speaking to us about the session)."""
        self._offers_since_answer = 0
        self._unanswered_since_ns = 0

    async def receive(self, timeout: float | None = None) -> tuple[bytes, SessionMessageHeader] | None:
        """The next session message kept for the application (when no ``on_message`` handler
        was given): ``(payload, header)``, or None at the timeout. Raises ServiceRequestError
        when the next thing in line is a ServiceErrorEvent (the service raised on one of our
        messages), and ClientClosedError when the client is closed and nothing is left."""
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            while not self._inbox:
                if self._closed:
                    raise ClientClosedError(f"client is closed{': ' + self.error if self.error else ''}")
                await self._inbox_lot.park()
            item = self._inbox.popleft()
            if isinstance(item, ServiceRequestError):
                raise item
            return item
        return None

    # ---------------------------------------------------------------- admin requests

    async def request_snapshot(self, timeout: float = 10.0) -> AdminResponse:
        """Ask the cluster for a snapshot (AdminRequest SNAPSHOT) and return its AdminResponse:
        OK (every member takes a snapshot), UNAUTHORISED_ACCESS (this session's principal may
        not), ERROR (``message`` says why). Raises trio.TooSlowError after ``timeout``."""
        return await self.admin_request(int(AdminRequestType.SNAPSHOT), timeout)

    async def admin_request(self, request_type: int, timeout: float = 10.0) -> AdminResponse:
        """Send an AdminRequest of ``request_type`` and wait for its AdminResponse."""
        correlation_id = next(self._correlation_ids)
        self._admin_responses[correlation_id] = None
        try:
            with trio.fail_after(timeout):
                msg = encode_ingress(
                    AdminRequest(self.leadership_term_id, self.cluster_session_id, correlation_id, request_type)
                )
                while True:
                    if self._closed:
                        raise ClientClosedError(f"client is closed{': ' + self.error if self.error else ''}")
                    pub = self._ingress
                    if pub is not None and not self._connecting and pub.offer(msg) > 0:
                        break
                    await trio.sleep(POLL_S)
                while self._admin_responses[correlation_id] is None:
                    if self._closed:
                        raise ClientClosedError(f"client is closed{': ' + self.error if self.error else ''}")
                    await self._admin_lot.park()
                return self._admin_responses[correlation_id]
        finally:
            self._admin_responses.pop(correlation_id, None)

    # ---------------------------------------------------------------- duty cycle

    def _leader_alive(self) -> bool:
        # The leader's ingress subscription answers our publication's setup and status
        # exchange; when the leader process is gone the publication stops being connected
        # after the driver's publication_connection_timeout. (Egress images are no sign: the
        # leader may send replies and session events from different publications.)
        pub = self._ingress
        return pub is not None and pub.is_connected

    def do_work(self, now_ns: int) -> int:
        """One duty cycle: egress, keep-alive, leader liveness. The work count (0 = idle)."""
        work = self.poll_egress()
        if self._closed or self._connecting or self.cluster_session_id == NULL_VALUE:
            return work
        if work or self._leader_alive():
            self._last_leader_sign_ns = now_ns
        if self._offers_since_answer and not self._unanswered_since_ns:
            self._unanswered_since_ns = now_ns
        if now_ns >= self._next_keep_alive_ns:
            if self._offers_since_keep_alive == 0 and self.send_keep_alive():
                work += 1
            self._offers_since_keep_alive = 0
            self._next_keep_alive_ns = now_ns + self._keep_alive_interval_ns
        return work

    def _leader_silent(self, now_ns: int) -> bool:
        if self._closed or self._connecting or self.cluster_session_id == NULL_VALUE:
            return False
        if now_ns - self._last_leader_sign_ns >= self._silence_timeout_ns:
            return True
        if (
            self._reconnect_when_unanswered
            and self._unanswered_since_ns
            and now_ns - self._unanswered_since_ns >= self._silence_timeout_ns
        ):
            log.warning(
                "requests unanswered, taking the session for dead",
                session=self.cluster_session_id,
                leader=self.leader_member_id,
                offers=self._offers_since_answer,
            )
            self.unanswered_reconnects += 1
            return True
        return False

    async def _run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The client's duty cycle. It reads the driver's sockets itself while it waits for
        egress (``MediaDriver.claim_receive``): a reply wakes this task directly instead of
        through a step of the driver's receiver task. The claim is handed back while it
        reconnects, which sleeps and awaits the publications' connections."""
        task_status.started()
        keep_alive_s = self._keep_alive_interval_ns / 1e9
        driver = self.driver
        driver.claim_receive(duties=True)
        try:
            while not self._closed:
                now = time.monotonic_ns()
                if self.do_work(now):
                    await trio.lowlevel.checkpoint()
                    continue
                if self._leader_silent(now) or self._reconnect_wanted:
                    self._reconnect_wanted = False
                    driver.unclaim_receive()
                    try:
                        await self._reconnect()
                    finally:
                        driver.claim_receive(duties=True)
                    continue
                await self._egress.wait(min(_LIVENESS_CHECK_S, keep_alive_s))
        finally:
            driver.unclaim_receive()

    # ---------------------------------------------------------------- closing

    def _close_locally(self, reason: str | None) -> None:
        if self._closed:
            return
        self._closed = True
        if reason:
            self.error = reason
            log.warning("client closed", reason=reason, session=self.cluster_session_id)
        self._replace_ingress(None)
        self._egress.close()
        self._inbox_lot.unpark_all()
        self._admin_lot.unpark_all()

    def close(self) -> None:
        """Close the session (SessionCloseRequest, best effort) and the client's streams."""
        if self._closed:
            return
        pub = self._ingress
        if pub is not None and not self._connecting and self.cluster_session_id != NULL_VALUE:
            msg = encode_ingress(SessionCloseRequest(self.leadership_term_id, self.cluster_session_id))
            for _ in range(3):
                if pub.offer(msg) > 0:
                    break
        self._close_locally(None)


def _unwrap(exc: BaseException) -> BaseException:
    """The single exception inside (nested) one-member exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@asynccontextmanager
async def open_cluster_client(
    config: ClientConfig,
    *,
    driver: MediaDriver | None = None,
    on_message: MessageHandler | None = None,
    on_new_leader: Callable[[int, int], None] | None = None,
    on_reconnect: Callable[[int], None] | None = None,
    protocol_version: int = CLIENT_PROTOCOL_VERSION,
    encoded_credentials: bytes = b"",
    on_service_error: Callable[[ServiceRequestError], None] | None = None,
    reconnect_when_unanswered: bool = True,
    connect_timeout: float | None = None,
    credentials=None,
) -> AsyncIterator[ClusterClient]:
    """Connect to the cluster and keep the session alive for the ``async with`` block.

    Without ``driver`` the client runs its own media driver in a private temporary directory
    (removed at the end). Raises ConnectTimeoutError, ClusterRejectedError or
    AuthenticationError when the session cannot be opened. With ``on_message`` every session
    message goes to that handler (called in this trio thread); without it, use ``receive()``.
    An exception from the block comes out as itself, not wrapped in an exception group.
    ``connect_timeout`` (seconds) is the connect's deadline, the config's ``connect_timeout``
    when None: until it passes the client asks every member, through elections.
    ``credentials`` is a credentials supplier (:class:`SharedSecretCredentials`, or any object
    with ``encoded_credentials()`` and ``on_challenge(challenge)``); None: the config's
    ``client.credentials_file`` if it names one (a file that cannot be used raises
    ``secret_file.SecretFileError``), else none.
    """
    if connect_timeout is not None and not connect_timeout > 0:
        raise ValueError(f"connect_timeout must be positive, not {connect_timeout!r}")
    try:
        async with contextlib.AsyncExitStack() as stack:
            if driver is None:
                base = "/dev/shm" if Path("/dev/shm").is_dir() else None
                own_dir = Path(tempfile.mkdtemp(prefix="pycluster-client-", dir=base))
                stack.callback(shutil.rmtree, own_dir, ignore_errors=True)
                driver = await stack.enter_async_context(open_media_driver(**config.driver_kwargs(own_dir)))
            client = ClusterClient(
                config,
                driver,
                on_message=on_message,
                on_new_leader=on_new_leader,
                on_reconnect=on_reconnect,
                protocol_version=protocol_version,
                encoded_credentials=encoded_credentials,
                on_service_error=on_service_error,
                reconnect_when_unanswered=reconnect_when_unanswered,
                credentials=credentials,
            )
            stack.callback(client.close)
            timeout_ns = client._connect_timeout_ns if connect_timeout is None else int(connect_timeout * 1e9)
            await client._connect(time.monotonic_ns() + timeout_ns)
            nursery = await stack.enter_async_context(trio.open_nursery())
            await nursery.start(client._run)
            try:
                yield client
            finally:
                client.close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        inner = _unwrap(group)
        if inner is group:
            raise
        context, suppress = inner.__context__, inner.__suppress_context__
        try:
            raise inner
        finally:
            inner.__context__, inner.__suppress_context__ = context, suppress
