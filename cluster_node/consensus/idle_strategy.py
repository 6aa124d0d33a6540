"""How the consensus agent waits when a pass found nothing to do (the reference's idle strategy).

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it; it reads the
agent's subscriptions, core and timers): whether a pass that did work may park at once, how long
a park may last (the core's next heartbeat, the services' timers, a replication's progress, a
nomination's own instant), the leader's short commit spin, and the wait itself on the driver's
sockets or the agent's wake event. Kept apart from the duty cycle because it is where latency and
idle CPU are decided, and a change here must be read against nothing but the inputs that wake it.
"""

from __future__ import annotations

import time

import trio

from cluster_node.consensus.election import ElectionState
from cluster_node.consensus.service_proxy import FOLLOWER_SERVICE_RING_NS


class IdleStrategy:
    """Parking and waking of the consensus duty cycle (see the module docstring)."""

    def _quiet_after_work(self, unrecorded: bool) -> bool:
        """May a pass that did work park instead of running again? Only when settled and nothing
        it started waits for a next pass: no election, replay, replication, snapshot,
        termination, leader action, unsent JoinLog, service acks, session effects or consensus
        effects, and all log data recorded. What arrives meanwhile ends the park at once (the
        park looks at the subscriptions first, and its wait at the sockets).

        Parking at once saves the followers an empty pass per message (their CPU per message
        drops in ``scripts/cluster_cpu.py --rate 1000``); the round trip and the idle cluster's
        CPU are unchanged."""
        m = self.module
        return (
            m.election is None
            and not unrecorded
            and not m.has_effects
            and not self.sessions.effects
            and self._replay is None
            and self._replication is None
            and self._snapshot is None
            and self._termination is None
            and self._leader_action is None
            and self._join_unsent is None
            and not self._service_acks
            and not self.stopping
        )

    async def _park(self, now: int) -> bool:
        """Nothing to do: wait for input or the next deadline. True if it yielded to the other
        tasks of this loop (it returns at once, without yielding, when input is already waiting
        or arrives within the leader's commit spin).

        Inputs all wake us: the UDP subscriptions (consensus, ingress, the follower's log) through
        their wake hook, the service's IPC messages through one long-lived waiter task, a replay
        through its doorbell. Log data waiting to be recorded never parks (see ``ConsensusAgent.run``). What
        remains is time: the core's heartbeats and timeouts (half the shortest interval is early
        enough), timers, and a replication's progress, which only the archive sees.
        """
        m = self.module
        t = self.cfg.timeouts
        if m.election is None:
            # Settled: the core's next duty is a heartbeat (CommitPosition or AppendPosition) a
            # heartbeat interval after the last, whatever woke us in between; its timeouts
            # (leader silence, inactive followers) are far longer and checked on the way.
            due = m.next_heartbeat_ns()
            timeout_ns = t.leader_heartbeat_interval_ns if due is None else max(0, due - now)
        else:
            timeout_ns = min(t.leader_heartbeat_interval_ns, t.election_status_interval_ns) // 2
        # A nomination is due at its own random instant, which must not be rounded onto the
        # timer grid below: every process shares that grid, so two members whose random delays
        # fell into one slot would nominate together and split the vote.
        nominate_at = None
        election = m.election
        if election is not None and election.state == ElectionState.NOMINATE:
            nominate_at = election.nomination_deadline_ns
        # Settled, the heartbeat goes on the driver's timer grid (its heartbeats, status
        # messages and this duty then fall in one wake-up); in an election the wait is exact:
        # its steps are short and their timing decides how soon the cluster has a leader again.
        deadline_ns = self.driver.coalesce(now + timeout_ns, now) if election is None else now + timeout_ns
        # Exact, whatever the grid: the services' timers and a replication's progress.
        nxt = self.timers.next_deadline()
        if nxt is not None and m.is_leader:
            deadline_ns = min(deadline_ns, now + max(0, nxt - self._clock.now()))  # deadlines are cluster time
        if self._replication is not None:
            deadline_ns = min(deadline_ns, now + 10_000_000)
        if self._service_ring_due:
            deadline_ns = min(deadline_ns, self._service_rung_ns + FOLLOWER_SERVICE_RING_NS)
        if nominate_at is not None:
            deadline_ns = min(deadline_ns, max(now, nominate_at))
        timeout_s = max(0.0, (deadline_ns - now) / 1e9)
        self._wake = trio.Event()
        ingress = self._ingress_sub if (self._leader_active() or not m.is_leader) else None
        for sub in (self._consensus_sub, self._follower_sub, ingress):
            if sub is not None:
                if sub.wake_hook is None:
                    sub.wake_hook = self._on_wake
                if sub.has_data():
                    return False
        if self._from_service.has_data():
            return False
        if self._replay is not None:
            # Rare (elections only): the replay's doorbell needs a task of its own.
            async with trio.open_nursery() as nursery:

                async def replay_waiter() -> None:
                    await self._replay[3].wait(timeout_s)
                    nursery.cancel_scope.cancel()

                async def other_waiter() -> None:
                    await self._wait_input(timeout_s)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(replay_waiter)
                nursery.start_soon(other_waiter)
            return True
        if self._commit_spin_due(now) and self._spin_for_input():
            return False
        return await self._wait_input(timeout_s)

    def _commit_spin_due(self, now: int) -> bool:
        """Will :meth:`_park` poll for the followers' answer (:meth:`_spin_for_input`) rather
        than sleep: a settled leader with entries not yet committed, within ``commit_spin`` of
        the last one sent."""
        m = self.module
        return (
            now < self._commit_spin_until
            and m.is_leader
            and m.election is None
            and self._reads_sockets
            and self.driver.receive_claimed
            and self.local is not None
            and self.local.pub.position > m.commit_position
        )

    def _spin_for_input(self) -> bool:
        """Poll the sockets until input for this agent arrives (True) or the commit spin ends
        (``timeouts.commit_spin``; False).

        A leader with log entries on their way to the followers expects their AppendPositions
        within a round trip. Sleeping costs more than waiting awake: a process woken from sleep
        pays for the wake-up before its first instruction (on a VM a trip through the host), and
        the follower's send wakes a halted CPU. The spin lowers the round trip at 1,000
        messages/s without raising the leader's CPU per message. The spin blocks this thread's trio
        loop, so it is short and bounded: the other duties here (the driver's sender and
        conductor, the archive) wait at most ``commit_spin``; the reading system call lets the
        service thread take the GIL."""
        driver = self.driver
        wake = self._wake
        from_service = self._from_service
        service_parked = self.service_parked
        end = self._commit_spin_until
        while True:
            if service_parked is not None and not service_parked():
                # The service thread has work: it wants this process's CPU (the leader's CPUs
                # may be one) and the GIL more than this loop does. Measured: spinning past a
                # busy service cost a tenth of the 1 KiB throughput.
                return False
            driver.receive_work()
            if wake.is_set() or from_service.has_data():
                self._just_read = True
                return True
            if time.monotonic_ns() >= end:
                return False

    async def _wait_input(self, timeout_s: float) -> bool:
        """Wait until one of this agent's inputs has something (:meth:`_on_wake`: a subscription's
        wake hook, the service's doorbell task) or the timeout passes.

        This agent reads the driver's sockets itself (see ``ConsensusAgent.run``): a datagram at any of
        them ends the wait (``driver.park``), is read here, and the pass resumes only if it woke
        one of the agent's own subscriptions. Status messages, heartbeats and other tasks' data
        (the archive's) are handled by the read alone: a full pass for each would cost more
        than the read and would move the agent's heartbeats off the driver's timer grid. The
        driver's park has no trio cancel scope (see ``MediaDriver.park``); :meth:`_on_wake`
        rings it instead. True if it yielded (see :meth:`_park`)."""
        wake = self._wake
        driver = self.driver
        owner = driver.receive_claimant
        if self._reads_sockets and owner is not None:
            # (The claimant is this task, or this task's child while a replay runs.)
            deadline = time.monotonic_ns() + int(timeout_s * 1e9)
            self._parked_on_driver = True
            yielded = False
            try:
                while not wake.is_set() and time.monotonic_ns() < deadline:
                    await driver.park(deadline)
                    yielded = True
                    if driver.receive_claimant is not owner:
                        break  # another task claimed the sockets (not expected): run a pass
                    driver.receive_work()
                    self._just_read = True
            finally:
                self._parked_on_driver = False
            return yielded
        with trio.move_on_after(timeout_s) as scope:
            self._park_scope = scope
            try:
                await wake.wait()  # (a checkpoint even when already set)
            finally:
                self._park_scope = None
        return True

    def _on_wake(self) -> None:
        self._wake.set()
        if self._parked_on_driver:
            self.driver.wake_parked()  # (nothing when this agent is the caller: it is not parked)
            return
        scope = self._park_scope
        if scope is not None:
            scope.cancel()
