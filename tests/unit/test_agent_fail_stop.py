"""The consensus agent's effect executor fails stop when a durable write fails.

A ``PersistCandidateTerm`` or ``WriteRecordingLog`` that cannot be written must end the node
(``NodeFailure`` with ``ExitCode.PERSIST_FAILED``) before the effects after it run: the vote or the
position report that depends on it must not leave the node. Other effects' failures are counted
and the executor goes on (consensus.effects, *When an effect fails*).

The executor runs on a real node-state.dat and recording.log in a temporary directory; the
fault is the system call failing (EIO, ENOSPC), injected at ``os``; the "network" is a capture of
what would have been offered to the peer's consensus publication.
"""

from __future__ import annotations

import errno
import os

import pytest
import trio

from cluster_node import codecs
from cluster_node.consensus import effects as fx
from cluster_node.consensus.agent import ConsensusAgent
from cluster_node.consensus.node_files import NodeStateFile
from cluster_node.consensus.recording_log_file import RecordingLogFile
from cluster_node.exit_codes import ExitCode, NodeFailure


class _Pub:
    def __init__(self) -> None:
        self.offered: list[bytes] = []

    def offer(self, data) -> int:
        self.offered.append(bytes(data))
        return len(self.offered)


class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int) -> None:
        self.value += n

    def get(self) -> int:
        return self.value


@pytest.fixture
def agent(tmp_path):
    a = object.__new__(ConsensusAgent)  # only what the executor touches for these effects
    a.node_state = NodeStateFile.open(tmp_path)
    a.recording_log_file = RecordingLogFile(tmp_path)
    a._consensus_pubs = {1: _Pub()}
    a._members_digest = 0
    a._reads_sockets = False
    a.errors = 0
    a.counters = {"errors": _Counter()}
    a.module = None
    yield a
    a.node_state.close()
    a.recording_log_file.close()


def _raiser(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


VOTE = codecs.Vote(5, 1, 0, candidate_member_id=1, follower_member_id=0, vote=True)
APPEND_POSITION = codecs.AppendPosition(5, 0, 0)


def _run(agent, effects) -> None:
    trio.run(agent._execute, effects)


def test_without_a_fault_the_vote_is_persisted_and_sent(agent):
    _run(agent, [fx.PersistCandidateTerm(5, 0, 0), fx.SendToMember(1, VOTE)])
    assert agent.node_state.candidate_term_id == 5
    assert len(agent._consensus_pubs[1].offered) == 1


@pytest.mark.parametrize("call,code", [("fdatasync", errno.EIO), ("pwrite", errno.ENOSPC), ("pwrite", errno.EIO)])
def test_a_failed_candidate_term_write_stops_the_node_before_the_vote(agent, monkeypatch, call, code):
    monkeypatch.setattr(os, call, _raiser(code))
    with pytest.raises(NodeFailure) as failure:
        _run(agent, [fx.PersistCandidateTerm(5, 0, 0), fx.SendToMember(1, VOTE)])
    monkeypatch.undo()
    assert failure.value.code == ExitCode.PERSIST_FAILED
    line = str(failure.value)
    assert str(agent.node_state.path) in line and os.strerror(code) in line, line
    assert "\n" not in line
    assert agent._consensus_pubs[1].offered == []  # no vote left the node
    assert agent.node_state.candidate_term_id != 5


@pytest.mark.parametrize("call,code", [("fsync", errno.EIO), ("pwrite", errno.ENOSPC)])
def test_a_failed_recording_log_write_stops_the_node_before_the_position_report(agent, monkeypatch, call, code):
    rl = agent.recording_log_file.log
    writes = rl.append_term(0, 5, 0, 0)
    monkeypatch.setattr(os, call, _raiser(code))
    with pytest.raises(NodeFailure) as failure:
        _run(agent, [fx.WriteRecordingLog(tuple(writes)), fx.SendToMember(1, APPEND_POSITION)])
    monkeypatch.undo()
    assert failure.value.code == ExitCode.PERSIST_FAILED
    line = str(failure.value)
    assert str(agent.recording_log_file.path) in line and os.strerror(code) in line, line
    assert agent._consensus_pubs[1].offered == []


def test_a_failed_best_effort_send_is_counted_and_the_effects_after_it_run(agent):
    class _Broken:
        def offer(self, data):
            raise OSError(errno.ENOBUFS, os.strerror(errno.ENOBUFS))

    agent._consensus_pubs[2] = _Broken()
    _run(agent, [fx.SendToMember(2, VOTE), fx.PersistCandidateTerm(7, 0, 0), fx.SendToMember(1, VOTE)])
    assert agent.errors == 1 and agent.counters["errors"].get() == 1
    assert agent.node_state.candidate_term_id == 7
    assert len(agent._consensus_pubs[1].offered) == 1


def test_the_fail_stop_effects_are_the_durable_ones():
    assert {fx.PersistCandidateTerm, fx.WriteRecordingLog, fx.TruncateRecording} == fx.FAIL_STOP_EFFECTS


def test_a_log_recording_that_cannot_be_stopped_stops_the_node(agent):
    """The election waits in INIT for the stop position: a member that cannot learn it would
    never elect again, so it stops (a restart recovers the recording)."""
    from cluster_node.archive.client import ArchiveError

    class _Archive:
        async def stop_recording_by_identity(self, recording_id):
            return None

        async def get_stop_position(self, recording_id):
            raise ArchiveError("the archive did not answer in time")

    class _Driver:
        def release_sends(self):
            pass

    agent.archive, agent.driver, agent.recording_id = _Archive(), _Driver(), 4
    with pytest.raises(NodeFailure) as failure:
        _run(agent, [fx.StopLogRecording(4), fx.SendToMember(1, VOTE)])
    assert failure.value.code == ExitCode.CONSENSUS_FAILED
    assert "could not stop log recording 4" in str(failure.value) and "did not answer" in str(failure.value)
    assert agent._consensus_pubs[1].offered == []


def test_every_effect_type_has_a_handler():
    """An effect the core emits with no handler would be dropped without a word."""
    from cluster_node.consensus.effect_executor import EFFECT_HANDLERS

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    # (A slotted dataclass is a new class: the one it replaced is still a subclass, unnamed.)
    effect_types = {t for t in subclasses(fx.Effect) if getattr(fx, t.__name__, None) is t}
    assert len(effect_types) > 20 and effect_types == set(EFFECT_HANDLERS)


def test_the_effects_run_with_the_sends_held_are_the_ones_that_never_await():
    from cluster_node.consensus.effect_executor import SYNC_EFFECTS

    assert {
        fx.SendToMember,
        fx.AppendLog,
        fx.PersistCandidateTerm,
        fx.WriteRecordingLog,
        fx.CommitPositionChanged,
        fx.RoleChanged,
        fx.ElectionStateChanged,
        fx.NewLeader,
        fx.RollbackUncommitted,
        fx.CloseLogPublication,
        fx.OpenLogSubscription,
        fx.AddLiveDestination,
        fx.AddCatchupDestination,
        fx.RemoveCatchupDestination,
        fx.CloseLogSubscription,
        fx.SnapshotNeeded,
        fx.SetModuleState,
        fx.ResetControlToggle,
        fx.ClusterResumed,
        fx.ControlNote,
        fx.AppendClusterAction,
        fx.NotifyServiceTermination,
        fx.SnapshotFailed,
        fx.SnapshotTaken,
        fx.Terminate,
    } == SYNC_EFFECTS


def test_the_executor_decides_through_the_shared_policy(agent, monkeypatch):
    """The node's executor asks ``effect_policy.after``, the function the simulator follows too
    (so the simulator's checks judge the node's rule): a policy that counts a failed candidate-term
    write lets the vote out."""
    from cluster_node.consensus import effect_policy

    monkeypatch.setattr(effect_policy, "after", lambda t, error: effect_policy.COUNT if error else effect_policy.OK)
    monkeypatch.setattr(os, "pwrite", _raiser(errno.EIO))
    _run(agent, [fx.PersistCandidateTerm(5, 0, 0), fx.SendToMember(1, VOTE)])
    monkeypatch.undo()
    assert agent.errors == 1
    assert len(agent._consensus_pubs[1].offered) == 1
