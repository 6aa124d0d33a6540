"""Deterministic simulator of the service layer: the consensus module's timers and pending
service messages (``consensus.timers``, ``consensus.pending``) on every member, fed by services
that schedule, cancel and re-arm timers and offer bursts of service messages from their log
callbacks, through a bounded stream per member (back-pressure: a service whose request finds the
stream full waits, mid-callback, as ``Cluster.offer`` does).

What it models, per member, as the node does (consensus.agent, service.agent):

* the log: one canonical list of entries (client messages, TimerEvents, service messages), each
  64 bytes long, so positions are real-looking; the leader appends, a commit position follows at
  random, and a leadership change drops the uncommitted tail (the new leader's rollback);
* the consensus module: the leader fires expired timers (``Timers.expired``/``on_fired``) and
  appends pending service messages (``to_append``/``on_appended``/``on_commit``); a follower's
  log adapter applies committed entries (``on_log_timer_event``, ``on_log_service_message``);
  each reads its service's stream at random moments, a settled leader only while its pending
  queue has room;
* the service: applies entries in order, bounded by the commit position, and on a follower by
  the log adapter's position (``gate_followers``: the fix; off, it runs up to the commit as the
  issue found); every request carries the log position of its entry.

Checks (:meth:`ServiceLayerSim.run`): once the leader stops firing and appending and everything
is drained, every member's timer table is the same, every service has the same state, and every
service message offered was applied exactly once on every member.

Not modelled: elections' timing and the network (tests/support/sim.py does those for the
consensus core), crashes and snapshots (the real-cluster tests restart from snapshots).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from cluster_node.consensus.pending import PendingServiceMessages
from cluster_node.consensus.timers import Timers

ENTRY_LENGTH = 64
MS = 1_000_000


@dataclass
class Entry:
    end: int
    kind: str  # "client", "timer", "service"
    a: object = None
    b: object = None
    timestamp: int = 0


class Service:
    """A deterministic service: its state depends on the log only.

    client ("arm", cid, period_ns)    a periodic timer, re-armed in on_timer_event
    client ("cancel", cid)            stops it
    client ("resched", cid, delay)    a one-shot timer (rescheduling a periodic one's id)
    client ("burst", n)               n service messages from this one callback
    """

    def __init__(self) -> None:
        self.position = 0
        self.periodic: dict[int, int] = {}
        self.fired: dict[int, int] = {}
        self.applied: dict[str, int] = {}
        self.offered = 0

    def apply(self, entry: Entry) -> list[tuple]:
        """The requests the callback for ``entry`` makes, in order."""
        self.position = entry.end
        out: list[tuple] = []
        if entry.kind == "client":
            action = entry.a
            if action[0] == "arm":
                self.periodic[action[1]] = action[2]
                out.append(("schedule", action[1], entry.timestamp + action[2]))
            elif action[0] == "cancel":
                self.periodic.pop(action[1], None)
                out.append(("cancel", action[1]))
            elif action[0] == "resched":
                self.periodic.pop(action[1], None)
                out.append(("schedule", action[1], entry.timestamp + action[2]))
            elif action[0] == "burst":
                for i in range(action[1]):
                    out.append(("offer", f"{entry.end}:{i}"))
                    self.offered += 1
        elif entry.kind == "timer":
            cid = entry.a
            self.fired[cid] = self.fired.get(cid, 0) + 1
            if cid in self.periodic:
                out.append(("schedule", cid, entry.timestamp + self.periodic[cid]))
        elif entry.kind == "service":
            self.applied[entry.b] = self.applied.get(entry.b, 0) + 1
        return [(*r, self.position) for r in out]

    def state(self) -> tuple:
        return (
            self.position,
            tuple(sorted(self.periodic.items())),
            tuple(sorted(self.fired.items())),
            tuple(sorted(self.applied.items())),
        )


@dataclass
class Member:
    member_id: int
    timers: Timers = field(default_factory=Timers)
    pending: PendingServiceMessages = field(default_factory=lambda: PendingServiceMessages(capacity=16))
    service: Service = field(default_factory=Service)
    stream: deque = field(default_factory=deque)  # service -> consensus module
    blocked: deque = field(default_factory=deque)  # requests of the current callback not yet in the stream
    adapter: int = 0  # follower: log position its consensus module has applied


class ServiceLayerSim:
    def __init__(
        self, seed: int, members: int = 3, gate_followers: bool = True, stream_capacity: int = 4, log_order: bool = True
    ) -> None:
        self.rng = random.Random(seed)
        self.gate_followers = gate_followers
        self.log_order = log_order
        """Requests carry their log position (off: applied as they come, to compare)."""
        self.stream_capacity = stream_capacity
        self.members = [Member(i) for i in range(members)]
        self.leader = 0
        self.log: list[Entry] = []
        self.commit = 0
        self.now = 1_000 * MS
        self.firing = True
        self.violations: list[str] = []

    # ------------------------------------------------------------------ the log

    @property
    def end(self) -> int:
        return self.log[-1].end if self.log else 0

    def _append(self, kind: str, a=None, b=None) -> int:
        entry = Entry(self.end + ENTRY_LENGTH, kind, a, b, self.now)
        self.log.append(entry)
        return entry.end

    def _entry_after(self, position: int) -> Entry:
        return self.log[position // ENTRY_LENGTH]

    # ------------------------------------------------------------------ steps

    def _leader_step(self) -> None:
        m = self.members[self.leader]
        if self.firing:
            for cid, _deadline in m.timers.expired(self.now, 4):
                m.timers.on_fired(cid, self._append("timer", cid))
        for sid, payload in m.pending.to_append(4):
            m.pending.on_appended(sid, self._append("service", sid, payload))

    def _client(self) -> None:
        r = self.rng.random()
        cid = self.rng.randrange(1, 5)
        if r < 0.3:
            action = ("arm", cid, self.rng.choice([20, 50, 80]) * MS)
        elif r < 0.45:
            action = ("cancel", cid)
        elif r < 0.6:
            action = ("resched", cid, self.rng.randrange(0, 60) * MS)
        else:
            action = ("burst", self.rng.randrange(1, 40))
        self._append("client", action)

    def _commit_step(self) -> None:
        if self.end > self.commit:
            self.commit = self.rng.randrange(self.commit // ENTRY_LENGTH, self.end // ENTRY_LENGTH + 1) * ENTRY_LENGTH
            leader = self.members[self.leader]
            leader.timers.on_commit(self.commit)
            leader.pending.on_commit(self.commit)

    def _adapter_step(self, m: Member) -> None:
        """A follower's consensus module applies committed entries."""
        for _ in range(self.rng.randrange(1, 8)):
            if m.adapter >= self.commit:
                return
            entry = self._entry_after(m.adapter)
            if entry.kind == "timer":
                m.timers.on_log_timer_event(entry.a, entry.end)
            elif entry.kind == "service":
                m.pending.on_log_service_message(entry.a)
            m.adapter = entry.end

    def _service_step(self, m: Member) -> None:
        """The service applies entries up to its bound; a callback's requests go into the
        stream, waiting (the service with them) while it is full."""
        for _ in range(self.rng.randrange(1, 6)):
            while m.blocked and len(m.stream) < self.stream_capacity:
                m.stream.append(m.blocked.popleft())
            if m.blocked:
                return  # waiting in offer / schedule_timer
            bound = self.commit
            if m.member_id != self.leader and self.gate_followers:
                bound = min(bound, m.adapter)
            if m.service.position >= bound:
                return
            m.blocked.extend(m.service.apply(self._entry_after(m.service.position)))

    def _module_reads(self, m: Member) -> None:
        settled_leader = m.member_id == self.leader
        for _ in range(self.rng.randrange(1, 6)):
            if not m.stream or (settled_leader and not m.pending.has_room):
                return
            request = m.stream.popleft()
            if not self.log_order:
                request = (*request[:-1], -1)
            if request[0] == "schedule":
                m.timers.schedule(request[1], request[2], request[3])
            elif request[0] == "cancel":
                m.timers.cancel(request[1], request[2])
            else:
                m.pending.enqueue(request[1].encode())

    def _change_leader(self) -> None:
        """The leader steps down: the uncommitted tail is gone; a follower whose module has
        applied the committed log leads next (an election's replay makes it so)."""
        old = self.members[self.leader]
        del self.log[self.commit // ENTRY_LENGTH :]
        old.timers.rollback(self.commit)
        old.pending.rollback(self.commit)
        old.pending.become_follower()
        old.adapter = self.commit
        self._settle_at_commit()
        new = self.rng.choice([m for m in self.members if m is not old])
        new.pending.rollback(self.commit)
        self.leader = new.member_id

    def _settle_at_commit(self) -> None:
        """Between leaders: every module and service reaches the commit position and every
        request made up to it is applied; the timer tables must then be equal (the table at
        that log position)."""
        leader, self.leader = self.leader, -1
        for _ in range(100_000):
            busy = False
            for m in self.members:
                self._adapter_step(m)
                self._service_step(m)
                self._module_reads(m)
                busy = busy or bool(m.stream or m.blocked) or m.service.position < self.commit
                busy = busy or m.adapter < self.commit
            if not busy:
                break
        self.leader = leader
        tables = {m.member_id: m.timers.snapshot() for m in self.members}
        if len({tuple(t) for t in tables.values()}) != 1:
            self.violations.append(f"timer tables differ at log position {self.commit}: {tables}")

    # ------------------------------------------------------------------ run

    def run(self, steps: int = 3000) -> None:
        rng = self.rng
        for step in range(steps):
            self.now += rng.randrange(1, 6) * MS
            r = rng.random()
            if r < 0.08:
                self._client()
            elif r < 0.3:
                self._leader_step()
            elif r < 0.45:
                self._commit_step()
            elif r < 0.452 and step < steps * 3 // 4:
                self._change_leader()
            m = rng.choice(self.members)
            if m.member_id != self.leader:
                self._adapter_step(m)
            self._service_step(rng.choice(self.members))
            self._module_reads(rng.choice(self.members))
        self._drain()
        self._check()

    def _drain(self) -> None:
        """The leader stops firing; everything offered is appended, committed and applied."""
        self.firing = False
        for _ in range(100_000):
            self._leader_step()
            self.commit = self.end
            leader = self.members[self.leader]
            leader.timers.on_commit(self.commit)
            leader.pending.on_commit(self.commit)
            busy = False
            for m in self.members:
                if m.member_id != self.leader:
                    self._adapter_step(m)
                self._service_step(m)
                self._module_reads(m)
                busy = busy or bool(m.stream or m.blocked) or m.service.position < self.end
                busy = busy or (m.member_id != self.leader and m.adapter < self.end)
            if not busy and not leader.pending.to_append(1):
                return
        self.violations.append("the run did not drain")

    def _check(self) -> None:
        tables = {m.member_id: m.timers.snapshot() for m in self.members}
        if len({tuple(t) for t in tables.values()}) != 1:
            self.violations.append(f"timer tables differ: {tables}")
        states = {m.member_id: m.service.state() for m in self.members}
        if len(set(states.values())) != 1:
            self.violations.append("service states differ")
        for m in self.members:
            twice = [k for k, n in m.service.applied.items() if n != 1]
            if twice:
                self.violations.append(f"member {m.member_id}: service messages applied more than once: {twice[:3]}")
            if len(m.service.applied) != m.service.offered:
                self.violations.append(
                    f"member {m.member_id}: {m.service.offered} service messages offered, "
                    f"{len(m.service.applied)} applied"
                )
