"""Child processes for integration tests: start, read their protocol lines with deadlines, stop."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "tests" / "support" / "media_peer.py"


class Peer:
    """A child process speaking the line protocol of ``media_peer.py`` (READY / EVENT / DONE / FAIL)."""

    def __init__(self, args: list[str], name: str = "peer") -> None:
        self.name = name
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    @staticmethod
    def _pump(stream, q) -> None:
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    def _pump_err(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, prefix: str, timeout: float) -> str:
        """The next line starting with ``prefix``; fail on FAIL, exit or deadline."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.name}: no {prefix!r} line within {timeout}s; saw {self.seen[-5:]}; stderr {self.stderr[-10:]}"
                )
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=5)
                raise AssertionError(
                    f"{self.name}: exited ({self.proc.returncode}) before {prefix!r}; saw {self.seen[-5:]}; stderr {self.stderr[-15:]}"
                )
            self.seen.append(line)
            if line.startswith("FAIL"):
                raise AssertionError(f"{self.name}: {line}")
            if line.startswith(prefix):
                return line

    def fields(self, line: str) -> dict[str, str]:
        return dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)

    def finish(self, timeout: float = 30) -> int:
        """Close stdin (a publisher's signal to stop) and wait for the exit code."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name}: did not exit within {timeout}s") from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def free_udp_port() -> int:
    """A free port for another process to bind later (below the ephemeral range, see
    :func:`cluster_node.config.free_fixed_udp_ports`)."""
    from cluster_node.config import free_fixed_udp_ports

    return free_fixed_udp_ports(1, "127.0.0.1")[0]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def state_and_ticks(pid: int) -> tuple[str, int] | None:
    """A process's state letter (``S``, ``R``, ``Z`` ...) and its CPU time (user + system clock
    ticks) from ``/proc/<pid>/stat``; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return fields[0], int(fields[11]) + int(fields[12])


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started and that still run (``keep_cpus_awake`` helpers), from /proc."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue  # a thread that just ended
    return out


def wait_until(condition, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)
