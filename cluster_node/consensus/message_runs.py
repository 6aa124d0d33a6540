"""Runs of client session messages handled as one block, not one Python call each (core).

Why
===
At full load a leader's ingress image holds hundreds of session messages when its duty cycle
comes round (``scripts/cluster_cpu.py --max`` shows most polls taking the fragment limit), and
a follower's log adapter finds as many newly committed. Taken one by one, each costs a
handler call and a header unpack, and on the leader a session lookup, a copy into a bytearray,
a timestamp pack and an offer: a large share of the leader's CPU per message. Yet such a
run is uniform: one frame per message, each a session message whose 32-byte session header
names the same session and term.

How
===
The image finds the run's frames with numpy (``Image.frames_poll``, cluster_node.media.framescan); the
functions here check them all at once and keep the longest leading part that the per-message
path would have treated the same way.

- Leader, ingress (:func:`session_run`): unfragmented data frames, each a session message of
  at least its 32-byte header, all of one cluster session and one leadership term. The session
  and term are checked once for the run (``ClusterSessions.on_ingress``), and the frames are
  copied into the log with one ``ExclusivePublication.offer_frames``, which rewrites their
  headers and lets :func:`stamp_timestamps` write the leader's timestamp into each before any
  reader sees them. The log's bytes are exactly those of one offer per message.
- Follower, log adapter (:func:`client_run`): committed entries that are client session
  messages concern only the service, not the module (service messages, negative session ids,
  and every other entry do), so a run of them is stepped over as a whole.

Anything else at the head of the run (a keep-alive, a connect request, a fragment, padding, a
message of another session, an event, bad bytes) ends it; the per-message path then takes it and
does what it always did (count and drop what is bad). So does a log that refuses the block (back
pressure, the end of a term): the per-message path queues or rotates as before.
"""

from __future__ import annotations

import struct

from cluster_node.codecs import SESSION_HEADER_LENGTH, SESSION_PREFIX_WORD, SESSION_TIMESTAMP_OFFSET
from cluster_node.media.frames import FLAG_UNFRAGMENTED, HEADER_LENGTH, TYPE_DATA, VERSION
from cluster_node.media.framescan import numpy_module

__all__ = ["client_run", "fit", "last_timestamp", "session_run", "stamp_timestamps"]

_DATA_WORD = VERSION | (FLAG_UNFRAGMENTED << 8) | (TYPE_DATA << 16)
"""A frame header's second int32 (version, flags, type) for an unfragmented data frame."""
_MIN_FRAME = HEADER_LENGTH + SESSION_HEADER_LENGTH
_TIMESTAMP_AT = HEADER_LENGTH + SESSION_TIMESTAMP_OFFSET
_I64 = struct.Struct("<q")


def session_run(buffer, offset: int, starts, length: int, max_frame_length: int) -> tuple[int, int, int, int]:
    """``(count, end, leadership_term_id, cluster_session_id)``: the leading ``count`` frames of
    ``buffer[offset:offset + length]`` (frame starts ``starts``, relative offsets as
    ``cluster_node.media.framescan.chain`` gives them, ``length`` where the last frame ends) are unfragmented
    data frames of at most ``max_frame_length`` bytes holding session messages of that one
    session and term, and end at relative offset ``end``. ``count`` 0 when the first frame is
    not one.

    ``max_frame_length`` is the log's MTU: a client whose MTU is larger sends frames the log may
    not hold as they are (a replay of the log uses the log's MTU, and its sender never splits a
    frame); such a message takes the per-message path, whose offer fragments it as the log's."""
    np = numpy_module()
    count, w64, at = _session_messages(np, buffer, offset, starts, length)
    if count == 0:
        return 0, 0, 0, 0
    w32 = np.frombuffer(buffer, dtype="<i4", count=length >> 2, offset=offset)
    terms = w64[at + 1]
    sessions = w64[at + 2]
    term_id = int(terms[0])
    session_id = int(sessions[0])
    ok = (terms == term_id) & (sessions == session_id) & (w32[starts[:count] >> 2] <= max_frame_length)
    count = _leading(np, ok, count)
    if count == 0:
        return 0, 0, 0, 0
    return count, _end(starts, count, length), term_id, session_id


def client_run(buffer, offset: int, starts, length: int) -> int:
    """Where the leading run of client session messages ends (a relative offset: 0 when the
    first frame is not one): unfragmented data frames, each a session message with a session
    id of zero or more (``starts``, ``length`` as in :func:`session_run`)."""
    np = numpy_module()
    count, w64, at = _session_messages(np, buffer, offset, starts, length)
    if count == 0:
        return 0
    return _end(starts, _leading(np, w64[at + 2] >= 0, count), length)


def last_timestamp(buffer, offset: int, starts, end: int) -> int:
    """The timestamp in the session header of the last frame of a run that ends at relative
    offset ``end`` (as :func:`client_run` returned it, > 0): what the log's cluster time had
    reached there (consensus.cluster_clock)."""
    np = numpy_module()
    last = int(starts[int(np.searchsorted(starts, end, side="left")) - 1])
    return _I64.unpack_from(buffer, offset + last + _TIMESTAMP_AT)[0]


def _session_messages(np, buffer, offset: int, starts, length: int):
    """``(count, words, at)``: the leading ``count`` frames are unfragmented data frames, each
    holding a whole 32-byte session header; ``words`` is the run as int64s and ``at`` the index
    in it of each of those frames' session header."""
    total = starts.size
    if total == 0:
        return 0, None, None
    w32 = np.frombuffer(buffer, dtype="<i4", count=length >> 2, offset=offset)
    head = starts >> 2
    count = _leading(np, (w32[head + 1] == _DATA_WORD) & (w32[head] >= _MIN_FRAME), total)
    if count == 0:
        return 0, None, None
    # Every frame kept holds a whole session header: its words are inside the frame.
    w64 = np.frombuffer(buffer, dtype="<i8", count=length >> 3, offset=offset)
    at = (starts[:count] + HEADER_LENGTH) >> 3
    count = _leading(np, w64[at] == SESSION_PREFIX_WORD, count)
    return count, w64, at[:count]


def _end(starts, count: int, length: int) -> int:
    """Where the first ``count`` frames of a run of ``starts.size`` frames ending at ``length`` end."""
    return int(starts[count]) if count < starts.size else length


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
