"""Timers and pending service messages held by the consensus module (cores)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.consensus.pending import FIRST_SERVICE_SESSION_ID, PendingServiceMessages
from cluster_node.consensus.timers import Timers


def test_timers_fire_in_deadline_then_id_order_and_reschedule_replaces():
    t = Timers()
    t.schedule(3, 100)
    t.schedule(1, 100)
    t.schedule(2, 50)
    t.schedule(3, 40)  # reschedule
    assert t.expired(99) == [(3, 40), (2, 50)]
    assert t.expired(100) == [(3, 40), (2, 50), (1, 100)]
    assert t.next_deadline() == 40 and len(t) == 3
    t.on_fired(3, 640)
    assert t.expired(100) == [(2, 50), (1, 100)]
    assert t.cancel(2) and not t.cancel(2)
    assert t.snapshot() == [(1, 100)]


def test_a_request_made_before_an_applied_timer_event_is_superseded_by_it():
    t = Timers()
    t.on_log_timer_event(9, 500)  # the leader fired before our service's request reached us
    assert not t.schedule(9, 10, log_position=400)  # made before the event: in log order, undone by it
    assert len(t) == 0 and t.superseded == 1
    assert t.schedule(9, 20, log_position=500)  # the re-arm inside on_timer_event: after it
    assert t.snapshot() == [(9, 20)]
    t.on_log_timer_event(9, 900)
    assert len(t) == 0
    assert not t.event_positions or t.event_positions[9] == 900


def test_a_re_arm_that_arrives_before_its_event_is_applied_is_not_lost():
    """What the issue saw on followers: the service's re-arm reached the module before the event
    that ran it; that order cannot occur once the service is bounded by the log adapter, and a
    request made at the event's own position is after it in log order."""
    t = Timers()
    t.schedule(7, 100, log_position=64)
    t.on_log_timer_event(7, 128)
    assert t.schedule(7, 150, log_position=128)
    assert t.snapshot() == [(7, 150)]


def test_superseded_requests_apply_again_when_the_event_is_rolled_back():
    t = Timers()
    t.schedule(1, 10, log_position=64)
    t.on_fired(1, 320)  # appended, not committed
    assert not t.schedule(1, 99, log_position=256)  # made before the event: superseded
    t.rollback(commit_position=300)  # the event is gone with the uncommitted tail
    assert t.snapshot() == [(1, 99)]
    assert t.schedule(1, 40, log_position=300)
    assert t.snapshot() == [(1, 40)]


def test_uncommitted_fired_timers_come_back_on_rollback():
    t = Timers()
    t.schedule(1, 10)
    t.schedule(2, 20)
    t.on_fired(1, 100)
    t.on_fired(2, 200)
    t.on_commit(150)
    t.rollback(150)
    assert t.snapshot() == [(2, 20)]


def test_pending_leader_appends_in_order_and_forgets_on_commit():
    p = PendingServiceMessages()
    a = p.enqueue(b"a")
    b = p.enqueue(b"b")
    assert a == FIRST_SERVICE_SESSION_ID and b == a + 1
    assert p.to_append() == [(a, b"a"), (b, b"b")]
    p.on_appended(a, 100)
    assert p.to_append() == [(b, b"b")]
    p.on_appended(b, 200)
    p.on_commit(150)
    assert len(p) == 1 and p.log_service_session_id == a


def test_follower_drops_what_the_log_holds_and_stays_in_step():
    p = PendingServiceMessages()
    ids = [p.enqueue(bytes([i])) for i in range(5)]
    p.on_log_service_message(ids[2])
    assert [s for s, _ in p.to_append()] == ids[3:]
    p.on_log_service_message(ids[4] + 2)  # the log is ahead of our service
    assert len(p) == 0
    assert p.enqueue(b"x") == ids[4] + 1 and len(p) == 0  # already in the log: not kept
    assert p.enqueue(b"y") == ids[4] + 2 and len(p) == 0
    assert p.enqueue(b"z") == ids[4] + 3 and len(p) == 1  # new


def test_pending_capacity_is_back_pressure_never_a_refusal():
    """A full queue still takes the message and gives it the next id (a refusal on one member
    only would shift every later id there); has_room tells the owner to stop reading."""
    p = PendingServiceMessages(capacity=2)
    a = p.enqueue(b"1")
    assert p.has_room and p.enqueue(b"2") == a + 1 and not p.has_room
    assert p.enqueue(b"3") == a + 2 and len(p) == 3


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["offer", "append", "commit", "failover"]), max_size=60))
def test_every_service_message_lands_in_the_committed_log_exactly_once(ops):
    # One leader and one follower; on failover they swap and the uncommitted tail is lost.
    members = [PendingServiceMessages(), PendingServiceMessages()]
    leader = 0
    log: list[int] = []  # service session ids in log order
    committed = 0
    offered = 0
    for op in ops:
        if op == "offer":
            for m in members:
                m.enqueue(b"%d" % offered)
            offered += 1
        elif op == "append":
            for sid, _ in members[leader].to_append():
                log.append(sid)
                members[leader].on_appended(sid, len(log))
        elif op == "commit":
            committed = len(log)
            members[leader].on_commit(committed)
            follower = members[1 - leader]
            for sid in log[:committed]:
                follower.on_log_service_message(sid)
        else:
            del log[committed:]
            leader = 1 - leader
            members[leader].rollback(committed)
            members[1 - leader].become_follower()
    # Drain: append and commit everything on the final leader.
    for sid, _ in members[leader].to_append(limit=10**6):
        log.append(sid)
        members[leader].on_appended(sid, len(log))
    assert sorted(log) == log and len(set(log)) == len(log)
    assert len(log) == offered


def test_restart_replay_offers_again_what_the_log_holds():
    # The consensus module applies the replayed log before or after the service, replaying the
    # same log, offers its messages again: either way nothing is appended twice.
    for log_first in (True, False):
        p = PendingServiceMessages()
        first = FIRST_SERVICE_SESSION_ID
        in_log = [first, first + 1]
        if log_first:
            for sid in in_log:
                p.on_log_service_message(sid)
        offered = [p.enqueue(b"a"), p.enqueue(b"b")]
        if not log_first:
            for sid in in_log:
                p.on_log_service_message(sid)
        assert offered == in_log and len(p) == 0 and p.to_append() == []
        assert p.enqueue(b"new") == first + 2 and p.to_append() == [(first + 2, b"new")]
