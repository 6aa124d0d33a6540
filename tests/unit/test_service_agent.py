"""ServiceAgent (cluster_node.service.agent): the committed log applied to a service, and what
the service sends back, with no container and no transport."""

from __future__ import annotations

import pytest

from cluster_node.codecs import (
    CONSENSUS_TO_SERVICE_CODEC,
    LOG_CODEC,
    SERVICE_TO_CONSENSUS_CODEC,
    CancelTimer,
    CloseReason,
    CloseSession,
    ClusterTimeUnit,
    JoinLog,
    NewLeadershipTermEvent,
    RequestServiceAck,
    ScheduleTimer,
    ServiceAck,
    ServiceTerminationPosition,
    SessionCloseEvent,
    SessionOpenEvent,
    TimerEvent,
    decode_session_message,
    encode_session_message,
)
from cluster_node.service.agent import ServiceAgent, ServiceStopping
from cluster_node.service.api import MOCKED_OFFER, ClusteredService, Role


class Recorder(ClusteredService):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_start(self, cluster, snapshot):
        self.calls.append(("start", snapshot))

    def on_session_open(self, session, timestamp):
        self.calls.append(("open", session.id, timestamp))

    def on_session_close(self, session, timestamp, close_reason):
        self.calls.append(("close", session.id, timestamp, close_reason))

    def on_session_message(self, session, timestamp, payload):
        self.calls.append(("message", session.id if session else None, timestamp, bytes(payload)))
        if session is not None:
            session.offer(b"re:" + bytes(payload))

    def on_timer_event(self, correlation_id, timestamp):
        self.calls.append(("timer", correlation_id, timestamp))

    def on_role_change(self, new_role):
        self.calls.append(("role", new_role))

    def on_terminate(self, cluster):
        self.calls.append(("terminate", cluster.log_position))

    def on_new_leadership_term_event(
        self,
        leadership_term_id,
        log_position,
        timestamp,
        term_base_log_position,
        leader_member_id,
        log_session_id,
        time_unit,
        app_version,
    ):
        self.calls.append(("term", leadership_term_id, leader_member_id))


class Header:
    def __init__(self, position: int) -> None:
        self.position = position


class Rig:
    def __init__(self) -> None:
        self.service = Recorder()
        self.to_cm: list[bytes] = []
        self.egress: list[tuple[int, bytes]] = []
        self.accept = True
        self.agent = ServiceAgent(
            self.service,
            member_id=2,
            service_id=0,
            send_to_consensus=self._send,
            egress_offer=lambda s, p: self.egress.append((s.id, bytes(p))) or 64,
        )
        self.position = 0

    def _send(self, data: bytes) -> int:
        if not self.accept:
            return -2
        self.to_cm.append(data)
        return 1

    def log(self, data: bytes) -> None:
        self.position += (len(data) + 32 + 31) & ~31
        framed = b"\0" * 32 + data
        self.agent.on_log_fragment(memoryview(framed), 32, len(data), Header(self.position))

    def sent(self):
        return [SERVICE_TO_CONSENSUS_CODEC.decode(d) for d in self.to_cm]


def test_start_acks_the_consensus_module():
    rig = Rig()
    rig.accept = False  # the consensus module's subscription is not there yet
    rig.agent.start(None, log_position=0)
    rig.agent.check_positions()
    assert rig.service.calls == [("start", None), ("role", Role.FOLLOWER)] and rig.to_cm == []
    rig.accept = True
    rig.agent.check_positions()
    rig.agent.check_positions()
    assert rig.sent() == [ServiceAck(0, 0, 0, -1, 0)]
    assert rig.agent.ack_id == 1


def test_log_entries_reach_the_service_in_order_with_log_time():
    rig = Rig()
    rig.agent.start(None)
    rig.agent.check_positions()
    rig.log(LOG_CODEC.encode(NewLeadershipTermEvent(3, 0, 1000, 0, 1, 77, ClusterTimeUnit.MILLIS, 1)))
    rig.log(LOG_CODEC.encode(SessionOpenEvent(3, 9, 5, 1001, 102, "aeron:udp?endpoint=127.0.0.1:9999")))
    rig.log(encode_session_message(3, 5, 1002, b"hello"))
    rig.log(encode_session_message(3, -7, 1003, b"from a service"))
    rig.log(LOG_CODEC.encode(TimerEvent(3, 42, 1004)))
    rig.log(LOG_CODEC.encode(SessionCloseEvent(3, 5, 1005, CloseReason.TIMEOUT)))
    assert rig.service.calls[2:] == [
        ("term", 3, 1),
        ("open", 5, 1001),
        ("message", 5, 1002, b"hello"),
        ("message", None, 1003, b"from a service"),
        ("timer", 42, 1004),
        ("close", 5, 1005, CloseReason.TIMEOUT),
    ]
    assert rig.agent.time == 1005 and rig.agent.leadership_term_id == 3
    assert rig.agent.log_position == rig.position
    assert len(rig.agent.client_sessions) == 0


def test_replies_go_out_only_on_the_leader():
    rig = Rig()
    rig.agent.start(None)
    rig.agent.check_positions()
    rig.log(LOG_CODEC.encode(SessionOpenEvent(0, 1, 5, 1, 102, "aeron:udp?endpoint=127.0.0.1:9999")))
    rig.log(encode_session_message(0, 5, 2, b"a"))
    assert rig.egress == []  # follower: mocked
    assert rig.agent.get_client_session(5).offer(b"x") == MOCKED_OFFER
    rig.agent.on_consensus_message(
        CONSENSUS_TO_SERVICE_CODEC.encode(JoinLog(0, -1, 2, 77, 100, False, Role.LEADER, "aeron:ipc"))
    )
    assert rig.agent.role == Role.LEADER and ("role", Role.LEADER) in rig.service.calls
    rig.log(encode_session_message(0, 5, 3, b"b"))
    assert rig.egress == [(5, b"re:b")]


def test_cluster_handle_sends_to_the_consensus_module():
    rig = Rig()
    rig.agent.start(None)
    rig.agent.check_positions()
    rig.log(LOG_CODEC.encode(SessionOpenEvent(0, 1, 5, 1, 102, "aeron:udp?endpoint=127.0.0.1:9999")))
    rig.to_cm.clear()
    assert rig.agent.schedule_timer(7, 5000) and rig.agent.cancel_timer(7)
    assert rig.agent.close_client_session(5) and rig.agent.get_client_session(5).is_closing
    assert rig.agent.offer(b"svc") > 0
    sent = rig.sent()
    position = rig.agent.log_position
    assert sent[:3] == [ScheduleTimer(7, 5000, position), CancelTimer(7, position), CloseSession(5)]
    hdr, payload = sent[3]
    assert hdr.cluster_session_id == 0 and payload == b"svc"


def test_a_request_the_stream_refuses_waits_for_room_and_is_never_lost():
    """Back-pressure on the stream to the consensus module: offer, schedule_timer and
    cancel_timer wait until it is taken (the same message gets the same id on every member)."""
    rig = Rig()
    rig.agent.start(None)
    refusals = []

    def send(data: bytes) -> int:
        if len(refusals) < 5:
            refusals.append(data)
            return -2  # BACK_PRESSURED
        rig.to_cm.append(data)
        return 1

    rig.agent._send = send
    assert rig.agent.offer(b"one") > 0 and rig.agent.schedule_timer(8, 1)
    assert len(refusals) == 5 and rig.agent.offer_waits == 1
    assert len(rig.sent()) == 2 and rig.sent()[1] == ScheduleTimer(8, 1, rig.agent.log_position)


def test_a_request_waiting_for_room_ends_the_thread_when_the_node_stops():
    stopping = []
    rig = Rig()
    rig.agent._stopping = lambda: bool(stopping)
    rig.agent.start(None)
    rig.accept = False
    stopping.append(True)
    with pytest.raises(ServiceStopping):
        rig.agent.offer(b"lost with the process")


def test_close_client_session_of_an_unknown_or_closed_session_is_a_no_op():
    rig = Rig()
    rig.agent.start(None)
    rig.to_cm.clear()
    assert rig.agent.close_client_session(12345) is False and rig.to_cm == []


def test_time_unit_is_nanos_from_on_start_and_the_initial_role_is_told():
    seen = []

    class Svc(ClusteredService):
        def on_start(self, cluster, snapshot):
            seen.append(("unit", cluster.time_unit))

        def on_role_change(self, new_role):
            seen.append(("role", new_role))

    agent = ServiceAgent(Svc(), member_id=0, send_to_consensus=lambda d: 1)
    agent.start(None, role=Role.LEADER)
    assert seen == [("unit", ClusterTimeUnit.NANOS), ("role", Role.LEADER)]


def test_requested_ack_and_termination_wait_for_the_position():
    rig = Rig()
    rig.agent.start(None)
    rig.agent.check_positions()
    rig.to_cm.clear()
    rig.log(encode_session_message(0, -1, 1, b"x" * 10))  # position 96
    rig.agent.on_consensus_message(CONSENSUS_TO_SERVICE_CODEC.encode(RequestServiceAck(192)))
    rig.agent.on_consensus_message(CONSENSUS_TO_SERVICE_CODEC.encode(ServiceTerminationPosition(192)))
    rig.agent.check_positions()
    assert rig.to_cm == [] and not rig.agent.terminated
    rig.log(encode_session_message(0, -1, 2, b"y" * 10))  # position 192
    rig.agent.check_positions()
    acks = rig.sent()
    assert [a.log_position for a in acks] == [192, 192] and [a.ack_id for a in acks] == [1, 2]
    assert rig.agent.terminated and ("terminate", 192) in rig.service.calls


def test_malformed_log_entries_and_consensus_messages_are_counted_not_fatal():
    rig = Rig()
    errors: list[str] = []
    rig.agent._on_error = errors.append
    rig.agent.start(None)
    rig.agent.check_positions()
    rig.log(b"\x95\x7f\x00")
    rig.agent.on_consensus_message(b"\x01garbage")
    rig.log(encode_session_message(0, -1, 2, b"ok"))
    assert rig.agent.malformed_entries == 2 and len(errors) == 2
    assert rig.service.calls[-1] == ("message", None, 2, b"ok")
    hdr, _ = decode_session_message(encode_session_message(0, -1, 2, b"ok"))
    assert hdr.timestamp == 2


def test_malformed_session_messages_in_the_log_are_counted_and_never_applied():
    """The hot path reads a session message's header in place; what it refuses (short, wrong
    schema, reserved bytes set) is reported by decode_session_message, never applied."""
    rig = Rig()
    errors: list[str] = []
    rig.agent._on_error = errors.append
    rig.agent.start(None)
    good = bytearray(encode_session_message(0, 7, 3, b"payload"))
    short = bytes(good[:10])
    wrong_schema = bytearray(good)
    wrong_schema[2] ^= 0xFF
    reserved_set = bytearray(good)
    reserved_set[4] = 1
    calls = len(rig.service.calls)
    for entry in (short, bytes(wrong_schema), bytes(reserved_set)):
        rig.log(entry)
    assert rig.agent.malformed_entries == 3 and len(errors) == 3
    assert all("malformed" in e for e in errors)
    assert len(rig.service.calls) == calls  # nothing reached the service
    rig.log(bytes(good))
    assert rig.service.calls[-1] == ("message", None, 3, b"payload")
