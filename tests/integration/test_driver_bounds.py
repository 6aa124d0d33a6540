"""The driver's bounds on what remote SETUPs and datagrams may make it do, over real UDP.

Forged SETUPs cost an attacker one datagram each and the driver a mapping of three terms and
three counters: the term length, the images per endpoint and per source host, and the rate of
new images are bounded by the config; running out of counters refuses the image; a datagram
whose handling raises closes its image only. Each refusal is counted (Images refused), the
driver goes on serving its real streams.
"""

from __future__ import annotations

import socket

import trio

from cluster_node.media.driver import open_media_driver
from cluster_node.media.frames import Setup, encode_setup
from tests.support.procs import free_udp_port

_MINUTE = 60_000_000_000
QUIET = dict(
    network_term_length=64 * 1024,
    heartbeat_interval_ns=_MINUTE,
    status_message_timeout_ns=_MINUTE,
    setup_interval_ns=20_000_000,
    publication_connection_timeout_ns=_MINUTE,
    image_liveness_timeout_ns=_MINUTE,
)


async def _until(cond, timeout=10.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


def _setups(port: int, sessions, term_length: int = 64 * 1024, stream_id: int = 9, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        for session_id in sessions:
            s.sendto(encode_setup(Setup(0, session_id, stream_id, 0, 0, term_length, 1408, 0)), ("127.0.0.1", port))


async def _still_serves(driver, port: int) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    pub = driver.add_publication(channel, 77)
    sub = driver.add_subscription(channel, 77)
    await _until(lambda: pub.is_connected)
    got: list[bytes] = []
    with trio.fail_after(10):
        while pub.offer(b"real") < 0:
            await trio.sleep(0.005)
        while not got:
            sub.poll(lambda buf, off, n, h: got.append(bytes(buf[off : off + n])), 10)
            await trio.sleep(0.005)
    assert got == [b"real"]


async def test_a_setup_asking_for_a_term_above_the_bound_is_refused(tmp_path):
    port = free_udp_port()
    async with open_media_driver(dir=tmp_path, max_receive_term_length=1024 * 1024, **QUIET) as driver:
        sub = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 9)
        _setups(port, [1], term_length=1024 * 1024 * 1024)
        _setups(port, [2], term_length=1024 * 1024)
        await _until(lambda: driver.system.images_refused.get() == 1 and sub.image_count == 1)
        assert [i.term_length for i in sub.images] == [1024 * 1024]
        await _still_serves(driver, port)


async def test_images_per_source_and_per_endpoint_are_bounded(tmp_path):
    port = free_udp_port()
    async with open_media_driver(dir=tmp_path, max_images_per_source=3, max_images_per_endpoint=5, **QUIET) as driver:
        sub = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 9)
        _setups(port, range(1, 11), host="127.0.0.1")
        await _until(lambda: sub.image_count == 3 and driver.system.images_refused.get() == 7)
        _setups(port, range(11, 21), host="127.0.0.2")
        await _until(lambda: sub.image_count == 5 and driver.system.images_refused.get() == 15)
        await _still_serves(driver, free_udp_port())


async def test_new_images_a_second_are_bounded(tmp_path):
    port = free_udp_port()
    async with open_media_driver(dir=tmp_path, image_creations_per_s=10, **QUIET) as driver:
        sub = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 9)
        _setups(port, range(1, 51))
        await _until(lambda: sub.image_count + driver.system.images_refused.get() == 50)
        assert 10 <= sub.image_count <= 12  # the burst, and what a second refills meanwhile


async def test_running_out_of_counters_refuses_the_image_and_the_driver_goes_on(tmp_path):
    port = free_udp_port()
    async with open_media_driver(dir=tmp_path, max_counters=60, **QUIET) as driver:
        sub = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 9)
        _setups(port, range(1, 41))
        await _until(lambda: sub.image_count + driver.system.images_refused.get() == 40)
        assert driver.system.images_refused.get() > 0
        assert any("CountersError" in e.key for e in driver.errors.entries())
        for image in list(sub.images):  # free the counters the forged images took
            driver._drop_image(
                next(
                    ni
                    for g in driver._all_groups()
                    for ni in g.images.values()
                    if ni.core.session_id == image.session_id
                )
            )
        await _still_serves(driver, free_udp_port())


async def test_a_datagram_whose_handling_raises_closes_its_image_only(tmp_path, monkeypatch):
    port = free_udp_port()
    async with open_media_driver(dir=tmp_path, **QUIET) as driver:
        channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
        sub = driver.add_subscription(channel, 9)
        good, bad = driver.add_publication(channel, 9), driver.add_publication(channel, 9)
        await _until(lambda: good.is_connected and bad.is_connected and sub.image_count == 2)
        from cluster_node.media.receiver_core import ImageReceiverCore

        real = ImageReceiverCore.on_data

        def on_data(self, run, now):
            if self.session_id == bad.session_id:
                raise RuntimeError("a fault the checks missed")
            return real(self, run, now)

        monkeypatch.setattr(ImageReceiverCore, "on_data", on_data)
        errors = driver.system.errors.get()
        assert bad.offer(b"boom") > 0
        await _until(lambda: driver.system.errors.get() == errors + 1 and sub.image_count == 1)
        assert sub.images[0].session_id == good.session_id
        got: list[bytes] = []
        with trio.fail_after(10):
            while good.offer(b"fine") < 0:
                await trio.sleep(0.005)
            while not got:
                sub.poll(lambda buf, off, n, h: got.append(bytes(buf[off : off + n])), 10)
                await trio.sleep(0.005)
        assert got == [b"fine"]
