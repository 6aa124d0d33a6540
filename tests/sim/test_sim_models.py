"""The simulator's models of clocks, services and client sessions (``tests/support/sim_clock.py``,
``sim_service.py``, ``sim_sessions.py``, the last around the real session manager): each
invariant they check holds on the seed sweep's fault mix, and each finds the bug it is there for
when a test-only subclass puts it in."""

from __future__ import annotations

from dataclasses import replace

from cluster_node.consensus.sessions import ClusterSessions
from tests.support.sim import MS, S, Simulation, random_config
from tests.support.sim_clock import SimClocks
from tests.support.sim_service import MessageKey, SimServices
from tests.support.sim_sessions import SessionClients

SEEDS = range(30)


def _config(seed: int, **overrides):
    return replace(random_config(seed), sessions=True, clock_skew_ns=2 * S, **overrides)


def _violations(make=Simulation, seeds=SEEDS, **overrides) -> list[str]:
    found: list[str] = []
    for seed in seeds:
        found += make(seed, _config(seed, **overrides)).run().violations
    return found


def test_the_models_keep_every_invariant_and_do_something() -> None:
    opened = timed_out = rolled_back = challenged = steps = applied = 0
    for seed in SEEDS:
        sim = Simulation(seed, _config(seed))
        result = sim.run()
        assert not result.violations, result.violations[0]
        opened += sim.sessions.opened
        timed_out += sim.sessions.timed_out
        rolled_back += sim.sessions.rolled_back
        challenged += sim.sessions.challenged
        steps += sim.clocks.steps
        applied += sum(len(m.service.applied) for m in sim.members)
    assert opened and timed_out and rolled_back and challenged and steps and applied


class _WallClockOnly:
    """Cluster time without ClusterClock's floor: the wall clock as it is."""

    def __init__(self, wall) -> None:
        self._wall = wall

    def now(self) -> int:
        return self._wall()

    def observe(self, timestamp: int) -> None:
        pass


class _RawClocks(SimClocks):
    clock_factory = _WallClockOnly


class _RawClockSimulation(Simulation):
    clock_model = _RawClocks


def test_cluster_time_that_follows_a_stepped_wall_clock_back_is_caught() -> None:
    found = [v for v in _violations(_RawClockSimulation) if "cluster time goes backwards" in v]
    assert found, "a leader stamping its raw wall clock went unnoticed"


class _OneServiceSkipsTermEvents(SimServices):
    """Member 0's service ignores NewLeadershipTermEvents: not the others' state machine."""

    def apply(self, m, svc, start, end, key):
        if m.member_id == 0 and isinstance(key, tuple) and key[0] == "nlt":
            svc.position = end
            svc.unverified.append((end, svc.state))
            return
        super().apply(m, svc, start, end, key)


class _DivergentServiceSimulation(Simulation):
    service_model = _OneServiceSkipsTermEvents


def test_a_service_state_that_differs_between_members_is_caught() -> None:
    found = [
        v
        for v in _violations(_DivergentServiceSimulation, seeds=range(3))
        if "service state at" in v and "differs" in v
    ]
    assert found, "member 0's divergent service went unnoticed"


class _ManagerWithoutSessionCheck(ClusterSessions):
    """A leader's session manager that lets through a message of any session it ever opened."""

    def on_ingress(self, leadership_term_id, cluster_session_id, current_term_id, now_ns, image_session_id, **kw):
        if cluster_session_id not in self.sessions and 0 < cluster_session_id < self.next_session_id:
            return True
        return super().on_ingress(
            leadership_term_id, cluster_session_id, current_term_id, now_ns, image_session_id, **kw
        )


class _LeaderWithoutSessionCheck(SessionClients):
    manager_class = _ManagerWithoutSessionCheck


class _NoSessionCheckSimulation(Simulation):
    session_model = _LeaderWithoutSessionCheck


def test_a_message_appended_for_a_closed_session_is_caught() -> None:
    found = [v for v in _violations(_NoSessionCheckSimulation, session_timeout_ns=300 * MS) if "which is closed" in v]
    assert found, "messages of timed-out sessions went unnoticed"


class _LeaderAppendingTwice(SessionClients):
    """A leader that appends a client's message twice (a retry that forgot the first went out)."""

    def _on_message(self, c, member_id, sid, term, payload, since):
        super()._on_message(c, member_id, sid, term, payload, since)
        m = self.sim.members[member_id]
        if m.alive and m.core.is_leader and sid in m.sessions.sessions and self.rng.random() < 0.05:
            if m.core.on_ingress(sid, payload, self.sim.now_ns):
                self.sim._run_core(m)


class _TwiceSimulation(Simulation):
    session_model = _LeaderAppendingTwice


def test_a_message_applied_twice_is_caught() -> None:
    found = [v for v in _violations(_TwiceSimulation, seeds=range(5)) if "a second time" in v]
    assert found, "a message applied twice went unnoticed"


class _ManagerWithoutRollback(ClusterSessions):
    """A session manager that keeps what its uncommitted tail did when a new leadership is prepared."""

    def rollback(self, commit_position, *, leadership_term_id=-1, now_ns=0):
        self.closed_uncommitted.clear()


class _NoRollbackSimulation(Simulation):
    session_model = type("_NoRollbackSessions", (SessionClients,), {"manager_class": _ManagerWithoutRollback})


def test_session_state_a_new_leadership_does_not_roll_back_is_caught() -> None:
    found = [v for v in _violations(_NoRollbackSimulation, session_timeout_ns=300 * MS) if "open sessions" in v]
    assert found, "a member keeping sessions of a lost log tail went unnoticed"


class _ManagerReusingIds(ClusterSessions):
    """A session manager that does not learn the ids in use from the log it applies."""

    def on_log_session_open(self, event, log_position):
        next_id = self.next_session_id
        super().on_log_session_open(event, log_position)
        self.next_session_id = next_id


class _ReusedIdsSimulation(Simulation):
    session_model = type("_ReusedIdsSessions", (SessionClients,), {"manager_class": _ManagerReusingIds})


def test_a_session_id_opened_twice_in_the_committed_log_is_caught() -> None:
    found = [v for v in _violations(_ReusedIdsSimulation, seeds=range(10)) if "an id reused" in v]
    assert found, "a new leader reusing session ids went unnoticed"


class _ServiceDroppingMessages(SimServices):
    """Member 1's service loses every tenth client message (state kept as if applied)."""

    def apply(self, m, svc, start, end, key):
        if m.member_id == 1 and isinstance(key, MessageKey) and key.endswith(b"0"):
            svc.position = end
            svc.unverified.clear()
            return
        super().apply(m, svc, start, end, key)


class _DroppingSimulation(Simulation):
    service_model = _ServiceDroppingMessages


def test_an_acknowledged_message_a_service_never_applied_is_caught() -> None:
    found = [v for v in _violations(_DroppingSimulation, seeds=range(3)) if "is not applied by member 1" in v]
    assert found, "a service that lost acknowledged messages went unnoticed"
