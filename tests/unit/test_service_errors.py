"""Service callback errors and the skip list (cluster_node.service.errors, .skips, the agent's
callback boundary, the container's counting and logging), with no transport."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from cluster_node.codecs import (
    CONSENSUS_TO_SERVICE_CODEC,
    EGRESS_CODEC,
    LOG_CODEC,
    ClusterTimeUnit,
    JoinLog,
    ServiceErrorEvent,
    SessionOpenEvent,
    TimerEvent,
    encode_session_message,
)
from cluster_node.consensus.snapshot import ServiceSnapshot, decode_service_snapshot, encode_service_snapshot
from cluster_node.service.agent import ServiceAgent
from cluster_node.service.api import ClusteredService, Role
from cluster_node.service.container import ServiceContainer
from cluster_node.service.errors import ErrorDeduper, ServiceCallbackFailure, ServiceErrorStop
from cluster_node.service.skips import SKIP_FILE_NAME, SkipListError, add_skip, read_skips, skip_positions


class Counter(ClusteredService):
    """The README's example before input validation: ``int()`` of whatever comes."""

    def __init__(self) -> None:
        self.total = 0
        self.timers = 0

    def on_session_message(self, session, timestamp, payload):
        self.total += int(bytes(payload))
        if session is not None:
            session.offer(str(self.total).encode())

    def on_timer_event(self, correlation_id, timestamp):
        self.timers += 1
        if correlation_id == 13:
            raise RuntimeError("unlucky timer")


class Header:
    def __init__(self, position: int) -> None:
        self.position = position


class Rig:
    def __init__(self, policy: str = "record", skips=(), role: Role = Role.LEADER) -> None:
        self.service = Counter()
        self.replies: list[tuple[int, bytes]] = []
        self.errors_sent: list[tuple[int, bytes]] = []
        self.failures: list[ServiceCallbackFailure] = []
        self.skipped: list[tuple[int, str]] = []
        self.agent = ServiceAgent(
            self.service,
            member_id=0,
            send_to_consensus=lambda data: 1,
            egress_offer=lambda s, p: self.replies.append((s.id, bytes(p))) or 64,
            service_errors=policy,
            on_service_error=self.failures.append,
            egress_send=lambda s, data: self.errors_sent.append((s.id, data)) or 64,
            skip_positions=skips,
            on_skip=lambda p, cb: self.skipped.append((p, cb)),
        )
        self.agent.start(None)
        self.agent.on_consensus_message(
            CONSENSUS_TO_SERVICE_CODEC.encode(JoinLog(0, 2**63 - 1, 1, 7, 100, True, int(role), "aeron:ipc"))
        )
        self.position = 0
        self.log(LOG_CODEC.encode(SessionOpenEvent(1, 5, 42, 10, 102, "aeron:udp?endpoint=h:9", b"")))

    def log(self, data: bytes) -> int:
        self.position += (len(data) + 32 + 31) & ~31
        framed = b"\0" * 32 + data
        self.agent.on_log_fragment(memoryview(framed), 32, len(data), Header(self.position))
        return self.position

    def send(self, payload: bytes) -> int:
        return self.log(encode_session_message(1, 42, 20, payload))


def test_record_catches_counts_and_answers_the_client_with_an_error_event():
    rig = Rig("record")
    rig.send(b"5")
    bad = rig.send(b"abc")
    rig.send(b"7")
    assert rig.service.total == 12  # the cluster went on
    assert rig.replies == [(42, b"5"), (42, b"12")]
    assert rig.agent.service_errors == 1
    [failure] = rig.failures
    assert (failure.callback, failure.log_position, failure.session_id, failure.payload_prefix) == (
        "on_session_message",
        bad,
        42,
        b"abc",
    )
    assert isinstance(failure.error, ValueError)
    [(session_id, data)] = rig.errors_sent
    event = EGRESS_CODEC.decode(data)
    assert session_id == 42 and isinstance(event, ServiceErrorEvent)
    assert (event.cluster_session_id, event.log_position, event.payload_prefix) == (42, bad, b"abc")
    assert event.error.startswith("ValueError: invalid literal for int()")


def test_record_on_a_follower_counts_but_sends_nothing():
    rig = Rig("record", role=Role.FOLLOWER)
    rig.send(b"abc")
    assert rig.agent.service_errors == 1 and len(rig.failures) == 1
    assert rig.errors_sent == []


def test_record_covers_callbacks_without_a_session_and_sends_no_reply_for_them():
    rig = Rig("record")
    rig.log(LOG_CODEC.encode(TimerEvent(1, 13, 30)))
    rig.log(LOG_CODEC.encode(TimerEvent(1, 14, 31)))
    assert rig.service.timers == 2
    assert [f.callback for f in rig.failures] == ["on_timer_event"]
    assert rig.failures[0].session_id is None and rig.errors_sent == []


def test_stop_raises_out_of_the_agent_naming_the_position():
    rig = Rig("stop")
    rig.send(b"5")
    with pytest.raises(ServiceErrorStop) as info:
        rig.send(b"abc")
    failure = info.value.failure
    assert failure.log_position == rig.position and failure.callback == "on_session_message"
    assert f"log position {rig.position}" in str(info.value) and "ValueError" in str(info.value)
    assert "\n" not in str(info.value)
    assert rig.errors_sent == [] and rig.agent.service_errors == 0


def test_a_skipped_position_is_not_given_to_the_service_but_still_moves_the_agent():
    probe = Rig("record")
    probe.send(b"5")
    bad = probe.send(b"abc")
    rig = Rig("stop", skips={bad})
    rig.send(b"5")
    rig.send(b"abc")  # would raise: skipped instead
    rig.send(b"7")
    assert rig.service.total == 12
    assert rig.skipped == [(bad, "on_session_message")]
    assert rig.agent.entries_skipped == 1 and rig.agent.log_position == rig.position


def test_a_skipped_session_open_keeps_the_session_for_later_entries():
    probe = Rig()
    rig = Rig("record", skips={probe.position})  # the SessionOpenEvent's position
    assert rig.skipped == [(probe.position, "on_session_open")]
    rig.send(b"3")
    assert rig.replies == [(42, b"3")]


def test_snapshot_start_merges_its_skips():
    rig = Rig()
    agent = ServiceAgent(Counter(), member_id=0, send_to_consensus=lambda d: 1, skip_positions={96})
    agent.start(None, 64, skipped_positions=[160, 96])
    assert agent.skip_positions == {96, 160}
    assert rig.agent.skip_positions == set()


def test_service_snapshot_keeps_the_skip_list():
    snap = ServiceSnapshot(
        4096, 3, user_records=[b"x"], time_unit=ClusterTimeUnit.MILLIS, skipped_positions=[2048, 1024]
    )
    back = decode_service_snapshot(encode_service_snapshot(snap))
    assert back.skipped_positions == [1024, 2048] and back.user_records == [b"x"]
    plain = decode_service_snapshot(encode_service_snapshot(ServiceSnapshot(64, 1)))
    assert plain.skipped_positions == []


def _failure(message: str, position: int = 64) -> ServiceCallbackFailure:
    return ServiceCallbackFailure("on_session_message", position, 42, b"abc", ValueError(message))


def test_dedup_logs_each_distinct_error_once_and_caps_the_distinct_ones():
    d = ErrorDeduper(max_distinct=2)
    assert d.first(_failure("a")) is True
    assert d.first(_failure("a", 128)) is False
    assert d.first(_failure("b")) is True
    assert d.first(_failure("c")) is None  # the first one too many: say so once
    assert d.first(_failure("d")) is False
    assert d.counts[("on_session_message", "ValueError", "a")] == 2 and d.unlogged == 2


class _Count:
    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int = 1) -> int:
        self.value += n
        return self.value


def test_container_counts_every_failure_and_logs_each_distinct_one_once(tmp_path):
    counter = _Count()
    container = ServiceContainer(
        Counter(), member_id=0, driver_dir=tmp_path, commit_position=lambda: 0, error_counter=counter
    )
    with capture_logs() as logs:
        for position in (64, 128, 192):
            container._on_service_error(_failure("same", position))
        container._on_service_error(_failure("other", 256))
    assert counter.value == 4
    logged = [e for e in logs if e["event"].startswith("service callback raised")]
    assert [(e["log_position"], e["error"]) for e in logged] == [(64, "ValueError: same"), (256, "ValueError: other")]
    assert logged[0]["session"] == 42 and logged[0]["payload_prefix"] == "b'abc'"
    assert logged[0]["log_level"] == "error"


def test_skip_file_round_trip_is_sorted_and_idempotent(tmp_path):
    assert read_skips(tmp_path) == [] and skip_positions(tmp_path) == frozenset()
    entries, new = add_skip(tmp_path, 4096, "ValueError: bad")
    assert new and [e.log_position for e in entries] == [4096]
    entries, new = add_skip(tmp_path, 1024)
    assert new and [e.log_position for e in entries] == [1024, 4096]
    entries, new = add_skip(tmp_path, 4096)
    assert not new and len(entries) == 2
    assert skip_positions(tmp_path) == {1024, 4096}
    assert read_skips(tmp_path)[1].note == "ValueError: bad"
    assert json.loads((tmp_path / SKIP_FILE_NAME).read_text())["format"] == 1


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"format": 2, "skips": []}',
        '{"format": 1, "skips": [{"log_position": 0}]}',
        '{"format": 1, "skips": [{"position": 64}]}',
        "[1, 2]",
    ],
)
def test_a_damaged_skip_file_is_a_one_line_error(tmp_path, text):
    (tmp_path / SKIP_FILE_NAME).write_text(text)
    with pytest.raises(SkipListError) as info:
        read_skips(tmp_path)
    assert "\n" not in str(info.value) and SKIP_FILE_NAME in str(info.value)


def test_add_skip_refuses_a_position_at_the_log_start(tmp_path):
    with pytest.raises(SkipListError):
        add_skip(tmp_path, 0)


def test_service_request_error_names_the_position_and_matches_its_request():
    from cluster_node.client import ServiceRequestError

    e = ServiceRequestError(ServiceErrorEvent(42, 3, 4096, "ValueError: bad", b"\x94\x01\x07"))
    assert str(e) == "the service failed on the message at log position 4096: ValueError: bad"
    assert e.is_for(b"\x94\x01\x07rest") and not e.is_for(b"\x94\x01\x08rest")
    assert e.log_position == 4096 and e.error == "ValueError: bad"


class Answering(Counter):
    """Answers its own failures with a reply of its own (the optional hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.hooked: list[tuple] = []

    def on_callback_error(self, session, log_position, callback, error):
        self.hooked.append((session.id if session else None, log_position, callback, type(error).__name__))
        if session is None:
            raise RuntimeError("the hook fails too")
        session.offer(b"error: " + str(error).encode())
        return True


def test_a_service_hook_may_answer_instead_of_the_error_event():
    rig = Rig("record")
    rig.agent.service = rig.service = Answering()
    bad = rig.send(b"abc")
    assert rig.service.hooked == [(42, bad, "on_session_message", "ValueError")]
    assert rig.replies == [(42, b"error: invalid literal for int() with base 10: b'abc'")]
    assert rig.errors_sent == [] and rig.agent.service_errors == 1
    rig.log(LOG_CODEC.encode(TimerEvent(1, 13, 30)))  # the hook raises: counted once, nothing sent
    assert rig.agent.service_errors == 2 and rig.errors_sent == []


def test_the_readme_counter_answers_bad_input_instead_of_raising():
    """The README's example service, as printed there, under ``stop``: a bad request is answered
    with an error and stops nothing."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [code] = [
        block for block in re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL) if "class Counter" in block
    ]
    namespace: dict = {}
    exec(code.replace("        ...\n", "        pass\n"), namespace)  # the README's own code
    rig = Rig("stop")
    rig.agent.service = service = namespace["Counter"]()
    service.on_start(rig.agent, None)
    rig.send(b"5")
    rig.send(b"abc")
    rig.send(b"7")
    assert rig.replies == [(42, b"5"), (42, b"error: not an integer"), (42, b"12")]
