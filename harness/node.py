"""One member process of a :class:`harness.cluster.TestCluster`: its config, process, counters and logs.

A :class:`Node` starts ``cluster-node run`` for its config (``$CLUSTER_TEST_NODE_SCRIPT``, when
set, names a Python script run instead of the entry point, with the same arguments), kills,
stops and restarts it, and reads its role, election state, term and positions from its
counters file; its ``describe`` is what a failed wait prints about the member.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cluster_node.config import (
    NodeConfig,
    load_node_config,
)
from cluster_node.media.counters import CountersError, CountersReader, CounterType
from harness.digest_service import DIGEST_DIR_ENV

if TYPE_CHECKING:
    from harness.cluster import TestCluster


ROOT = Path(__file__).resolve().parents[1]
S = 1_000_000_000
MS = 1_000_000

ROLE_TYPE = 201
COMMIT_POS_TYPE = 203
ELECTION_STATE_TYPE = 207
ERRORS_TYPE = 212
TERM_TYPE = 239
APPEND_POS_TYPE = 240
_COUNTER_TYPES = {
    "role": ROLE_TYPE,
    "commit": COMMIT_POS_TYPE,
    "election": ELECTION_STATE_TYPE,
    "errors": ERRORS_TYPE,
    "term": TERM_TYPE,
    "append": APPEND_POS_TYPE,
}
LEADER = 2
FOLLOWER = 0
CLOSED = 17


def _without_timestamp(line: str) -> str:
    try:
        event = json.loads(line)
    except ValueError:
        return line
    if isinstance(event, dict):
        event.pop("timestamp", None)
        return json.dumps(event, sort_keys=True)
    return line


def _shorten(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def _node_command() -> list[str]:
    if os.environ.get("CLUSTER_TEST_NODE_SCRIPT"):
        return [sys.executable, os.environ["CLUSTER_TEST_NODE_SCRIPT"]]
    exe = Path(sys.executable).parent / "cluster-node"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "from cluster_node.cli import main; main()"]


@dataclass(frozen=True)
class NodeCounters:
    """One reading of a running member's consensus counters."""

    role: int
    commit: int
    election: int
    term: int
    append: int
    errors: int

    @property
    def is_leader(self) -> bool:
        return self.role == LEADER and self.election == CLOSED

    @property
    def is_follower(self) -> bool:
        return self.role == FOLLOWER and self.election == CLOSED


class Node:
    """One member: its config, its current process (if any), its counters and logs."""

    def __init__(self, cluster: TestCluster, member_id: int, config_path: Path) -> None:
        self.cluster = cluster
        self.member_id = member_id
        self.config_path = config_path
        self.cfg: NodeConfig = load_node_config(config_path)
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.stdout_path: Path | None = None
        self.stderr_path: Path | None = None
        self._reader: CountersReader | None = None
        self._counter_ids: dict[str, int] = {}
        self.log_offset = 0
        """Size of the log file when the current process started: its lines come after."""

    # ---------------------------------------------------------------- paths

    @property
    def dir(self) -> Path:
        return self.cfg.node_dir

    @property
    def log_path(self) -> Path:
        return self.cfg.log_file

    @property
    def counters_path(self) -> Path:
        return self.cfg.driver_dir / "counters.dat"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---------------------------------------------------------------- process control

    def spawn(self, extra_args: Iterable[str] = ()) -> tuple[subprocess.Popen, Path, Path]:
        """Start a ``cluster-node run`` process for this member's config, not waiting for READY:
        ``(process, stdout path, stderr path)``. The cluster stops it at the end; :meth:`start`
        makes it this member's process, a test may also start a competing one."""
        self.starts += 1
        out = self.cluster.out_dir
        tag = f"node{self.member_id}.{self.starts}"
        stdout_path, stderr_path = out / f"{tag}.stdout", out / f"{tag}.stderr"
        env = dict(os.environ, PYTHONPATH=str(ROOT), **{DIGEST_DIR_ENV: str(self.cluster.digest_dir)})
        env.pop("PYTHONSTARTUP", None)
        with open(stdout_path, "wb") as so, open(stderr_path, "wb") as se:
            netns = self.cluster.netns
            prefix = netns.command_prefix(self.member_id) if netns is not None else []
            proc = subprocess.Popen(
                [*prefix, *_node_command(), "run", "--config", str(self.config_path), *extra_args],
                stdin=subprocess.DEVNULL,
                stdout=so,
                stderr=se,
                env=env,
                cwd=ROOT,
            )
        self.cluster._all_procs.append(proc)
        return proc, stdout_path, stderr_path

    def start(self) -> None:
        """Start this member's process (not waiting for READY: see :meth:`wait_ready`)."""
        assert not self.running, f"node {self.member_id} is already running (pid {self.pid})"
        self.cluster.leaders.start()
        self._close_reader()
        try:
            self.log_offset = self.log_path.stat().st_size
        except FileNotFoundError:
            self.log_offset = 0
        self.proc, self.stdout_path, self.stderr_path = self.spawn()

    def ready(self) -> bool:
        if self.stdout_path is None:
            return False
        try:
            text = self.stdout_path.read_text(errors="replace")
        except FileNotFoundError:
            return False
        return f"READY member={self.member_id}" in text

    def wait_ready(self, timeout: float = 20.0) -> None:
        self.cluster.wait_for(
            lambda: self.ready() or not self.running,
            timeout,
            f"node {self.member_id} prints READY",
        )
        if not self.ready():
            raise AssertionError(
                f"node {self.member_id} exited ({self.proc.returncode}) before READY\n" + self.cluster.diagnostics()
            )

    def kill(self) -> None:
        """kill -9: a crash."""
        if self.running:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._close_reader()

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM, a graceful stop; waits for the exit and returns its code."""
        if not self.running:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            diag = self.cluster.diagnostics()
            self.kill()
            raise AssertionError(f"node {self.member_id} did not stop within {timeout}s of SIGTERM\n{diag}") from None
        self._close_reader()
        return rc

    def send_sigterm(self) -> None:
        """SIGTERM without waiting (to time what the others do meanwhile)."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)

    # ---------------------------------------------------------------- counters

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
            self._counter_ids = {}

    def counters(self) -> NodeCounters | None:
        """The member's counters, or None when its process is not running or has not yet
        published them (a counters file left by an earlier process is ignored)."""
        if not self.running:
            self._close_reader()
            return None
        if self._reader is None or len(self._counter_ids) < len(_COUNTER_TYPES):
            self._close_reader()
            try:
                reader = CountersReader.open(self.counters_path)
            except (CountersError, OSError, ValueError):
                return None
            if reader.owner_pid != self.proc.pid:
                reader.close()
                return None
            ids: dict[str, int] = {}
            for name, type_id in _COUNTER_TYPES.items():
                found = [c for c in reader.find(type_id=type_id) if c.label.endswith(f"member {self.member_id}")]
                if found:
                    ids[name] = found[0].counter_id
            self._reader, self._counter_ids = reader, ids
            if len(ids) < len(_COUNTER_TYPES):
                return None
        try:
            values = {name: self._reader.get(cid) for name, cid in self._counter_ids.items()}
        except CountersError:
            self._close_reader()
            return None
        return NodeCounters(**values)

    # ---------------------------------------------------------------- logs

    def log_events(self, current_process_only: bool = True) -> list[dict]:
        """The JSON log lines of this member's current (or last) process, or of all its
        processes, parsed; bad lines skipped."""
        try:
            with open(self.log_path, "rb") as f:
                if current_process_only:
                    f.seek(self.log_offset)
                lines = f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def election_states(self) -> list[str]:
        """The ``to_state`` of every election transition of the current process, in order."""
        return [e.get("to_state", "?") for e in self.log_events() if e.get("event") == "election state"]

    def log_tail(self, lines: int = 40, width: int = 400) -> str:
        """The last ``lines`` log lines; a run of lines equal but for their timestamp is shown
        once with its count (a warning repeated per datagram would hide everything else)."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "    (no log file)"
        runs: list[list] = []  # [line, key, count]
        for line in text[-20 * lines :]:
            key = _without_timestamp(line)
            if runs and runs[-1][1] == key:
                runs[-1][2] += 1
            else:
                runs.append([line, key, 1])
        return "\n".join(
            "    " + _shorten(line, width) + (f"  (x{count}, last shown)" if count > 1 else "")
            for line, _key, count in runs[-lines:]
        )

    def stderr_tail(self, lines: int = 25) -> str:
        if self.stderr_path is None:
            return "    (never started)"
        try:
            text = self.stderr_path.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            return "    (no stderr file)"
        return "\n".join("    " + line for line in text) or "    (empty)"

    def describe(self) -> str:
        if self.proc is None:
            status = "never started"
        elif self.running:
            status = f"running pid {self.pid}"
        else:
            status = f"exited rc={self.proc.returncode} (pid {self.pid})"
        c = self.counters()
        return f"node {self.member_id}: {status}; counters {c}" + self._log_stream_positions()

    _STREAM_POSITION_TYPES = {
        CounterType.PUBLISHER_POS: "pub-pos",
        CounterType.SENDER_POSITION: "snd-pos",
        CounterType.SENDER_LIMIT: "snd-lmt",
        CounterType.RECEIVER_HWM: "rcv-hwm",
        CounterType.RECEIVER_POS: "rcv-pos",
        CounterType.SUBSCRIBER_POSITION: "sub-pos",
    }

    def _log_stream_positions(self) -> str:
        """The media positions of the replicated log's UDP stream on this member (where a
        stalled log stands: sender behind, receivers waiting, ...)."""
        if self._reader is None:
            return ""
        marker = f"stream={self.cfg.cluster.log_stream_id} "
        try:
            found = [
                (self._STREAM_POSITION_TYPES[i.type_id], i.value, i.label.split(" ")[1])
                for i in self._reader.counters()
                if i.type_id in self._STREAM_POSITION_TYPES and marker in i.label + " "
            ]
        except (CountersError, IndexError):
            return ""
        return "".join(f"\n    log {name} {value} {session}" for name, value, session in found)
