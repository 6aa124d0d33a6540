"""The simulator's invariant checks on the consensus cores (the models check their own).

A mixin of :class:`tests.support.sim.Simulation`: each commit a member reports is compared with
one canonical committed log, each step's end looks at the core's safety alerts and sends the
acknowledgements that are due, ``converged`` says whether the cluster settled, and
``final_checks`` looks at recording.log against the archive and at every acknowledged message.
See ``tests/support/sim.py`` for the list of invariants.
"""

from __future__ import annotations

from cluster_node.consensus.effects import Role
from cluster_node.consensus.recording_log import RecordingLog
from tests.support.sim_model import SimMember


class Checks:
    """The invariant checks of a :class:`~tests.support.sim.Simulation` (mixed into it)."""

    def _on_commit(self, m: SimMember, position: int) -> None:
        mid = m.member_id
        if position < m.last_commit:
            self.violation(f"member {mid} commit went back {m.last_commit} -> {position}")
            return
        archive = m.archive
        if position > archive.stop:
            self.violation(f"member {mid} commits {position} beyond its log end {archive.stop}")
            return
        start = max(m.last_commit, 0)
        i = archive.index_at(start)
        if i < 0:
            self.violation(f"member {mid} commit {start} is not an entry boundary")
            return
        committed = self.committed
        ends, terms, keys = archive.ends, archive.terms, archive.keys
        n = len(ends)
        while i < n and ends[i] <= position:
            s = archive.starts[i]
            entry = (ends[i], terms[i], keys[i])
            known = committed.get(s)
            if known is None:
                if s != self.committed_end:
                    self.violation(f"member {mid} committed entry at {s} leaves a gap")
                committed[s] = entry
                self.committed_end = ends[i]
            elif known != entry:
                self.violation(f"member {mid} committed {entry} at {s}, but {known} was committed there")
                return
            i += 1
        if position != (ends[i - 1] if i > 0 else 0) and position != 0:
            self.violation(f"member {mid} commit position {position} is inside an entry")
        m.last_commit = position
        m.applied = max(m.applied, position)
        self._record(f"c {mid} {position}")

    def _after_step(self, m: SimMember) -> None:
        core = m.core
        if core is None:
            return
        self.service.sync(m)
        if self.sessions is not None:
            self.sessions.sync(m)
            if not m.alive:
                return
        if core.safety_alerts:
            for alert in core.safety_alerts:
                self.violation(alert)
            core.safety_alerts.clear()
        if m.pending_acks and core.role == Role.LEADER:
            commit = core.commit_position
            pending = m.pending_acks
            k = 0
            while k < len(pending) and pending[k][0] <= commit:
                end, term, payload, client = pending[k]
                if term == core.leadership_term_id:
                    self._send_ack(m.member_id, client, payload, end)
                k += 1
            if k:
                del pending[:k]
        elif m.pending_acks and core.role != Role.LEADER:
            m.pending_acks.clear()

    def converged(self) -> bool:
        """One settled leader; every member alive, settled on its term, holding its whole log,
        with the same commit position."""
        leader_id = self.leader()
        if leader_id is None:
            return False
        lead = self.members[leader_id]
        lc = lead.core
        if lc.commit_position != lead.archive.stop:
            return False
        for m in self.members:
            if not m.alive:
                return False
            c = m.core
            if c.election is not None or c.leadership_term_id != lc.leadership_term_id:
                return False
            if m.member_id != leader_id and c.leader_member_id != leader_id:
                return False
            if m.archive.stop != lead.archive.stop or c.commit_position != lc.commit_position:
                return False
        return True

    def coverage(self) -> dict[str, int]:
        s = self.sessions
        return {
            "io_errors": self.disk.failures,
            "io_errors_counted": self.errors,
            "recording_stalls_reported": self.disk.stalls_reported,
            "clock_steps": self.clocks.steps,
            "sessions_opened": s.opened if s else 0,
            "sessions_closed": s.closed_by_client if s else 0,
            "sessions_timed_out": s.timed_out if s else 0,
            "sessions_rolled_back": s.rolled_back if s else 0,
            "sessions_redirected": s.redirected if s else 0,
            "sessions_challenged": s.challenged if s else 0,
            "sessions_auth_rejected": s.auth_rejected if s else 0,
            "acked": len(self.acked),
        }

    def check_log_terms(self, member_id: int, log: RecordingLog | None = None) -> None:
        """recording.log must describe the archive: every recorded entry carries the term of the
        TERM entry that covers its position (the last one starting at or before it). The vote
        rule compares logs by that term, so a mismatch would be a safety hole."""
        m = self.members[member_id]
        if log is None:
            log = RecordingLog.decode(bytes(m.recording_log_bytes))
        terms = sorted((e.term_base_log_position, e.leadership_term_id) for e in log.term_entries())
        a = m.archive
        k = -1
        for i, start in enumerate(a.starts):
            while k + 1 < len(terms) and terms[k + 1][0] <= start:
                k += 1
            if k < 0 or terms[k][1] != a.terms[i]:
                covering = terms[k][1] if k >= 0 else None
                self.violation(
                    f"member {member_id}: entry at {start} has term {a.terms[i]} but recording.log says term {covering}"
                )
                return

    def final_checks(self) -> None:
        for m in self.members:
            self.check_log_terms(m.member_id)
        self.service.final_checks()
        counts: dict[object, int] = {}
        for _, _, key in self.committed.values():
            if isinstance(key, bytes):
                counts[key] = counts.get(key, 0) + 1
        for payload in self.acked:
            c = counts.get(payload, 0)
            if c != 1:
                self.violation(f"acknowledged message {payload!r} is in the committed log {c} times")
