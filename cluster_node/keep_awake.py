"""Keeping the node's CPUs out of the idle state while the log moves (``[node] keep_cpus_awake``).

Why
===
A node waits for its next datagram asleep in ``epoll_wait``; when nothing else runs on its CPU,
the kernel idles that CPU with ``HLT``. On bare metal, waking from that is cheap. In a
virtual machine whose host does not poll for its guests' halts (no ``cpuidle-haltpoll`` driver:
``/sys/devices/system/cpu/cpuidle/current_driver`` is ``none``), a halted vCPU is a host thread
asleep, and a wake-up costs a trip through the host (``scripts/calibration.py``'s
``wake_cpu_us`` shows it), and a client's round trip
through the cluster crosses four of them (the leader for the client's message, a follower for
the log, the leader's service thread for the commit, the client for the reply). Spinning in the node's own threads does not help: a Python thread
that spins takes the CPU and the GIL from the work it waits for (measured worse).

What
====
With ``keep_cpus_awake = true`` in ``[node]``, the node starts one small helper process per CPU it
may run on (the union of ``leader_cpus`` and ``follower_cpus``, or every CPU it may use when neither
is set). A helper is pinned to its CPU, runs in the ``SCHED_IDLE`` scheduling class and spins in
a plain loop, so that CPU never halts. Any ordinary thread that wakes on that CPU preempts the
helper at once (an idle-class task yields to every normal one, and the scheduler counts a CPU
running only idle-class tasks as idle when it places a woken thread), so the wake-up costs a
context switch inside the guest instead of a trip through the host. The loop avoids the
``PAUSE`` instruction: KVM's pause-loop exiting takes a vCPU that executes many of them off the
CPU, which is the cost this avoids (a C helper spinning on ``PAUSE`` showed no clear gain).

It burns a CPU only while the cluster works. The node rings the helpers (one byte on a pipe of
each) when its log's recorded position moves and the last ring is at least ``_RING_EVERY_NS``
old; a helper spins until ``LINGER_NS`` has passed without a ring and then blocks reading its
pipe. An idle cluster (heartbeats only) appends nothing, so its helpers sleep and cost nothing; the first
message after a pause pays the ordinary wake-ups and wakes the helpers for the ones after it.

A helper ends when its pipe's write end closes: when the node stops, and when it dies by kill -9
(the kernel closes the dead process's descriptors), whether the helper spins (a read returns
end of file) or sleeps (the blocking read returns it). ``PR_SET_PDEATHSIG`` covers a helper
waiting for its CPU's lock (below).

Only one helper spins on a CPU at a time, machine-wide: members sharing a machine each start
helpers for the same CPUs, and a rung helper first takes the CPU's lock file (see
:func:`_helper` for why).

On such a VM it lowers the round trip's p50 at 1,000 messages/s (``scripts/cluster_cpu.py --rate
1000`` or ``scripts/bench_cluster.py``, by turns without and with ``--keep-cpus-awake``; see
docs/benchmarks.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["KeepAwake", "LINGER_NS", "default_lock_dir", "supported"]


def _log():
    # Imported here, not at the top: the helper process imports this module too, and structlog
    # would add some 70 ms of start-up to each helper.
    import structlog

    return structlog.get_logger("cluster_node.keep_awake")


LINGER_NS = 100_000_000
"""How long a helper spins after the node's last ring: 100 ms. Long enough that a cluster taking
a message every few milliseconds keeps its CPUs awake between them, short enough that a pause in
the traffic gives the CPUs back at once."""

_RING_EVERY_NS = LINGER_NS // 4
"""The node rings at most this often while its log moves: 40 rings a second at most, each a
one-byte write, whatever the message rate."""


def default_lock_dir() -> Path:
    """The user's directory under /dev/shm (the driver directories' root), else under the
    temporary directory: every member on the machine must find the same lock files."""
    import tempfile

    from cluster_node.driver_dir import shm_driver_root

    return shm_driver_root() or Path(tempfile.gettempdir()) / f"pycluster-{os.getuid()}"


def supported() -> bool:
    """Linux with the idle scheduling class and CPU affinity."""
    return hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")


class KeepAwake:
    """The node's side: starts the helpers, rings them, stops them.

    ``cpus``: the CPUs to keep awake (one helper each). Nothing is started before :meth:`start`;
    a helper that cannot start is logged once and the node runs without it (this is a matter of
    speed, never of correctness)."""

    def __init__(self, cpus: Iterable[int], lock_dir: Path | None = None) -> None:
        self.cpus = tuple(sorted(set(cpus)))
        self.lock_dir = lock_dir if lock_dir is not None else default_lock_dir()
        """Where the CPUs' lock files are (one spinner per CPU on the machine: see
        :func:`_helper`)."""
        self._helpers: list[tuple[subprocess.Popen, int]] = []
        """Each running helper and the write end of its pipe."""
        self._ended: list[subprocess.Popen] = []
        """Helpers found gone by :meth:`ring`, reaped by :meth:`close`."""
        self._last_ring_ns = -_RING_EVERY_NS
        self.rings = 0

    @property
    def running(self) -> bool:
        return bool(self._helpers)

    def start(self) -> None:
        if self.running or not self.cpus:
            return
        if not supported():
            _log().warning("keep_cpus_awake needs Linux (SCHED_IDLE); the CPUs are left to idle")
            return
        try:
            self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:  # the helpers then spin without the lock
            _log().warning("keep_cpus_awake lock directory not made", dir=str(self.lock_dir), error=str(e))
        # A pipe per helper: a ring is one byte, and a byte read by one reader is gone for the
        # others (and O_NONBLOCK, which a spinning helper sets, belongs to the shared end).
        for cpu in self.cpus:
            rfd, wfd = os.pipe()
            os.set_blocking(wfd, False)  # a full pipe drops a ring: that helper is awake anyway
            try:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "cluster_node.keep_awake",
                        str(cpu),
                        str(self.lock_dir / f"keep-awake-cpu{cpu}.lock"),
                    ],
                    stdin=rfd,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    close_fds=True,
                )
            except OSError as e:
                os.close(wfd)
                _log().warning("keep_cpus_awake helper not started", cpu=cpu, error=str(e))
                continue
            finally:
                os.close(rfd)
            self._helpers.append((proc, wfd))
        if self._helpers:
            _log().info("keeping CPUs awake while the log moves", cpus=list(self.cpus), pids=self.pids)

    def ring(self, now_ns: int) -> None:
        """The log moved at ``now_ns`` (monotonic): keep the helpers spinning."""
        if now_ns - self._last_ring_ns < _RING_EVERY_NS or not self._helpers:
            return
        self._last_ring_ns = now_ns
        self.rings += 1
        gone = []
        for proc, wfd in self._helpers:
            try:
                os.write(wfd, b"\x01")
            except BlockingIOError:
                pass
            except OSError:  # that helper is gone (it failed, or was killed by hand): stop ringing it
                os.close(wfd)
                gone.append((proc, wfd))
                _log().warning(
                    "keep_cpus_awake helper ended; its CPU is left to idle", pid=proc.pid, exit_code=proc.poll()
                )
        for helper in gone:
            self._helpers.remove(helper)
            self._ended.append(helper[0])

    def close(self, timeout: float = 2.0) -> None:
        """Stop the helpers: close the pipes (each ends at end of file) and reap them."""
        for _, wfd in self._helpers:
            os.close(wfd)
        deadline = time.monotonic() + timeout
        for p in [proc for proc, _ in self._helpers] + self._ended:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
            if p.stderr:
                p.stderr.close()
            if p.returncode not in (0, -9) and err:
                _log().warning("keep_cpus_awake helper failed", pid=p.pid, error=err.splitlines()[-1])
        self._helpers.clear()
        self._ended.clear()

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc, _ in self._helpers]


# ------------------------------------------------------------------ the helper process


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _lock(lock_path: str) -> int:
    """The CPU's lock file, open (-1 if it cannot be: the helper then spins without it)."""
    try:
        # Never through a link: in the temporary directory fallback another user could plant one.
        return os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return -1


def _helper(cpu: int, lock_path: str, fd: int = 0) -> int:
    """Spin on ``cpu`` in the idle class while rings come on ``fd``; block when they stop; end
    at end of file.

    Only one helper spins on a CPU at a time, machine-wide (members sharing a machine each start
    helpers for the same CPUs): a rung helper first takes the CPU's lock file (``flock``),
    waiting in the kernel, without CPU, while another one spins. Several idle-class spinners on
    one CPU take turns on it, and each switch between those processes costs the woken work its
    warm caches (measured: six spinners on two CPUs gave a worse round trip p99 than two). The
    lock goes when the spinner stops, or dies."""
    import fcntl

    _die_with_parent()
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    lock = _lock(lock_path)
    monotonic_ns = time.monotonic_ns
    read = os.read
    while True:
        os.set_blocking(fd, True)
        if not read(fd, 4096):  # asleep until a ring (or end of file: the node is gone)
            return 0
        last_ring = monotonic_ns()
        if lock >= 0:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the CPU's one spinner: wait while another spins
        os.set_blocking(fd, False)
        until = last_ring + LINGER_NS
        while True:
            try:
                if not read(fd, 4096):
                    return 0
                until = monotonic_ns() + LINGER_NS  # (rings that came while it waited count too)
            except BlockingIOError:
                if monotonic_ns() >= until:
                    break
            for _ in range(2000):  # a short stretch of plain work between looks at the pipe
                pass
        if lock >= 0:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    sys.exit(_helper(int(sys.argv[1]), sys.argv[2]))
