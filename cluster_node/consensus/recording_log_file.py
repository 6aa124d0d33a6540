"""recording.log on disk: read, repair a torn tail, apply the core's patches with fsync.

The format and every decision live in ``recording_log.RecordingLog`` (core); this shell only moves
bytes. A patch set (``WriteRecordingLog.writes``) is applied in order with ``os.pwrite`` and then
the file is synced once (``os.fsync``), before the next effect runs: a member reports a position
in a term only after the TERM entry is durable.
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from cluster_node.consensus.recording_log import RecordingLog
from cluster_node.media.private_files import FILE_MODE

__all__ = ["RecordingLogFile", "RECORDING_LOG_FILE_NAME"]

RECORDING_LOG_FILE_NAME = "recording.log"

log = structlog.get_logger("recording_log")


class RecordingLogFile:
    """Owns the file descriptor of one node's recording.log."""

    def __init__(self, directory: str | os.PathLike[str], fsync: bool = True) -> None:
        self.path = Path(directory) / RECORDING_LOG_FILE_NAME
        self._fsync = fsync
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        data = b""
        size = os.fstat(self._fd).st_size
        if size:
            data = os.pread(self._fd, size, 0)
        self.log = RecordingLog.decode(data)
        self.repaired_tail_length = self.log.torn_tail_length
        if self.repaired_tail_length:
            # Said once, with what is cut: an entry torn by a crash mid-append is expected, but
            # the operator of a file damaged otherwise must be able to tell what was dropped.
            log.warning(
                "recording.log: a torn last entry cut off",
                path=str(self.path),
                bytes=self.repaired_tail_length,
                entries_kept=len(self.log.entries),
                cut_from_offset=self.log.length,
            )
            os.ftruncate(self._fd, self.log.length)
            self._sync()

    def apply(self, writes: tuple[tuple[int, bytes], ...]) -> None:
        for offset, data in writes:
            written = os.pwrite(self._fd, data, offset)
            if written != len(data):
                raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        if writes:
            self._sync()

    def _sync(self) -> None:
        if self._fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordingLogFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
