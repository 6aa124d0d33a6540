"""The local-cluster supervisor behind ``cluster-node up``: one ``cluster-node run`` child process
per member, started, watched and stopped in order.

Members run in sessions of their own, so the terminal's Ctrl-C reaches the supervisor alone,
which stops them in order (SIGTERM, then SIGKILL after a timeout); on Linux each member also gets
SIGTERM if the supervisor itself dies (PR_SET_PDEATHSIG), so a killed supervisor leaves no
orphaned cluster behind. Signals and children's exits arrive through a wake-up pipe, so the
supervisor sleeps in ``select`` and reacts at once. A member restarted by hand after a crash is
adopted (found through its counters file) and stopped with the others.

Nothing here prints: events go to the ``on_event`` callback and a start failure raises
``StartError`` with the member's last lines of output.
"""

from __future__ import annotations

import collections
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cluster_node.exit_codes import ExitCode
from cluster_node.member_view import LEADER_ROLE, ROLE_NAMES, CounterIds, MemberView, read_member_view

__all__ = ["Member", "Supervisor", "LocalClusterError", "StartError", "exit_text", "CONSOLE_LOG_NAME"]

CONSOLE_LOG_NAME = "console.log"
_TAIL_LINES = 8
_EVENTS_SHOWN = 10
_ERROR_LINE = re.compile(r"^\s*(Error: |[\w.]*(Error|Exception)\b: )")


class LocalClusterError(Exception):
    """A local cluster cannot be set up or started (the message is the line to show)."""


class StartError(LocalClusterError):
    """A member could not start; the message ends with the last lines of its output."""


# --------------------------------------------------------------------------------------------
# One member process
# --------------------------------------------------------------------------------------------


def _die_with_parent_fn() -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when ``up`` dies (resolved here, in
    the parent: a forked child must not import or load libraries before exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return preexec


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    try:
        meaning = ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        return f"exit code {code}"
    return f"exit code {code}: {meaning}"


def _tail(path: Path, lines: int, start_offset: int = 0) -> list[str]:
    """The last ``lines`` non-empty lines of a file from ``start_offset`` (reads at most 64 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            begin = max(start_offset, size - 65536)
            f.seek(begin)
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _looks_like_member(pid: int) -> bool:
    """Whether ``pid`` runs ``cluster-node run`` (before ``up`` signals a process it did not
    start, found through a counters file: a pid alone may have been reused)."""
    args = _cmdline(pid)
    if not args:
        return sys.platform != "linux"  # no /proc: trust the counters file's live owner
    return "run" in args and any("cluster-node" in a or "cluster_node" in a for a in args)


class Member:
    """One ``cluster-node run`` child and how to read its state."""

    def __init__(self, member_id: int, config_path: Path, node_dir: Path, counters_path: Path, log_file: Path) -> None:
        self.member_id = member_id
        self.config_path = config_path
        self.node_dir = node_dir
        self.counters_path = counters_path
        self.log_file = log_file
        self.console_path = node_dir / "logs" / CONSOLE_LOG_NAME
        self.console_offset = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = False
        self.exit_code: int | None = None
        self.view = MemberView()
        self._ids = CounterIds()

    # ---------------------------------------------------------------- process

    def start(self, preexec: Callable[[], None] | None) -> None:
        self.console_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.console_path, "ab") as console:
            console.write(
                f"--- cluster-node up: starting member {self.member_id} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode()
            )
            console.flush()
            self.console_offset = console.tell()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cluster_node.cli", "run", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
            )
        self.ready = False
        self.exit_code = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """The child's exit code once it exited (recorded once), else None."""
        if self.proc is None:
            return self.exit_code
        code = self.proc.poll()
        if code is not None:
            self.exit_code = code
        return code

    @property
    def child_running(self) -> bool:
        return self.proc is not None and self.poll() is None

    def check_ready(self) -> bool:
        if not self.ready:
            for line in _tail(self.console_path, 50, self.console_offset):
                if line.startswith(f"READY member={self.member_id} "):
                    self.ready = True
                    break
        return self.ready

    def console_tail(self, lines: int = _TAIL_LINES) -> list[str]:
        return _tail(self.console_path, lines, self.console_offset)

    def last_error_event(self) -> str | None:
        """The newest error/warning event in the node's JSON log, shortened to one line."""
        for line in reversed(_tail(self.log_file, 200)):
            m = re.search(r'"level":\s*"(error|warning|critical)"', line)
            if m:
                ev = re.search(r'"event":\s*"((?:[^"\\]|\\.)*)"', line)
                text = ev.group(1) if ev else line
                return f"{m.group(1)}: {text}"[:160]
        return None

    # ---------------------------------------------------------------- state

    def refresh(self) -> MemberView:
        self.view = read_member_view(self.counters_path, self.member_id, self._ids)
        return self.view

    @property
    def adopted_pid(self) -> int | None:
        """A live member process ``up`` did not start (restarted by hand after a crash)."""
        v = self.view
        if self.child_running or not v.owner_alive or v.owner_pid is None or v.owner_pid == self.pid:
            return None
        return v.owner_pid if _looks_like_member(v.owner_pid) else None

    @property
    def running_pid(self) -> int | None:
        if self.child_running:
            return self.pid
        return self.adopted_pid

    @property
    def alive_text(self) -> str:
        if self.child_running:
            return "yes" if self.ready else "starting"
        if self.adopted_pid is not None:
            return "yes"
        if self.proc is None:
            return "-"
        return "down"


class Supervisor:
    """Starts, watches and stops the members. Signals arrive through a wake-up pipe, so the
    loop sleeps in ``select`` and reacts to Ctrl-C or a child's exit at once."""

    def __init__(self, members: list[Member], echo: Callable[[str], None]) -> None:
        self.members = members
        self.echo = echo
        self.events: collections.deque[str] = collections.deque(maxlen=_EVENTS_SHOWN)
        self.stop_requests = 0
        self.kill_reason = ""
        """Why :meth:`stop_all` killed members (for the closing line)."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._old_handlers: dict[int, object] = {}
        self._old_wakeup_fd = -1
        self._last: dict[int, tuple] = {}
        self.on_event: Callable[[str], None] | None = None

    # ---------------------------------------------------------------- signals

    def install_signals(self) -> None:
        def on_stop(signum, frame) -> None:
            self.stop_requests += 1

        self._old_wakeup_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, on_stop)
        # A handler (doing nothing) makes a child's exit write to the wake-up pipe too.
        self._old_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda s, f: None)

    def restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def wait(self, timeout_s: float) -> None:
        """Sleep until ``timeout_s`` passes, a signal arrives or a child exits."""
        if timeout_s > 0:
            try:
                select.select([self._wake_r], [], [], timeout_s)
            except InterruptedError:
                pass
        try:
            while os.read(self._wake_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # ---------------------------------------------------------------- events

    def event(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        self.events.append(line)
        if self.on_event is not None:
            self.on_event(line)

    def refresh(self) -> None:
        """Read every member's counters and turn changes into events."""
        for m in self.members:
            code_before = m.exit_code
            code = m.poll()
            m.refresh()
            if m.proc is not None and code is not None and code_before is None:
                self.event(f"member {m.member_id} exited ({exit_text(code)})")
            v = m.view
            running_pid = m.running_pid
            key = (running_pid, v.get("role") if running_pid else None, v.get("term"), v.get("errors"))
            old = self._last.get(m.member_id)
            self._last[m.member_id] = key
            if old is None:
                continue
            old_pid, old_role, old_term, old_errors = old
            if running_pid is not None and running_pid != old_pid and not m.child_running:
                self.event(f"member {m.member_id} is back, pid {running_pid} (not started by up)")
            if running_pid is not None and key[1] is not None and key[1] != old_role and key[1] != LEADER_ROLE:
                # (a new leader is announced once its election closed, by the caller)
                role = ROLE_NAMES.get(key[1], str(key[1]))
                term = key[2]
                self.event(
                    f"member {m.member_id} is {role}" + (f" (term {term})" if term is not None and term >= 0 else "")
                )
            errors = key[3]
            if errors is not None and old_errors is not None and errors > old_errors:
                detail = m.last_error_event()
                self.event(
                    f"member {m.member_id} errors {old_errors} -> {errors}" + (f" (last {detail})" if detail else "")
                )

    # ---------------------------------------------------------------- start and stop

    def start_all(self, start_timeout_s: float, tick: Callable[[], None] | None = None) -> None:
        """Start every member and wait for each one's READY; raises StartError (after stopping
        the others) when one exits first or the deadline passes, and returns early on a stop
        request."""
        preexec = _die_with_parent_fn()
        for m in self.members:
            try:
                m.start(preexec)
            except OSError as e:
                self.stop_all(5.0)
                raise StartError(f"cannot start member {m.member_id}: {e.strerror or e}") from None
            self.event(f"member {m.member_id} started, pid {m.pid} ({m.config_path})")
        deadline = time.monotonic() + start_timeout_s
        while True:
            for m in self.members:
                if not m.ready and m.check_ready():
                    self.event(f"member {m.member_id} is running")
            if all(m.ready for m in self.members):
                break
            if self.stop_requests:
                return
            for m in self.members:
                code = m.poll()
                if code is not None and not m.ready:
                    tail = m.console_tail() or _tail(m.log_file, _TAIL_LINES)
                    self.stop_all(5.0)
                    raise StartError(self._start_failure(m, f"exited during start-up ({exit_text(code)})", tail))
            left = deadline - time.monotonic()
            if left <= 0:
                late = next(m for m in self.members if not m.ready)
                tail = late.console_tail() or _tail(late.log_file, _TAIL_LINES)
                self.stop_all(5.0)
                raise StartError(self._start_failure(late, f"not running after {start_timeout_s:g}s", tail))
            if tick is not None:
                tick()
            self.wait(min(0.1, left))
        self.refresh()

    @staticmethod
    def _start_failure(m: Member, what: str, tail: list[str]) -> str:
        """One line (the member, what happened, the error it printed last), then its last lines."""
        where = m.console_path if tail else m.log_file
        cause = next((line.strip() for line in reversed(tail) if _ERROR_LINE.search(line)), None)
        first = f"member {m.member_id} {what}" + (f": {cause}" if cause else "")
        lines = [f"{first}; last lines of {where}:" if tail else f"{first} (no output)"]
        lines += [f"  {line}" for line in tail]
        return "\n".join(lines)

    def stop_all(self, timeout_s: float) -> tuple[int, int]:
        """SIGTERM every running member, wait up to ``timeout_s`` (a further stop request cuts
        the wait short), SIGKILL the rest. Returns (stopped cleanly, killed)."""
        requests_before = self.stop_requests
        targets: list[tuple[Member, int, bool]] = []  # member, pid, is our child
        for m in self.members:
            if m.child_running:
                targets.append((m, m.pid, True))
            else:
                m.refresh()
                pid = m.adopted_pid
                if pid is not None:
                    targets.append((m, pid, False))
        for _m, pid, _ in targets:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s

        def running(entry) -> bool:
            m, pid, child = entry
            if child:
                return m.poll() is None
            from cluster_node.media.counters import pid_alive

            return pid_alive(pid)

        while any(running(t) for t in targets):
            left = deadline - time.monotonic()
            if left <= 0 or self.stop_requests > requests_before:
                break
            self.wait(min(0.05, left))
        killed = 0
        # Said as it happened: a second Ctrl-C (or SIGTERM) asks for the kill at once, which is
        # not a member that failed to stop in time.
        self.kill_reason = (
            "were still stopping at a second stop request"
            if self.stop_requests > requests_before
            else f"did not stop within {timeout_s:g}s"
        )
        for entry in targets:
            if running(entry):
                m, pid, child = entry
                killed += 1
                self.event(f"member {m.member_id} {self.kill_reason.replace('were', 'was')}: SIGKILL")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if child:
                    try:
                        m.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    m.poll()
        return len(targets) - killed, killed
