"""The exit codes of a cluster node process (``cluster-node run``), one per kind of ending.

A supervisor (systemd, ``cluster-node up``, a test) must be able to tell "asked to stop and
stopped" from every kind of failure without reading logs, so a node exits 0 only after a
SIGTERM/SIGINT or a cluster SHUTDOWN/ABORT that it carried out, and every failure has a code of
its own, printed with one line on stderr that says why (the node log has the details).

A failure after start-up ends the process at once (:func:`fail`), as a crash would: the node's
files are built to survive kill -9 at any moment, and a node whose driver, archive or service is
in an unknown state must not go on acting as a member. The table is documented for operators in
docs/operations.md; its numbers are part of the interface and never change meaning.
"""

from __future__ import annotations

import enum
import sys

__all__ = ["ExitCode", "NodeFailure", "fail"]


class ExitCode(enum.IntEnum):
    OK = 0
    """Asked to stop (SIGTERM, SIGINT, a cluster SHUTDOWN or ABORT) and stopped cleanly."""
    START_FAILED = 1
    """Could not start: a bad config, a directory in use, a port taken (click's error exit)."""
    USAGE = 2
    """The command line was wrong (click's usage exit)."""
    SERVICE_FAILED = 3
    """The clustered service's thread died (its state no longer follows the log)."""
    DRIVER_FAILED = 4
    """A task of the media driver failed."""
    ARCHIVE_FAILED = 5
    """A task of the archive failed."""
    CONSENSUS_FAILED = 6
    """The consensus module's duty cycle failed."""
    PERSIST_FAILED = 7
    """State that must be on disk before the node acts on it could not be written."""
    SERVICE_ERROR_STOP = 8
    """A service callback raised and the config's policy is to stop (``service_errors = "stop"``)."""
    DATA_DAMAGED = 9
    """A file of the node is damaged (the catalog, the recorded log, recording.log, node-state,
    a snapshot): the node will not use, serve or cut it; the line names it and what to do."""
    STORAGE_FAILED = 10
    """The archive could not write (a full disk: ENOSPC, a quota; or EIO): a member that cannot
    record its log can neither append nor acknowledge, so it leaves the cluster at once and the
    others go on; free space (``cluster-node tool purge-log``, ``cluster.purge_log``) and start it
    again, and it catches up."""
    SNAPSHOT_NEEDED = 11
    """The member's log ends before the leader's log starts (the leader purged it after a
    snapshot): recording.log was moved aside, and the next start copies the leader's snapshot."""
    BACKUP_REFUSED = 12
    """A cluster member's authenticator refused the backup's query (``cluster-node backup``: no
    or wrong ``backup.credentials_file``); the line gives the member's reason."""
    INTERNAL = 70
    """Any other unexpected error (a bug): the log file has the traceback."""


class NodeFailure(Exception):
    """A failure that ends the node with ``code``; ``str()`` is the one line for the operator."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def fail(code: ExitCode, message: str, **details) -> None:
    """End this process now with ``code``: one ERROR line in the node log (with ``details``),
    one line on stderr, then ``os._exit``.

    No unwinding: other threads (the service) and tasks would go on touching shared memory that
    the unwinding unmaps, and a stuck close would keep a failed member around. What was
    acknowledged is on disk already (the files are made for kill -9)."""
    # Imported here, not at the top: the codes are named by sans-I/O cores (effect_policy), which
    # must not import logging or the OS through this module.
    import os

    import structlog

    try:
        structlog.get_logger("node").error("node failed", exit_code=int(code), reason=message, **details)
    except Exception:  # noqa: BLE001 - the exit must happen whatever logging does
        pass
    try:
        print(f"error: {message} (exit code {int(code)})", file=sys.stderr, flush=True)
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(int(code))
