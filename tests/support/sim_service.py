"""The simulator's log entries and services: what each entry means, and a service per member.

Entries. The simulator's archive keeps one key per entry; the key says what the entry is:

* a client message: a :class:`MessageKey`, the payload itself (bytes, so the simulator's
  acknowledgement checks compare payloads) carrying its session id and timestamp;
* ``("nlt", term, leader, timestamp)``: a NewLeadershipTermEvent;
* ``("open", session, timestamp, response channel)`` and ``("close", session, timestamp,
  reason)``: a session's SessionOpenEvent and SessionCloseEvent (``sim_sessions``);
* ``("other", name, timestamp)``: anything else.

Services. Each member process runs a deterministic service that applies the log in order up to
where the process has applied it (``SimMember.applied``: the commit position as it advances, a
replay's progress): its state is a hash chain over every entry it applied (what it is, its
session, its timestamp), plus the sessions open and the messages applied. A process that starts
begins with an empty service and applies the log again from its start. The timestamps of the
entries it applies feed the process's cluster clock (as the node's log adapter does), and so do
those of the entries a replay covers.

Invariants, checked entry by entry as each service applies them:

* cluster time never goes backwards: every entry's timestamp is at least the one before it in the
  log (across wall-clock steps and leaders);
* every service that applied the log up to position P has the same state at P (compared with the
  first service to reach P once P is committed; a service that applied beyond the commit
  position is checked when the commit catches up, so a tail it applied and the log then lost is
  found);
* with sessions modelled: a session is opened once, a message is applied only while its session
  is open (after its open, before its close), a close closes an open session;
* a message is applied at most once by a service, and (at the end of the run) every message a
  client had acknowledged is applied by every member's service that reached its position.
"""

from __future__ import annotations

import hashlib

from cluster_node import codecs


class MessageKey(bytes):
    """A client message's key: its payload, with its session id and timestamp as attributes
    (equal to the payload: the committed-log and acknowledgement checks compare payloads; the
    services' hash chains compare the rest)."""

    session_id: int
    timestamp: int


def entry_key(message: object, term: int, member_id: int) -> object:
    """The archive key of an entry the leader ``member_id`` appends in ``term``."""
    t = type(message)
    if t is codecs.SessionMessage:
        key = MessageKey(bytes(message.payload))
        key.session_id = message.header.cluster_session_id
        key.timestamp = message.header.timestamp
        return key
    if t is codecs.NewLeadershipTermEvent:
        return ("nlt", term, member_id, message.timestamp)
    if t is codecs.SessionOpenEvent:
        return ("open", message.cluster_session_id, message.timestamp, message.response_channel)
    if t is codecs.SessionCloseEvent:
        return ("close", message.cluster_session_id, message.timestamp, int(message.close_reason))
    return ("other", t.__name__, getattr(message, "timestamp", 0))


def timestamp_of(key: object) -> int:
    if isinstance(key, MessageKey):
        return key.timestamp
    if isinstance(key, tuple):
        return key[3] if key[0] == "nlt" else key[2]
    return 0  # (entries made outside this module: no time)


def _digest(prev: bytes, key: object) -> bytes:
    if isinstance(key, MessageKey):
        data = b"m%d:%d:" % (key.session_id, key.timestamp) + key
    else:
        data = repr(key).encode()
    return hashlib.blake2b(prev + data, digest_size=16).digest()


class SimService:
    """One member process's service (see the module docstring)."""

    __slots__ = ("position", "state", "open", "closed", "applied", "last_timestamp", "unverified", "broken")

    def __init__(self) -> None:
        self.position = 0
        self.state = b""
        self.open: set[int] = set()
        self.closed: set[int] = set()
        self.applied: set[bytes] = set()
        self.last_timestamp = 0
        self.unverified: list[tuple[int, bytes]] = []
        """(position, state) reached beyond the commit position, checked once it is committed."""
        self.broken = False
        """Its log was cut below what it applied (reported once; it stops applying)."""


class SimServices:
    """Every member's service, the canonical states and the checks."""

    def __init__(self, sim) -> None:
        self.sim = sim
        self.canonical: dict[int, bytes] = {}
        """Committed position -> the state of the first service that applied up to it."""
        self.session_client: dict[int, int] = {}
        """Session id -> the client that opened it (``sim_sessions``); without sessions the
        client's number is its session id."""

    def client_of(self, session_id: int) -> int:
        return self.session_client.get(session_id, session_id)

    def on_start(self, m) -> None:
        m.service = SimService()
        self.sync(m)

    def sync(self, m) -> None:
        """Apply what ``m``'s process has applied (``m.applied``) and its service has not."""
        svc: SimService = m.service
        if svc.broken:
            return
        a = m.archive
        target = m.applied
        if svc.position < target:
            i = a.index_at(svc.position)
            if i < 0:
                svc.broken = True
                self.sim.violation(
                    f"member {m.member_id}'s service applied up to {svc.position}, which its log no "
                    f"longer holds (stop {a.stop})"
                )
                return
            ends, keys = a.ends, a.keys
            n = len(ends)
            while i < n and ends[i] <= target:
                self.apply(m, svc, a.starts[i], ends[i], keys[i])
                i += 1
        if svc.unverified:
            self._verify(m, svc)

    def apply(self, m, svc: SimService, start: int, end: int, key: object) -> None:
        sim = self.sim
        mid = m.member_id
        ts = timestamp_of(key)
        if ts < svc.last_timestamp:
            sim.violation(
                f"cluster time goes backwards in the log at {start}: {ts} after {svc.last_timestamp} "
                f"(member {mid}'s service)"
            )
        svc.last_timestamp = max(svc.last_timestamp, ts)
        m.clock.observe(ts)
        if isinstance(key, MessageKey):
            if sim.config.sessions and key.session_id not in svc.open:
                sim.violation(
                    f"member {mid} applies a message of session {key.session_id} at {start}, which is "
                    f"{'closed' if key.session_id in svc.closed else 'not open'}"
                )
            if key in svc.applied:
                sim.violation(f"member {mid} applies message {bytes(key)!r} a second time at {start}")
            svc.applied.add(key)
        elif isinstance(key, tuple) and key[0] in ("open", "close"):
            sid = key[1]
            if key[0] == "open":
                if sid in svc.open or sid in svc.closed:
                    sim.violation(f"member {mid} applies a second open of session {sid} at {start}")
                svc.open.add(sid)
            else:
                if sid not in svc.open:
                    sim.violation(f"member {mid} applies a close of session {sid} at {start}, not open")
                svc.open.discard(sid)
                svc.closed.add(sid)
        svc.state = _digest(svc.state, key)
        svc.position = end
        svc.unverified.append((end, svc.state))

    def _verify(self, m, svc: SimService) -> None:
        committed_end = self.sim.committed_end
        canonical = self.canonical
        k = 0
        for position, state in svc.unverified:
            if position > committed_end:
                break
            known = canonical.setdefault(position, state)
            if known != state:
                self.sim.violation(
                    f"member {m.member_id}'s service state at {position} differs from another member's there"
                )
                svc.unverified.clear()
                return
            k += 1
        if k:
            del svc.unverified[:k]

    def on_replay_done(self, m, from_position: int, to_position: int) -> None:
        """A replay covered [from, to) of the process's log: its clock has seen those times."""
        a = m.archive
        i, j = a.index_at(from_position), a.index_at(to_position)
        if 0 <= i <= j:
            for key in a.keys[i:j]:
                m.clock.observe(timestamp_of(key))

    def final_checks(self) -> None:
        sim = self.sim
        for m in sim.members:
            if not m.alive:
                continue
            self.sync(m)
            svc: SimService = m.service
            for payload, end in sim.acked.items():
                if end <= svc.position and payload not in svc.applied:
                    sim.violation(f"acknowledged message {payload!r} is not applied by member {m.member_id}")
                    return
