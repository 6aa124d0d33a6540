"""Transport frames on the wire and in log buffers (core).

Every frame starts with the same 8 bytes, little-endian::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                         frame length                          |   i32 (0 = not yet written)
    +---------------+---------------+-------------------------------+
    |    version    |     flags     |              type             |   u8, u8 (B 0x80 E 0x40 EOS 0x20), u16
    +---------------+---------------+-------------------------------+

DATA and PAD frames (32-byte header, then the payload; frames are 32-byte aligned)::

    8  term offset  i32 | 12 session id  i32 | 16 stream id  i32 | 20 term id  i32 | 24 reserved value  i64

A *heartbeat* is a DATA header with frame length 0 sent on its own: its term id / term offset
carry the sender's position; with the EOS flag it says the publication has ended there.

SETUP (40)::   8 term offset | 12 session | 16 stream | 20 initial term id | 24 active term id
               28 term length | 32 mtu | 36 ttl                                            (all i32)
STATUS (36)::  8 session | 12 stream | 16 consumption term id | 20 consumption term offset
               24 receiver window i32 | 28 receiver id i64.     flag 0x80 = "send me a SETUP"
NAK (28)::     8 session | 12 stream | 16 term id | 20 term offset | 24 length
RTTM (40)::    8 session | 12 stream | 16 echo timestamp i64 | 24 reception delta i64
               32 receiver id i64.                              flag 0x80 = reply

One datagram carries either one control frame (SETUP, STATUS, NAK, RTTM, heartbeat) or a run of
whole DATA/PAD frames that are contiguous in one term. Everything that arrives from the network is
checked by :func:`decode_untrusted` / :func:`check_data_run`, which raise only :class:`FrameError`.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "FrameError",
    "HEADER_LENGTH",
    "FRAME_ALIGNMENT",
    "frame_step",
    "VERSION",
    "FLAG_BEGIN",
    "FLAG_END",
    "FLAG_UNFRAGMENTED",
    "FLAG_EOS",
    "FLAG_SEND_SETUP",
    "FLAG_RTTM_REPLY",
    "TYPE_PAD",
    "TYPE_DATA",
    "TYPE_NAK",
    "TYPE_SM",
    "TYPE_ERR",
    "TYPE_SETUP",
    "TYPE_RTTM",
    "SETUP_LENGTH",
    "SM_LENGTH",
    "NAK_LENGTH",
    "RTTM_LENGTH",
    "DATA_HEADER",
    "align",
    "DataHeader",
    "Heartbeat",
    "Setup",
    "StatusMessage",
    "Nak",
    "Rttm",
    "DataRun",
    "encode_data_header",
    "encode_heartbeat",
    "encode_setup",
    "encode_status",
    "encode_nak",
    "encode_rttm",
    "decode_untrusted",
    "check_data_run",
    "compute_position",
    "term_id_at",
    "wrap_i32",
    "max_message_length",
    "term_window",
]


class FrameError(ValueError):
    """Bytes from the network that are not a valid frame. The only error the decoders raise."""


HEADER_LENGTH = 32
FRAME_ALIGNMENT = 32
VERSION = 0

FLAG_BEGIN = 0x80
FLAG_END = 0x40
FLAG_UNFRAGMENTED = FLAG_BEGIN | FLAG_END
FLAG_EOS = 0x20
FLAG_SEND_SETUP = 0x80  # on STATUS frames
FLAG_RTTM_REPLY = 0x80  # on RTTM frames

TYPE_PAD = 0
TYPE_DATA = 1
TYPE_NAK = 2
TYPE_SM = 3
TYPE_ERR = 4
TYPE_SETUP = 5
TYPE_RTTM = 6

SETUP_LENGTH = 40
SM_LENGTH = 36
NAK_LENGTH = 28
RTTM_LENGTH = 40

# Precompiled structs; the hot paths bind their pack_into / unpack_from methods.
DATA_HEADER = struct.Struct("<iBBHiiiiq")
_PREFIX = struct.Struct("<iBBH")
_RUN_STEP = struct.Struct("<iBBHi")
_SETUP = struct.Struct("<iBBHiiiiiiii")
_SM = struct.Struct("<iBBHiiiiiq")
_NAK = struct.Struct("<iBBHiiiii")
_RTTM = struct.Struct("<iBBHiiqqq")
assert DATA_HEADER.size == HEADER_LENGTH and _SETUP.size == SETUP_LENGTH
assert _SM.size == SM_LENGTH and _NAK.size == NAK_LENGTH and _RTTM.size == RTTM_LENGTH

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def align(length: int) -> int:
    """Round a frame length up to the 32-byte frame alignment."""
    return (length + (FRAME_ALIGNMENT - 1)) & ~(FRAME_ALIGNMENT - 1)


def wrap_i32(value: int) -> int:
    """``value`` as the int32 it becomes on the wire (term ids wrap from 2**31 - 1 to -2**31)."""
    return (value + 2**31) % 2**32 - 2**31


def compute_position(term_id: int, term_offset: int, initial_term_id: int, position_bits: int) -> int:
    """Stream position of (term id, term offset).

    ``((term id - initial term id) << bits) + offset``, where the term count is the int32
    difference: term ids wrap, so a stream that started at term id 2**31 - 2 is at term count 3
    when its term id reads -2**31 + 1.
    """
    return (wrap_i32(term_id - initial_term_id) << position_bits) + term_offset


def term_id_at(position: int, initial_term_id: int, position_bits: int) -> int:
    """The (wrapped, int32) term id of the term holding ``position``."""
    return wrap_i32(initial_term_id + (position >> position_bits))


def max_message_length(term_length: int) -> int:
    """The largest message a publication accepts: min(term length / 8, 16 MiB)."""
    return min(term_length // 8, 16 * 1024 * 1024)


def frame_step(frame_length: int) -> int:
    """How far the next frame starts after a frame of ``frame_length`` bytes: its length rounded
    up to FRAME_ALIGNMENT, for DATA and PAD frames alike. The one definition every walker of a
    log buffer uses (validation, polling, scanning), so that what :func:`check_data_run` let
    into an image is read back frame by frame exactly as it was checked; a walker that stepped
    over padding by its raw length once read a forged header hidden behind a short pad."""
    return (frame_length + 31) & ~31


def term_window(term_length: int) -> int:
    """The most a publisher may run ahead of its slowest reader (IPC) or its sender (UDP), and
    the most a receiver's window may grant: half a term, so a term is never written while it is
    still being read. Also the longest block a publication can ever admit at once."""
    return term_length // 2


class DataHeader(NamedTuple):
    frame_length: int
    version: int
    flags: int
    type: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int


class Heartbeat(NamedTuple):
    flags: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int

    @property
    def is_eos(self) -> bool:
        return bool(self.flags & FLAG_EOS)


class Setup(NamedTuple):
    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu: int
    ttl: int


class StatusMessage(NamedTuple):
    flags: int
    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int

    @property
    def wants_setup(self) -> bool:
        return bool(self.flags & FLAG_SEND_SETUP)


class Nak(NamedTuple):
    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int


class Rttm(NamedTuple):
    flags: int
    session_id: int
    stream_id: int
    echo_timestamp_ns: int
    reception_delta_ns: int
    receiver_id: int

    @property
    def is_reply(self) -> bool:
        return bool(self.flags & FLAG_RTTM_REPLY)


class DataRun(NamedTuple):
    """A datagram of whole DATA/PAD frames, contiguous in one term, already checked."""

    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    flags: int  # flags of the first frame
    length: int  # bytes in the datagram
    covered: int  # bytes of the term the run covers (a trailing padding frame covers the term's end)


# ---------------------------------------------------------------------------- encoders


def encode_data_header(
    frame_length: int,
    flags: int,
    term_offset: int,
    session_id: int,
    stream_id: int,
    term_id: int,
    reserved_value: int = 0,
    frame_type: int = TYPE_DATA,
) -> bytes:
    return DATA_HEADER.pack(
        frame_length, VERSION, flags, frame_type, term_offset, session_id, stream_id, term_id, reserved_value
    )


def encode_heartbeat(term_offset: int, session_id: int, stream_id: int, term_id: int, eos: bool = False) -> bytes:
    flags = FLAG_UNFRAGMENTED | (FLAG_EOS if eos else 0)
    return DATA_HEADER.pack(0, VERSION, flags, TYPE_DATA, term_offset, session_id, stream_id, term_id, 0)


def encode_setup(s: Setup) -> bytes:
    return _SETUP.pack(SETUP_LENGTH, VERSION, 0, TYPE_SETUP, *s)


def encode_status(
    session_id: int,
    stream_id: int,
    consumption_term_id: int,
    consumption_term_offset: int,
    receiver_window: int,
    receiver_id: int,
    send_setup: bool = False,
) -> bytes:
    return _SM.pack(
        SM_LENGTH,
        VERSION,
        FLAG_SEND_SETUP if send_setup else 0,
        TYPE_SM,
        session_id,
        stream_id,
        consumption_term_id,
        consumption_term_offset,
        receiver_window,
        receiver_id,
    )


def encode_nak(session_id: int, stream_id: int, term_id: int, term_offset: int, length: int) -> bytes:
    return _NAK.pack(NAK_LENGTH, VERSION, 0, TYPE_NAK, session_id, stream_id, term_id, term_offset, length)


def encode_rttm(
    session_id: int, stream_id: int, echo_timestamp_ns: int, reception_delta_ns: int, receiver_id: int, reply: bool
) -> bytes:
    return _RTTM.pack(
        RTTM_LENGTH,
        VERSION,
        FLAG_RTTM_REPLY if reply else 0,
        TYPE_RTTM,
        session_id,
        stream_id,
        echo_timestamp_ns,
        reception_delta_ns,
        receiver_id,
    )


# ---------------------------------------------------------------------------- decoders


_RUN_UNPACKERS: dict[tuple[str, int, int], object] = {}


def run_unpacker(fields: str, aligned: int, count: int):
    """``unpack_from`` of the leading header ``fields`` (struct codes, little-endian) of
    ``count`` frames ``aligned`` bytes apart, all in one call: how a run of equal frames is
    checked at C speed. Kept per shape (a few hundred at most: a run is one datagram)."""
    key = (fields, aligned, count)
    unpack = _RUN_UNPACKERS.get(key)
    if unpack is None:
        if len(_RUN_UNPACKERS) >= 1024:
            _RUN_UNPACKERS.clear()
        gap = aligned - struct.calcsize("<" + fields)
        unpack = _RUN_UNPACKERS[key] = struct.Struct("<" + f"{fields}{gap}x" * (count - 1) + fields).unpack_from
    return unpack


def check_data_run(buf, length: int, term_length: int) -> DataRun:
    """Check a datagram that starts with a DATA or PAD frame and return where it belongs.

    Every frame in the run is walked: version 0, type DATA or PAD, a length of at least a header,
    each frame's term offset where the previous one ended, the last ending exactly at the end of the
    datagram, and the run inside one term. A frame that lies about its length is caught here, before
    anything is written to an image.
    """
    if length < HEADER_LENGTH:
        raise FrameError(f"data frame of {length} bytes is shorter than its 32-byte header")
    try:
        (_flen, version, flags, ftype, term_offset, session_id, stream_id, term_id, _rv) = DATA_HEADER.unpack_from(
            buf, 0
        )
    except struct.error as e:  # pragma: no cover - length checked above
        raise FrameError(str(e)) from None
    if term_offset < 0 or term_offset % FRAME_ALIGNMENT or term_offset + length > term_length:
        raise FrameError(f"data frame at term offset {term_offset} (+{length}) lies outside the term")
    flen = _flen
    if ftype == TYPE_DATA and version == VERSION and flen >= HEADER_LENGTH:
        aligned = (flen + 31) & ~31
        if aligned == length:
            return DataRun(term_offset, session_id, stream_id, term_id, flags, length, length)  # a lone frame
        count = length // aligned
        if count > 1 and count * aligned == length:
            # Frames of one length (small messages batched by the sender): all headers in one
            # unpack, checked field by field at C speed; anything else is left to the walk,
            # which names the first fault.
            fields = run_unpacker("iBBHi", aligned, count)(buf, 0)
            if (
                fields[0::5].count(flen) == count
                and fields[1::5].count(VERSION) == count
                and fields[3::5].count(TYPE_DATA) == count
                and fields[4::5] == tuple(range(term_offset, term_offset + length, aligned))
            ):
                return DataRun(term_offset, session_id, stream_id, term_id, flags, length, length)
    step = _RUN_STEP.unpack_from
    off = 0
    expected = term_offset
    while off < length:
        if length - off < HEADER_LENGTH:
            raise FrameError(f"truncated frame header at byte {off} of the datagram")
        flen, version, _fl, ftype, toff = step(buf, off)
        if version != VERSION:
            raise FrameError(f"frame version {version}, expected {VERSION}")
        if ftype != TYPE_DATA and ftype != TYPE_PAD:
            raise FrameError(f"frame type {ftype} inside a data run")
        if flen < HEADER_LENGTH:
            raise FrameError(f"frame length {flen} inside a data run")
        if ftype == TYPE_PAD and flen % FRAME_ALIGNMENT:
            raise FrameError(f"padding frame length {flen} is not a multiple of {FRAME_ALIGNMENT}")
        if toff != expected:
            raise FrameError(f"frame term offset {toff}, expected {expected}")
        aligned = (flen + 31) & ~31
        if ftype == TYPE_DATA:
            if off + flen > length:
                raise FrameError(f"frame length {flen} runs past the end of the datagram")
        elif off + HEADER_LENGTH > length:  # pragma: no cover - caught by the header check
            raise FrameError("truncated padding frame")
        if off + aligned > length:
            if ftype == TYPE_PAD and off + HEADER_LENGTH == length:
                # Padding frames travel header-only; they claim the rest of the term.
                if toff + flen != term_length:
                    raise FrameError("padding frame does not end at the term end")
                return DataRun(term_offset, session_id, stream_id, term_id, flags, length, term_length - term_offset)
            raise FrameError(f"frame of {flen} bytes at byte {off} runs past the end of the datagram")
        off += aligned
        expected += aligned
    return DataRun(term_offset, session_id, stream_id, term_id, flags, length, length)


def decode_untrusted(buf) -> DataHeader | Heartbeat | Setup | StatusMessage | Nak | Rttm:
    """Decode one control datagram, or the first header of a data datagram.

    Raises only :class:`FrameError`. A DATA datagram with frame length 0 is a :class:`Heartbeat`;
    other DATA/PAD datagrams return the first :class:`DataHeader` (use :func:`check_data_run` before
    trusting the rest of the datagram).
    """
    n = len(buf)
    if n < 8:
        raise FrameError(f"datagram of {n} bytes is shorter than a frame prefix")
    flen, version, flags, ftype = _PREFIX.unpack_from(buf, 0)
    if version != VERSION:
        raise FrameError(f"frame version {version}, expected {VERSION}")
    try:
        if ftype == TYPE_DATA or ftype == TYPE_PAD:
            if n < HEADER_LENGTH:
                raise FrameError(f"data frame of {n} bytes is shorter than its header")
            h = DataHeader._make(DATA_HEADER.unpack_from(buf, 0))
            if h.frame_length == 0 and ftype == TYPE_DATA:
                if n != HEADER_LENGTH:
                    raise FrameError("heartbeat with trailing bytes")
                return Heartbeat(h.flags, h.term_offset, h.session_id, h.stream_id, h.term_id)
            if h.frame_length < HEADER_LENGTH:
                raise FrameError(f"data frame length {h.frame_length} is shorter than its header")
            return h
        if ftype == TYPE_SETUP:
            if n < SETUP_LENGTH or flen < SETUP_LENGTH:
                raise FrameError("truncated SETUP frame")
            v = _SETUP.unpack_from(buf, 0)
            s = Setup(*v[4:])
            tl = s.term_length
            if tl < 64 * 1024 or tl > 1024 * 1024 * 1024 or tl & (tl - 1):
                raise FrameError(f"SETUP term length {tl} is not a power of two in 64k..1g")
            if s.mtu < 64 or s.mtu > 65504 or s.mtu % 32:
                raise FrameError(f"SETUP mtu {s.mtu} is invalid")
            if s.term_offset < 0 or s.term_offset >= tl or s.term_offset % FRAME_ALIGNMENT:
                raise FrameError(f"SETUP term offset {s.term_offset} is invalid")
            return s
        if ftype == TYPE_SM:
            if n < SM_LENGTH or flen < SM_LENGTH:
                raise FrameError("truncated STATUS frame")
            v = _SM.unpack_from(buf, 0)
            sm = StatusMessage(flags, *v[4:])
            if sm.receiver_window < 0 or sm.consumption_term_offset < 0:
                raise FrameError("STATUS frame with a negative window or offset")
            return sm
        if ftype == TYPE_NAK:
            if n < NAK_LENGTH or flen < NAK_LENGTH:
                raise FrameError("truncated NAK frame")
            v = _NAK.unpack_from(buf, 0)
            nak = Nak(*v[4:])
            if nak.length <= 0 or nak.term_offset < 0:
                raise FrameError("NAK frame with a non-positive length or negative offset")
            return nak
        if ftype == TYPE_RTTM:
            if n < RTTM_LENGTH or flen < RTTM_LENGTH:
                raise FrameError("truncated RTTM frame")
            v = _RTTM.unpack_from(buf, 0)
            return Rttm(flags, *v[4:])
    except struct.error as e:  # pragma: no cover - lengths are checked first
        raise FrameError(str(e)) from None
    raise FrameError(f"unknown frame type {ftype}")
