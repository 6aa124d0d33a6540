"""Authenticated channels (``auth=mac``) over real UDP: the driver signs every datagram of such
a channel (data, SETUP, heartbeats, status messages, NAKs) and drops, counts and says once
anything without a valid MAC, before it is parsed."""

from __future__ import annotations

import socket

import trio

from cluster_node.media.driver import open_media_driver
from cluster_node.media.frames import (
    FLAG_UNFRAGMENTED,
    HEADER_LENGTH,
    Setup,
    encode_data_header,
    encode_setup,
    encode_status,
)
from cluster_node.media.mac import MacKeys
from tests.support.procs import free_udp_port

KEY = bytes(range(32))
NEW_KEY = bytes(range(100, 132))


async def _until(cond, timeout=20.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


async def _exchange(pub, sub, payloads) -> list[bytes]:
    got: list[bytes] = []
    with trio.fail_after(20):
        for p in payloads:
            while pub.offer(p) < 0:
                await trio.sleep(0.005)
        while len(got) < len(payloads):
            sub.poll(lambda buf, off, n, h: got.append(bytes(buf[off : off + n])), 100)
            await trio.sleep(0.002)
    return got


def _forge(port: int, datagrams) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        for d in datagrams:
            s.sendto(d, ("127.0.0.1", port))


async def test_mac_channel_delivers_and_refuses_forgeries(tmp_path):
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|auth=mac"
    async with (
        open_media_driver(dir=tmp_path / "a", mac_key=KEY) as a,
        open_media_driver(dir=tmp_path / "b", mac_key=KEY) as b,
    ):
        sub = b.add_subscription(channel, 9)
        pub = a.add_publication(channel, 9)
        await _until(lambda: pub.is_connected)
        payloads = [bytes([i]) * (10 + i * 97) for i in range(30)]  # fragmented ones too
        assert await _exchange(pub, sub, payloads) == payloads
        assert b.system.frames_failed_authentication.get() == 0
        assert a.system.frames_failed_authentication.get() == 0
        # Unsigned, wrongly signed and altered datagrams: a SETUP of a new session, data of the
        # live one. None reaches the parser (no new image, no invalid packet), each is counted.
        image = sub.images[0]
        setup = encode_setup(Setup(0, 4242, 9, 0, 0, 64 * 1024, 1408, 0))
        body = b"forged!!"
        data = (
            encode_data_header(
                HEADER_LENGTH + len(body), FLAG_UNFRAGMENTED, 0, image.session_id, 9, image.log.initial_term_id
            )
            + body
        )
        good = MacKeys(KEY).signed(setup)
        altered = bytearray(good)
        altered[13] ^= 0xFF
        forged = [setup, data, MacKeys(NEW_KEY).signed(setup), bytes(altered), good[:-1], b"\x00" * 8]
        invalid_before = b.system.invalid_packets.get()
        _forge(port, forged)
        await _until(lambda: b.system.frames_failed_authentication.get() == len(forged))
        assert b.system.invalid_packets.get() == invalid_before
        assert [i.session_id for i in sub.images] == [image.session_id]
        assert [e.count for e in b.errors.entries() if "authentication" in e.key] == [len(forged)]
        assert await _exchange(pub, sub, [b"after"]) == [b"after"]


async def test_a_publication_takes_control_frames_only_signed_and_from_its_destination(tmp_path):
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|auth=mac"
    async with (
        open_media_driver(dir=tmp_path / "a", mac_key=KEY) as a,
        open_media_driver(dir=tmp_path / "b", mac_key=KEY) as b,
    ):
        sub = b.add_subscription(channel, 9)
        pub = a.add_publication(channel, 9)
        await _until(lambda: pub.is_connected)
        pub_port = next(np.sock.getsockname()[1] for np in a._net_pubs)
        sm = encode_status(pub.session_id, 9, 0, 0, 1 << 20, 99, send_setup=True)
        # Unsigned: failed authentication. Signed with the key but from an address this
        # publication does not send to (a replayed member datagram): invalid, dropped.
        invalid_before = a.system.invalid_packets.get()
        _forge(pub_port, [sm, MacKeys(KEY).signed(sm)])
        await _until(
            lambda: (
                a.system.frames_failed_authentication.get() == 1
                and a.system.invalid_packets.get() == invalid_before + 1
            )
        )
        assert [e.key for e in a.errors.entries()] == [
            "failed authentication at a publication",
            "control frame from a non-destination",
        ]
        assert await _exchange(pub, sub, [b"still"]) == [b"still"]


async def test_a_driver_with_another_key_never_connects(tmp_path):
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|auth=mac"
    async with (
        open_media_driver(dir=tmp_path / "a", mac_key=NEW_KEY, setup_interval_ns=10_000_000) as a,
        open_media_driver(dir=tmp_path / "b", mac_key=KEY) as b,
    ):
        sub = b.add_subscription(channel, 9)
        pub = a.add_publication(channel, 9)
        await _until(lambda: b.system.frames_failed_authentication.get() >= 3)
        assert not pub.is_connected and sub.image_count == 0


async def test_previous_key_accepted_during_a_rotation(tmp_path):
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|auth=mac"
    # b moved to the new key and still takes the old one; a (not restarted yet) has the old key
    # and the new one as its previous key: each signs with its current key, takes both.
    async with (
        open_media_driver(dir=tmp_path / "a", mac_key=KEY, mac_previous_key=NEW_KEY) as a,
        open_media_driver(dir=tmp_path / "b", mac_key=NEW_KEY, mac_previous_key=KEY) as b,
    ):
        sub = b.add_subscription(channel, 9)
        pub = a.add_publication(channel, 9)
        await _until(lambda: pub.is_connected)
        assert await _exchange(pub, sub, [b"x" * 3000, b"y"]) == [b"x" * 3000, b"y"]
        assert a.system.frames_failed_authentication.get() == b.system.frames_failed_authentication.get() == 0


async def test_plain_and_mac_channels_cannot_share_an_endpoint_and_mac_needs_a_key(tmp_path):
    from cluster_node.media.channel import ChannelError

    port = free_udp_port()
    async with open_media_driver(dir=tmp_path / "a", mac_key=KEY) as a, open_media_driver(dir=tmp_path / "b") as b:
        a.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|auth=mac", 9)
        for call in (
            lambda: a.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 10),
            lambda: b.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|auth=mac", 9),
        ):
            try:
                call()
            except ChannelError:
                continue
            raise AssertionError("accepted")
