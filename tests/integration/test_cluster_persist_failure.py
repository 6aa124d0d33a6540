"""A member whose disk refuses a durable write stops (exit PERSIST_FAILED) before it acts on it.

Real processes, real files: the fault is the system call failing inside the running member,
injected by ``strace`` (attached to the member, injecting only on calls that touch the one file,
``-P``): EIO from the sync of node-state.dat, ENOSPC from the write of node-state.dat or of
recording.log.

The member's vote is what must not leave it when its candidate term could not be persisted: the
leader is killed, so the member is asked for a vote (or nominates itself) in a new term; it must
exit 7 with one line naming the file and the error, and the survivor must never have been voted
for by it (no "voted for member f" on the survivor, no survivor leading on its vote). The old
leader then comes back and the two healthy members elect a leader: the failed member does not
block the cluster.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from cluster_node.exit_codes import ExitCode
from tests.support.cluster import TestCluster

EXPECTED = [r'"exit_code": 7, "reason": "could not write .*"event": "node failed"']
"""The failing member's own ERROR line, which the test causes."""

pytestmark = pytest.mark.skipif(
    shutil.which("strace") is None or os.geteuid() != 0, reason="needs strace and ptrace rights over the member (root)"
)


class _Injector:
    """``strace -p pid -P path -e inject=call:error=ERR``: from now on every ``call`` of the
    member on ``path`` fails with ``ERR`` (and does nothing)."""

    def __init__(self, cluster: TestCluster, pid: int, path: Path, call: str, error: str, out: Path) -> None:
        self.err_path = out.with_suffix(".stderr")
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    "strace",
                    "-f",
                    "-p",
                    str(pid),
                    "-P",
                    str(path),
                    "-e",
                    "trace=pwrite64,fsync,fdatasync",
                    "-e",
                    f"inject={call}:error={error}",
                    "-o",
                    str(out),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        # Attached to every thread once it says so (and before that nothing is injected).
        cluster.wait_for(
            lambda: "attached" in self.err_path.read_text(errors="replace") or self.proc.poll() is not None,
            30,
            "strace attaches to the member",
        )
        assert self.proc.poll() is None, self.err_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # detaches; the member (if alive) runs on
            self.proc.wait(timeout=30)


def _one_line(node) -> str:
    lines = [ln for ln in node.stderr_path.read_text(errors="replace").splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def _reasons(node) -> list[tuple[str, str]]:
    return [
        (e.get("to_state", "?"), e.get("reason", "")) for e in node.log_events() if e.get("event") == "election state"
    ]


@pytest.mark.parametrize("call,error", [("fdatasync", "EIO"), ("pwrite64", "ENOSPC")])
def test_a_member_that_cannot_persist_its_candidate_term_stops_without_voting(tmp_path, call, error):
    with TestCluster(tmp_path, expected_errors=EXPECTED) as c:
        leader = c.start()
        f, g = [i for i in range(3) if i != leader]
        failing, survivor = c.nodes[f], c.nodes[g]
        path = (failing.dir / "node-state.dat").resolve()
        before = len(_reasons(survivor))
        injector = _Injector(c, failing.pid, path, call, error, tmp_path / "strace.out")
        try:
            c.nodes[leader].kill()
            c.wait_for(lambda: not failing.running, 60, f"member {f} stops on the failed write")
        finally:
            injector.close()
        assert failing.proc.returncode == int(ExitCode.PERSIST_FAILED), failing.stderr_tail()
        line = _one_line(failing)
        assert str(path) in line and os.strerror(getattr(errno, error)) in line, line
        assert "INJECTED" in (tmp_path / "strace.out").read_text()

        seen = _reasons(survivor)[before:]
        assert ("FOLLOWER_BALLOT", f"voted for member {f}") not in seen, seen
        assert not any(state.startswith("LEADER") for state, _ in seen), seen  # it had no second vote

        c.restart(leader)
        c.wait_for_leader(60)
        assert f not in {c.leader()}


def test_a_member_that_cannot_write_its_recording_log_stops_with_one_line(tmp_path):
    with TestCluster(tmp_path, expected_errors=EXPECTED) as c:
        leader = c.start()
        f = next(i for i in range(3) if i != leader)
        failing = c.nodes[f]
        path = (failing.dir / "recording.log").resolve()
        injector = _Injector(c, failing.pid, path, "pwrite64", "ENOSPC", tmp_path / "strace.out")
        try:
            c.nodes[leader].kill()  # the next leadership term is a new entry in recording.log
            c.wait_for(lambda: not failing.running, 60, f"member {f} stops on the failed write")
        finally:
            injector.close()
        assert failing.proc.returncode == int(ExitCode.PERSIST_FAILED), failing.stderr_tail()
        line = _one_line(failing)
        assert str(path) in line and os.strerror(errno.ENOSPC) in line, line
        c.restart(leader)
        c.wait_for_leader(60)
