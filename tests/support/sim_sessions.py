"""The simulator's client sessions, kept by each member's real session manager.

Every member process runs the node's session manager (``consensus.sessions.ClusterSessions``,
null authenticator) and the simulator does around it what the node's agent does (its ingress
adapter, log adapter, effect executor and egress publisher):

* clients' SessionConnectRequests, session messages, SessionKeepAlives and SessionCloseRequests
  travel the simulator's network to whoever the client believes leads and go to the manager
  (a settled leader decides; anything else redirects or answers what it can); a message the
  manager accepts goes to the core, which appends it; a leader that is not active (the control
  model: suspended, a snapshot or termination under way) reads none of them, they wait;
* the manager's effects are carried out in order: AppendSessionEvent appends the open or close
  to the leader's log (stamped with its cluster time) and reports the position after it,
  SendEgress travels back to the client (SessionEvent OK, REDIRECT, CLOSED, ..., NewLeaderEvent);
* each duty cycle (tick) of a settled, active leader checks session timeouts and pending
  authentications with its cluster time; ElectionComplete greets the inherited sessions (or,
  at a process's first election, closes them: the cluster restarted), RollbackUncommitted rolls
  back what the log will not keep, CommitPositionChanged makes closes final, ClusterResumed
  restarts every timeout;
* a member's log adapter applies the session events of its log to its manager: a member that
  does not lead up to its commit position, any member through a replay (a new leader's replay
  covers its uncommitted tail, so its sessions come from its log); a restarted process starts
  with no sessions and applies the log again from its start.

A client (``SimConfig.clients`` of them, with ``SimConfig.sessions``) without a session asks to
connect (again after half a second without an answer); with ``SimConfig.session_auth`` the
members run the shared-secret authenticator, the leader challenges each connect and the client
answers (now and then with a wrong key: it is rejected and connects again); with a session, it sends messages in it, now
and then a keep-alive, closes it, or falls silent for longer than the session timeout. It follows
REDIRECTs and NewLeaderEvents, forgets a session it is told is CLOSED and connects again.

Invariants, checked after every step of a member and every decision of its manager (beside the
services' checks of ``sim_service``, which see the log these decisions made):

* the session table is the log's: a member that does not lead, once its log adapter has applied
  its log up to a committed position P, has open exactly the sessions open in the committed log
  at P (after a rollback: at its commit position); a settled leader has open exactly the sessions
  its whole log leaves open (committed, uncommitted and not yet recorded entries);
* session ids are never reused: no two SessionOpenEvents of the committed log carry the same
  session id (whichever leaders appended them; with authentication, ids are handed out at the
  connect and opened in the order clients answer their challenges, so they need not grow).
"""

from __future__ import annotations

import random
from bisect import bisect_right

from cluster_node.codecs import (
    CLIENT_PROTOCOL_VERSION,
    Challenge,
    CloseReason,
    EventCode,
    NewLeaderEvent,
    SessionCloseEvent,
    SessionConnectRequest,
    SessionEvent,
    SessionOpenEvent,
)
from cluster_node.consensus import effects as fx
from cluster_node.consensus.auth import SharedSecretAuthenticator, challenge_answer
from cluster_node.consensus.effects import Role
from cluster_node.consensus.sessions import (
    AppendSessionEvent,
    ClusterSessions,
    SendEgress,
    SessionSettings,
)

MS = 1_000_000
CONNECT_RETRY_NS = 500 * MS
INACTIVE_PATIENCE_NS = 1_000 * MS
"""How long a client request waits unread by a leader that is not active before it is lost."""
EGRESS_STREAM = 102


_CHANNEL_PREFIX = "aeron:udp?endpoint=client"


def _channel(c: int) -> str:
    """Client ``c``'s response channel (its egress), on its own host ``client<c>``."""
    return f"{_CHANNEL_PREFIX}{c}:9000"


def _client_of_channel(channel: str) -> int:
    return int(channel[len(_CHANNEL_PREFIX) :].split(":")[0])


def _client_id(c: int) -> bytes:
    """Client ``c``'s credentials in its connect request (its id, with the shared secret)."""
    return b"client%d" % c


def _image(c: int, member_id: int) -> int:
    """The ingress image a client's requests arrive on at one member (one per client and member)."""
    return 1000 * (member_id + 1) + c


def _image_host(image_session_id: int) -> str:
    return f"client{image_session_id % 1000}"


class SessionClients:
    """The clients, each member's session manager and what the node's agent does around it."""

    manager_class = ClusterSessions
    """The session manager each member process runs (a test subclass injects a broken one)."""

    def __init__(self, sim, seed: int, session_timeout_ns: int) -> None:
        self.sim = sim
        self.rng = random.Random(seed * 977 + 5)
        self.timeout_ns = session_timeout_ns
        n = sim.config.clients
        self.session: list[int | None] = [None] * n
        self.term = [-1] * n
        """The leadership term each client's session is in, as far as the client knows."""
        self.connecting: list[tuple[int, int] | None] = [None] * n
        """(correlation id, sent at) of each client's outstanding connect request."""
        self.silent_until = [0] * n
        self._correlation = 0
        self.endpoints = ",".join(f"{i}=member{i}:9010" for i in range(len(sim.members)))
        self.opened = self.closed_by_client = self.timed_out = self.rolled_back = self.redirected = 0
        self.auth = sim.config.session_auth
        self.keys = {_client_id(c): b"key-%d" % c for c in range(n)}
        self.challenged = self.auth_rejected = 0
        # The canonical committed log's sessions: positions where the open set changed, and the
        # set from there on (read from ``sim.committed`` as it grows).
        self._canon_position = 0
        self._canon_open: frozenset[int] = frozenset()
        self._canon_ends: list[int] = [0]
        self._canon_sets: list[frozenset[int]] = [frozenset()]
        self._committed_ids: set[int] = set()

    # ------------------------------------------------------------------ member processes

    def on_start(self, m) -> None:
        """A process starts with no sessions; its log adapter applies its log from the start."""
        m.sessions = self.manager_class(
            m.member_id,
            self.endpoints,
            SessionSettings(self.timeout_ns, max_sessions=1000),
            image_source_host=_image_host,
        )
        if self.auth:
            nonces = random.Random(self.rng.getrandbits(64))
            m.sessions.authenticator = SharedSecretAuthenticator(dict(self.keys), nonces.randbytes)
        m.sessions_position = 0
        m.sessions_elections = 0
        m.sessions_led = False
        m.sessions_timed_out = 0
        m.sessions_table_broken = False

    def _feed(self, m, limit: int) -> None:
        """The log adapter applies the session events of ``m``'s log up to ``limit``."""
        position = m.sessions_position
        if position >= limit:
            return
        a = m.archive
        i = a.index_at(position)
        if i < 0:
            self.sim.violation(
                f"member {m.member_id}'s sessions were applied up to {position}, which its log no longer "
                f"holds (stop {a.stop})"
            )
            m.sessions_position = limit
            return
        ends, keys, sessions = a.ends, a.keys, m.sessions
        n = len(ends)
        while i < n and ends[i] <= limit:
            key = keys[i]
            if type(key) is tuple and key[0] in ("open", "close"):
                if key[0] == "open":
                    event = SessionOpenEvent(a.terms[i], 0, key[1], key[2], EGRESS_STREAM, key[3])
                    sessions.on_log_session_open(event, ends[i])
                else:
                    sessions.on_log_session_close(SessionCloseEvent(0, key[1], key[2], CloseReason(key[3])))
            position = ends[i]
            i += 1
        m.sessions_position = position

    def sync(self, m) -> None:
        """End of a member's step: a member that does not lead applies its committed log."""
        if m.core.role != Role.LEADER:
            self._feed(m, m.last_commit)
        self.check(m)

    def on_replay(self, m, position: int) -> None:
        """A replay applied ``m``'s log up to ``position`` (its log adapter reads the replay)."""
        self._feed(m, position)

    def on_effect(self, m, e) -> None:
        """The core's effects that concern sessions, as the node's executor carries them out."""
        t = type(e)
        s = m.sessions
        if t is fx.CommitPositionChanged:
            s.on_commit(e.position)
        elif t is fx.RollbackUncommitted:
            before = s.rolled_back
            s.rollback(e.commit_position, leadership_term_id=m.core.leadership_term_id, now_ns=m.clock.now())
            self.rolled_back += s.rolled_back - before
            if m.sessions_led or m.sessions_position > e.commit_position:
                m.sessions_position = e.commit_position
            m.sessions_led = False
            self._run(m)
        elif t is fx.ElectionComplete:
            m.sessions_elections += 1
            m.sessions_led = e.role == Role.LEADER
            s.on_new_leadership(
                is_leader=e.role == Role.LEADER,
                is_startup=m.sessions_elections == 1,
                leadership_term_id=e.leadership_term_id,
                leader_member_id=e.leader_member_id,
                now_ns=m.clock.now(),
            )
            self._run(m)
        elif t is fx.ClusterResumed:
            s.on_resume(m.clock.now())

    def on_tick(self, m) -> None:
        """A duty cycle: a settled, active leader checks timeouts and pending connects."""
        core = m.core
        if not core.is_leader:
            return
        s = m.sessions
        now = m.clock.now()
        if core.control.leader_active and s.check_timeouts(core.leadership_term_id, now):
            self.timed_out = self.timed_out + s.timed_out - m.sessions_timed_out
            m.sessions_timed_out = s.timed_out
            self.sim._record(f"sessions timed out on {m.member_id}: {s.timed_out}")
        if s.pending:
            s.process_pending(core.leadership_term_id, core.known_leader_member_id, now)
        self._run(m)

    def _run(self, m) -> None:
        """Carry out the manager's effects in order (the node's egress publisher and log publisher)."""
        sim = self.sim
        for e in m.sessions.drain_effects():
            if not m.alive:
                return
            t = type(e)
            if t is AppendSessionEvent:
                msg = e.message
                if type(msg) is SessionOpenEvent:
                    sim.service.session_client[msg.cluster_session_id] = _client_of_channel(msg.response_channel)
                    self.opened += 1
                elif msg.close_reason == CloseReason.CLIENT_ACTION:
                    self.closed_by_client += 1
                end = sim._append_log(m, msg)
                if end is not None:
                    m.sessions.on_event_appended(e, end)
            elif t is SendEgress:
                c = _client_of_channel(e.response_channel)
                self._deliver(self._on_egress, (c, m.member_id, e.message))
            # CloseEgress, ForeignMessage, AuthenticatorFailed: nothing to model.
        self.check(m)

    # ------------------------------------------------------------------ the invariants

    def _canon_open_at(self, position: int) -> frozenset[int] | None:
        """The sessions open in the committed log at ``position`` (None: not committed yet)."""
        sim = self.sim
        committed = sim.committed
        p = self._canon_position
        while p < sim.committed_end:
            end, _term, key = committed[p]
            if type(key) is tuple and key[0] in ("open", "close"):
                sid = key[1]
                if key[0] == "open":
                    if sid in self._committed_ids:
                        sim.violation(
                            f"session id {sid} opened at {p} in the committed log a second time: an id reused"
                        )
                    self._committed_ids.add(sid)
                    self._canon_open = self._canon_open | {sid}
                else:
                    self._canon_open = self._canon_open - {sid}
                self._canon_ends.append(end)
                self._canon_sets.append(self._canon_open)
            p = end
        self._canon_position = p
        if position > p:
            return None
        return self._canon_sets[bisect_right(self._canon_ends, position) - 1]

    def _log_open(self, m) -> frozenset[int] | None:
        """The sessions ``m``'s whole log leaves open (its committed part, then the rest)."""
        base = self._canon_open_at(m.last_commit)
        a = m.archive
        i = a.index_at(m.last_commit)
        if base is None or i < 0:
            return None
        sessions = set(base)
        for key in [*a.keys[i:], *(u[3] for u in m.unrecorded)]:
            if type(key) is tuple and key[0] in ("open", "close"):
                if key[0] == "open":
                    sessions.add(key[1])
                else:
                    sessions.discard(key[1])
        return frozenset(sessions)

    def check(self, m) -> None:
        core = m.core
        if core is None or not m.alive:
            return
        if core.is_leader:
            expected = self._log_open(m)
            where = "its whole log"
        elif core.role != Role.LEADER and m.sessions_position <= m.last_commit:
            expected = self._canon_open_at(m.sessions_position)
            where = f"the committed log at {m.sessions_position}"
        else:
            return  # (a leader in its election; a replayed tail not committed yet)
        if expected is None or m.sessions_table_broken:
            return
        table = set(m.sessions.sessions)
        if table != expected:
            m.sessions_table_broken = True  # (said once per process)
            self.sim.violation(
                f"member {m.member_id}'s open sessions {sorted(table)} are not those of {where}: {sorted(expected)}"
            )

    # ------------------------------------------------------------------ clients

    def _deliver(self, fn, args: tuple, delay_ns: int = 0) -> None:
        sim = self.sim
        if sim.drop_rate and self.rng.random() < sim.drop_rate:
            return
        sim.call_later(delay_ns + self.rng.randint(sim.config.delay_min_ns, sim.config.delay_max_ns), fn, args)

    def on_client(self, c: int, target: int) -> None:
        """Client ``c``'s turn (the simulator's client event) towards member ``target``: connect,
        send a message or a keep-alive, close its session or fall silent."""
        sim = self.sim
        if sim.now_ns < self.silent_until[c]:
            return
        sid = self.session[c]
        if sid is None:
            pending = self.connecting[c]
            if pending is not None and sim.now_ns - pending[1] < CONNECT_RETRY_NS:
                return
            self._correlation += 1
            self.connecting[c] = (self._correlation, sim.now_ns)
            req = SessionConnectRequest(
                self._correlation, EGRESS_STREAM, CLIENT_PROTOCOL_VERSION, _channel(c), _client_id(c)
            )
            self._deliver(self._on_connect, (c, target, req, sim.now_ns))
            return
        r = self.rng.random()
        if r < 0.02:
            self.session[c] = None
            self._deliver(self._on_close, (c, target, sid, self.term[c], sim.now_ns))
            return
        if r < 0.03:
            self.silent_until[c] = sim.now_ns + self.timeout_ns + self.rng.randint(0, self.timeout_ns)
            sim._record(f"client {c} silent")
            return
        if r < 0.08:
            self._deliver(self._on_keep_alive, (c, target, sid, self.term[c], sim.now_ns))
            return
        sim.client_seq[c] += 1
        payload = b"c%d:%d" % (c, sim.client_seq[c])
        self._deliver(self._on_message, (c, target, sid, self.term[c], payload, sim.now_ns))

    def _on_egress(self, c: int, member_id: int, msg) -> None:
        sim = self.sim
        sim.client_last_reply_ns[c] = sim.now_ns
        if type(msg) is NewLeaderEvent:
            if self.session[c] == msg.cluster_session_id:
                self.term[c] = msg.leadership_term_id
                sim.client_leader[c] = msg.leader_member_id
            return
        pending = self.connecting[c]
        if type(msg) is Challenge:
            if pending is not None and msg.correlation_id == pending[0]:
                self.challenged += 1
                key = self.keys[_client_id(c)] if self.rng.random() >= 0.05 else b"wrong"
                answer = challenge_answer(key, bytes(msg.encoded_challenge), _client_id(c))
                args = (c, member_id, msg.correlation_id, msg.cluster_session_id, answer, sim.now_ns)
                self._deliver(self._on_challenge_response, args)
            return
        if type(msg) is not SessionEvent:
            return
        code = msg.code
        if code == EventCode.CLOSED:
            if self.session[c] == msg.cluster_session_id:
                self.session[c] = None
            return
        if pending is None or msg.correlation_id != pending[0]:
            return  # an answer to an earlier request (its session, if any, times out)
        self.connecting[c] = None
        if code == EventCode.OK and self.session[c] is None:
            self.session[c] = msg.cluster_session_id
            self.term[c] = msg.leadership_term_id
            sim.client_leader[c] = member_id
        elif code == EventCode.AUTHENTICATION_REJECTED:
            self.auth_rejected += 1
        elif code == EventCode.REDIRECT:
            self.redirected += 1
            if msg.leader_member_id >= 0:
                sim.client_leader[c] = msg.leader_member_id

    # ------------------------------------------------------------------ members' ingress

    def _member(self, fn, args: tuple):
        """The member a request is for, when it reads it now: a paused one reads it when it
        resumes, a leader that is not active once it is again (if the request is still there)."""
        sim = self.sim
        member_id, since = args[1], args[-1]
        m = sim.members[member_id]
        if not m.alive or sim.defer_call(m, fn, args):
            return None
        if m.core.is_leader and not m.core.control.leader_active:
            if sim.now_ns - since < INACTIVE_PATIENCE_NS:
                sim.call_later(20 * MS, fn, args)
            return None
        return m

    def _on_connect(self, c: int, member_id: int, req: SessionConnectRequest, since: int) -> None:
        m = self._member(self._on_connect, (c, member_id, req, since))
        if m is None:
            return
        core = m.core
        m.sessions.on_connect_request(
            req,
            is_leader=core.is_leader,
            leader_member_id=core.known_leader_member_id,
            leadership_term_id=core.leadership_term_id,
            now_ns=m.clock.now(),
            image_session_id=_image(c, member_id),
        )
        self._run(m)

    def _on_message(self, c: int, member_id: int, sid: int, term: int, payload: bytes, since: int) -> None:
        m = self._member(self._on_message, (c, member_id, sid, term, payload, since))
        if m is None:
            return
        core = m.core
        s = m.sessions
        if not core.is_leader:
            s.on_ingress_not_leading(
                term,
                sid,
                leader_member_id=core.known_leader_member_id,
                current_term_id=core.leadership_term_id,
                now_ns=m.clock.now(),
            )
        elif s.on_ingress(term, sid, core.leadership_term_id, m.clock.now(), _image(c, member_id)):
            if core.on_ingress(sid, payload, self.sim.now_ns):
                self.sim._run_core(m)
        if m.alive:
            self._run(m)

    def _on_keep_alive(self, c: int, member_id: int, sid: int, term: int, since: int) -> None:
        m = self._member(self._on_keep_alive, (c, member_id, sid, term, since))
        if m is None:
            return
        core = m.core
        if core.is_leader:
            m.sessions.on_keep_alive(term, sid, core.leadership_term_id, m.clock.now(), _image(c, member_id))
        else:
            m.sessions.on_ingress_not_leading(
                term,
                sid,
                leader_member_id=core.known_leader_member_id,
                current_term_id=core.leadership_term_id,
                now_ns=m.clock.now(),
            )
        self._run(m)

    def _on_close(self, c: int, member_id: int, sid: int, term: int, since: int) -> None:
        m = self._member(self._on_close, (c, member_id, sid, term, since))
        if m is None:
            return
        core = m.core
        if core.is_leader:
            m.sessions.on_close_request(term, sid, core.leadership_term_id, m.clock.now(), _image(c, member_id))
        else:
            m.sessions.on_close_request_not_leading(term, sid)
        self._run(m)

    def _on_challenge_response(
        self, c: int, member_id: int, correlation_id: int, sid: int, answer: bytes, since: int
    ) -> None:
        m = self._member(self._on_challenge_response, (c, member_id, correlation_id, sid, answer, since))
        if m is None or not m.core.is_leader:
            return
        core = m.core
        m.sessions.on_challenge_response(
            correlation_id,
            sid,
            answer,
            leadership_term_id=core.leadership_term_id,
            leader_member_id=core.known_leader_member_id,
            now_ns=m.clock.now(),
            image_session_id=_image(c, member_id),
        )
        self._run(m)
