"""cluster_node.keep_awake: idle-class helpers that spin while rung, sleep when not, and end with
their node (closed pipe, or the node killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cluster_node import keep_awake
from cluster_node.keep_awake import LINGER_NS, KeepAwake
from tests.support.procs import state_and_ticks, wait_until

pytestmark = pytest.mark.skipif(not keep_awake.supported(), reason="Linux only (SCHED_IDLE)")


def _state_and_ticks(pid: int) -> tuple[str, int]:
    st = state_and_ticks(pid)
    assert st is not None, f"process {pid} is gone"
    return st


def _wait_for(cond, timeout: float, what: str) -> None:
    wait_until(cond, timeout, what, interval=0.005)


def _alive(pid: int) -> bool:
    return (state_and_ticks(pid) or ("Z",))[0] != "Z"


def _asleep(pid: int) -> bool:
    """Blocked in its read ('S'), and not just preempted: the state is read twice."""
    return _state_and_ticks(pid)[0] == "S" and (time.sleep(0.01) or _state_and_ticks(pid)[0] == "S")


def test_helpers_are_idle_class_pinned_and_asleep_until_rung() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    k = KeepAwake(cpus)
    k.start()
    try:
        assert len(k.pids) == len(cpus)
        for pid, cpu in zip(k.pids, cpus):
            _wait_for(lambda pid=pid: os.sched_getscheduler(pid) == os.SCHED_IDLE, 5, "the idle class")
            assert os.sched_getaffinity(pid) == {cpu}
            _wait_for(lambda pid=pid: _asleep(pid), 5, "the helper asleep before any ring")
    finally:
        k.close()


def test_a_ring_makes_them_spin_and_they_sleep_again_after_the_linger() -> None:
    k = KeepAwake(sorted(os.sched_getaffinity(0))[:1])
    k.start()
    try:
        (pid,) = k.pids
        _wait_for(lambda: _asleep(pid), 5, "the helper asleep before any ring")
        k.ring(time.monotonic_ns())
        t0 = _state_and_ticks(pid)[1]
        # (rung on while it waits, at most every 25 ms: the linger alone may pass before 30 ms of
        # CPU come; the linger then ends at least 75 ms after rung_at)
        _wait_for(
            lambda: k.ring(time.monotonic_ns()) or _state_and_ticks(pid)[1] >= t0 + 3,
            5,
            "the helper using CPU after a ring",
        )
        rung_at = time.monotonic()
        _wait_for(lambda: _asleep(pid), 5, "the helper asleep after the linger")
        assert time.monotonic() - rung_at >= LINGER_NS / 1e9 / 2, "slept well before the linger ended"
    finally:
        k.close()


def test_one_spinner_per_cpu_on_the_machine(tmp_path: Path) -> None:
    """Two members' helpers for one CPU: one spins, the other waits on the CPU's lock without
    using CPU, and takes over when the first one's member stops."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    a, b = KeepAwake([cpu], lock_dir=tmp_path), KeepAwake([cpu], lock_dir=tmp_path)
    a.start()
    b.start()
    try:
        (pa,), (pb,) = a.pids, b.pids
        _wait_for(lambda: _asleep(pa) and _asleep(pb), 5, "both helpers asleep before any ring")
        # a's helper rung on while it is waited for, at most every 25 ms: the linger alone (100
        # ms) may pass before 30 ms of CPU come. Using CPU, it holds the CPU's lock.
        ta = _state_and_ticks(pa)[1]
        _wait_for(lambda: a.ring(time.monotonic_ns()) or _state_and_ticks(pa)[1] >= ta + 3, 5, "a's helper spinning")
        b.ring(time.monotonic_ns())
        tb = _state_and_ticks(pb)[1]
        ta = _state_and_ticks(pa)[1]
        _wait_for(
            lambda: a.ring(time.monotonic_ns()) or _state_and_ticks(pa)[1] >= ta + 3,
            5,
            "a's helper spinning on, b's rung",
        )
        a.ring(time.monotonic_ns() + LINGER_NS)  # keep a's spinning
        assert _asleep(pb) and _state_and_ticks(pb)[1] <= tb + 1, "b's helper spun beside a's"
        a.close()  # a's member stops: b's helper, rung a moment ago, gets the CPU
        _wait_for(
            lambda: b.ring(time.monotonic_ns() + LINGER_NS) or _state_and_ticks(pb)[1] >= tb + 3,
            5,
            "b's helper spinning once a's stopped",
        )
    finally:
        a.close()
        b.close()


def test_rings_are_rate_limited() -> None:
    k = KeepAwake([sorted(os.sched_getaffinity(0))[0]])
    k.start()
    try:
        now = time.monotonic_ns()
        for i in range(100):
            k.ring(now + i * 1000)
        assert k.rings == 1
        k.ring(now + LINGER_NS)
        assert k.rings == 2
    finally:
        k.close()


def test_close_ends_the_helpers() -> None:
    k = KeepAwake(sorted(os.sched_getaffinity(0))[:2])
    k.start()
    pids = k.pids
    k.ring(time.monotonic_ns())  # one spinning, or about to
    k.close()
    assert k.pids == []
    assert not any(_alive(p) for p in pids)


def test_a_helper_killed_by_hand_is_dropped_at_the_next_ring() -> None:
    k = KeepAwake(sorted(os.sched_getaffinity(0))[:1])
    k.start()
    (pid,) = k.pids
    os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: _state_and_ticks(pid)[0] == "Z", 5, "the helper dead")
    k.ring(time.monotonic_ns())  # EPIPE: logged, not raised
    assert k.pids == [] and not k.running
    k.ring(time.monotonic_ns() + LINGER_NS)
    k.close()
    assert not _alive(pid)


def test_no_cpus_starts_nothing() -> None:
    k = KeepAwake([])
    k.start()
    k.ring(time.monotonic_ns())
    assert k.pids == [] and not k.running
    k.close()


@pytest.mark.parametrize("spinning", [True, False], ids=["spinning", "asleep"])
def test_helpers_end_when_their_node_is_killed(spinning: bool) -> None:
    """kill -9 of the process that started them: no helper outlives it, spinning or asleep."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from cluster_node.keep_awake import KeepAwake
        k = KeepAwake(sorted(os.sched_getaffinity(0))[:2])
        k.start()
        if {spinning!r}:
            k.ring(time.monotonic_ns())
        print("PIDS", *k.pids, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2]
    )
    try:
        line = ""
        while not line.startswith("PIDS"):  # past the log lines
            line = parent.stdout.readline()
            assert line, "the parent ended early"
        pids = [int(p) for p in line.split()[1:]]
        assert pids
        if not spinning:
            _wait_for(lambda: all(_asleep(p) for p in pids), 5, "helpers asleep")
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        _wait_for(lambda: not any(_alive(p) for p in pids), 5, "helpers gone after their node was killed")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
