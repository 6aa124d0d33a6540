"""The adversarial suite's datagram generator (tests/support/fuzz.py): one seed, one sequence;
every message type is drawn; the frames of a forged session are frames a receiver accepts
once its SETUP is answered, so that the messages they carry reach the decoders."""

from __future__ import annotations

import struct

from cluster_node.media import frames as F
from tests.support.fuzz import ALL_CLUSTER_MESSAGES, ARCHIVE_REQUESTS, DatagramFuzzer, Target

TL = 4 * 1024 * 1024
MTU = 8192
TARGETS = [
    Target(m, role, "127.0.0.1", 20000 + 10 * m + i, stream)
    for m in range(3)
    for i, (role, stream) in enumerate(
        (("ingress", 101), ("consensus", 108), ("log", 100), ("archive", 10), ("other", None))
    )
]


def _fuzzer(seed: int) -> DatagramFuzzer:
    f = DatagramFuzzer(seed, sources=3, sink=("127.0.0.1", 9), term_length=TL, mtu=MTU)
    f.update(TARGETS, {})
    return f


def test_one_seed_gives_one_sequence():
    a, b = _fuzzer(5), _fuzzer(5)
    for _ in range(2000):
        assert a.next() == b.next()
    assert [_fuzzer(6).next() for _ in range(50)] != [_fuzzer(5).next() for _ in range(50)]


def test_every_frame_type_and_message_is_drawn_and_no_datagram_exceeds_udp():
    f = _fuzzer(1)
    for _ in range(30_000):
        _kind, _mutation, _source, _target, datagrams = f.next()
        assert all(len(d) <= 65507 for d in datagrams)
    kinds = set(f.sent)
    assert {f"media:{name}" for name in DatagramFuzzer.MEDIA} <= kinds
    assert {f"cluster:{t.__name__}" for t in ALL_CLUSTER_MESSAGES if t.__name__ != "SessionMessageHeader"} <= kinds
    assert "cluster:SessionMessage" in kinds
    assert {f"archive:{t.__name__}" for t in ARCHIVE_REQUESTS} <= kinds
    assert {"random", "setup-sweep", "setup-flood", "replay"} <= kinds


def test_a_forged_sessions_frames_are_accepted_once_its_setup_is_answered():
    f = _fuzzer(2)
    f.mutate_probability = 0.0
    target = TARGETS[1]
    fs = f._forged_session(target, 0, target.stream_id)
    first = f._frames_for(fs, b"\x91\x37" * 5000)  # fragmented: more than one MTU
    assert first == [fs.setup]
    setup = F.decode_untrusted(fs.setup)
    assert isinstance(setup, F.Setup) and setup.session_id == fs.session_id and setup.term_length == TL
    status = F.encode_status(fs.session_id, fs.stream_id, setup.active_term_id, setup.term_offset, TL // 2, 1)
    to, frames = f.on_status(0, target.port, status)
    assert to == target and len(frames) == 2
    offset = setup.term_offset
    for d in frames:
        run = F.check_data_run(d, len(d), TL)
        assert run.session_id == fs.session_id and run.stream_id == fs.stream_id
        assert run.term_offset == offset or run.term_offset == 0  # (a padding frame may end the term first)
        offset = run.term_offset + run.covered
    flags = [struct.unpack_from("<B", d, 5)[0] for d in frames if d[6] == F.TYPE_DATA]
    assert flags[0] & F.FLAG_BEGIN and flags[-1] & F.FLAG_END
    # Connected: the next message goes at once.
    assert len(f._frames_for(fs, b"\x90")) == 1
