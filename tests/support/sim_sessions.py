"""The simulator's client sessions: opened, used, closed and timed out through the leader's log.

The consensus core does not own client sessions (the node's agent keeps them in
``consensus.sessions`` and appends their events to the log itself); what the rest of the cluster
sees of them is the log: a SessionOpenEvent, the session's messages, a SessionCloseEvent. This
model produces those entries as a leader does, with the leader's cluster time on each, and the
services (``sim_service``) check them.

A client (``SimConfig.clients`` of them, with ``SimConfig.sessions``) without a session asks
whoever it believes leads to connect; a settled leader appends an open event for a new session
and answers with its id, anything else redirects the client to the leader it knows. With a
session, the client sends messages in it; now and then it closes it (the leader appends a close
event) or falls silent for longer than the session timeout. A settled leader closes a session
that was silent for longer than ``session_timeout_ns`` of its cluster time (the timeout counts
from when this process started leading, as the node restarts every session's timeout after an
election), and answers a message for a session that is not open with "closed" (the client then
connects again).

Whether a session is open is the leader's view of its own whole log, the part its service has
applied and the part after it (its uncommitted entries, its own appends included): a message is
appended only after an open and before any close in that log, which is the log the cluster
commits if it commits the message at all. Every request and answer travels the simulator's
network (delayed, lost with the drop rate; a paused member handles them when it resumes).
"""

from __future__ import annotations

import random

from cluster_node.codecs import CloseReason, SessionCloseEvent, SessionOpenEvent
from cluster_node.consensus import effects as fx
from cluster_node.consensus.effects import Role

MS = 1_000_000


class SessionClients:
    """The clients' sessions and the leaders' side of them (own random stream)."""

    def __init__(self, sim, seed: int, session_timeout_ns: int) -> None:
        self.sim = sim
        self.rng = random.Random(seed * 977 + 5)
        self.timeout_ns = session_timeout_ns
        n = sim.config.clients
        self.session: list[int | None] = [None] * n
        self.silent_until = [0] * n
        self.next_session_id = 1
        self.activity: dict[tuple[int, int, int], dict[int, int]] = {}
        """(member, incarnation, leadership term) -> session -> cluster time of its last message."""
        self.opened = 0
        self.closed_by_client = 0
        self.timed_out = 0
        sim.call_later(100 * MS, self._check_timeouts, ())

    # ------------------------------------------------------------------------------ clients

    def _deliver(self, fn, args: tuple) -> None:
        sim = self.sim
        if sim.drop_rate and self.rng.random() < sim.drop_rate:
            return
        sim.call_later(self.rng.randint(sim.config.delay_min_ns, sim.config.delay_max_ns), fn, args)

    def on_client(self, c: int, target: int) -> None:
        """Client ``c``'s turn (the simulator's client event) towards member ``target``: connect,
        send a message, close its session or fall silent. Returns the payload sent, if any."""
        sim = self.sim
        if sim.now_ns < self.silent_until[c]:
            return None
        sid = self.session[c]
        if sid is None:
            self._deliver(self._on_connect, (c, target))
            return None
        r = self.rng.random()
        if r < 0.02:
            self.session[c] = None
            self.closed_by_client += 1
            self._deliver(self._on_close, (c, target, sid))
            return None
        if r < 0.03:
            self.silent_until[c] = sim.now_ns + self.timeout_ns + self.rng.randint(0, self.timeout_ns)
            sim._record(f"client {c} silent")
            return None
        sim.client_seq[c] += 1
        payload = b"c%d:%d" % (c, sim.client_seq[c])
        self._deliver(self._on_message, (c, target, sid, payload))
        return payload

    def _on_opened(self, c: int, member_id: int, sid: int) -> None:
        self.sim.client_leader[c] = member_id
        self.sim.client_last_reply_ns[c] = self.sim.now_ns
        if self.session[c] is None:
            self.session[c] = sid

    def _on_session_closed(self, c: int, sid: int) -> None:
        if self.session[c] == sid:
            self.session[c] = None

    # ------------------------------------------------------------------------------ leaders

    def _member(self, member_id: int, fn, args: tuple):
        """The member's process when it is up and running now (input to a paused one waits)."""
        sim = self.sim
        m = sim.members[member_id]
        if not m.alive or sim.defer_call(m, fn, args):
            return None
        return m

    @staticmethod
    def _settled_leader(m) -> bool:
        return m.core.election is None and m.core.role == Role.LEADER

    def _redirect(self, m, c: int) -> None:
        leader = m.core.leader_member_id
        if leader >= 0:
            self._deliver(self.sim._on_redirect, (c, leader))

    def _activity(self, m) -> dict[int, int]:
        return self.activity.setdefault((m.member_id, m.incarnation, m.core.leadership_term_id), {})

    def open_sessions(self, m) -> set[int]:
        """The sessions open in ``m``'s whole log (see the module docstring)."""
        sim = self.sim
        sim.service.sync(m)
        svc = m.service
        sessions = set(svc.open)
        a = m.archive
        i = a.index_at(svc.position)
        keys = a.keys[i:] if i >= 0 else []
        for key in [*keys, *(u[3] for u in m.unrecorded)]:
            if isinstance(key, tuple) and key[0] in ("open", "close"):
                if key[0] == "open":
                    sessions.add(key[1])
                else:
                    sessions.discard(key[1])
        return sessions

    def _append(self, m, message) -> None:
        m.core.emit(fx.AppendLog(message))
        self.sim._run_core(m)

    def _on_connect(self, c: int, member_id: int) -> None:
        m = self._member(member_id, self._on_connect, (c, member_id))
        if m is None:
            return
        if not self._settled_leader(m):
            self._redirect(m, c)
            return
        sid = self.next_session_id
        self.next_session_id += 1
        self.sim.service.session_client[sid] = c
        self.opened += 1
        now = m.clock.now()
        self._activity(m)[sid] = now
        self._append(m, SessionOpenEvent(m.core.leadership_term_id, c, sid, now, 0, f"client-{c}"))
        self._deliver(self._on_opened, (c, member_id, sid))

    def _on_message(self, c: int, member_id: int, sid: int, payload: bytes) -> None:
        m = self._member(member_id, self._on_message, (c, member_id, sid, payload))
        if m is None:
            return
        if not self._settled_leader(m):
            self._redirect(m, c)
            return
        if sid not in self.open_sessions(m):
            self._deliver(self._on_session_closed, (c, sid))
            return
        self._activity(m)[sid] = m.clock.now()
        if m.core.on_ingress(sid, payload, self.sim.now_ns):
            self.sim._run_core(m)

    def _on_close(self, c: int, member_id: int, sid: int) -> None:
        m = self._member(member_id, self._on_close, (c, member_id, sid))
        if m is None or not self._settled_leader(m) or sid not in self.open_sessions(m):
            return
        self._append(m, SessionCloseEvent(m.core.leadership_term_id, sid, m.clock.now(), CloseReason.CLIENT_ACTION))

    def _check_timeouts(self) -> None:
        sim = self.sim
        for m in sim.members:
            if not m.alive or m.paused_until > sim.now_ns or not self._settled_leader(m):
                continue
            now = m.clock.now()
            activity = self._activity(m)
            for sid in sorted(self.open_sessions(m)):
                last = activity.setdefault(sid, now)
                if now - last > self.timeout_ns:
                    self.timed_out += 1
                    sim._record(f"session {sid} timed out on {m.member_id}")
                    self._append(m, SessionCloseEvent(m.core.leadership_term_id, sid, now, CloseReason.TIMEOUT))
                    if not m.alive:
                        break
        sim.call_later(100 * MS, self._check_timeouts, ())
