"""The backup / member-seeding state machine (cluster_node.consensus.backup), without I/O."""

import random

from cluster_node import codecs
from cluster_node.consensus import backup as b
from cluster_node.consensus.effects import WriteRecordingLog
from cluster_node.consensus.recording_log import RecordingLog

S = 1_000_000_000
SNAPS = (
    codecs.BackupSnapshot(7, 2, 1024, 4096, 111, 0),
    codecs.BackupSnapshot(8, 2, 1024, 4096, 111, -1),
)


def response(cid, member_id, leader_id, *, snapshots=SNAPS, commit=8192, start=0, rec=3):
    return codecs.BackupResponse(
        correlation_id=cid,
        log_recording_id=rec,
        log_leadership_term_id=0,
        log_term_base_log_position=0,
        last_leadership_term_id=2,
        last_term_base_log_position=1024,
        commit_position_counter_id=42,
        leader_member_id=leader_id,
        member_id=member_id,
        snapshots=snapshots,
        cluster_members="",
        commit_position=commit,
        log_start_position=start,
    )


def core(seed=False, live_log=None, rl=None, self_member_id=-1):
    c = b.ClusterBackupCore(
        [0, 1, 2],
        b.BackupSettings(seed=seed),
        rl or RecordingLog(),
        1,
        0,
        random.Random(1),
        live_log=live_log,
        self_member_id=self_member_id,
    )
    return c


def apply(rl_effects):
    return [e for e in rl_effects if isinstance(e, WriteRecordingLog)]


def test_query_prefers_the_leader_and_falls_back_to_the_first_answer():
    c = core()
    (q,) = c.drain_effects()
    assert isinstance(q, b.SendBackupQuery) and c.state == b.BackupState.BACKUP_QUERY
    other = next(m for m in (0, 1, 2) if m != q.member_id)
    # The asked member names another as leader: the leader is asked too.
    c.on_response(response(q.correlation_id, q.member_id, other), 1)
    (q2,) = c.drain_effects()
    assert q2 == b.SendBackupQuery(other, q.correlation_id) and c.state == b.BackupState.BACKUP_QUERY
    # The leader does not answer in time: the first answer is used.
    c.do_work(1 + 5 * S)
    assert c.state == b.BackupState.SNAPSHOT_RETRIEVE and c.source_member_id == q.member_id


def test_unanswered_query_asks_the_next_member_and_stale_answers_are_ignored():
    c = core()
    (q,) = c.drain_effects()
    c.do_work(5 * S)
    (q2,) = c.drain_effects()
    assert q2.member_id != q.member_id and q2.correlation_id == q.correlation_id
    c.on_response(response(q.correlation_id + 99, q2.member_id, q2.member_id), 5 * S)
    c.on_response(response(q.correlation_id, 9, 9), 5 * S)  # not a member
    assert c.state == b.BackupState.BACKUP_QUERY and c.drain_effects() == []


def test_backup_cycle_copies_snapshots_records_the_log_from_the_snapshot_and_writes_recording_log():
    rl = RecordingLog()
    c = core(rl=rl)
    (q,) = c.drain_effects()
    c.on_response(response(q.correlation_id, q.member_id, q.member_id), 1)
    (r1,) = c.drain_effects()
    assert r1 == b.RetrieveSnapshot(q.member_id, SNAPS[0])
    c.on_snapshot_retrieved(SNAPS[0], 100, 2)
    (r2,) = c.drain_effects()
    assert r2 == b.RetrieveSnapshot(q.member_id, SNAPS[1])
    c.on_snapshot_retrieved(SNAPS[1], 101, 3)
    (rec,) = c.drain_effects()
    assert rec == b.StartLogRecording(-1, 4096) and c.state == b.BackupState.LIVE_LOG_RECORD
    c.on_log_recording(-1, 4)
    (replay,) = c.drain_effects()
    assert replay == b.StartLiveLogReplay(q.member_id, 3, 4096, 42)
    c.on_live_log_replay_started(102, 5)
    (w,) = apply(c.drain_effects())
    assert c.state == b.BackupState.BACKING_UP and c.last_success_ns == 5
    # services first, then the consensus module, then the TERM of the snapshot
    kinds = [(e.entry_type, e.service_id, e.recording_id) for e in rl.entries]
    assert kinds == [(1, 0, 100), (1, -1, 101), (0, 0, 102)]
    assert rl.last_term().leadership_term_id == 2 and rl.last_term().term_base_log_position == 1024
    plan = rl.create_recovery_plan(1, 4096, 4096)
    assert plan.snapshots[0].recording_id == 101 and plan.snapshots[1].recording_id == 100
    assert len(w.writes) == 3


def test_new_term_in_the_log_adds_a_term_and_queries_again_extending_the_recording():
    rl = RecordingLog()
    c = core(rl=rl)
    (q,) = c.drain_effects()
    c.on_response(response(q.correlation_id, q.member_id, q.member_id), 1)
    c.on_snapshot_retrieved(SNAPS[0], 100, 2)
    c.on_snapshot_retrieved(SNAPS[1], 101, 3)
    c.on_log_recording(-1, 4)
    c.on_live_log_replay_started(102, 5)
    c.drain_effects()
    c.on_live_log_position(9000, 6)
    c.on_new_term(3, 8800, 1_795_000_000_123, 7)
    assert apply(c.drain_effects()) and rl.last_term().leadership_term_id == 3
    # The TERM entry carries the event's cluster time (ms), as a member writes it, not our clock.
    assert rl.last_term().timestamp == 1_795_000_000_123
    c.on_new_term(3, 8800, 1_795_000_000_123, 7)  # seen again: nothing
    assert c.drain_effects() == []
    c.do_work(8)
    assert c.drain_effects() == [b.StopLiveLog()]
    c.on_live_log_ended(9024, 9)
    (q2,) = c.drain_effects()
    assert c.state == b.BackupState.BACKUP_QUERY and q2.correlation_id != q.correlation_id
    # The snapshots are already held: straight to the log, extended from where it stopped.
    c.on_response(response(q2.correlation_id, q2.member_id, q2.member_id, commit=20000), 10)
    assert c.drain_effects() == [b.StartLogRecording(102, 9024)]
    c.on_log_recording(102, 11)
    assert c.drain_effects() == [b.StartLiveLogReplay(q2.member_id, 3, 9024, 42)]
    c.on_live_log_replay_started(102, 12)
    assert c.drain_effects() == [] and c.state == b.BackupState.BACKING_UP


def test_a_member_whose_log_starts_after_our_copy_starts_a_new_copy_at_its_snapshot():
    rl = RecordingLog()
    c = core(rl=rl, live_log=(50, 1000))
    (q,) = c.drain_effects()
    c.on_response(response(q.correlation_id, q.member_id, q.member_id, start=2048), 1)
    c.on_snapshot_retrieved(SNAPS[0], 100, 2)
    c.on_snapshot_retrieved(SNAPS[1], 101, 3)
    assert c.drain_effects()[-1] == b.StartLogRecording(-1, 4096)


def test_failure_resets_and_queries_after_the_cool_down():
    c = core()
    (q,) = c.drain_effects()
    c.on_response(response(q.correlation_id, q.member_id, q.member_id), 1)
    c.drain_effects()
    c.on_failure("replication failed", 2)
    assert c.state == b.BackupState.RESET_BACKUP
    assert c.do_work(2 + 29 * S) == 0
    c.do_work(2 + 30 * S)
    assert c.state == b.BackupState.BACKUP_QUERY
    assert isinstance(c.drain_effects()[0], b.SendBackupQuery)


def test_the_member_s_live_log_ending_queries_again():
    c = core()
    (q,) = c.drain_effects()
    c.on_response(response(q.correlation_id, q.member_id, q.member_id, snapshots=()), 1)
    assert c.drain_effects() == [b.StartLogRecording(-1, 0)]
    c.on_log_recording(-1, 2)
    c.drain_effects()
    c.on_live_log_replay_started(5, 3)
    # Copying from 0: terms the answer already knew are written, but are no reason to ask again.
    c.on_new_term(0, 0, 1, 3)
    c.on_new_term(2, 320, 1, 3)
    assert len(apply(c.drain_effects())) == 2 and c.do_work(3) == 0
    c.on_new_term(3, 600, 1, 3)
    c.drain_effects()
    assert c.do_work(3) == 1 and c.drain_effects() == [b.StopLiveLog()]
    c.on_live_log_ended(640, 4)
    assert c.state == b.BackupState.BACKUP_QUERY and c.live_stop_position == 640


def test_seed_asks_every_member_and_copies_the_leader_s_snapshot_set():
    rl = RecordingLog()
    c = core(seed=True, rl=rl, self_member_id=1)
    qs = c.drain_effects()
    assert sorted(q.member_id for q in qs) == [0, 2]
    cid = qs[0].correlation_id
    # A follower answers first, naming the leader (also asked): its answer is kept aside.
    c.on_response(response(cid, 2, 0), 1)
    assert c.state == b.BackupState.BACKUP_QUERY
    c.on_response(response(cid, 0, 0), 2)
    assert c.source_member_id == 0
    c.on_snapshot_retrieved(*[e.snapshot for e in c.drain_effects()], 100, 2)
    c.on_snapshot_retrieved(*[e.snapshot for e in c.drain_effects()], 101, 3)
    assert c.drain_effects() == [b.StartLogRecording(-1, 4096)]
    c.on_log_recording(7, 4)
    assert apply(c.drain_effects())
    assert c.state == b.BackupState.CLOSED and c.seeded and c.highest_term_seen == 2
    plan = rl.create_recovery_plan(1, 4096, 4096)
    assert plan.snapshots[0].log_position == 4096 and plan.log_recording_id == 7
    assert plan.last_leadership_term_id == 2 and plan.last_term_base_log_position == 1024


def test_seed_without_the_leader_s_answer_uses_the_follower_s_after_the_response_timeout():
    c = core(seed=True, self_member_id=1)
    cid = c.drain_effects()[0].correlation_id
    c.on_response(response(cid, 2, 0), 1)
    c.do_work(4 * S)
    assert c.state == b.BackupState.BACKUP_QUERY
    c.do_work(5 * S)
    assert c.state == b.BackupState.SNAPSHOT_RETRIEVE and c.source_member_id == 2


def test_seed_asks_again_until_someone_answers():
    c = core(seed=True, self_member_id=1)
    assert len(c.drain_effects()) == 2
    c.do_work(5 * S)
    assert len(c.drain_effects()) == 2 and c.state == b.BackupState.BACKUP_QUERY


def test_seed_gives_up_when_a_majority_has_no_snapshot_or_on_timeout():
    c = core(seed=True, self_member_id=0)
    (q, _) = c.drain_effects()
    c.on_response(response(q.correlation_id, q.member_id, -1, snapshots=(), rec=-1), 1)
    assert c.state == b.BackupState.CLOSED and not c.seeded
    c = core(seed=True, self_member_id=0)
    c.do_work(60 * S)
    assert c.state == b.BackupState.CLOSED and not c.seeded


def test_seed_counts_a_refusal_as_a_member_without_a_snapshot_set():
    # Members that refuse each other's queries (an authenticator, no cluster key) must not hold
    # a new cluster's first start up until the seed query timeout.
    c = core(seed=True, self_member_id=0)
    (q, _) = c.drain_effects()
    c.on_refused(9, "member 9: no", 1)  # asked nobody by that id: ignored
    assert c.state == b.BackupState.BACKUP_QUERY
    c.on_refused(q.member_id, f"member {q.member_id}: no credentials", 1)
    assert c.state == b.BackupState.CLOSED and not c.seeded and "no credentials" in c.failure


def test_a_refusal_does_not_end_a_backup_s_query_by_itself():
    c = core()
    (q,) = c.drain_effects()
    c.on_refused(q.member_id, "member: wrong key", 1)
    assert c.state == b.BackupState.BACKUP_QUERY and c.failure == "member: wrong key"


def test_incomplete_snapshot_set_is_not_used():
    assert not b.snapshot_set_is_complete(SNAPS[:1], 1)
    assert b.snapshot_set_is_complete(SNAPS, 1)
    assert not b.snapshot_set_is_complete(SNAPS, 2)


def _backing_up(c):
    (q,) = c.drain_effects()
    c.on_response(response(q.correlation_id, q.member_id, q.member_id, snapshots=()), 1)
    for e in c.drain_effects():
        if isinstance(e, b.StartLogRecording):
            c.on_log_recording(-1, 2)
    c.drain_effects()
    c.on_live_log_replay_started(102, 3)
    c.drain_effects()
    assert c.state == b.BackupState.BACKING_UP
    return q.member_id


def test_a_silent_source_is_probed_then_given_up_before_any_image_timeout():
    c = core()
    source = _backing_up(c)
    timeout = c.settings.progress_timeout_ns
    # Probes four times a timeout; an answer (or log progress) keeps the source.
    c.do_work(3 + timeout // 4)
    assert c.drain_effects() == [b.ProbeSource(source)]
    c.on_source_heard(3 + timeout // 4)
    c.do_work(3 + timeout)
    assert c.drain_effects() == [b.ProbeSource(source)] and c.state == b.BackupState.BACKING_UP
    c.on_live_log_position(9000, 3 + timeout)
    # Then silence for longer than the timeout: the live log stops, and its end queries again.
    c.do_work(4 + 2 * timeout)
    assert b.StopLiveLog() in c.drain_effects() and "silent" in c.failure
    c.on_live_log_ended(9000, 5 + 2 * timeout)
    (q,) = c.drain_effects()
    assert isinstance(q, b.SendBackupQuery) and c.state == b.BackupState.BACKUP_QUERY
