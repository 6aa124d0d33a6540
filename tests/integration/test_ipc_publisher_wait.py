"""A back-pressured IPC publisher waits on a doorbell that its subscribers ring when they move, join
or leave (no polling timer), and a block poll takes what ``offer_block`` vouched for without
walking frames."""

from __future__ import annotations

import threading

import trio
import trio.testing

from cluster_node.media.driver import open_media_driver
from cluster_node.media.frames import DATA_HEADER
from cluster_node.media.logbuffer import LogBuffer
from cluster_node.media.publication import OfferResult

TERM = 64 * 1024


def _fill(pub) -> int:
    """Offer until the window is full; the number of messages offered."""
    n = 0
    while (r := pub.offer(b"x" * 200)) > 0:
        n += 1
    assert r == OfferResult.BACK_PRESSURED
    return n


async def _connected(sub):
    with trio.fail_after(5):
        while not sub.images:
            await sub.wait(0.1)
    return sub.images[0]


async def _wait_parked(pub) -> None:
    with trio.fail_after(5):
        while not pub.log.buffer[LogBuffer.PUBLISHER_PARKED_OFFSET]:
            await trio.sleep(0.001)


async def test_a_full_window_opens_when_the_subscriber_in_the_same_loop_polls(tmp_path):
    async with open_media_driver(dir=tmp_path, ipc_term_length=TERM) as driver:
        sub = driver.add_subscription("aeron:ipc", 3)
        pub = driver.add_publication("aeron:ipc", 3)
        await _connected(sub)
        offered = _fill(pub)
        got = []

        async def reader():
            await _wait_parked(pub)
            while len(got) < offered:
                sub.poll(lambda b, o, n, h: got.append(n), 100)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            with trio.fail_after(5):  # the wait's own timeout is far longer: the ring ended it
                await pub.wait(60)
        assert pub.offer(b"after") > 0
        assert not pub.log.buffer[LogBuffer.PUBLISHER_PARKED_OFFSET]


async def test_a_subscriber_in_another_thread_rings_the_publisher_through_its_doorbell(tmp_path):
    async with open_media_driver(dir=tmp_path, ipc_term_length=TERM) as driver:
        sub = driver.add_subscription("aeron:ipc", 4)
        pub = driver.add_publication("aeron:ipc", 4)
        await _connected(sub)
        offered = _fill(pub)
        ready = threading.Event()
        got = []

        def consume():
            ready.wait(10)
            while len(got) < offered:
                sub.poll(lambda b, o, n, h: got.append(n), 100)

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        try:
            async with trio.open_nursery() as nursery:

                async def release():
                    await _wait_parked(pub)
                    ready.set()

                nursery.start_soon(release)
                with trio.fail_after(5):
                    await pub.wait(60)
        finally:
            ready.set()
            t.join(10)
        assert pub.offer(b"after") > 0


async def test_a_publisher_waiting_to_be_connected_is_rung_when_a_subscriber_joins(tmp_path):
    async with open_media_driver(dir=tmp_path, ipc_term_length=TERM) as driver:
        pub = driver.add_publication("aeron:ipc", 5)
        assert pub.offer(b"nobody") == OfferResult.NOT_CONNECTED
        async with trio.open_nursery() as nursery:

            async def join():
                await _wait_parked(pub)
                await _connected(driver.add_subscription("aeron:ipc", 5))

            nursery.start_soon(join)
            with trio.fail_after(5):
                await pub.wait(60)
        assert pub.is_connected and pub.offer(b"somebody") > 0


async def test_a_publisher_held_back_by_a_subscriber_is_rung_when_that_subscriber_closes(tmp_path):
    async with open_media_driver(dir=tmp_path, ipc_term_length=TERM) as driver:
        slow = driver.add_subscription("aeron:ipc", 6)
        pub = driver.add_publication("aeron:ipc", 6)
        await _connected(slow)
        _fill(pub)
        async with trio.open_nursery() as nursery:

            async def leave():
                await _wait_parked(pub)
                slow.close()

            nursery.start_soon(leave)
            with trio.fail_after(5):
                await pub.wait(60)
        assert pub.offer(b"x") == OfferResult.NOT_CONNECTED  # nobody holds it back, nobody reads


def _frames(count: int, size: int, term_offset: int, term_id: int) -> bytearray:
    aligned = (size + 32 + 31) & ~31
    block = bytearray(count * aligned)
    for i in range(count):
        DATA_HEADER.pack_into(block, i * aligned, size + 32, 0, 0xC0, 1, term_offset + i * aligned, 0, 0, term_id, 0)
        block[i * aligned + 32 : i * aligned + 32 + size] = bytes([i % 251]) * size
    return block


async def test_block_poll_takes_an_offered_block_whole_and_never_a_partial_frame(tmp_path):
    async with open_media_driver(dir=tmp_path, ipc_term_length=TERM) as driver:
        sub = driver.add_subscription("aeron:ipc", 8)
        pub = driver.add_publication("aeron:ipc", 8)
        image = await _connected(sub)
        blocks = []
        block = _frames(10, 100, 0, pub.term_id)
        assert pub.offer_block(block, 0, len(block)) == len(block)
        assert image.block_poll(lambda b, o, n, p: blocks.append((p, n)), 1 << 20) == len(block)
        # A block poll limited below the publisher's edge still ends at a frame boundary.
        block2 = _frames(10, 100, len(block), pub.term_id)
        pub.offer_block(block2, 0, len(block2))
        assert image.block_poll(lambda b, o, n, p: blocks.append((p, n)), 330) == 320  # two 160-byte frames
        # A message offered one by one (offer() moves no edge): the frames below the edge the
        # last offer_block left are taken without a walk, the new message's frame is walked to.
        pub.offer(b"y" * 10)
        assert image.block_poll(lambda b, o, n, p: blocks.append((p, n)), 1 << 20) == len(block2) - 320 + 64
        assert image.block_poll(lambda b, o, n, p: blocks.append((p, n)), 1 << 20) == 0
        assert [p for p, _ in blocks] == [0, len(block), len(block) + 320]


async def test_a_transport_that_stalled_does_not_judge_its_peers_by_their_old_heartbeats(tmp_path):
    """Both ends of an IPC stream in one process stop together (SIGSTOP, an overloaded machine).
    Whichever transport runs first afterwards sees the other's heartbeat as old: it must not
    drop the image (the reader would re-join at the tail and skip what was written meanwhile) or
    free the reader's slot, until the other has had a liveness timeout to beat again."""
    import time

    from cluster_node.media.channel import parse
    from cluster_node.media.ipc import IpcTransport

    liveness = 2_000_000_000
    sub_side = IpcTransport(tmp_path, image_liveness_timeout_ns=liveness, heartbeat_interval_ns=100_000_000)
    pub_side = IpcTransport(tmp_path, image_liveness_timeout_ns=liveness, heartbeat_interval_ns=100_000_000)
    sub = sub_side.add_subscription(parse("aeron:ipc"), 9)
    pub = pub_side.add_publication(parse("aeron:ipc"), 9)
    sub_side.rescan()
    now = time.monotonic_ns()
    pub_side.do_work(now)
    sub_side.do_work(now)
    assert len(sub.images) == 1 and pub.offer(b"before") > 0
    sub.poll(lambda *a: None, 10)
    image = sub.images[0]
    later = now + 3 * liveness // 2  # both were stopped for 1.5 liveness timeouts
    sub_side.do_work(later)  # the subscriber's side runs first: the publisher's beat is old
    # (The old behaviour dropped the image and at once re-joined the stream at its tail: a new
    # image, and whatever was written in between was never delivered.)
    assert sub.images == (image,), "the image was dropped for a stall of our own"
    assert not sub_side.peers_judgeable(later)
    # A peer of this process is never judged by its heartbeat, however long it stays silent:
    # its thread lives as long as the process (a busy service thread is not a gone one).
    for t in range(later + 100_000_000, later + 3 * liveness, 100_000_000):
        sub_side.do_work(t)
    assert sub.images == (image,), "a publisher of this process was dropped for its silence"
    assert pub.offer(b"after") > 0
    got: list[bytes] = []
    sub.poll(lambda buf, offset, length, header: got.append(bytes(buf[offset : offset + length])), 10)
    assert got == [b"after"]
    pub.close()
    sub_side.do_work(later + 3 * liveness)
    assert image not in sub.images, "a closed publication ends its image"
    sub.close()
