"""A seeded, structure-aware datagram fuzzer for a live cluster (issue 26's adversarial suite).

What it sends
=============
Each call of :meth:`DatagramFuzzer.next` picks one *kind* and returns the datagrams of one
attack step, with the socket to send them from and the target to send them to:

* ``random``: bytes of any length, most of them short, some up to the largest UDP datagram;
* ``media:<FRAME>``: one frame of the media protocol (DATA, PAD, SETUP, SM, NAK, RTTM, HB for a
  heartbeat, ERR, UNKNOWN type), every field drawn from values that matter (zero, -1, the int32
  and int64 edges, the target's own stream id, live session ids read from the member's
  counters, term lengths from 32 bytes to 2 GiB);
* ``cluster:<Message>`` / ``archive:<Request>``: one message of the cluster codecs (every
  template, session messages included) or of the archive control protocol, with fields drawn
  the same way (terms and positions near the member's real ones, member ids 0..2 and beyond,
  channels naming only the fuzzer's own sink socket or the cluster's ports), carried in valid
  DATA frames of a forged session: a SETUP first (so the receiver makes an image), then frames
  at consecutive term offsets (so the subscriber polls them), fragmented when longer than the
  MTU, padded across term ends; most go to the port whose stream decodes them, some to any port;
* ``setup-sweep``: a SETUP at a chosen term offset (0, 32, the term's end minus 64 or 32, any
  aligned offset, wrong ones) followed by a DATA frame there, sometimes a PAD to the term's end;
* ``replay``: an earlier datagram again, to another port or with another session id (a
  datagram "replayed from another session");
* ``setup-flood``: SETUPs of many new sessions at once, to one endpoint from one source.

The sink socket answers the members' publications as a receiver would (a status message for a
SETUP), so that they connect and send, and now and then with hostile status messages and NAKs
(:meth:`DatagramFuzzer.on_sink`).

Any of these may then be mutated (``mutations``): truncated, extended, bits flipped,
misaligned, version/type/length/session/stream fields overwritten, frames concatenated.

Where it sends
==============
:func:`discover_targets` finds every UDP socket of every member process: the configured
endpoints (ingress, consensus, log, archive control) from the node config, and every other
socket the process holds (the publications' own sockets, which take status messages and NAKs,
and the catchup endpoint while a catchup runs) by matching the socket inodes of
``/proc/<pid>/fd`` against ``/proc/<pid>/net/udp``. Traffic goes only to 127.0.0.x; replies the
members send to channels the fuzzer names go to its own sink socket, which it drains.

Everything is drawn from one ``random.Random(seed)``, so a seed names a run (the datagrams
themselves also depend on the members' live counters and ports).
"""

from __future__ import annotations

import enum
import os
import random
import socket
import struct
import typing
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from cluster_node import codecs as cluster_codecs
from cluster_node.archive import codecs as archive_codecs
from cluster_node.media import frames as F

MAX_UDP_PAYLOAD = 65507

ROLE_STREAMS = {"ingress": "ingress_stream_id", "consensus": "consensus_stream_id", "log": "log_stream_id"}
"""The cluster section's stream id decoded at each configured endpoint."""

CLUSTER_MESSAGES_BY_ROLE: dict[str, tuple[type, ...]] = {
    "ingress": typing.get_args(cluster_codecs.IngressMessage),
    "consensus": typing.get_args(cluster_codecs.ConsensusMessage),
    "log": typing.get_args(cluster_codecs.LogMessage),
}
ALL_CLUSTER_MESSAGES: tuple[type, ...] = tuple(cluster_codecs.MESSAGE_TYPES.values())
ARCHIVE_REQUESTS: tuple[type, ...] = typing.get_args(archive_codecs.ArchiveRequest)

_I32_EDGES = (0, 1, -1, 2**31 - 1, -(2**31), 2**31 - 32, 32, 64)
_I64_EDGES = (0, 1, -1, 2**63 - 1, -(2**63), 2**32, 2**31 - 1, 2**64 - 1)


@dataclass(frozen=True)
class Target:
    """One UDP socket of one member: its role (``ingress``, ``consensus``, ``log``, ``archive``
    or ``other`` for a publication's socket or a catchup endpoint) and the stream id it decodes
    (None for ``other``)."""

    member_id: int
    role: str
    host: str
    port: int
    stream_id: int | None

    @property
    def addr(self) -> tuple[str, int]:
        return (self.host, self.port)


@dataclass
class MemberView:
    """What the fuzzer knows of one live member, refreshed while it runs: its process, term and
    commit position, and the (session id, stream id) of its publications and images."""

    member_id: int
    pid: int | None = None
    term: int = 0
    commit: int = 0
    publications: list[tuple[int, int]] = field(default_factory=list)
    images: list[tuple[int, int]] = field(default_factory=list)


def _udp_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for entry in os.listdir(fd_dir):
        try:
            link = os.readlink(fd_dir / entry)
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def udp_sockets_of(pid: int) -> list[tuple[str, int]]:
    """``(host, port)`` of every IPv4 UDP socket process ``pid`` holds: the inodes of its
    ``socket:[...]`` file descriptors looked up in ``/proc/<pid>/net/udp``."""
    try:
        inodes = _udp_inodes(pid)
        lines = Path(f"/proc/{pid}/net/udp").read_text().splitlines()[1:]
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 10 or int(parts[9]) not in inodes:
            continue
        hex_ip, hex_port = parts[1].split(":")
        host = socket.inet_ntoa(struct.pack("<I", int(hex_ip, 16)))
        out.append((host, int(hex_port, 16)))
    return out


def configured_targets(node) -> list[Target]:
    """The configured endpoints of a member (a ``tests.support.cluster.Node``)."""
    me = node.cfg.this_member
    c = node.cfg.cluster
    out = []
    for role, attr in ROLE_STREAMS.items():
        host, port = getattr(me, role).rsplit(":", 1)
        out.append(Target(node.member_id, role, host, int(port), getattr(c, attr)))
    host, port = me.archive.rsplit(":", 1)
    out.append(Target(node.member_id, "archive", host, int(port), node.cfg.archive.control_request_stream_id))
    return [t for t in out if t.port != 0]


def discover_targets(node) -> list[Target]:
    """Every UDP socket of a running member: its configured endpoints, plus (role ``other``)
    every other socket its process holds on a loopback address."""
    targets = configured_targets(node)
    if node.pid is None or not node.running:
        return targets
    known = {t.port for t in targets}
    for host, port in udp_sockets_of(node.pid):
        if port in known or port == 0:
            continue
        if host == "0.0.0.0":
            host = "127.0.0.1"
        if not host.startswith("127."):
            continue
        known.add(port)
        targets.append(Target(node.member_id, "other", host, port, None))
    return targets


def read_member_view(node, view: MemberView) -> None:
    """Refresh ``view`` from the member's counters (term, commit, publication and image
    sessions); left as it was when the member does not run or its counters cannot be read."""
    from cluster_node.media.counters import CountersError, CountersReader, CounterType

    view.pid = node.pid if node.running else None
    c = node.counters()
    if c is not None:
        view.term, view.commit = c.term, c.commit
    if view.pid is None:
        return
    try:
        reader = CountersReader.open(node.counters_path)
    except (CountersError, OSError, ValueError):
        return
    try:
        pubs, images = [], []
        for info in reader.counters():
            if info.type_id not in (CounterType.PUBLISHER_POS, CounterType.RECEIVER_HWM):
                continue
            fields = dict(p.split("=", 1) for p in info.label.split() if "=" in p)
            try:
                key = (int(fields["session"]), int(fields["stream"]))
            except (KeyError, ValueError):
                continue
            (pubs if info.type_id == CounterType.PUBLISHER_POS else images).append(key)
        view.publications, view.images = pubs, images
    except CountersError:
        pass
    finally:
        reader.close()


# ------------------------------------------------------------------------------------ fields


def _s64(value: int) -> int:
    """``value`` as the int64 it reads as on the wire."""
    return (value + 2**63) % 2**64 - 2**63


def _base_type(tp):
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


class _Values:
    """Field values that matter, by field name and type, near the cluster's live state."""

    def __init__(self, rng: random.Random, sink: tuple[str, int], ports: list[int]) -> None:
        self.rng = rng
        self.sink = sink
        self.ports = ports  # the cluster's configured ports (a channel may name one)
        self.term = 0
        self.commit = 0
        self.sessions: list[int] = [1]
        self.impersonate = True
        """False: no term field is one a real member could send now (see DatagramFuzzer)."""

    def i64(self) -> int:
        r = self.rng.random()
        if r < 0.5:
            return self.rng.choice(_I64_EDGES) if self.rng.random() < 0.8 else self.rng.randrange(-(2**63), 2**63)
        return self.rng.randrange(-4, 1000)

    def int_for(self, name: str) -> int:
        rng = self.rng
        r = rng.random()
        if "term_id" in name and not self.impersonate:
            # Never a term a real member could send: stale, null, or further ahead than any
            # member can be (past the consensus module's MAX_TERM_JUMP).
            stale = [t for t in (self.term - 1, self.term - 2, 0, -1, -(2**63)) if t < self.term]
            return rng.choice(stale + [2**62, 2**63 - 1, self.term + 2**31 + 1])
        if r < 0.15:
            return self.i64()
        if "term_id" in name:
            return rng.choice((self.term, self.term, self.term + 1, self.term - 1, self.term + 2, 0, -1, 2**63 - 1))
        if "position" in name:
            return rng.choice(
                (
                    self.commit,
                    self.commit + 32 * rng.randrange(1, 64),
                    max(0, self.commit - 64),
                    0,
                    -1,
                    2**62,
                    self.commit + 1,
                )
            )
        if "member_id" in name:
            return rng.choice((0, 1, 2, 0, 1, 2, -1, 3, 63, 64, 2**31 - 1))
        if name in ("log_session_id", "session_id", "replication_session_id") or name.endswith("_session_id"):
            return rng.choice(self.sessions + [0, -1, rng.randrange(-(2**31), 2**31)])
        if "stream_id" in name:
            return rng.choice((100, 101, 102, 108, 10, 20, 0, -1, rng.randrange(1, 2**31)))
        if "version" in name:
            return rng.choice(
                (
                    cluster_codecs.CONSENSUS_PROTOCOL_VERSION,
                    cluster_codecs.CLIENT_PROTOCOL_VERSION,
                    archive_codecs.PROTOCOL_SEMANTIC_VERSION,
                    0,
                    2**31 - 1,
                    99 << 16,
                )
            )
        if name in ("length", "record_count", "file_io_max_length", "pending_message_capacity"):
            return rng.choice((0, -1, 1, 1024, 2**31 - 1, 2**63 - 1, archive_codecs.REPLAY_FOLLOW_LENGTH))
        if "recording_id" in name:
            return rng.choice((0, 1, 2, 3, -1, 2**63 - 1, 1000))
        if name in ("flags", "ack_id", "relevant_id", "counter_id", "limit_counter_id"):
            return rng.choice((0, 1, -1, 255, 256, 2**31 - 1))
        return rng.choice(_I32_EDGES) if r < 0.5 else rng.randrange(0, 2**31)

    def channel(self) -> str:
        rng = self.rng
        host, port = self.sink
        base = f"aeron:udp?endpoint={host}:{port}"
        choice = rng.randrange(14)
        if choice < 5:
            return base
        if choice == 5:
            return f"{base}|control={host}:{port}"
        if choice == 6:
            return f"{base}|term-length={rng.choice(('1g', '64k', '128m', '3', '-1'))}"
        if choice == 7:
            return f"{base}|mtu={rng.choice((32, 65504, 1408, 7))}"
        if choice == 8 and self.ports:
            return f"aeron:udp?endpoint=127.0.0.1:{rng.choice(self.ports)}"
        if choice == 9:
            return rng.choice(("aeron:ipc", "aeron:ipc?term-length=1g", "aeron:udp", "aeron:udp?endpoint=", ""))
        if choice == 10:
            return "aeron:udp?endpoint=" + "x" * rng.randrange(1, 4200)
        if choice == 11:
            return f"{base}|session-id={rng.randrange(-5, 2**31)}|alias=" + "é" * rng.randrange(0, 1500)
        if choice == 12:
            return f"{host}:{port}"
        return rng.randbytes(rng.randrange(0, 64)).decode("latin-1")

    def text_for(self, name: str) -> str:
        rng = self.rng
        if "channel" in name or "destination" in name:
            return self.channel()
        if "endpoint" in name:
            host, port = self.sink
            return rng.choice((f"{host}:{port}", f"{host}:0", "nowhere", "", f"{host}:{port}" * 200))
        if rng.random() < 0.1:
            return "m" * rng.choice((4096, 4097, 16384, 16385))
        return rng.randbytes(rng.randrange(0, 40)).decode("latin-1")

    def value(self, tp, name: str):
        rng = self.rng
        base = _base_type(tp)
        if base is bool:
            return rng.random() < 0.5
        if isinstance(base, type) and issubclass(base, enum.IntEnum):
            members = [int(m) for m in base]
            return rng.choice(members) if rng.random() < 0.85 else rng.choice((-1, max(members) + 1, 255, 2**31 - 1))
        if base is int:
            return self.int_for(name)
        if base is str:
            return self.text_for(name)
        if base is bytes:
            return rng.randbytes(rng.choice((0, 0, 8, 64, rng.randrange(0, 70_000))))
        if typing.get_origin(base) is tuple:
            (item, _ellipsis) = typing.get_args(base)
            return [self.fields(item) for _ in range(rng.choice((0, 1, 3, 65)))]
        raise TypeError(f"no values for {tp!r}")

    def fields(self, cls) -> list:
        """Values for every field of ``cls``, in wire order (trailing defaulted fields sometimes
        left out, as an older sender would)."""
        fields = msgspec.structs.fields(cls)
        values = [self.value(f.type, f.name) for f in fields]
        if self.rng.random() < 0.1:
            values = values[: self.rng.randrange(0, len(values) + 1)]
        elif self.rng.random() < 0.05:
            values.append(self.rng.randrange(0, 100))
        return values

    def message(self, cls) -> bytes:
        """A message of ``cls`` as msgpack ``[template id, fields...]``, built without the
        Struct so that no field is checked on the way out."""
        return msgspec.msgpack.encode([cls.__struct_config__.tag, *self.fields(cls)])


# ------------------------------------------------------------------------------------ sessions


@dataclass
class _Forged:
    """A forged publication into one target from one source socket: where its next frame goes.

    Its frames wait (``pending``) until the receiver answers the SETUP with a status message
    (:meth:`DatagramFuzzer.on_status`): frames sent before the image exists would be dropped,
    and the gap they leave would hold back every later frame of the session."""

    target: Target
    source: int
    session_id: int
    stream_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    term_id: int
    term_offset: int
    connected: bool = False
    pending: list = field(default_factory=list)
    setup: bytes = b""

    def setup_frame(self) -> bytes:
        return F._SETUP.pack(
            F.SETUP_LENGTH,
            F.VERSION,
            0,
            F.TYPE_SETUP,
            self.term_offset,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            self.term_id,
            self.term_length,
            self.mtu,
            0,
        )


MAX_PENDING_FRAMES = 64


class DatagramFuzzer:
    """The generator: ``next()`` returns ``(kind, mutation, source index, target, datagrams)``.

    ``impersonate``: whether a cluster message may carry the term a real member would send now
    (the current one or the next two). Nothing authenticates a member's messages (any host that
    can send UDP to a consensus port can speak for a member, as in the reference), so a forged
    but current TerminationPosition, CommitPosition or NewLeadershipTerm does what the real one
    would: that is impersonation, not malformed input, and it is off by default; stale, null
    and absurd terms (2**63 - 1 among them) are always drawn.

    ``sources`` is how many sending sockets the caller has (different source addresses or
    ports); ``term_length``/``mtu`` those the members' driver uses (a forged session uses them
    mostly, so its SETUP is accepted, and sometimes anything else)."""

    KINDS = (
        ("random", 6),
        ("media", 30),
        ("cluster", 30),
        ("archive", 12),
        ("setup-sweep", 8),
        ("replay", 6),
        ("setup-flood", 0.2),
    )
    MEDIA = ("DATA", "PAD", "SETUP", "SM", "NAK", "RTTM", "HB", "ERR", "UNKNOWN")
    MUTATIONS = (
        "truncate",
        "extend",
        "flip",
        "misalign",
        "version",
        "type",
        "length",
        "session",
        "stream",
        "concat",
        "huge-term",
    )

    def __init__(
        self,
        seed: int,
        *,
        sources: int,
        sink: tuple[str, int],
        term_length: int,
        mtu: int,
        mutate_probability: float = 0.3,
        huge_term_probability: float = 0.002,
        impersonate: bool = False,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.sources = sources
        self.term_length = term_length
        self.mtu = mtu
        self.mutate_probability = mutate_probability
        self.huge_term_probability = huge_term_probability
        self.targets: list[Target] = []
        self.views: dict[int, MemberView] = {}
        self.values = _Values(self.rng, sink, [])
        self.values.impersonate = impersonate
        self._forged: dict[tuple[int, int, int, int], _Forged] = {}  # (source, port, session, stream) -> it
        self._current: dict[tuple[int, int, int], _Forged] = {}  # (member, port, source) -> session in use
        self._history: deque[tuple[Target, bytes]] = deque(maxlen=512)
        self._kinds, self._weights = zip(*self.KINDS)
        self.sent = Counter()

    # -------------------------------------------------------------- live state

    def update(self, targets: list[Target], views: dict[int, MemberView]) -> None:
        self.targets = list(targets)
        self.views = views
        self.values.ports = sorted({t.port for t in targets if t.role != "other"})
        ports = {t.port for t in targets}
        self._current = {k: v for k, v in self._current.items() if k[1] in ports}

    def _view_of(self, target: Target) -> MemberView:
        return self.views.get(target.member_id) or MemberView(target.member_id)

    def _sync_values(self, target: Target) -> None:
        view = self._view_of(target)
        self.values.term, self.values.commit = view.term, view.commit
        self.values.sessions = [s for s, _ in view.publications + view.images][:32] or [1]

    # -------------------------------------------------------------- one step

    def next(self) -> tuple[str, str, int, Target, list[bytes]]:
        rng = self.rng
        target = rng.choice(self.targets)
        source = rng.randrange(self.sources)
        self._sync_values(target)
        family = rng.choices(self._kinds, self._weights)[0]
        if family == "random":
            kind, datagrams = "random", [self._random_bytes()]
        elif family == "media":
            name = rng.choice(self.MEDIA)
            kind, datagrams = f"media:{name}", [self._media(name, target)]
        elif family == "cluster":
            kind, datagrams = self._cluster(target, source)
        elif family == "archive":
            kind, datagrams = self._archive(target, source)
        elif family == "setup-flood":
            kind, datagrams = "setup-flood", self._setup_flood(target)
        elif family == "setup-sweep":
            kind, datagrams = "setup-sweep", self._setup_sweep(target, source)
        else:
            kind, target, datagrams = self._replay(target)
        mutation = ""
        if datagrams and rng.random() < self.mutate_probability:
            mutation = rng.choice(self.MUTATIONS)
            i = rng.randrange(len(datagrams))
            datagrams[i] = self.mutate(mutation, datagrams[i])
        datagrams = [d[:MAX_UDP_PAYLOAD] for d in datagrams]
        for d in datagrams:
            if len(d) >= 8:
                self._history.append((target, d))
        self.sent[kind] += len(datagrams)
        return kind, mutation, source, target, datagrams

    def _random_bytes(self) -> bytes:
        rng = self.rng
        n = rng.choice(
            (
                0,
                1,
                7,
                8,
                27,
                28,
                31,
                32,
                35,
                36,
                39,
                40,
                41,
                64,
                rng.randrange(0, 200),
                rng.randrange(0, 9000),
                MAX_UDP_PAYLOAD,
            )
        )
        return rng.randbytes(n)

    def _term_length(self) -> int:
        rng = self.rng
        if rng.random() < self.huge_term_probability:
            return rng.choice((1 << 30, 1 << 29, 1 << 28))
        if rng.random() < 0.9:
            return self.term_length
        return rng.choice((64 * 1024, 128 * 1024, 32, 0, -1, 3 * 64 * 1024, 2**31 - 1, -(2**31), 1 << 31 >> 1))

    def _session(self) -> int:
        rng = self.rng
        if rng.random() < 0.1:
            return rng.choice(self.values.sessions + [0, -1, 2**31 - 1, -(2**31)])
        return rng.randrange(-(2**31), 2**31)

    def _stream(self, target: Target) -> int:
        rng = self.rng
        if target.stream_id is not None and rng.random() < 0.8:
            return target.stream_id
        return rng.choice((100, 101, 102, 104, 105, 108, 10, 20, 30, 0, -1, rng.randrange(-(2**31), 2**31)))

    def _media(self, name: str, target: Target) -> bytes:
        rng = self.rng
        v = self.values
        session, stream = self._session(), self._stream(target)
        if target.role == "other" and self._view_of(target).publications and rng.random() < 0.8:
            session, stream = rng.choice(self._view_of(target).publications)
        term_id = rng.choice((0, 1, -1, 2**31 - 1, -(2**31), rng.randrange(-(2**31), 2**31)))
        tl = self.term_length
        offset = rng.choice((0, 32, tl - 64, tl - 32, tl, 32 * rng.randrange(0, tl // 32), -32, 7, 2**31 - 32))
        if name in ("DATA", "PAD"):
            ftype = F.TYPE_DATA if name == "DATA" else F.TYPE_PAD
            body = rng.randbytes(rng.choice((0, 1, 31, 32, 100, rng.randrange(0, self.mtu))))
            flen = rng.choice((F.HEADER_LENGTH + len(body),) * 4 + (0, 1, 31, 33, 40, 2**31 - 1, -1, tl - offset))
            flags = rng.choice((F.FLAG_UNFRAGMENTED, F.FLAG_BEGIN, F.FLAG_END, 0, F.FLAG_EOS, 0xFF))
            unaligned = F.HEADER_LENGTH + len(body)
            padding = bytes(F.align(unaligned) - unaligned) if rng.random() < 0.8 else b""
            return (
                F.encode_data_header(
                    flen, flags, offset, session, stream, term_id, rng.choice((0, -1, 2**63 - 1)), ftype
                )
                + body
                + padding
            )
        if name == "SETUP":
            mtu = rng.choice((self.mtu, self.mtu, 1408, 64, 65504, 32, 0, 65536, 33))
            return F._SETUP.pack(
                F.SETUP_LENGTH,
                F.VERSION,
                0,
                F.TYPE_SETUP,
                offset,
                session,
                stream,
                term_id,
                F.wrap_i32(term_id + rng.choice((0, 0, 1, 5, -1, 2**31 - 1))),
                self._term_length(),
                mtu,
                rng.choice((0, 1, 255)),
            )
        if name == "SM":
            window = rng.choice((0, 1, 64 * 1024, tl, 2**31 - 1, -1))
            consumption_offset = rng.choice((0, 32, tl - 32, tl, 2**31 - 1, -1))
            return F._SM.pack(
                F.SM_LENGTH,
                F.VERSION,
                rng.choice((0, F.FLAG_SEND_SETUP)),
                F.TYPE_SM,
                session,
                stream,
                term_id,
                consumption_offset,
                window,
                rng.choice((0, 1, -1, _s64(v.i64()))),
            )
        if name == "NAK":
            length = rng.choice((1, 32, 4096, tl, 2**31 - 1, 0, -1))
            return F._NAK.pack(F.NAK_LENGTH, F.VERSION, 0, F.TYPE_NAK, session, stream, term_id, offset, length)
        if name == "RTTM":
            return F._RTTM.pack(
                F.RTTM_LENGTH,
                F.VERSION,
                rng.choice((0, F.FLAG_RTTM_REPLY)),
                F.TYPE_RTTM,
                session,
                stream,
                _s64(v.i64()),
                _s64(v.i64()),
                _s64(v.i64()),
            )
        if name == "HB":
            return F.encode_heartbeat(offset, session, stream, term_id, eos=rng.random() < 0.3)
        frame_type = F.TYPE_ERR if name == "ERR" else rng.choice((7, 8, 0xFFFF, 0x100))
        length = rng.choice((8, 32, 64, 200))
        return struct.pack("<iBBH", length, F.VERSION, 0, frame_type) + rng.randbytes(length - 8)

    # -------------------------------------------------------------- forged sessions carrying messages

    def _forged_session(self, target: Target, source: int, stream_id: int) -> _Forged:
        rng = self.rng
        key = (target.member_id, target.port, source)
        fs = self._current.get(key)
        if fs is None or fs.stream_id != stream_id or rng.random() < 0.01:
            tl = self.term_length if rng.random() < 0.97 else rng.choice((64 * 1024, 128 * 1024))
            initial = rng.randrange(-(2**31), 2**31)
            offset = rng.choice((0, 0, 0, 32 * rng.randrange(0, tl // 32), tl - 64, tl - 32))
            active = F.wrap_i32(initial + rng.choice((0, 0, 1, 7)))
            fs = self._new_forged(target, source, stream_id, initial, tl, active, offset)
            self._current[key] = fs
        return fs

    def _new_forged(
        self, target: Target, source: int, stream_id: int, initial: int, tl: int, active: int, offset: int
    ) -> _Forged:
        fs = _Forged(target, source, self._session(), stream_id, initial, tl, self.mtu, active, offset)
        fs.setup = fs.setup_frame()
        self._forged[(source, target.port, fs.session_id, stream_id)] = fs
        if len(self._forged) > 4096:  # forget the oldest sessions
            for k in list(self._forged)[:1024]:
                del self._forged[k]
        return fs

    def _frames_for(self, fs: _Forged, message: bytes) -> list[bytes]:
        """DATA frames carrying ``message`` at the session's next term offsets (fragmented to
        the MTU, a padding frame where a frame would not fit before the term's end), one
        datagram each; while the receiver has not answered the SETUP, the SETUP instead (now
        and then) and the frames are kept for :meth:`on_status`."""
        out = []
        max_payload = fs.mtu - F.HEADER_LENGTH
        chunks = [message[i : i + max_payload] for i in range(0, len(message), max_payload)] or [b""]
        for i, chunk in enumerate(chunks):
            flags = (F.FLAG_BEGIN if i == 0 else 0) | (F.FLAG_END if i == len(chunks) - 1 else 0)
            flen = F.HEADER_LENGTH + len(chunk)
            if fs.term_offset + F.align(flen) > fs.term_length:
                pad = fs.term_length - fs.term_offset
                out.append(
                    F.encode_data_header(pad, 0, fs.term_offset, fs.session_id, fs.stream_id, fs.term_id, 0, F.TYPE_PAD)
                )
                fs.term_id = F.wrap_i32(fs.term_id + 1)
                fs.term_offset = 0
            # A datagram holds whole aligned frames: the payload is padded to the frame alignment.
            out.append(
                F.encode_data_header(flen, flags, fs.term_offset, fs.session_id, fs.stream_id, fs.term_id)
                + chunk
                + bytes(F.align(flen) - flen)
            )
            fs.term_offset += F.align(flen)
        if fs.connected:
            return out
        first = not fs.pending
        fs.pending.extend(out)
        del fs.pending[MAX_PENDING_FRAMES:]
        return [fs.setup] if first or self.rng.random() < 0.2 else []

    def on_status(self, source: int, port: int, datagram: bytes) -> tuple[Target | None, list[bytes]]:
        """A datagram that came back to sending socket ``source`` from ``port``: when it is a
        status message for a forged session, the frames to send now (those held back until
        the image existed, or the SETUP again when the receiver asks for it) and their target."""
        if len(datagram) < F.SM_LENGTH or datagram[6] != F.TYPE_SM or datagram[7] != 0:
            return None, []
        session_id, stream_id = struct.unpack_from("<ii", datagram, 8)
        fs = self._forged.get((source, port, session_id, stream_id))
        if fs is None:
            return None, []
        if datagram[5] & F.FLAG_SEND_SETUP:
            fs.connected = False
            return fs.target, [fs.setup]
        fs.connected = True
        out, fs.pending = fs.pending, []
        return fs.target, out

    def _message_target(self, target: Target, source: int, message: bytes) -> list[bytes]:
        stream = target.stream_id if target.stream_id is not None else self._stream(target)
        if self.rng.random() < 0.05:
            stream = self._stream(target)
        return self._frames_for(self._forged_session(target, source, stream), message)

    def _session_message(self) -> bytes:
        rng = self.rng
        v = self.values
        payload = rng.choice(
            (
                b"",
                rng.randbytes(rng.randrange(0, 200)),
                msgspec.msgpack.encode([1, rng.randrange(2**31), "fuzz1", b"x"]),
                msgspec.msgpack.encode([3, rng.randrange(2**31), "fuzz0", b"fuzz;"]),
            )
        )
        if rng.random() < 0.3:
            # The current term, for a session no client has (ids are handed out from 1 up):
            # refused for the session, not for the term.
            term, session = v.term, rng.choice((10**6 + rng.randrange(10**6), 2**63 - 1, -5, 0))
        else:
            term, session = v.int_for("leadership_term_id"), rng.choice((1, 2, 3, 0, -1, v.i64()))
        return (
            struct.pack(
                "<HHIqqq",
                1,
                rng.choice((111, 111, 111, 0, 101)),
                rng.choice((0, 0, 1)),
                _s64(term),
                _s64(session),
                _s64(v.i64()),
            )
            + payload
        )

    def _cluster(self, target: Target, source: int) -> tuple[str, list[bytes]]:
        rng = self.rng
        if target.role in CLUSTER_MESSAGES_BY_ROLE and rng.random() < 0.8:
            pool = CLUSTER_MESSAGES_BY_ROLE[target.role]
        else:
            pool = ALL_CLUSTER_MESSAGES
        if target.role in ("ingress", "log") and rng.random() < 0.2:
            return "cluster:SessionMessage", self._message_target(target, source, self._session_message())
        cls = rng.choice(pool)
        if cls is cluster_codecs.SessionMessageHeader:
            return "cluster:SessionMessage", self._message_target(target, source, self._session_message())
        return f"cluster:{cls.__name__}", self._message_target(target, source, self.values.message(cls))

    def _archive(self, target: Target, source: int) -> tuple[str, list[bytes]]:
        rng = self.rng
        if target.role != "archive" and rng.random() < 0.8:
            archives = [t for t in self.targets if t.role == "archive"]
            if archives:
                target = rng.choice(archives)
        cls = rng.choice(ARCHIVE_REQUESTS)
        return f"archive:{cls.__name__}", self._message_target(target, source, self.values.message(cls))

    def _setup_sweep(self, target: Target, source: int) -> list[bytes]:
        """A SETUP at a chosen term offset (the term's end minus 64 or 32 among them), and a
        DATA frame there (sometimes a PAD to the term's end after it) once it is answered."""
        rng = self.rng
        tl = self._term_length() if rng.random() < 0.2 else self.term_length
        safe_tl = tl if 64 * 1024 <= tl <= 1 << 30 and not tl & (tl - 1) else self.term_length
        offset = rng.choice((0, 32, safe_tl - 64, safe_tl - 32, 32 * rng.randrange(0, safe_tl // 32), safe_tl, 16))
        initial = rng.randrange(-(2**31), 2**31)
        fs = self._new_forged(target, source, self._stream(target), initial, tl, initial, offset)
        body = rng.randbytes(rng.choice((0, 32, 100)))
        flen = F.HEADER_LENGTH + len(body)
        fs.pending.append(
            F.encode_data_header(flen, F.FLAG_UNFRAGMENTED, offset, fs.session_id, fs.stream_id, initial)
            + body
            + bytes(F.align(flen) - flen)
        )
        at = offset + F.align(flen)
        if rng.random() < 0.3 and at < safe_tl:
            fs.pending.append(
                F.encode_data_header(safe_tl - at, 0, at, fs.session_id, fs.stream_id, initial, 0, F.TYPE_PAD)
            )
        return [fs.setup]

    def _setup_flood(self, target: Target) -> list[bytes]:
        """SETUPs of many new sessions at once to one endpoint and stream, from one source:
        what the bounds on images per endpoint, per source and per second are for."""
        rng = self.rng
        stream = target.stream_id if target.stream_id is not None else self._stream(target)
        return [
            F.encode_setup(F.Setup(0, rng.randrange(-(2**31), 2**31), stream, 0, 0, self.term_length, self.mtu, 0))
            for _ in range(rng.randrange(20, 120))
        ]

    def _replay(self, target: Target) -> tuple[str, Target, list[bytes]]:
        rng = self.rng
        if not self._history:
            return "replay", target, [self._random_bytes()]
        old_target, d = rng.choice(self._history)
        d = bytearray(d)
        if rng.random() < 0.5 and len(d) >= 32:
            ftype = struct.unpack_from("<H", d, 6)[0]
            at = 12 if ftype in (F.TYPE_DATA, F.TYPE_PAD, F.TYPE_SETUP) else 8
            d[at : at + 4] = struct.pack("<i", self._session())
        else:
            target = old_target if rng.random() < 0.3 else target
        return "replay", target, [bytes(d)]

    # -------------------------------------------------------------- the sink as a receiver

    def on_sink(self, datagram: bytes) -> list[bytes]:
        """Replies of the sink socket (where every channel the fuzzer names points) to a
        datagram a member's publication sent it: a status message for a SETUP, so that the
        publication connects and sends (control responses, replays, egress), and for data
        now and then a hostile status message or NAK (windows, positions and lengths at their
        edges), from the receiver the publication knows."""
        rng = self.rng
        if len(datagram) < F.HEADER_LENGTH or datagram[4] != F.VERSION:
            return []
        ftype = datagram[6]
        if ftype == F.TYPE_SETUP and len(datagram) >= F.SETUP_LENGTH:
            _l, _v, _f, _t, offset, session, stream, initial, active, tl, _mtu, _ttl = F._SETUP.unpack_from(datagram)
            window = rng.choice((tl // 2, tl // 2, 0, 2**31 - 1, 1))
            return [F.encode_status(session, stream, active, offset, window, 0x5EED)]
        if ftype != F.TYPE_DATA or rng.random() > 0.05:
            return []
        _l, _v, _f, _t, offset, session, stream, term_id, _rv = F.DATA_HEADER.unpack_from(datagram)
        tl = self.term_length
        choice = rng.randrange(4)
        if choice == 0:
            return [
                F.encode_nak(
                    session,
                    stream,
                    rng.choice((term_id, term_id - 1, term_id + 1, 0)),
                    rng.choice((0, offset, tl - 32, 2**31 - 32)),
                    rng.choice((32, tl, 2**31 - 1, 4096)),
                )
            ]
        if choice == 1:
            return [
                F.encode_status(
                    session,
                    stream,
                    rng.choice((term_id, term_id + 1, term_id + 1000)),
                    rng.choice((0, offset, tl - 32, tl)),
                    rng.choice((0, 1, 2**31 - 1)),
                    0x5EED,
                )
            ]
        if choice == 2:
            return [
                F.encode_status(
                    session, stream, term_id, offset, tl // 2, rng.randrange(-(2**63), 2**63), send_setup=True
                )
            ]
        return [F.encode_rttm(session, stream, rng.randrange(0, 2**62), 0, 0x5EED, False)]

    # -------------------------------------------------------------- mutations

    def mutate(self, mutation: str, d: bytes) -> bytes:
        rng = self.rng
        b = bytearray(d)
        if mutation == "truncate":
            return bytes(b[: rng.randrange(0, max(1, len(b)))])
        if mutation == "extend":
            return bytes(b) + rng.randbytes(rng.choice((1, 31, 32, 64, rng.randrange(0, MAX_UDP_PAYLOAD - len(b) + 1))))
        if mutation == "flip" and b:
            for _ in range(rng.randrange(1, 9)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
            return bytes(b)
        if mutation == "misalign":
            return rng.randbytes(rng.randrange(1, 32)) + bytes(b)
        if len(b) < 8:
            return bytes(b) + rng.randbytes(rng.randrange(0, 40))
        if mutation == "version":
            b[4] = rng.choice((1, 2, 0x7F, 0xFF))
        elif mutation == "type":
            b[6:8] = struct.pack("<H", rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 0xFFFF)))
        elif mutation == "length":
            b[0:4] = struct.pack("<i", rng.choice((0, 1, 31, 33, 40, len(b) + 32, 2**31 - 1, -1, -(2**31))))
        elif mutation in ("session", "stream") and len(b) >= 20:
            ftype = struct.unpack_from("<H", b, 6)[0]
            at = 12 if ftype in (F.TYPE_DATA, F.TYPE_PAD, F.TYPE_SETUP) else 8
            at += 4 if mutation == "stream" else 0
            b[at : at + 4] = struct.pack("<i", rng.choice((0, -1, 2**31 - 1, rng.randrange(-(2**31), 2**31))))
        elif mutation == "concat" and self._history:
            b += rng.choice(self._history)[1]
        elif mutation == "huge-term" and len(b) >= F.SETUP_LENGTH:
            b[28:32] = struct.pack("<i", rng.choice((1 << 30, 2**31 - 1, -(2**31), 0)))
        return bytes(b[:MAX_UDP_PAYLOAD])


# ------------------------------------------------------------------------------------ process figures


def proc_figures(pid: int) -> dict[str, int] | None:
    """``rss_kb``, ``peak_rss_kb`` and ``fds`` of a process from /proc; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    out = {"fds": fds, "rss_kb": 0, "peak_rss_kb": 0}
    for line in status:
        if line.startswith("VmRSS:"):
            out["rss_kb"] = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            out["peak_rss_kb"] = int(line.split()[1])
    return out


def counters_in_use(node) -> tuple[int, int, dict[str, int]] | None:
    """``(allocated counters, capacity, allocated by kind)`` of a running member's counters
    file; a counter's kind is its label up to the first colon (``rcv-hwm``, ``pub-pos``...),
    or, for a label of words only, its first two words."""
    from cluster_node.media.counters import CountersError, CountersReader

    if not node.running:
        return None
    try:
        reader = CountersReader.open(node.counters_path)
    except (CountersError, OSError, ValueError):
        return None
    try:
        kinds = Counter(
            c.label.split(":", 1)[0] if ":" in c.label else " ".join(c.label.split()[:2]) for c in reader.counters()
        )
        return sum(kinds.values()), reader.max_counters, dict(kinds.most_common())
    except CountersError:
        return None
    finally:
        reader.close()


REPORTED_SYSTEM_COUNTERS = (
    "INVALID_PACKETS",
    "ERRORS",
    "IMAGES_AVAILABLE",
    "IMAGES_UNAVAILABLE",
    "NAK_MESSAGES_RECEIVED",
    "RETRANSMITS_SENT",
    "STATUS_MESSAGES_RECEIVED",
)


def system_counters(node) -> dict[str, int]:
    """A few driver-wide counters of a running member, by name (lower case)."""
    from cluster_node.media.counters import CountersError, CountersReader, SystemCounter

    if not node.running:
        return {}
    labels = {getattr(SystemCounter, name).label: name.lower() for name in REPORTED_SYSTEM_COUNTERS}
    try:
        reader = CountersReader.open(node.counters_path)
    except (CountersError, OSError, ValueError):
        return {}
    try:
        return {labels[c.label]: c.value for c in reader.counters() if c.label in labels}
    except CountersError:
        return {}
    finally:
        reader.close()
