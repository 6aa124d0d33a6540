"""The service container on its own thread, driven by a stand-in consensus module over real IPC
(shared-memory log buffers and doorbells in a driver directory)."""

from __future__ import annotations

import threading
import time

import trio

from cluster_node.codecs import (
    CONSENSUS_TO_SERVICE_CODEC,
    LOG_CODEC,
    SERVICE_TO_CONSENSUS_CODEC,
    JoinLog,
    RequestServiceAck,
    ServiceAck,
    ServiceTerminationPosition,
    SessionOpenEvent,
    encode_session_message,
)
from cluster_node.media.channel import parse
from cluster_node.media.doorbell import ring
from cluster_node.media.ipc import IpcTransport
from cluster_node.service.api import ClusteredService, Role
from cluster_node.service.container import (
    CONSENSUS_TO_SERVICE_STREAM_ID,
    CONTROL_CHANNEL,
    SERVICE_TO_CONSENSUS_STREAM_ID,
    ServiceContainer,
)


class Counting(ClusteredService):
    def __init__(self) -> None:
        self.messages: list[tuple[int | None, bytes]] = []
        self.lock = threading.Lock()
        self.terminated_at = None

    def on_session_message(self, session, timestamp, payload):
        with self.lock:
            self.messages.append((session.id if session else None, bytes(payload)))

    def on_terminate(self, cluster):
        self.terminated_at = cluster.log_position

    def count(self) -> int:
        with self.lock:
            return len(self.messages)


async def _until(cond, timeout=10.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.002)


async def test_service_reads_only_the_committed_log_and_acks(tmp_path):
    cm = IpcTransport(tmp_path)
    from_service = cm.add_subscription(parse(CONTROL_CHANNEL), SERVICE_TO_CONSENSUS_STREAM_ID)
    to_service = cm.add_publication(parse(CONTROL_CHANNEL), CONSENSUS_TO_SERVICE_STREAM_ID)
    log_pub = cm.add_publication(parse("aeron:ipc?term-length=64k"), 100)
    commit = [0]
    service = Counting()
    container = ServiceContainer(
        service,
        member_id=1,
        driver_dir=tmp_path,
        commit_position=lambda: commit[0],
        role=lambda: Role.FOLLOWER,
        idle_timeout_s=5.0,
    )
    container.start()
    acks: list = []

    def on_msg(buf, offset, length, header):
        acks.append(SERVICE_TO_CONSENSUS_CODEC.decode(bytes(buf[offset : offset + length])))

    def pump() -> bool:
        cm.do_work(time.monotonic_ns())
        from_service.poll(on_msg, 10)
        return True

    try:
        # The service starts and acks position 0 once its publication finds our subscription.
        await _until(lambda: pump() and any(isinstance(a, ServiceAck) for a in acks))
        assert acks[0].log_position == 0 and acks[0].service_id == 0
        # It joins the log once its subscription is attached to our publication.
        await _until(lambda: pump() and to_service.is_connected)
        join = JoinLog(0, -1, 1, log_pub.session_id, 100, False, Role.FOLLOWER, "aeron:ipc")
        assert to_service.offer(CONSENSUS_TO_SERVICE_CODEC.encode(join)) > 0
        await _until(lambda: pump() and log_pub.is_connected)
        log_pub.offer(LOG_CODEC.encode(SessionOpenEvent(0, 1, 7, 10, 102, "aeron:udp?endpoint=127.0.0.1:1")))
        positions = [log_pub.offer(encode_session_message(0, 7, 11 + i, b"m%d" % i)) for i in range(100)]
        assert all(p > 0 for p in positions)
        # Nothing committed: nothing applied. A requested ack comes back from a pass of the
        # service's loop that polled the log after the entries were there.
        acks_before = len(acks)
        to_service.offer(CONSENSUS_TO_SERVICE_CODEC.encode(RequestServiceAck(0)))
        await _until(lambda: pump() and len(acks) > acks_before)
        assert service.count() == 0 and container.agent.log_position == 0
        commit[0] = positions[49]
        ring(container.commit_doorbell.name)
        await _until(lambda: service.count() == 50)
        commit[0] = positions[-1]
        ring(container.commit_doorbell.name)
        await _until(lambda: service.count() == 100)
        assert service.messages[0] == (7, b"m0") and service.messages[-1] == (7, b"m99")
        # Termination at the end of the log: on_terminate, a final ack, the thread ends.
        to_service.offer(CONSENSUS_TO_SERVICE_CODEC.encode(ServiceTerminationPosition(positions[-1])))
        await _until(lambda: pump() and not container.is_alive)
        assert service.terminated_at == positions[-1]
        pump()
        assert isinstance(acks[-1], ServiceAck) and acks[-1].log_position == positions[-1]
        assert container.error is None
    finally:
        container.stop()
        container.join(5)
        cm.close()


def test_ipc_subscription_with_a_session_id_joins_only_that_publication(tmp_path):
    t = IpcTransport(tmp_path)
    a = t.add_publication(parse("aeron:ipc?session-id=5"), 100)
    b = t.add_publication(parse("aeron:ipc?session-id=6"), 100)
    only_a = t.add_subscription(parse("aeron:ipc?session-id=5"), 100)
    both = t.add_subscription(parse("aeron:ipc"), 100)
    t.do_work(time.monotonic_ns())
    assert [i.session_id for i in only_a.images] == [5]
    assert sorted(i.session_id for i in both.images) == [5, 6]
    a.close(), b.close(), t.close()
