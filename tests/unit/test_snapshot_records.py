"""Snapshot record formats: round trips, restore into the cores, and corrupt input refused."""

import pytest

from cluster_node.codecs import CLIENT_PROTOCOL_VERSION, ClientSession, SessionConnectRequest, compose_semantic_version
from cluster_node.consensus.pending import PendingServiceMessages
from cluster_node.consensus.sessions import AppendSessionEvent, ClusterSessions
from cluster_node.consensus.snapshot import (
    ServiceSnapshot,
    SnapshotError,
    decode_cm_snapshot,
    decode_service_snapshot,
    encode_cm_snapshot,
    encode_service_snapshot,
    restore_cm_snapshot,
    take_cm_snapshot,
)
from cluster_node.consensus.timers import Timers


def _state():
    sessions = ClusterSessions(member_id=0, ingress_endpoints="0=h:1")
    for i in range(3):
        sessions.on_connect_request(
            SessionConnectRequest(10 + i, 102, CLIENT_PROTOCOL_VERSION, f"aeron:udp?endpoint=h:{i}"),
            is_leader=True,
            leader_member_id=0,
            leadership_term_id=4,
            now_ns=5,
            image_session_id=i,
        )
        for e in sessions.drain_effects():
            if isinstance(e, AppendSessionEvent):
                sessions.on_event_appended(e, 100 * i + 96)  # the agent appended the open
    timers = Timers()
    timers.schedule(7, 1_000)
    timers.schedule(3, 500)
    timers.schedule(9, 500)
    pending = PendingServiceMessages()
    pending.enqueue(b"one")
    pending.enqueue(b"two")
    pending.on_log_service_message(pending.pending[0].session_id)
    return sessions, timers, pending


def test_cm_snapshot_round_trip_and_restore():
    sessions, timers, pending = _state()
    snap = take_cm_snapshot(
        4096, 4, sessions, timers, pending, timestamp=77, app_version=compose_semantic_version(0, 0, 1)
    )
    records = encode_cm_snapshot(snap)
    back = decode_cm_snapshot(records)
    assert back == snap
    assert back.timers == [(3, 500), (9, 500), (7, 1_000)]
    assert [p for _, p in back.pending] == [b"two"]
    s2, t2, p2 = ClusterSessions(member_id=1, ingress_endpoints="x"), Timers(), PendingServiceMessages()
    restore_cm_snapshot(back, s2, t2, p2)
    assert sorted(s2.sessions) == sorted(sessions.sessions)
    assert s2.next_session_id == sessions.next_session_id
    assert t2.snapshot() == timers.snapshot()
    assert [(p.session_id, p.payload) for p in p2.pending] == [(p.session_id, p.payload) for p in pending.pending]
    assert p2.next_service_session_id == pending.next_service_session_id
    assert p2.log_service_session_id == pending.log_service_session_id
    # The restored tracker gives the next offer the same id as the original would.
    assert p2.enqueue(b"three") == pending.enqueue(b"three")


def test_cm_snapshot_refuses_truncated_or_foreign_records():
    sessions, timers, pending = _state()
    records = encode_cm_snapshot(take_cm_snapshot(64, 1, sessions, timers, pending))
    with pytest.raises(SnapshotError, match="expected SnapshotMarker END"):
        decode_cm_snapshot(records[:-1])
    with pytest.raises(SnapshotError):
        decode_cm_snapshot([b"\xff\x00garbage"] + records[1:])
    svc = encode_service_snapshot(ServiceSnapshot(64, 1))
    with pytest.raises(SnapshotError, match="marker type 2, expected 1|records"):
        decode_cm_snapshot(svc + svc)


def test_service_snapshot_keeps_user_records_that_look_like_markers():
    marker_like = encode_service_snapshot(ServiceSnapshot(1, 1))[0]
    snap = ServiceSnapshot(
        8192,
        3,
        sessions=[ClientSession(5, 102, "aeron:udp?endpoint=h:1")],
        user_records=[b"", marker_like, b"x" * 10_000],
    )
    back = decode_service_snapshot(encode_service_snapshot(snap))
    assert back == snap
    records = encode_service_snapshot(snap)
    with pytest.raises(SnapshotError, match="no SECTION"):
        decode_service_snapshot([records[0], records[1], records[-1]])
