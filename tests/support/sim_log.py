"""How the log moves between the simulator's members and into their services.

A mixin of :class:`tests.support.sim.Simulation`: the leader's archive records its own
publication a tick after sending it; a follower's subscription receives what the leader's
publication (live) or catchup replay has sent since its position; a replication copies a few
entries per tick from the leader's archive and fails when its source was truncated; a replay
into the service takes time per entry and reports its progress (``SimConfig.replay_entry_ns``).
"""

from __future__ import annotations

from cluster_node.consensus import effects as fx
from tests.support.sim_model import _REPLAY_DONE, _REPLAY_PROGRESS, MS, SimMember


class LogTransport:
    """The log's movement in a :class:`~tests.support.sim.Simulation` (mixed into it)."""

    def _pull_log(self, m: SimMember) -> None:
        """The follower's subscription receives what the leader's publication (live destination)
        or the leader's catchup replay (catchup destination) has sent since its position."""
        sub = m.subscription
        if sub is None or m.recording_session != sub.log_session_id:
            return
        leader = self.members[sub.leader_member_id]
        if not leader.alive or leader.paused_until > self.now_ns or not self._link_up(leader.member_id, m.member_id):
            return
        if self.drop_rate and self.rng.random() < self.drop_rate:
            return
        live = sub.live and leader.publication_session == sub.log_session_id
        catchup = sub.catchup and leader.catchup_replays.get(m.member_id) == sub.log_session_id
        if not (live or catchup):
            return
        if not sub.joined:
            sub.joined = True
            m.core.on_log_image(m.archive.stop, self.now_ns)
        if self.disk.recording_stalled(m):
            return
        a = m.archive
        a.copy_from(leader.archive, leader.archive.stop, 1 << 30 if live else self.chunk_entries)
        if live and leader.unrecorded and a.stop == leader.archive.stop:
            for start, end, term, key in leader.unrecorded:
                a.append(end - start, term, key)

    def _replicate(self, m: SimMember) -> None:
        rep = m.replication
        if rep is None:
            return
        replication_id, leader_id, stop, epoch = rep
        src = self.members[leader_id]
        if (
            not src.alive
            or src.paused_until > self.now_ns
            or not (self._link_up(leader_id, m.member_id) and self._link_up(m.member_id, leader_id))
        ):
            return
        if src.archive.epoch != epoch:
            m.replication = None
            m.core.on_replication_failed(replication_id, "source recording truncated", self.now_ns)
            return
        if m.archive.stop < stop and src.archive.index_at(m.archive.stop) < 0:
            m.replication = None
            m.core.on_replication_failed(replication_id, "position not in source", self.now_ns)
            return
        m.archive.copy_from(src.archive, min(stop, src.archive.stop), self.chunk_entries)
        self._report_position(m)
        if m.archive.stop == stop:
            m.replication = None
            m.core.on_replication_done(replication_id, self.now_ns)
        elif m.archive.stop > stop:
            self.violation(f"member {m.member_id} replicated past its stop position {stop}")

    def _record_publication(self, m: SimMember) -> None:
        """The leader's archive records its own publication a little after it was sent (on the
        next tick), so followers can hold a tail that a crashing leader never recorded."""
        a = m.archive
        for start, end, term, key in m.unrecorded:
            if start != a.stop:
                self.violation(f"member {m.member_id} publication and recording diverge")
                break
            a.append(end - start, term, key)
        m.unrecorded.clear()

    def _start_replay(self, m: SimMember, e: fx.StartReplay) -> None:
        if e.from_position != m.applied:
            what = "applies entries a second time" if e.from_position < m.applied else "skips entries"
            self.violation(f"member {m.member_id} replays from {e.from_position}, applied up to {m.applied}: {what}")
        m.active_replay = e.replay_id
        m.replay_range = (e.from_position, e.to_position)
        a = m.archive
        i, j = a.index_at(e.from_position), a.index_at(e.to_position)
        if i < 0 or j < 0 or j < i:
            self.violation(f"member {m.member_id} replays [{e.from_position}, {e.to_position}), not entries")
            return
        per_entry = self.config.replay_entry_ns
        if per_entry <= 0 or j == i:
            self._schedule(1 * MS, _REPLAY_DONE, (m.member_id, m.incarnation, e.replay_id))
            return
        step = max(1, (j - i + 3) // 4)
        k = i
        while k < j:
            k = min(j, k + step)
            position = a.ends[k - 1]
            self._schedule((k - i) * per_entry, _REPLAY_PROGRESS, (m.member_id, m.incarnation, e.replay_id, position))
        self._schedule((j - i) * per_entry + 1, _REPLAY_DONE, (m.member_id, m.incarnation, e.replay_id))

    def _on_replay_progress(self, member_id: int, incarnation: int, replay_id: int, position: int) -> None:
        m = self.members[member_id]
        if not m.alive or m.incarnation != incarnation:
            return
        if self._deferred(m, _REPLAY_PROGRESS, (member_id, incarnation, replay_id, position)):
            return
        if m.active_replay != replay_id:
            return  # stopped (StopReplay): nothing more of it is applied
        m.applied = max(m.applied, position)
        if self.sessions is not None:
            self.sessions.on_replay(m, position)
        m.core.on_replay_progress(replay_id, position)
        self._run_core(m)

    def _on_replay_done(self, member_id: int, incarnation: int, replay_id: int) -> None:
        m = self.members[member_id]
        if not m.alive or m.incarnation != incarnation:
            return
        if self._deferred(m, _REPLAY_DONE, (member_id, incarnation, replay_id)):
            return
        if m.active_replay == replay_id:
            self.service.on_replay_done(m, *m.replay_range)
            if self.sessions is not None:
                self.sessions.on_replay(m, m.replay_range[1])
        m.core.on_replay_done(replay_id, self.now_ns)
        m.core.do_work(self.now_ns)
        self._run_core(m)
