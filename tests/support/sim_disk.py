"""The simulator's failing disk: durable writes and archive requests that fail at random.

A member's effects that touch its files or its archive fail now and then, as a full or broken
disk or a refusing archive makes them fail on a real node:

* ``PersistCandidateTerm`` (node-state.dat) and ``WriteRecordingLog`` (recording.log): the write
  or its sync fails. What reached the disk is either nothing or all of it (a failed fsync may
  still leave the data in the file), chosen at random: after the crash that follows, the member
  reads back whichever it is;
* ``TruncateRecording`` (the archive cuts the recording): either done or not;
* ``StopLogRecording`` (the archive does not answer where the recording stopped);
* ``StartLogRecording`` on a follower (the archive refuses to extend the recording);
* a follower's running log recording stops writing (the archive cannot append): its log stands
  still while the leader's grows, and after a leader heartbeat timeout the member reports the
  stall to its core (``on_log_stalled``, as the node's stall check does), which leaves the term
  for an election that records the log again.

Not modelled: a leader's recording that fails to start or stops writing (its publication would
go on unrecorded while followers commit it, which the simulator's leader, whose archive records
all it publishes, does not represent), and back-pressure on the leader's appends.

What happens next is not decided here: the simulator asks ``consensus.effect_policy`` (the rules
the node's executor follows), and crashes the member when the policy says fail-stop, or counts
the error and runs the next effect.

Invariants (:meth:`SimDisk.on_send`), on what the member's files hold, not on what it believes:

* every RequestVote, and every Vote that grants, names a candidate term no higher than the one in
  its node-state.dat (a vote must survive a crash: a member that forgot it could vote twice);
* every AppendPosition names a leadership term its recording.log holds (a member reports
  positions only in a term it has adopted durably).
"""

from __future__ import annotations

import errno
import random

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.effects import Role
from cluster_node.consensus.recording_log import RecordingLog

DURABLE = (fx.PersistCandidateTerm, fx.WriteRecordingLog)
ARCHIVE = (fx.TruncateRecording, fx.StopLogRecording, fx.StartLogRecording)


class SimDisk:
    """Decides which effects fail (own random stream: turning it off changes nothing else)."""

    def __init__(self, sim, seed: int, fault_rate: float) -> None:
        self.sim = sim
        self.rate = fault_rate
        self.rng = random.Random(seed * 31 + 7)
        self.failures = 0
        self.recording_failures = 0
        self.stalls_reported = 0
        self._stalled: dict[int, tuple[int, int]] = {}
        """member -> (incarnation, since when) of a log recording that stopped writing."""
        self._terms: dict[int, tuple[int, frozenset[int]]] = {}
        """member -> (recording.log length and content hash it was decoded at, terms it holds)."""

    def fault(self, m, e: fx.Effect) -> OSError | None:
        """None when ``e`` is to be carried out; else the error it fails with, after applying
        what reached the disk anyway."""
        if not self.rate or not self.sim.faults_active:
            return None
        t = type(e)
        if t not in DURABLE and t not in ARCHIVE:
            return None
        if t is fx.StartLogRecording and e.is_leader:
            return None  # not modelled (module docstring)
        if self.rng.random() >= self.rate:
            return None
        self.failures += 1
        reached = self.rng.random() < 0.5
        sim = self.sim
        if t is fx.PersistCandidateTerm:
            if reached:
                m.node_state_candidate_term = max(m.node_state_candidate_term, e.candidate_term_id)
        elif t is fx.WriteRecordingLog:
            if reached:
                buf = m.recording_log_bytes
                for offset, data in e.writes:
                    if offset <= len(buf):
                        buf[offset : offset + len(data)] = data
        elif t is fx.TruncateRecording:
            if reached and m.recording_session is None and e.position >= m.last_commit:
                m.archive.truncate(e.position)
        sim._record(f"io-error {m.member_id} {t.__name__} reached={reached}")
        return OSError(errno.EIO, "Input/output error")

    # ------------------------------------------------------------- a recording that stops writing

    def recording_stalled(self, m) -> bool:
        s = self._stalled.get(m.member_id)
        return s is not None and s[0] == m.incarnation

    def on_recording_started(self, m) -> None:
        self._stalled.pop(m.member_id, None)

    def on_tick(self, m) -> None:
        """Now and then a follower's recording stops writing; a stall that lasted a leader
        heartbeat timeout, with log data it did not record, is reported to the core."""
        if not self.rate:
            return
        sim = self.sim
        core = m.core
        settled_follower = core.election is None and core.role != Role.LEADER
        if not self.recording_stalled(m):
            if (
                sim.faults_active
                and settled_follower
                and m.recording_session is not None
                and self.rng.random() < self.rate * 0.1
            ):
                self._stalled[m.member_id] = (m.incarnation, sim.now_ns)
                self.recording_failures += 1
                sim._record(f"recording stops writing {m.member_id}")
            return
        self._report_stall(m, settled_follower)

    def _report_stall(self, m, settled_follower: bool) -> None:
        sim = self.sim
        since = self._stalled[m.member_id][1]
        sub = m.subscription
        behind = sub is not None and sim.members[sub.leader_member_id].archive.stop > m.archive.stop
        if settled_follower and behind and sim.now_ns - since >= sim.settings.leader_heartbeat_timeout_ns:
            self.stalls_reported += 1
            sim._record(f"log stalled {m.member_id}")
            m.core.on_log_stalled(sim.now_ns, "log recording stalled")

    # ----------------------------------------------------------------------------- invariants

    def _log_terms(self, m) -> frozenset[int]:
        buf = m.recording_log_bytes
        key = (len(buf), hash(bytes(buf)))
        cached = self._terms.get(m.member_id)
        if cached is None or cached[0] != key:
            log = RecordingLog.decode(bytes(buf))
            cached = (key, frozenset(e.leadership_term_id for e in log.term_entries()))
            self._terms[m.member_id] = cached
        return cached[1]

    def on_send(self, m, msg: object) -> None:
        """Check a consensus message ``m`` sends against what its files hold."""
        t = type(msg)
        if t is codecs.Vote:
            if msg.vote and msg.candidate_term_id > m.node_state_candidate_term:
                self.sim.violation(
                    f"member {m.member_id} votes for term {msg.candidate_term_id} but its node-state "
                    f"holds {m.node_state_candidate_term}"
                )
        elif t is codecs.RequestVote:
            if msg.candidate_term_id > m.node_state_candidate_term:
                self.sim.violation(
                    f"member {m.member_id} asks votes for term {msg.candidate_term_id} but its "
                    f"node-state holds {m.node_state_candidate_term}"
                )
        elif t is codecs.AppendPosition:
            if msg.leadership_term_id not in self._log_terms(m):
                self.sim.violation(
                    f"member {m.member_id} reports position {msg.log_position} in term "
                    f"{msg.leadership_term_id}, which its recording.log does not hold"
                )
