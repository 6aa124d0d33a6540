"""A leader's clients' session messages into the log a block at a time, not one offer each (core).

Why
===
At full load a client's ingress image holds hundreds of session messages when the leader's
duty cycle comes round (``scripts/cluster_cpu.py --max``: 256 a poll, the fragment limit, in
nine polls of ten). Taken one by one, each costs a handler call, a header unpack, a session
lookup, a copy into a bytearray, a timestamp pack and an offer: about 3 µs, a fifth of the
leader's CPU per message. Yet such a run is already nearly the log's bytes: one frame per
message, each a session message whose 32-byte session header names the same session and term.
Only the frame headers (term offset, ids) and the timestamp the leader gives every entry differ.

How
===
The ingress image finds the run's frames with numpy (``Image.frames_poll``, media.framescan);
:func:`session_run` checks them all at once and keeps the longest leading part the per-message
path would have appended unchanged: unfragmented data frames, each a session message of at
least its 32-byte header, all of one cluster session and one leadership term. The session and
term are checked once for the run (``ClusterSessions.on_ingress``), and the frames are copied
into the log with one ``ExclusivePublication.offer_frames``, which rewrites their headers and
lets :func:`stamp_timestamps` write the leader's timestamp into each before any reader sees
them. The log's bytes are exactly those of one offer per message.

Anything else at the head of the image (a keep-alive, a connect request, a fragment, padding, a
message of another session, bad bytes) ends the run; the per-message path then takes it and does
what it always did (count and drop what is bad). So does a log that refuses the block (back
pressure, the end of a term): the per-message path queues or rotates as before.
"""

from __future__ import annotations

from media.framescan import numpy_module
from media.frames import FLAG_UNFRAGMENTED, HEADER_LENGTH, TYPE_DATA, VERSION

from cluster_node.codecs import SESSION_HEADER_LENGTH, SESSION_PREFIX_WORD, SESSION_TIMESTAMP_OFFSET

__all__ = ["fit", "session_run", "stamp_timestamps"]

_DATA_WORD = VERSION | (FLAG_UNFRAGMENTED << 8) | (TYPE_DATA << 16)
"""A frame header's second int32 (version, flags, type) for an unfragmented data frame."""
_MIN_FRAME = HEADER_LENGTH + SESSION_HEADER_LENGTH
_TIMESTAMP_AT = HEADER_LENGTH + SESSION_TIMESTAMP_OFFSET


def session_run(buffer, offset: int, starts, length: int) -> tuple[int, int, int, int]:
    """``(count, end, leadership_term_id, cluster_session_id)``: the leading ``count`` frames of
    ``buffer[offset:offset + length]`` (frame starts ``starts``, relative offsets as
    ``media.framescan.chain`` gives them, ``length`` where the last frame ends) are unfragmented
    data frames holding session messages of that one session and term, and end at relative
    offset ``end``. ``count`` 0 when the first frame is not one."""
    np = numpy_module()
    total = starts.size
    if total == 0:
        return 0, 0, 0, 0
    w32 = np.frombuffer(buffer, dtype="<i4", count=length >> 2, offset=offset)
    at = starts >> 2
    ok = (w32[at + 1] == _DATA_WORD) & (w32[at] >= _MIN_FRAME)
    count = _leading(np, ok, total)
    if count == 0:
        return 0, 0, 0, 0
    # Every frame kept so far holds a whole session header: its words are inside the frame.
    w64 = np.frombuffer(buffer, dtype="<i8", count=length >> 3, offset=offset)
    at = (starts[:count] + HEADER_LENGTH) >> 3
    terms = w64[at + 1]
    sessions = w64[at + 2]
    term_id = int(terms[0])
    session_id = int(sessions[0])
    ok = (w64[at] == SESSION_PREFIX_WORD) & (terms == term_id) & (sessions == session_id)
    count = _leading(np, ok, count)
    if count == 0:
        return 0, 0, 0, 0
    end = int(starts[count]) if count < total else length
    return count, end, term_id, session_id


def fit(starts, count: int, end: int, room: int) -> tuple[int, int]:
    """``(count, end)`` of the leading frames of a run that end within ``room`` bytes."""
    if end <= room:
        return count, end
    np = numpy_module()
    # Frame i ends where frame i + 1 starts; the frames that fit are those whose end <= room.
    k = int(np.searchsorted(starts[1:count], room, side="right"))
    return k, (int(starts[k]) if k else 0)


def stamp_timestamps(buffer, offset: int, starts, timestamp: int) -> None:
    """Write ``timestamp`` into the session header of every frame at ``starts`` (relative to
    ``offset``): the leader's clock, as the per-message path writes it."""
    np = numpy_module()
    w64 = np.frombuffer(buffer, dtype="<i8", count=(int(starts[-1]) + _MIN_FRAME) >> 3, offset=offset)
    w64[(starts + _TIMESTAMP_AT) >> 3] = timestamp


def _leading(np, ok, n: int) -> int:
    """How many of the first ``n`` entries of the boolean array ``ok`` are True before the first False."""
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else n
