"""cluster-mark.dat (one node per directory) and node-state.dat (crash-safe candidate term)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_node.consensus.node_files import (
    MARK_FILE_NAME,
    NODE_STATE_FILE_NAME,
    MarkFile,
    MarkFileInUseError,
    NodeStateError,
    NodeStateFile,
    read_mark_file,
)

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------------------ mark file


def test_mark_file_records_owner_and_activity(tmp_path: Path) -> None:
    with MarkFile.open(tmp_path / "n0", member_id=2, cluster_id=7, details={"service": "kv"}, now_ms=1000) as mf:
        assert mf.takeover_reason is None
        info = read_mark_file(tmp_path / "n0")
        assert info is not None
        assert (info.pid, info.member_id, info.cluster_id) == (os.getpid(), 2, 7)
        assert info.start_timestamp_ms == info.activity_timestamp_ms == 1000
        assert info.details == {"service": "kv"}
        mf.update_activity(5000)
        assert read_mark_file(tmp_path / "n0").activity_timestamp_ms == 5000
        assert read_mark_file(tmp_path / "n0").start_timestamp_ms == 1000
    assert read_mark_file(tmp_path / "n0").pid == os.getpid()  # kept after close
    assert read_mark_file(tmp_path / "none") is None


def test_second_holder_in_this_process_is_refused(tmp_path: Path) -> None:
    with MarkFile.open(tmp_path, member_id=0):
        with pytest.raises(MarkFileInUseError) as info:
            MarkFile.open(tmp_path, member_id=0)
        msg = str(info.value)
        assert "in use by member 0" in msg and f"pid {os.getpid()}" in msg and "\n" not in msg
    # Released on close: a new owner may come.
    MarkFile.open(tmp_path, member_id=0).close()


def test_second_process_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    code = (
        "import sys, time; from cluster_node.consensus.node_files import MarkFile;"
        f"m = MarkFile.open({str(tmp_path)!r}, member_id=1); print('HELD', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        assert holder.stdout.readline().strip() == "HELD"
        with pytest.raises(MarkFileInUseError, match=f"member 1 \\(pid {holder.pid}"):
            MarkFile.open(tmp_path, member_id=1)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    # The holder exited: its lock went with it, the file is taken over.
    with MarkFile.open(tmp_path, member_id=1) as mf:
        assert mf.takeover_reason == f"pid {holder.pid} is not running"
        assert mf.previous.pid == holder.pid


def test_killed_holder_does_not_block_restart(tmp_path: Path) -> None:
    code = (
        "from cluster_node.consensus.node_files import MarkFile;"
        f"m = MarkFile.open({str(tmp_path)!r}, member_id=0); print('HELD', flush=True);"
        "import time; time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert holder.stdout.readline().strip() == "HELD"
    holder.kill()
    holder.wait(timeout=10)
    with MarkFile.open(tmp_path, member_id=0) as mf:
        assert "not running" in mf.takeover_reason


def _forge_mark(tmp_path: Path, pid: int, activity_ms: int) -> None:
    """A mark file as another owner left it (written without holding the lock afterwards)."""
    with MarkFile.open(tmp_path, member_id=3, now_ms=activity_ms):
        pass
    data = bytearray((tmp_path / MARK_FILE_NAME).read_bytes())
    data[24:32] = pid.to_bytes(8, "little")  # the pid is covered by the checksum: recompute it
    import struct
    import zlib

    body = bytearray(data[:52])
    body[8:16] = bytes(8)
    struct.pack_into("<I", data, 52, zlib.crc32(body))
    (tmp_path / MARK_FILE_NAME).write_bytes(bytes(data))
    assert read_mark_file(tmp_path).pid == pid


def test_stale_mark_file_from_dead_pid_is_taken_over(tmp_path: Path) -> None:
    pid = _dead_pid()
    _forge_mark(tmp_path, pid, activity_ms=10_000)
    with MarkFile.open(tmp_path, member_id=3, now_ms=10_500) as mf:  # fresh timestamp, dead pid
        assert mf.takeover_reason == f"pid {pid} is not running"
        assert read_mark_file(tmp_path).pid == os.getpid()


def test_live_pid_with_fresh_timestamp_is_refused_old_timestamp_taken_over(tmp_path: Path) -> None:
    live = os.getppid()  # alive, not us, and not holding our lock
    _forge_mark(tmp_path, live, activity_ms=100_000)
    with pytest.raises(MarkFileInUseError, match=f"pid {live}"):
        MarkFile.open(tmp_path, member_id=3, now_ms=105_000)
    with MarkFile.open(tmp_path, member_id=3, now_ms=111_000) as mf:
        assert mf.takeover_reason.startswith("not refreshed for 11.0s")


def test_garbage_mark_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / MARK_FILE_NAME).write_bytes(b"junk" * 100)
    assert read_mark_file(tmp_path) is None
    with MarkFile.open(tmp_path, member_id=0) as mf:
        assert mf.takeover_reason == "the existing file is not a valid mark file"
    assert read_mark_file(tmp_path).member_id == 0


# ------------------------------------------------------------------------------ node state


def test_node_state_starts_null_and_persists(tmp_path: Path) -> None:
    with NodeStateFile.open(tmp_path) as ns:
        assert ns.candidate_term_id == -1
        assert not ns.torn_write_detected
        assert ns.propose_max_candidate_term_id(3, 4096, 111) == 3
        assert ns.propose_max_candidate_term_id(2, 0, 112) == 3  # never goes back
        assert ns.state.timestamp_ms == 111
        ns.update_candidate_term_id(5, 8192, 113)
    with NodeStateFile.open(tmp_path) as ns:
        assert (ns.candidate_term_id, ns.state.log_position, ns.state.timestamp_ms) == (5, 8192, 113)
        assert not ns.torn_write_detected
    assert not (tmp_path / (NODE_STATE_FILE_NAME + ".tmp")).exists()


def test_torn_write_is_detected_and_previous_value_kept(tmp_path: Path) -> None:
    with NodeStateFile.open(tmp_path) as ns:
        for term in range(1, 8):
            ns.propose_max_candidate_term_id(term, term * 64, term)
        newest = ns._newest_slot  # the slot holding term 7
    path = tmp_path / NODE_STATE_FILE_NAME
    data = bytearray(path.read_bytes())
    # A crash half-way through writing term 7's slot: its second half never reached the disk.
    off = 64 + 64 * newest
    data[off + 16 : off + 64] = bytes(48)
    path.write_bytes(bytes(data))
    with NodeStateFile.open(tmp_path) as ns:
        assert ns.torn_write_detected
        assert ns.candidate_term_id == 6
        # The damaged slot is the next written; the good one survives another crash.
        ns.propose_max_candidate_term_id(9, 0, 0)
    with NodeStateFile.open(tmp_path) as ns:
        assert ns.candidate_term_id == 9 and not ns.torn_write_detected


def test_both_slots_damaged_is_refused(tmp_path: Path) -> None:
    with NodeStateFile.open(tmp_path) as ns:
        ns.propose_max_candidate_term_id(1, 0, 0)
    path = tmp_path / NODE_STATE_FILE_NAME
    data = bytearray(path.read_bytes())
    data[64 + 8] ^= 0xFF
    data[128 + 8] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(NodeStateError, match="no intact candidate-term entry"):
        NodeStateFile.open(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "header", "empty"])
def test_damaged_node_state_file_is_refused(tmp_path: Path, damage: str) -> None:
    NodeStateFile.open(tmp_path).close()
    path = tmp_path / NODE_STATE_FILE_NAME
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:100]
    elif damage == "header":
        data[2] ^= 0x01
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(NodeStateError) as info:
        NodeStateFile.open(tmp_path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_every_single_torn_byte_prefix_leaves_a_usable_state(tmp_path: Path) -> None:
    """Whatever prefix of a slot write reached the disk, open() yields the old or the new value."""
    with NodeStateFile.open(tmp_path) as ns:
        ns.propose_max_candidate_term_id(4, 0, 0)
        before = (tmp_path / NODE_STATE_FILE_NAME).read_bytes()
        ns.propose_max_candidate_term_id(5, 0, 0)
        after = (tmp_path / NODE_STATE_FILE_NAME).read_bytes()
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    lo, hi = changed[0], changed[-1] + 1
    for cut in range(lo, hi + 1):
        (tmp_path / NODE_STATE_FILE_NAME).write_bytes(after[:cut] + before[cut:])
        with NodeStateFile.open(tmp_path) as ns:
            assert ns.candidate_term_id in (4, 5)
            assert ns.candidate_term_id == 5 or cut < hi
