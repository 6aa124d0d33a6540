"""The consensus core's effects carried out, in order, with the fail-stop rules of ``effects.py``.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). The core
(``module.ConsensusModule``) never performs I/O: it emits effects, and this module runs each
through a table from effect type to handler (:data:`EFFECT_HANDLERS`). A handler that awaits
(the archive, for a while) first lets go of what the pass holds: its held sends go out and the
driver's receiver reads the sockets meanwhile; the others (:data:`SYNC_EFFECTS`) run with the
pass's sends still held. When a handler fails, ``effect_policy.after`` decides (the rules of
``effects.py``, *When an effect fails*, which the simulator follows too):
``effects.FAIL_STOP_EFFECTS`` end the node before the effects after them run (they depend on it),
``effects.FAIL_STOP_NOT_PERSISTED`` ends it too (an election cannot start without it), and any
other failure is counted and the list goes on.
"""

from __future__ import annotations

import inspect
import time

import msgspec
import structlog

from cluster_node.archive.client import ArchiveError
from cluster_node.codecs import CONSENSUS_CODEC, CodecError
from cluster_node.consensus import effect_policy
from cluster_node.consensus import effects as fx
from cluster_node.consensus.cluster_control import ClusterControl
from cluster_node.consensus.consensus_adapter import DIGESTED
from cluster_node.consensus.election import ElectionState
from cluster_node.consensus.module import Role
from cluster_node.consensus.node_files import NodeStateError
from cluster_node.consensus.snapshot_taker import SnapshotTaker
from cluster_node.consensus.termination import Termination
from cluster_node.exit_codes import ExitCode, NodeFailure

log = structlog.get_logger("consensus")


class EffectExecutor:
    """Runs the core's effects (see the module docstring)."""

    async def _execute(self, effects) -> None:
        unclaimed = False
        try:
            for e in effects:
                t = type(e)
                sync = t in SYNC_EFFECTS
                if not sync:
                    # It may await (the archive, for a while): what the pass holds goes out
                    # first rather than wait for the pass to end, and the driver's receiver
                    # reads the sockets meanwhile (what is awaited may need a datagram read).
                    self.driver.release_sends()
                    if not unclaimed and self._reads_sockets:
                        self.driver.unclaim_receive()
                        unclaimed = True
                handler = EFFECT_HANDLERS.get(t)
                if handler is None:
                    continue
                try:
                    if sync:
                        handler(self, e)
                    else:
                        await handler(self, e)
                except (ArchiveError, OSError, CodecError, NodeStateError) as ex:
                    decision = effect_policy.after(t, ex)
                    if decision.next is effect_policy.Next.STOP:
                        # Nothing after it runs: the effects that follow depend on it.
                        if decision.exit_code == ExitCode.PERSIST_FAILED:
                            raise self._persist_failed(e, ex) from ex
                        raise NodeFailure(
                            decision.exit_code,
                            f"could not stop log recording {self.recording_id} and learn where it "
                            f"ends: {ex}; an election cannot start without it, the node stops",
                        ) from ex
                    self.errors += 1
                    self.counters["errors"].add(1)
                    log.error("effect failed", effect=t.__name__, error=str(ex))
        finally:
            if unclaimed:
                self.driver.claim_receive(duties=True)

    def _persist_failed(self, e, error: Exception) -> NodeFailure:
        """The one line that ends the node when a fail-stop effect (``fx.FAIL_STOP_EFFECTS``)
        could not be carried out: which file, what the system said, what was withheld."""
        t = type(e)
        if t is fx.PersistCandidateTerm:
            what = (
                f"could not write {self.node_state.path} (candidate term {e.candidate_term_id})",
                "no vote or vote request for that term was sent",
            )
        elif t is fx.WriteRecordingLog:
            what = (f"could not write {self.recording_log_file.path}", "nothing that depends on it was sent")
        else:
            what = (
                f"could not truncate log recording {e.recording_id} to position {e.position}",
                "the log is not recorded again",
            )
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        if isinstance(error, NodeStateError):
            reason = str(error).rpartition(": cannot write: ")[2] or reason
        return NodeFailure(ExitCode.PERSIST_FAILED, f"{what[0]}: {reason}; {what[1]}, the node stops")

    def _apply_recording_log(self, writes) -> None:
        """recording.log writes made outside the effect list (snapshot, termination): the same
        fail-stop rule as ``fx.WriteRecordingLog``."""
        try:
            self.recording_log_file.apply(writes)
        except OSError as ex:
            raise self._persist_failed(fx.WriteRecordingLog(tuple(writes)), ex) from ex

    # Handlers, one per effect type (EFFECT_HANDLERS below). Those that await are async.

    def _send_to_member(self, e: fx.SendToMember) -> None:
        pub = self._consensus_pubs.get(e.member_id)
        if pub is not None:
            msg = e.message
            if type(msg) in DIGESTED:
                msg = msgspec.structs.replace(msg, members_digest=self._members_digest)
            pub.offer(CONSENSUS_CODEC.encode(msg))

    def _append_log(self, e: fx.AppendLog) -> None:
        self._appends.append((e.message, None))
        self._flush_appends()

    def _persist_candidate_term(self, e: fx.PersistCandidateTerm) -> None:
        # (Wall clock, as the file documents: the effect's time is the monotonic clock.)
        self.node_state.propose_max_candidate_term_id(e.candidate_term_id, e.log_position, time.time_ns() // 1_000_000)

    def _write_recording_log(self, e: fx.WriteRecordingLog) -> None:
        self.recording_log_file.apply(e.writes)

    def _commit_position_changed(self, e: fx.CommitPositionChanged) -> None:
        self.sessions.on_commit(e.position)
        self.timers.on_commit(e.position)
        if self.module.role == Role.LEADER:
            self.pending.on_commit(e.position)
        self._publish_service_limit()

    def _role_changed(self, e: fx.RoleChanged) -> None:
        self.counters["role"].set(e.role)
        self.affinity.apply(e.role == Role.LEADER)
        if e.role != Role.LEADER:
            self.pending.become_follower()

    def _election_state_changed(self, e: fx.ElectionStateChanged) -> None:
        m = self.module
        self.counters["election-state"].set(e.to_state)
        log.info(
            "election state",
            from_state=ElectionState(e.from_state).name,
            to_state=ElectionState(e.to_state).name,
            reason=e.reason,
            leadership_term_id=e.leadership_term_id,
            candidate_term_id=e.candidate_term_id,
            append_position=m.append_position if m else -1,
            commit_position=m.commit_position if m else -1,
        )

    def _new_leader(self, e: fx.NewLeader) -> None:
        self.counters["leadership-term-id"].set(e.leadership_term_id)

    async def _election_complete(self, e: fx.ElectionComplete) -> None:
        m = self.module
        self.counters["election-state"].set(int(ElectionState.CLOSED))
        self.counters["leadership-term-id"].set(e.leadership_term_id)
        self.counters["leader-member-id"].set(e.leader_member_id)
        self.counters["election-count"].set(m.election_count)
        self.elections_completed += 1
        # The first election of this process as leader: the sessions it learned from the log
        # belong to clients of a cluster that has restarted; they are closed, not greeted.
        is_startup = self.elections_completed == 1
        self.sessions.on_new_leadership(
            is_leader=e.role == Role.LEADER,
            is_startup=is_startup,
            leadership_term_id=e.leadership_term_id,
            leader_member_id=e.leader_member_id,
            now_ns=self._clock.now(),
        )
        await self._execute_sessions()
        log.info(
            "election complete",
            leadership_term_id=e.leadership_term_id,
            leader=e.leader_member_id,
            role=Role(e.role).name,
            log_position=e.log_position,
            sessions=len(self.sessions.sessions),
            adapter_position=self._adapter_position(),
            commit_position=m.commit_position,
        )

    def _rollback_uncommitted(self, e: fx.RollbackUncommitted) -> None:
        self.sessions.rollback(
            e.commit_position, leadership_term_id=self.module.leadership_term_id, now_ns=self._clock.now()
        )
        self.timers.rollback(e.commit_position)
        self.pending.rollback(e.commit_position)
        self._appends.clear()

    async def _open_log_publication(self, e: fx.OpenLogPublication) -> None:
        await self._open_leader_log(e)

    def _close_log_publication(self, e: fx.CloseLogPublication) -> None:
        self._close_leader_log()

    async def _start_log_recording(self, e: fx.StartLogRecording) -> None:
        await self._start_recording(e)

    async def _stop_log_recording(self, e: fx.StopLogRecording) -> None:
        await self._stop_recording()

    async def _truncate_recording(self, e: fx.TruncateRecording) -> None:
        await self.archive.truncate_recording(e.recording_id, e.position)
        self.counters["append-pos"].set(e.position)

    def _open_log_subscription(self, e: fx.OpenLogSubscription) -> None:
        self._open_follower_log(e)

    def _add_live_destination(self, e: fx.AddLiveDestination) -> None:
        self._follower_sub.add_destination(f"aeron:udp?endpoint={self.cfg.this_member.log}")

    def _add_catchup_destination(self, e: fx.AddCatchupDestination) -> None:
        self._follower_sub.add_destination(f"aeron:udp?endpoint={self.catchup_endpoint}")

    def _remove_catchup_destination(self, e: fx.RemoveCatchupDestination) -> None:
        if self._follower_sub is not None:
            try:
                self._follower_sub.remove_destination(f"aeron:udp?endpoint={self.catchup_endpoint}")
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _close_log_subscription(self, e: fx.CloseLogSubscription) -> None:
        self._close_follower_log()

    def _snapshot_needed_effect(self, e: fx.SnapshotNeeded) -> None:
        self._snapshot_needed(e)

    async def _start_replay_effect(self, e: fx.StartReplay) -> None:
        await self._start_replay(e)

    async def _stop_replay_effect(self, e: fx.StopReplay) -> None:
        await self._stop_replay()

    async def _start_replication_effect(self, e: fx.StartReplication) -> None:
        await self._start_replication(e)

    async def _start_catchup_replay_effect(self, e: fx.StartCatchupReplay) -> None:
        await self._start_catchup_replay(e)

    async def _stop_replication(self, e: fx.StopReplication) -> None:
        if self._replication is not None:
            try:
                await self.archive.stop_replication(self._replication[1])
            except ArchiveError:
                pass
            self._replication = None

    async def _stop_catchup_replay(self, e: fx.StopCatchupReplay) -> None:
        sid = self._catchup_replays.pop(e.follower_member_id, None)
        if sid is not None:
            try:
                await self.archive.stop_replay(sid)
            except ArchiveError:
                pass


EFFECT_HANDLERS = {
    fx.SendToMember: EffectExecutor._send_to_member,
    fx.AppendLog: EffectExecutor._append_log,
    fx.PersistCandidateTerm: EffectExecutor._persist_candidate_term,
    fx.WriteRecordingLog: EffectExecutor._write_recording_log,
    fx.CommitPositionChanged: EffectExecutor._commit_position_changed,
    fx.RoleChanged: EffectExecutor._role_changed,
    fx.ElectionStateChanged: EffectExecutor._election_state_changed,
    fx.NewLeader: EffectExecutor._new_leader,
    fx.ElectionComplete: EffectExecutor._election_complete,
    fx.SnapshotNeeded: EffectExecutor._snapshot_needed_effect,
    fx.RollbackUncommitted: EffectExecutor._rollback_uncommitted,
    fx.OpenLogPublication: EffectExecutor._open_log_publication,
    fx.CloseLogPublication: EffectExecutor._close_log_publication,
    fx.StartLogRecording: EffectExecutor._start_log_recording,
    fx.StopLogRecording: EffectExecutor._stop_log_recording,
    fx.TruncateRecording: EffectExecutor._truncate_recording,
    fx.OpenLogSubscription: EffectExecutor._open_log_subscription,
    fx.AddLiveDestination: EffectExecutor._add_live_destination,
    fx.AddCatchupDestination: EffectExecutor._add_catchup_destination,
    fx.RemoveCatchupDestination: EffectExecutor._remove_catchup_destination,
    fx.CloseLogSubscription: EffectExecutor._close_log_subscription,
    fx.StartReplay: EffectExecutor._start_replay_effect,
    fx.StopReplay: EffectExecutor._stop_replay_effect,
    fx.StartReplication: EffectExecutor._start_replication_effect,
    fx.StopReplication: EffectExecutor._stop_replication,
    fx.StartCatchupReplay: EffectExecutor._start_catchup_replay_effect,
    fx.StopCatchupReplay: EffectExecutor._stop_catchup_replay,
    # The control core's (module.control): most reach the agent from its calls
    # (cluster_control._run_control); an election's start and end put theirs in the module's list.
    fx.SetModuleState: ClusterControl._set_module_state,
    fx.ResetControlToggle: ClusterControl._reset_control_toggle,
    fx.ClusterResumed: ClusterControl._cluster_resumed,
    fx.ControlNote: ClusterControl._control_note,
    fx.AppendClusterAction: ClusterControl._append_cluster_action,
    fx.NotifyServiceTermination: ClusterControl._notify_service_termination,
    fx.SnapshotFailed: ClusterControl._snapshot_failed_effect,
    fx.SnapshotTaken: SnapshotTaker._snapshot_taken,
    fx.RecordSnapshot: SnapshotTaker._record_snapshot,
    fx.Terminate: Termination._terminate,
}
"""Effect type -> handler ``(agent, effect)``. Every effect type of ``effects.py`` has one."""

SYNC_EFFECTS = frozenset(t for t, handler in EFFECT_HANDLERS.items() if not inspect.iscoroutinefunction(handler))
"""Effects whose handler never awaits: executed with this pass's sends still held."""
