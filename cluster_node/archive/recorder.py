"""Recording sessions: one image of a stream written to one recording.

A :class:`RecordingSession` takes the image's raw frames in blocks (``Image.block_poll``: whole
frames, headers included, at most one term) and writes each block with one call to the segment
writer, so a busy stream costs one ``pwrite`` per block rather than one per message. After each
batch it publishes the recording position in its counter (the consensus module reads that as its
append position) and wakes whoever follows the recording (live replays, replications).

Life cycle::

    RECORDING --(image unavailable / end of stream / stop request)--> STOPPED

A session is driven by the conductor task that owns the subscription (``do_work`` after every
wake-up); it never awaits itself, so one task can drive all sessions of a subscription.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import structlog

from cluster_node.archive.storage import SegmentWriter
from cluster_node.media import framescan

__all__ = ["RecordingSession", "RecordingState", "DEFAULT_BLOCK_LENGTH"]

log = structlog.get_logger("archive.recorder")

DEFAULT_BLOCK_LENGTH = 1024 * 1024
"""Largest block handed to one write (the reference's file I/O max length)."""


class RecordingState(enum.Enum):
    RECORDING = "RECORDING"
    STOPPED = "STOPPED"


class RecordingSession:
    """Writes one image to one recording; ``do_work`` moves what has arrived to the file."""

    def __init__(
        self,
        *,
        recording_id: int,
        image,
        writer: SegmentWriter,
        position_counter,
        subscription_id: int,
        control_session_id: int,
        correlation_id: int,
        auto_stop: bool,
        on_progress: Callable[[int, int], None],
        block_length: int = DEFAULT_BLOCK_LENGTH,
        max_blocks_per_work: int = 16,
        on_write_failed: Callable[[int, str, OSError], None] | None = None,
    ) -> None:
        self.recording_id = recording_id
        self.image = image
        self.writer = writer
        self.counter = position_counter
        self.subscription_id = subscription_id
        self.control_session_id = control_session_id
        self.correlation_id = correlation_id
        self.auto_stop = auto_stop
        self.state = RecordingState.RECORDING
        self.position = writer.position
        self.stop_requested = False
        self.error: str | None = None
        self.invoked = False
        """A duty cycle of this thread writes the recording itself after each append
        (ArchiveConductor.record_now): the recording task need not be woken for its data."""
        self._on_progress = on_progress
        self._on_write_failed = on_write_failed
        self._block_length = block_length
        self._max_blocks = max_blocks_per_work
        self._write = writer.write_block
        # Block polls follow frame chains with numpy (cluster_node.media.framescan): import it now rather than
        # inside the first block, where it would stall the recording by some 0.2 s.
        framescan.numpy_module()
        position_counter.set(self.position)

    def do_work(self) -> int:
        """Write what the image has; return the bytes written (0: nothing new)."""
        if self.state is not RecordingState.RECORDING:
            return 0
        poll = self.image.block_poll
        write = self._write
        total = 0
        try:
            for _ in range(self._max_blocks):
                n = poll(write, self._block_length)
                if n == 0:
                    break
                total += n
        except OSError as e:
            # A full or failing disk: stop this recording where its data ends, loudly.
            self.error = f"recording {self.recording_id}: write failed at {self.writer.position}: {e.strerror or e}"
            log.error("recording write failed", recording_id=self.recording_id, error=str(e))
            self.stop_requested = True
            if self._on_write_failed is not None:
                self._on_write_failed(self.recording_id, self.error, e)
        if total:
            self.position = self.writer.position
            self.counter.set(self.position)
            self._on_progress(self.recording_id, self.position)
        return total

    @property
    def image_gone(self) -> bool:
        return self.image.closed

    def close(self) -> int:
        """Stop: drain nothing more, close the file and the counter; return the stop position."""
        if self.state is RecordingState.RECORDING:
            self.state = RecordingState.STOPPED
            self.position = self.writer.position
            self.writer.close()
            self.counter.close()
        return self.position
