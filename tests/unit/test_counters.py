"""The counters file: layout, allocation, ownership, corruption, and a reader in another process."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster_node.media.counters import (
    ALLOCATED,
    HEADER_LENGTH,
    MAGIC,
    MAX_LABEL_LENGTH,
    RECLAIMED,
    RECORD_LENGTH,
    CounterInfo,
    CountersError,
    CountersManager,
    CountersReader,
    CounterType,
    SystemCounter,
    SystemCounters,
    file_length,
)

CHILD_TIMEOUT_S = 30


@pytest.fixture
def path(tmp_path):
    return tmp_path / "driver" / "counters.dat"


@pytest.fixture
def manager(path):
    m = CountersManager.create(path, max_counters=8)
    yield m
    m.close()


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=CHILD_TIMEOUT_S)
    return child.pid


def test_header_and_record_layout_match_the_docstring(path, manager):
    c = manager.allocate("hello", CounterType.SENDER_POSITION, registration_id=42)
    c.set(-5)
    raw = path.read_bytes()
    assert len(raw) == file_length(8) == HEADER_LENGTH + 8 * (RECORD_LENGTH + 8)
    magic, version, max_counters, pid, start_ms = struct.unpack_from("<8siiqq", raw, 0)
    assert (magic, version, max_counters, pid) == (MAGIC, 1, 8, os.getpid())
    assert start_ms > 1_600_000_000_000  # epoch milliseconds
    state, type_id, registration_id, label_length = struct.unpack_from("<iiqi", raw, HEADER_LENGTH)
    assert (state, type_id, registration_id, label_length) == (ALLOCATED, 2, 42, 5)
    assert raw[HEADER_LENGTH + 20 : HEADER_LENGTH + 25] == b"hello"
    values = HEADER_LENGTH + 8 * RECORD_LENGTH
    assert values % 8 == 0
    assert struct.unpack_from("<q", raw, values)[0] == -5


def test_round_trip_through_reader(path, manager):
    a = manager.allocate("a", CounterType.PUBLISHER_LIMIT, 1)
    b = manager.allocate("b", CounterType.RECEIVER_HWM, 2)
    a.set(10)
    assert a.add() == 11
    b.add(2**40)
    with CountersReader.open(path) as reader:
        assert list(reader.counters()) == [
            CounterInfo(0, CounterType.PUBLISHER_LIMIT, 1, "a", 11),
            CounterInfo(1, CounterType.RECEIVER_HWM, 2, "b", 2**40),
        ]
        assert reader.get(b.counter_id) == 2**40
        assert reader.owner_pid == os.getpid() and reader.owner_alive()
        assert [c.label for c in reader.find(type_id=CounterType.RECEIVER_HWM)] == ["b"]
        assert [c.label for c in reader.find(label_contains="a")] == ["a"]
        assert reader.find(type_id=CounterType.RECEIVER_HWM, label_contains="a") == []


def test_free_hides_counter_and_slot_is_reused_with_zeroed_value(path, manager):
    a = manager.allocate("first", 1)
    a.set(99)
    keep = manager.allocate("keep", 1)
    a.close()
    a.close()  # idempotent
    a.set(7)  # a closed handle must not write into the slot
    with CountersReader.open(path) as reader:
        assert [c.label for c in reader.counters()] == ["keep"]
        with pytest.raises(CountersError, match="not allocated"):
            reader.get(0)
        assert struct.unpack_from("<i", path.read_bytes(), HEADER_LENGTH)[0] == RECLAIMED
        again = manager.allocate("second", 4)
        assert again.counter_id == 0
        assert again.get() == 0
        assert [(c.counter_id, c.label, c.value) for c in reader.counters()] == [(0, "second", 0), (1, "keep", 0)]
    with pytest.raises(CountersError, match="not allocated"):
        manager.free(a.counter_id + 5)
    assert keep.counter_id == 1


def test_full_file_refuses_allocation_until_a_slot_is_freed(manager):
    counters = [manager.allocate(f"c{i}", 1) for i in range(8)]
    with pytest.raises(CountersError, match="full"):
        manager.allocate("one too many", 1)
    counters[3].close()
    assert manager.allocate("fits again", 1).counter_id == 3


def test_long_label_is_truncated_on_a_character_boundary(path, manager):
    label = "x" + "é" * 200  # 401 bytes; a byte cut at MAX_LABEL_LENGTH would split an "é"
    c = manager.allocate(label, 1)
    assert len(c.label.encode()) <= MAX_LABEL_LENGTH
    assert label.startswith(c.label) and len(c.label) == 1 + (MAX_LABEL_LENGTH - 1) // 2
    with CountersReader.open(path) as reader:
        assert next(reader.counters()).label == c.label


def test_system_counters_are_all_allocated_and_addressable(path, tmp_path):
    with CountersManager.create(path) as m:
        sc = SystemCounters(m)
        sc.bytes_sent.add(100)
        sc[SystemCounter.ERRORS].add()
        assert sc[SystemCounter.BYTES_SENT] is sc.bytes_sent
        assert len({int(k) for k in SystemCounter}) == len(SystemCounter)
        with CountersReader.open(path) as reader:
            system = {c.registration_id: c for c in reader.find(type_id=CounterType.SYSTEM)}
            assert set(system) == {int(k) for k in SystemCounter}
            assert system[SystemCounter.BYTES_SENT].label == "Bytes sent"
            assert system[SystemCounter.BYTES_SENT].value == 100
            assert system[SystemCounter.ERRORS].value == 1
        sc.close()
        with CountersReader.open(path) as reader:
            assert list(reader.counters()) == []


def test_reference_type_ids():
    assert {t.name: t.value for t in CounterType} == {
        "SYSTEM": 0, "PUBLISHER_LIMIT": 1, "SENDER_POSITION": 2, "RECEIVER_HWM": 3,
        "SUBSCRIBER_POSITION": 4, "RECEIVER_POS": 5, "SEND_CHANNEL_STATUS": 6,
        "RECEIVE_CHANNEL_STATUS": 7, "SENDER_LIMIT": 9, "PUBLISHER_POS": 12, "SENDER_BPE": 13,
    }  # fmt: skip
    assert (SystemCounter.NAK_MESSAGES_SENT, SystemCounter.SHORT_SENDS) == (5, 16)
    assert SystemCounter.BYTES_RECEIVED.label == "Bytes received"


def test_stale_file_of_a_dead_process_is_replaced(path):
    with CountersManager.create(path, max_counters=4) as m:
        m.allocate("old", 1).set(5)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<q", raw, 16, dead_pid())
    path.write_bytes(raw)
    with CountersManager.create(path, max_counters=16) as m, CountersReader.open(path) as reader:
        assert reader.owner_pid == os.getpid()
        assert reader.max_counters == 16
        assert list(reader.counters()) == []
        m.allocate("new", 1)
        assert [c.label for c in reader.counters()] == ["new"]


def test_garbage_file_is_replaced(path):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a counters file")
    with CountersManager.create(path, max_counters=4), CountersReader.open(path) as reader:
        assert reader.owner_pid == os.getpid()


def test_file_owned_by_a_live_process_is_refused(path):
    script = textwrap.dedent(
        """
        import sys
        from cluster_node.media.counters import CountersManager
        m = CountersManager.create(sys.argv[1], max_counters=4)
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(CountersError, match=f"live process pid {child.pid}"):
            CountersManager.create(path)
        with CountersReader.open(path) as reader:
            assert reader.owner_pid == child.pid and reader.owner_alive()
    finally:
        child.communicate(timeout=CHILD_TIMEOUT_S)
    with CountersReader.open(path) as reader:
        assert not reader.owner_alive()


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CountersError, match="no counters file"):
        CountersReader.open(tmp_path / "absent.dat")


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda raw: raw[:10], "truncated"),
        (lambda raw: raw[: HEADER_LENGTH + 100], "truncated"),
        (lambda raw: b"XXXXXXXX" + raw[8:], "bad magic"),
        (lambda raw: raw[:8] + struct.pack("<i", 99) + raw[12:], "version 99"),
        (lambda raw: raw[:12] + struct.pack("<i", -1) + raw[16:], "max_counters -1"),
    ],
    ids=["short-header", "short-body", "magic", "version", "max-counters"],
)
def test_corrupt_or_truncated_file_is_a_clear_error(path, corrupt, message):
    with CountersManager.create(path, max_counters=4):
        pass
    bad = path.with_name("bad.dat")
    bad.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(CountersError, match=message):
        CountersReader.open(bad)


def test_reader_in_another_process_sees_live_values(path, manager):
    """The child maps the file first; values set afterwards must show through its mapping."""
    hits = manager.allocate("hits", CounterType.SUBSCRIBER_POSITION, 9)
    hits.set(1)
    script = textwrap.dedent(
        """
        import json, sys
        from cluster_node.media.counters import CountersReader
        reader = CountersReader.open(sys.argv[1])
        print("mapped", flush=True)
        for line in sys.stdin:
            print(json.dumps([list(c) for c in reader.counters()]), flush=True)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "mapped"
        hits.set(2**62 + 3)
        late = manager.allocate("late", CounterType.SENDER_BPE)
        late.add(-7)
        child.stdin.write("read\n")
        child.stdin.flush()
        seen = json.loads(child.stdout.readline())
    finally:
        child.stdin.close()
        child.wait(timeout=CHILD_TIMEOUT_S)
    assert seen == [[0, 4, 9, "hits", 2**62 + 3], [1, 13, 0, "late", -7]]
    assert child.returncode == 0


def _race_to_own(path, start, done, results) -> None:
    start.wait()
    try:
        CountersManager.create(path, 16)
        results.put("owner")
    except CountersError:
        results.put("refused")
    done.wait()  # stay alive until every process has tried: a live owner refuses the rest


def test_processes_starting_at_once_on_one_directory_get_one_owner(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    n = 6
    start, done, results = ctx.Barrier(n), ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race_to_own, args=(tmp_path / "counters.dat", start, done, results)) for _ in range(n)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=30) for _ in range(n))
    for p in procs:
        p.join(timeout=30)
    assert outcomes == ["owner"] + ["refused"] * (n - 1)


def test_a_zombie_owners_counters_file_is_taken_over(tmp_path):
    """A predecessor that exited but was not reaped (its parent never waited) still answers
    signal 0; it writes nothing any more, so its counters.dat is replaced rather than left for
    readers to find stale beside a counters-<pid>.dat of the new process."""
    import time as _time

    path = tmp_path / "counters.dat"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from cluster_node.media.counters import CountersManager; CountersManager.create({str(path)!r}, 8)",
        ]
    )
    try:
        deadline = _time.monotonic() + 30
        while True:
            try:
                state = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                state = "?"
            if state == "Z" and path.exists():
                break
            assert _time.monotonic() < deadline, "the child did not exit"
            _time.sleep(0.01)
        manager = CountersManager.create(path, 8)  # not refused, not counters-<pid>.dat
        assert manager.path == path
        manager.close()
    finally:
        child.wait()
