"""The control cores without I/O: the operator's toggle (control_core), snapshot tracking
(snapshot_tracker) and the termination protocol (termination_core), driven by hand with explicit
times; what they decide is read from the effects they return."""

from __future__ import annotations

import random
from types import SimpleNamespace

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.control_core import ClusterControlCore
from cluster_node.consensus.effects import Role
from cluster_node.consensus.members import ClusterMember
from cluster_node.consensus.module import ConsensusModule, ConsensusSettings
from cluster_node.consensus.recording_log import RecordingLog
from cluster_node.identifiers import ModuleState as MS
from cluster_node.identifiers import ToggleState as T

SNAP_TIMEOUT = 5_000
TERM_TIMEOUT = 10_000
HEARTBEAT = 100


def _module(role=Role.LEADER, member_id=0, term=3, interval=0):
    rl = RecordingLog()
    rl.append_term(7, term, 1024, 0)
    m = SimpleNamespace(
        member_id=member_id,
        role=role,
        is_leader=role == Role.LEADER,
        leadership_term_id=term,
        term_base_log_position=1024,
        members=[SimpleNamespace(member_id=i) for i in range(3)],
        member_by_id={0: 0, 1: 1, 2: 2},
        leader_member_id=0 if role == Role.LEADER else 1,
        settings=SimpleNamespace(leader_heartbeat_interval_ns=HEARTBEAT),
        recording_log=rl,
        cluster_clock=lambda now: now + 1_000_000_000,
        terminating=False,
        termination_position=-1,
    )
    m.control = ClusterControlCore(m, SNAP_TIMEOUT, TERM_TIMEOUT, interval)
    return m


def _types(effects) -> list[type]:
    return [type(e) for e in effects]


def _states(effects) -> list[int]:
    return [e.state for e in effects if type(e) is fx.SetModuleState]


def _notes(effects) -> list[str]:
    return [e.event for e in effects if type(e) is fx.ControlNote]


def _ack(position, recording_id=55) -> codecs.ServiceAck:
    return codecs.ServiceAck(position, 9, 1, recording_id, 0)


def _snapshot_in_log(m, position=2048, now=0):
    """Leader: SNAPSHOT taken and appended at ``position``."""
    c = m.control
    out = c.on_toggle(T.SNAPSHOT, now, position - 96, can_append=True)
    (append,) = [e for e in out if type(e) is fx.AppendClusterAction]
    out += c.on_cluster_action_appended(position, now)
    return out, append


# ----------------------------------------------------------------------------- the toggle


def test_suspend_and_resume_on_the_leader():
    m = _module()
    c = m.control
    out = c.on_toggle(T.SUSPEND, 0, 100, True)
    assert _states(out) == [MS.SUSPENDED] and out[-1] == fx.ResetControlToggle()
    assert c.suspended and not c.leader_active
    out = c.on_toggle(T.RESUME, 1, 100, True)
    assert _types(out)[:2] == [fx.ClusterResumed, fx.SetModuleState] and _states(out) == [MS.ACTIVE]
    assert c.leader_active


def test_a_follower_refuses_every_request_and_puts_neutral_back():
    m = _module(role=Role.FOLLOWER)
    for toggle in (T.SUSPEND, T.SNAPSHOT, T.SHUTDOWN, T.ABORT):
        out = m.control.on_toggle(toggle, 0, 100, True)
        assert _notes(out) == ["cluster control ignored: not the leader"] and out[-1] == fx.ResetControlToggle()
        assert m.control.state == MS.ACTIVE


def test_snapshot_waits_for_what_is_queued_then_appends_at_the_log_s_end():
    m = _module()
    c = m.control
    out = c.on_toggle(T.SNAPSHOT, 5, 1952, can_append=False)
    assert _states(out) == [MS.SNAPSHOT] and fx.AppendClusterAction not in _types(out)
    assert fx.ResetControlToggle not in _types(out)  # NEUTRAL comes when the snapshot is done
    assert not c.leader_active
    assert c.on_toggle(T.SNAPSHOT, 6, 1952, True) == []  # still under way: the toggle waits
    (append,) = c.append_leader_action(7, 1952, can_append=True)
    assert append.message == codecs.ClusterActionRequest(3, 1952, 7 + 1_000_000_000, codecs.ClusterAction.SNAPSHOT)
    out = c.on_cluster_action_appended(2048, 8)
    assert c.snapshots.pending.position == 2048 and c.leader_action is None
    assert "snapshot requested" in _notes(out)


def test_a_snapshot_acked_is_recorded_and_the_leader_serves_again():
    m = _module()
    c = m.control
    _snapshot_in_log(m)
    c.on_service_ack(_ack(1024))  # an older ack: nobody waits for it
    c.on_service_ack(_ack(2048))
    assert c.service_ack_work(adapter_position=0) == 1 and not c.snapshots.acks
    (record,) = c.take_acked_snapshot()
    assert record == fx.RecordSnapshot(2048, 3, 1024, 55, 9, 0)
    assert c.snapshots.pending is None and c.state == MS.SNAPSHOT  # not ACTIVE before it is recorded
    out = c.on_snapshot_recorded(record, 77, 10)
    assert _types(out) == [fx.WriteRecordingLog, fx.SnapshotTaken, fx.SetModuleState, fx.ResetControlToggle]
    assert _states(out) == [MS.ACTIVE] and out[-1].only_if == T.SNAPSHOT
    assert m.recording_log.latest_snapshot().recording_id == 77
    assert m.recording_log.latest_snapshot(0).recording_id == 55
    assert m.recording_log.latest_snapshot().log_position == 2048
    assert c.snapshots.last_snapshot_position == 2048 and c.leader_active


def test_a_snapshot_the_service_failed_records_nothing():
    m = _module()
    c = m.control
    _snapshot_in_log(m)
    c.on_service_ack(_ack(2048, recording_id=-1))
    c.service_ack_work(0)
    out = c.take_acked_snapshot()
    assert _types(out)[0] is fx.SnapshotFailed and "could not take its snapshot" in out[0].message
    assert _states(out) == [MS.ACTIVE] and m.recording_log.latest_snapshot() is None


def test_a_snapshot_not_acked_in_time_fails_at_the_timeout_and_not_before():
    m = _module()
    c = m.control
    _snapshot_in_log(m, now=100)
    assert c.check_snapshot_timeout(100 + SNAP_TIMEOUT) == []
    out = c.check_snapshot_timeout(100 + SNAP_TIMEOUT + 1)
    assert out[0].message.startswith("snapshot failed: the service did not acknowledge it in time")
    assert dict(out[0].fields)["log_position"] == 2048 and _states(out) == [MS.ACTIVE]
    c.on_service_ack(_ack(2048))  # comes late: dropped
    c.service_ack_work(0)
    assert c.take_acked_snapshot() == [] and not c.snapshots.acks


def test_abort_during_a_snapshot_abandons_it_and_stops_at_the_log_s_end():
    m = _module()
    c = m.control
    _snapshot_in_log(m)
    out = c.on_toggle(T.ABORT, 50, 2048, True)
    assert "snapshot abandoned" in _notes(out) and "termination position set" in _notes(out)
    assert c.snapshots.pending is None and c.termination.pending.position == 2048
    assert c.state == MS.TERMINATING and m.terminating
    out = c.on_toggle(T.SHUTDOWN, 51, 2048, True)
    assert _notes(out) == ["cluster control: already stopping"]


def test_shutdown_is_taken_while_suspended_and_refused_on_a_non_active_state_otherwise():
    m = _module()
    c = m.control
    c.on_toggle(T.SUSPEND, 0, 100, True)
    assert _notes(c.on_toggle(T.SNAPSHOT, 1, 100, True)) == ["cluster control not applicable"]
    out = c.on_toggle(T.SHUTDOWN, 2, 1952, True)
    assert fx.AppendClusterAction in _types(out) and c.leader_action == T.SHUTDOWN


def test_the_snapshot_interval_and_an_admin_request():
    m = _module(interval=4096)
    c = m.control
    c.snapshots.last_snapshot_position = 1000
    assert c.check_snapshot_interval(0, 5000, True) == []
    out = c.check_snapshot_interval(0, 5096, True)
    assert "snapshot interval reached" in _notes(out) and fx.AppendClusterAction in _types(out)
    assert c.on_admin_snapshot(1, 5096, True) is None  # one under way already


def test_a_follower_s_early_ack_waits_for_its_log_adapter():
    m = _module(role=Role.FOLLOWER)
    c = m.control
    c.on_service_ack(_ack(2048))
    assert c.service_ack_work(adapter_position=1500) == 0 and len(c.snapshots.acks) == 1
    c.begin_snapshot(2048, 3, 10)  # the log adapter met the request
    assert c.service_ack_work(adapter_position=2048) == 1
    assert c.take_acked_snapshot()[0].position == 2048


# ------------------------------------------------------------------------------ termination


def _shutdown_leader():
    m = _module()
    c = m.control
    c.on_toggle(T.SHUTDOWN, 0, 1952, True)
    c.on_cluster_action_appended(2048, 0)
    return m, c


def test_the_leader_stops_after_its_snapshot_its_service_and_every_follower_s_ack():
    m, c = _shutdown_leader()
    out = c.termination_work(0, 0)
    sent = [e for e in out if type(e) is fx.SendToMember]
    assert [(e.member_id, e.message) for e in sent] == [(i, codecs.TerminationPosition(3, 2048)) for i in (1, 2)]
    assert fx.NotifyServiceTermination not in _types(out)  # the snapshot comes first
    c.on_service_ack(_ack(2048))
    c.service_ack_work(0)
    c.on_snapshot_recorded(c.take_acked_snapshot()[0], 77, 1)
    assert c.state == MS.SNAPSHOT  # still stopping, not ACTIVE
    out = c.termination_work(1, 0)
    assert _states(out) == [MS.TERMINATING] and out[-1] == fx.NotifyServiceTermination(2048)
    assert fx.NotifyServiceTermination in _types(c.termination_work(2, 0))  # not taken yet: again
    c.termination.on_service_notified()
    c.on_service_ack(_ack(2048, recording_id=-1))
    assert c.service_ack_work(0) == 1
    for member in (1, 2):
        c.on_termination_message(codecs.TerminationAck(3, 2048, member), 3)
    out = c.termination_work(4, 0)
    assert _types(out) == [fx.WriteRecordingLog, fx.Terminate] and out[-1] == fx.Terminate(2048, 3)
    assert m.recording_log.last_term().log_position == 2048  # the term's end, committed
    assert c.state == MS.CLOSED and c.termination_work(5, 0) == []


def test_the_leader_stops_at_the_termination_timeout_without_a_missing_ack():
    m = _module()
    c = m.control
    c.on_toggle(T.ABORT, 0, 2048, True)
    c.termination_work(0, 0)
    c.termination.on_service_notified()
    c.on_service_ack(_ack(2048, recording_id=-1))
    c.service_ack_work(0)
    c.on_termination_message(codecs.TerminationAck(3, 2000, 1), 1)  # short of the position: not counted
    c.on_termination_message(codecs.TerminationAck(3, 2048, 2), 1)
    assert fx.Terminate not in _types(c.termination_work(TERM_TIMEOUT - 1, 0))
    out = c.termination_work(TERM_TIMEOUT, 0)
    assert "termination timeout: stopping without every member's ack" in _notes(out)
    assert dict(out[_types(out).index(fx.ControlNote)].fields)["missing"] == [1]
    assert out[-1] == fx.Terminate(2048, 3)


def test_a_follower_stops_only_once_its_log_reaches_the_position():
    m = _module(role=Role.FOLLOWER, member_id=2)
    c = m.control
    assert c.on_termination_message(codecs.TerminationPosition(2, 4096), 0) == []  # another term
    out = c.on_termination_message(codecs.TerminationPosition(3, 4096), 0)
    assert _states(out) == [MS.TERMINATING] and m.termination_position == 4096
    assert c.termination_work(1, adapter_position=4000) == []
    assert c.termination_work(2, adapter_position=4096) == [fx.NotifyServiceTermination(4096)]
    c.termination.on_service_notified()
    c.on_service_ack(_ack(4096, recording_id=-1))
    c.service_ack_work(4096)
    out = c.termination_work(3, 4096)
    assert out[0] == fx.SendToMember(1, codecs.TerminationAck(3, 4096, 2))
    assert out[-1] == fx.Terminate(4096, 3)


def test_an_election_abandons_the_snapshot_and_the_termination():
    log = RecordingLog()
    log.append_term(0, 0, 0, 0)
    core = ConsensusModule(
        0, [ClusterMember(i) for i in range(3)], ConsensusSettings(), random.Random(1), log, 0, 0, 1024, 0
    )
    c = core.control
    c.begin_snapshot(1024, 0, 0)
    c.termination.start_leader(1024, 0, 0, snapshot=True)
    core.drain_effects()
    core.stop_log_activity()
    effects = core.drain_effects()
    assert {"snapshot abandoned", "termination abandoned"} <= set(_notes(effects))
    assert c.snapshots.pending is None and c.termination.pending is None and not core.terminating
    assert _types(effects)[-1] is fx.RollbackUncommitted


def _settled_follower(append_position: int, commit_position: int) -> ConsensusModule:
    log = RecordingLog()
    log.append_term(0, 0, 0, 0)
    core = ConsensusModule(
        1, [ClusterMember(i) for i in range(3)], ConsensusSettings(), random.Random(1), log, 0, 0, append_position, 0
    )
    core.election = None
    core.role = Role.FOLLOWER
    core.leader_member_id = 0
    core.leader_commit_position = commit_position
    core.commit_position = commit_position
    core.termination_position = 2048
    core.time_of_last_leader_message_ns = 0
    core.drain_effects()
    return core


def test_a_follower_that_has_the_termination_position_committed_waits_for_a_gone_leader():
    core = _settled_follower(append_position=2048, commit_position=2048)
    core.do_work(core.settings.leader_heartbeat_timeout_ns + 1)
    assert core.election is None  # it stops by itself; an election would tear its log down


def test_a_follower_whose_commit_is_short_of_the_termination_position_elects_when_the_leader_is_gone():
    """Its log reached the position but the leader's last CommitPosition was lost: its state,
    bounded by the commit position, can never reach the position, so waiting would hang it."""
    core = _settled_follower(append_position=2048, commit_position=1024)
    core.do_work(core.settings.leader_heartbeat_timeout_ns + 1)
    assert core.election is not None
