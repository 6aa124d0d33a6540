"""The archive's requests that change a recording's extent: truncate, purge, detach, delete detached, attach.

A part of :class:`cluster_node.archive.conductor.Archive` (a base class of it), kept apart because these
requests share their own rules: the recording must be quiet (not recording, no replay or
replication reading it), the catalog change and the file change go in the crash-safe order of
``cluster_node.archive.segment_files``, and nothing a reader still needs is removed.
"""

from __future__ import annotations

import time

import structlog

from cluster_node.archive import codecs as c
from cluster_node.archive.catalog_layout import RecordingDescriptor, RecordingState
from cluster_node.archive.control_session import ArchiveRequestError, ControlSession
from cluster_node.archive.segment_files import (
    attach_front,
    delete_detached_segments,
    delete_segments,
    detach_front,
    truncate_segments,
)
from cluster_node.archive.segments import (
    NULL_POSITION,
    is_aligned,
)

log = structlog.get_logger("archive.conductor")
E = c.ArchiveErrorCode


class ExtentRequests:
    """Truncate, purge, detach, delete detached and attach (see the module docstring)."""

    def _check_quiet(self, recording_id: int, what: str) -> RecordingDescriptor:
        d = self._descriptor(recording_id)
        if recording_id in self.active_recordings or recording_id in self.extending or d.stop_position == NULL_POSITION:
            raise ArchiveRequestError(E.ACTIVE_RECORDING, f"cannot {what} recording {recording_id}: it is active")
        if any(rp.recording_id == recording_id and not rp.done for rp in self.replays.values()):
            raise ArchiveRequestError(E.GENERIC, f"cannot {what} recording {recording_id}: it is being replayed")
        return d

    def _on_TruncateRecordingRequest(self, session: ControlSession, r: c.TruncateRecordingRequest) -> None:
        self.truncate_recording(r.recording_id, r.position)
        session.ok(r.correlation_id)

    def truncate_recording(self, recording_id: int, position: int) -> None:
        d = self._check_quiet(recording_id, "truncate")
        if not is_aligned(position):
            raise ArchiveRequestError(E.GENERIC, f"truncate position {position} is not 32-byte aligned")
        if not d.start_position <= position <= d.stop_position:
            raise ArchiveRequestError(
                E.GENERIC,
                f"truncate position {position} is outside recording {recording_id}'s [{d.start_position}, {d.stop_position}]",
            )
        # Catalog first: a crash before the files shrink is repaired by recovery.
        self.catalog.update_recording_stopped(recording_id, position, time.time_ns())
        self.store.flush()
        truncate_segments(self.dir, d, position, self.config.sync_level)
        log.info("recording truncated", recording_id=recording_id, position=position)

    def _on_PurgeRecordingRequest(self, session: ControlSession, r: c.PurgeRecordingRequest) -> None:
        d = self._check_quiet(r.recording_id, "purge")
        self.catalog.change_state(r.recording_id, RecordingState.DELETED)
        self.store.flush()
        delete_segments(self.dir, r.recording_id)
        session.ok(r.correlation_id)
        session.signal(r.correlation_id, r.recording_id, c.NULL_VALUE, d.stop_position, c.RecordingSignal.DELETE)

    def _end_position(self, d: RecordingDescriptor) -> int:
        """Where the recording's data ends now: the live position of an active one, else its stop."""
        session = self.active_recordings.get(d.recording_id)
        if session is not None:
            return session.position
        return d.stop_position if d.stop_position != NULL_POSITION else d.start_position

    def _check_no_reader_before(self, recording_id: int, position: int, what: str) -> None:
        for rp in self.replays.values():
            if rp.recording_id == recording_id and not rp.done and rp.position < position:
                raise ArchiveRequestError(
                    E.GENERIC,
                    f"cannot {what} recording {recording_id} to {position}: a replay reads it at {rp.position}",
                )

    def detach_segments(self, recording_id: int, new_start_position: int) -> RecordingDescriptor:
        """Move the start of a recording (active or not) forward to a segment base; the files
        before it stay, detached (segment_files.detach_front has the rules and the crash order)."""
        d = self._descriptor(recording_id)
        self._check_no_reader_before(recording_id, new_start_position, "detach")
        try:
            return detach_front(self.store, recording_id, new_start_position, self._end_position(d))
        except ValueError as e:
            raise ArchiveRequestError(E.GENERIC, str(e)) from None

    def purge_segments(self, recording_id: int, new_start_position: int) -> int:
        """Detach, then delete the detached files (catalog first: see segment_files.detach_front)."""
        self.detach_segments(recording_id, new_start_position)
        deleted = delete_detached_segments(self.dir, self.catalog.get(recording_id), self.config.sync_level)
        log.info(
            "recording segments purged", recording_id=recording_id, start_position=new_start_position, files=deleted
        )
        return deleted

    def _on_DetachSegmentsRequest(self, session: ControlSession, r: c.DetachSegmentsRequest) -> None:
        self.detach_segments(r.recording_id, r.new_start_position)
        session.ok(r.correlation_id)

    def _on_DeleteDetachedSegmentsRequest(self, session: ControlSession, r: c.DeleteDetachedSegmentsRequest) -> None:
        d = self._descriptor(r.recording_id)
        session.ok(r.correlation_id, delete_detached_segments(self.dir, d, self.config.sync_level))

    def _on_PurgeSegmentsRequest(self, session: ControlSession, r: c.PurgeSegmentsRequest) -> None:
        session.ok(r.correlation_id, self.purge_segments(r.recording_id, r.new_start_position))

    def _on_AttachSegmentsRequest(self, session: ControlSession, r: c.AttachSegmentsRequest) -> None:
        self._descriptor(r.recording_id)
        session.ok(r.correlation_id, attach_front(self.store, r.recording_id))
