"""The example services (echo, kv) driven by a fake Cluster handle: no container, no network."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.service.api import (
    MOCKED_OFFER,
    BytesSnapshotReader,
    BytesSnapshotWriter,
    ClientSession,
    Cluster,
    ClusteredService,
    ClusterTimeUnit,
    Role,
    ServiceLoadError,
    load_service,
)
from cluster_node.service.examples.echo import EchoService
from cluster_node.service.examples.kv import (
    MAX_KEY_LENGTH,
    Append,
    Delete,
    Get,
    KeyValueService,
    Put,
    Reply,
    Status,
    decode_reply,
    encode_request,
)


class FakeCluster:
    """A Cluster handle that records what the service asks for."""

    def __init__(self, member_id: int = 0, role: Role = Role.LEADER) -> None:
        self.member_id = member_id
        self.role = role
        self.log_position = 0
        self.leadership_term_id = 0
        self.time = 0
        self.time_unit = ClusterTimeUnit.MILLIS
        self.sessions: dict[int, ClientSession] = {}
        self.egress: list[tuple[int, bytes]] = []
        self.offered: list[bytes] = []
        self.timers: dict[int, int] = {}
        self.closed: list[int] = []
        self.egress_result = 1000

    @property
    def client_sessions(self):
        return self.sessions.values()

    def get_client_session(self, cluster_session_id: int):
        return self.sessions.get(cluster_session_id)

    def close_client_session(self, cluster_session_id: int) -> bool:
        self.closed.append(cluster_session_id)
        return True

    def offer(self, payload) -> int:
        self.offered.append(bytes(payload))
        return 1

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        self.timers[correlation_id] = deadline
        return True

    def cancel_timer(self, correlation_id: int) -> bool:
        return self.timers.pop(correlation_id, None) is not None

    def open_session(self, cluster_session_id: int) -> ClientSession:
        def offer(session: ClientSession, payload) -> int:
            if self.role != Role.LEADER:
                return MOCKED_OFFER
            if self.egress_result > 0:
                self.egress.append((session.id, bytes(payload)))
            return self.egress_result

        s = ClientSession(cluster_session_id, 102, "aeron:udp?endpoint=127.0.0.1:9", b"", offer)
        self.sessions[cluster_session_id] = s
        return s


def _kv(requests, role=Role.LEADER):
    cluster = FakeCluster(role=role)
    svc = KeyValueService()
    svc.on_start(cluster, None)
    session = cluster.open_session(7)
    svc.on_session_open(session, 0)
    for i, r in enumerate(requests):
        cluster.time = i
        svc.on_session_message(session, i, memoryview(encode_request(r)))
    return svc, cluster


def _replies(cluster: FakeCluster) -> list[Reply]:
    return [decode_reply(p) for _sid, p in cluster.egress]


def test_fake_cluster_satisfies_the_protocol() -> None:
    assert isinstance(FakeCluster(), Cluster)
    assert isinstance(BytesSnapshotWriter(), object)


def test_echo_replies_to_the_sender_and_counts_service_messages() -> None:
    cluster = FakeCluster()
    svc = EchoService()
    svc.on_start(cluster, None)
    s = cluster.open_session(1)
    svc.on_session_message(s, 0, memoryview(b"hello"))
    svc.on_session_message(None, 1, b"from a service")
    assert cluster.egress == [(1, b"hello")]
    assert (svc.messages, svc.service_messages) == (1, 1)
    cluster.egress_result = -2  # back-pressured
    svc.on_session_message(s, 2, b"x")
    assert svc.echo_failures == 1
    w = BytesSnapshotWriter()
    svc.on_take_snapshot(w)
    again = EchoService()
    again.on_start(FakeCluster(), BytesSnapshotReader(w.records))
    assert (again.messages, again.service_messages) == (2, 1)


def test_echo_on_a_follower_sends_nothing() -> None:
    cluster = FakeCluster(role=Role.FOLLOWER)
    svc = EchoService()
    svc.on_start(cluster, None)
    svc.on_session_message(cluster.open_session(1), 0, b"hi")
    assert cluster.egress == [] and svc.echo_failures == 0


def test_kv_put_get_delete_append() -> None:
    svc, cluster = _kv(
        [
            Put(1, "a", b"1"),
            Get(2, "a"),
            Get(3, "missing"),
            Append(4, "log", b"x"),
            Append(5, "log", b"yz"),
            Delete(6, "a"),
            Delete(7, "a"),
            Get(8, "a"),
        ]
    )
    got = _replies(cluster)
    assert [r.request_id for r in got] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert got[0].status == Status.OK
    assert got[1] == Reply(2, Status.OK, b"1")
    assert got[2].status == Status.NOT_FOUND
    assert int.from_bytes(got[4].value, "little") == 3
    assert got[5].status == Status.OK and got[6].status == Status.NOT_FOUND
    assert got[7].status == Status.NOT_FOUND
    assert svc.data == {"log": b"xyz"}
    assert all(sid == 7 for sid, _ in cluster.egress)


def test_kv_bad_requests_change_nothing_and_are_answered() -> None:
    cluster = FakeCluster()
    svc = KeyValueService()
    svc.on_start(cluster, None)
    s = cluster.open_session(1)
    for payload in [
        b"",
        b"\xc1",
        msgspec.msgpack.encode([9, 5, "k"]),
        msgspec.msgpack.encode([1, 6, "k" * (MAX_KEY_LENGTH + 1), b"v"]),
        msgspec.msgpack.encode([1, 7, "k"]),
        bytes(range(256)),
    ]:
        svc.on_session_message(s, 0, payload)
    assert svc.data == {}
    assert svc.bad_requests == 6
    replies = _replies(cluster)
    assert all(r.status == Status.BAD_REQUEST for r in replies)
    assert [r.request_id for r in replies][2:5] == [5, 6, 7]


def test_kv_service_messages_apply_without_reply() -> None:
    cluster = FakeCluster()
    svc = KeyValueService()
    svc.on_start(cluster, None)
    svc.on_session_message(None, 0, encode_request(Put(1, "k", b"v")))
    assert svc.data == {"k": b"v"} and cluster.egress == []


def test_kv_follower_applies_but_does_not_reply() -> None:
    leader, lc = _kv([Put(1, "a", b"1"), Append(2, "b", b"2")], role=Role.LEADER)
    follower, fc = _kv([Put(1, "a", b"1"), Append(2, "b", b"2")], role=Role.FOLLOWER)
    assert leader.data == follower.data
    assert len(lc.egress) == 2 and fc.egress == []


def test_kv_snapshot_round_trip_is_canonical() -> None:
    requests = [Put(i, f"key-{i % 2500}", bytes([i % 256]) * (i % 7)) for i in range(5000)]
    svc, _ = _kv(requests)
    w = BytesSnapshotWriter()
    svc.on_take_snapshot(w)
    assert len(w.records) == 1 + 3  # header + 2500 entries in batches of 1000
    restored = KeyValueService()
    restored.on_start(FakeCluster(role=Role.FOLLOWER), BytesSnapshotReader(w.records))
    assert restored.data == svc.data
    w2 = BytesSnapshotWriter()
    restored.on_take_snapshot(w2)
    assert w2.records == w.records


def test_kv_damaged_snapshot_is_refused() -> None:
    svc, _ = _kv([Put(1, "a", b"1"), Put(2, "b", b"2")])
    w = BytesSnapshotWriter()
    svc.on_take_snapshot(w)
    with pytest.raises(ValueError, match="header says 2"):
        KeyValueService().on_start(FakeCluster(), BytesSnapshotReader(w.records[:1]))
    with pytest.raises(ValueError, match="empty"):
        KeyValueService().on_start(FakeCluster(), BytesSnapshotReader([]))


_ops = st.one_of(
    st.builds(Put, st.integers(0, 100), st.sampled_from("abcde"), st.binary(max_size=8)),
    st.builds(Get, st.integers(0, 100), st.sampled_from("abcde")),
    st.builds(Delete, st.integers(0, 100), st.sampled_from("abcde")),
    st.builds(Append, st.integers(0, 100), st.sampled_from("abcde"), st.binary(max_size=8)),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_ops, max_size=60), st.integers(0, 60))
def test_kv_matches_a_dict_and_snapshot_anywhere_gives_the_same_end_state(ops, cut) -> None:
    model: dict[str, bytes] = {}
    for op in ops:
        if isinstance(op, Put):
            model[op.key] = op.value
        elif isinstance(op, Delete):
            model.pop(op.key, None)
        elif isinstance(op, Append):
            model[op.key] = model.get(op.key, b"") + op.value
    full, _ = _kv(ops)
    assert full.data == model
    cut = min(cut, len(ops))
    first, _ = _kv(ops[:cut])
    w = BytesSnapshotWriter()
    first.on_take_snapshot(w)
    second = KeyValueService()
    cluster = FakeCluster()
    second.on_start(cluster, BytesSnapshotReader(w.records))
    s = cluster.open_session(1)
    for op in ops[cut:]:
        second.on_session_message(s, 0, encode_request(op))
    assert second.data == model


def test_base_class_callbacks_are_no_ops() -> None:
    svc = ClusteredService()
    c = FakeCluster()
    svc.on_start(c, None)
    s = c.open_session(1)
    svc.on_session_open(s, 0)
    svc.on_session_message(s, 0, b"x")
    svc.on_timer_event(1, 0)
    svc.on_take_snapshot(BytesSnapshotWriter())
    svc.on_role_change(Role.FOLLOWER)
    svc.on_new_leadership_term_event(1, 0, 0, 0, 0, 1, ClusterTimeUnit.MILLIS, 1)
    svc.on_terminate(c)
    assert svc.do_background_work(0) == 0
    assert c.egress == []
    assert ClientSession(3, 102, "ch").offer(b"x") == MOCKED_OFFER


def test_load_service() -> None:
    assert isinstance(load_service("kv"), KeyValueService)
    assert isinstance(load_service("echo"), EchoService)
    assert isinstance(load_service("cluster_node.service.examples.echo:EchoService"), EchoService)
    for bad, msg in [
        ("nope", "use one of"),
        ("no.such.module:X", "cannot import"),
        ("cluster_node.service.examples.echo:Nope", "has no Nope"),
        ("cluster_node.service.api:Role", "failed|not a ClusteredService"),
    ]:
        with pytest.raises(ServiceLoadError, match=msg):
            load_service(bad)
