"""Shared-memory IPC between threads and processes that point at the same driver directory.

Files, under ``<driver dir>/ipc/stream-<stream id>/``:

* ``<session id>.logbuffer``: one per publication (``cluster_node.media.logbuffer``), created by the publisher,
  mapped by every subscriber, removed by the publisher when it closes (readers keep their map).
* ``subscribers/<doorbell>``: an empty file per subscription, so that a new publication can ring
  the doorbells of the subscriptions already waiting for it instead of being found by a poll.

A subscription joins a publication at its current end (messages offered before it joined are
not delivered, as in the reference system): it takes a subscriber slot in the file and from then
on the publisher cannot run more than a term window ahead of it. Liveness works both ways:
the publisher writes a heartbeat into the file, each subscriber into its slot; a publisher whose
process is gone, or whose heartbeat is older than the image liveness timeout, makes the image
unavailable once what it wrote has been read; a dead subscriber's slot is freed so it no longer
holds the publisher back.

Peers in the same process (the node's conductor and service threads) are not judged by their
heartbeat: each thread beats from its own loop, and a thread that is busy for longer than the
liveness timeout (a service writing a large snapshot, a long callback) is alive all the same. A
link dropped for that was joined again at its tail, so what the busy side wrote meanwhile (the
snapshot's acknowledgement) was never read. A thread that dies ends its node, and a same-pid
file left by an earlier process (a reused pid) is told apart by a heartbeat older than this
process.
"""

from __future__ import annotations

import os
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path

import trio

from cluster_node.media.channel import DEFAULT_IPC_TERM_LENGTH, DEFAULT_MTU, ChannelUri
from cluster_node.media.counters import pid_alive
from cluster_node.media.doorbell import NEW_PUBLICATION, Doorbell, doorbell_pid, ring
from cluster_node.media.frames import frame_step, term_window
from cluster_node.media.library_log import library_logger
from cluster_node.media.logbuffer import MAX_POSITION, META_LENGTH, NO_SLOT, LogBuffer, LogBufferError
from cluster_node.media.private_files import FILE_MODE, make_private_dir
from cluster_node.media.publication import ExclusivePublication, OfferResult, Publication
from cluster_node.media.subscription import Image, Subscription

__all__ = ["IpcTransport", "pid_alive"]

_PROCESS_START_NS = time.monotonic_ns()
"""Roughly when this process started: a heartbeat of our pid from before it was another
process's."""


def _peer_gone(pid: int, my_pid: int, heartbeat_ns: int, now_ns: int, liveness_ns: int, judgeable: bool) -> bool:
    """Is the peer (a publisher, or a subscriber's slot) with ``pid`` and ``heartbeat_ns`` gone?
    See the module docstring: another process by its pid and its heartbeat, this process's
    other threads never by their heartbeat."""
    if pid == my_pid:
        return heartbeat_ns < _PROCESS_START_NS
    return (now_ns - heartbeat_ns > liveness_ns and judgeable) or not pid_alive(pid)


log = library_logger("media.ipc")
_PREFIX = struct.Struct("<iBBH").unpack_from


def _scan_to_tail(lb: LogBuffer, position: int) -> int:
    """Walk frames from ``position`` to the first unwritten one: the publication's end."""
    buf = lb.buffer
    cap = lb.capacity
    for _ in range(1 << 22):
        flen, _v, _f, ftype = _PREFIX(buf, META_LENGTH + position % cap)
        if flen <= 0:
            return position
        position += frame_step(flen)
    return position


class _IpcImageState:
    __slots__ = ("image", "slot", "gone_since_ns")

    def __init__(self, image: Image, slot: int) -> None:
        self.image = image
        self.slot = slot
        self.gone_since_ns = 0


class _IpcSub:
    __slots__ = ("sub", "doorbell", "marker", "dir", "images", "rescan", "own_doorbell", "waiting")

    def __init__(
        self, sub: Subscription, doorbell: Doorbell, marker: Path, directory: Path, own_doorbell: bool = True
    ) -> None:
        self.sub = sub
        self.doorbell = doorbell
        self.marker = marker
        self.dir = directory
        self.images: dict[str, _IpcImageState] = {}
        self.rescan = True
        self.own_doorbell = own_doorbell
        self.waiting = False  # in Subscription.wait: image changes ring the doorbell

    def images_changed(self) -> None:
        """Images came or went: end a wait in progress (same thread: no system call)."""
        if self.waiting:
            ring(self.doorbell.name)


class IpcTransport:
    """The IPC part of a media driver; its duty cycle runs in the driver's conductor."""

    def __init__(
        self,
        driver_dir: Path,
        *,
        image_liveness_timeout_ns: int = 10_000_000_000,
        heartbeat_interval_ns: int = 100_000_000,
        rescan_interval_ns: int = 1_000_000_000,
        default_term_length: int = DEFAULT_IPC_TERM_LENGTH,
        on_image_count: Callable[[int], None] | None = None,
        timer_slack_ns: int = 0,
    ) -> None:
        self.dir = Path(driver_dir) / "ipc"
        self.liveness_ns = image_liveness_timeout_ns
        self.heartbeat_interval_ns = heartbeat_interval_ns
        self.timer_slack_ns = timer_slack_ns
        """How early :meth:`do_work` may run its heartbeat duty: a caller that wakes on a timer
        grid (the media driver's conductor) then does it in the wake-up just before its deadline
        instead of waking again a few milliseconds later for it alone."""
        self.rescan_interval_ns = rescan_interval_ns
        self.default_term_length = default_term_length
        self._pubs: list[ExclusivePublication] = []
        self._subs: list[_IpcSub] = []
        self._last_heartbeat_ns = 0
        self._grace_until_ns = 0
        self._last_rescan_ns = 0
        self._pid = os.getpid()
        self._rng = random.Random()
        self.images_available = 0
        self.images_unavailable = 0

    def _stream_dir(self, stream_id: int) -> Path:
        return self.dir / f"stream-{stream_id}"

    def remove_stale_files(self, min_age_s: float = 10.0) -> tuple[int, int]:
        """Remove what processes that died without closing (kill -9) left in the directory:
        log buffers whose publisher process is gone, and subscriber markers of dead processes.
        Returns ``(files removed, bytes of their size)``.

        A publisher removes its log buffer when it closes; one killed cannot, and a node that
        is killed and restarted in a loop would otherwise leave its local log buffers (up to
        three terms each, a term of the cluster log being 64 MiB by default) behind every time.
        Only files of dead processes go: a live publisher's buffer is never touched (one of this
        process's beats), and readers that still map a removed buffer keep their map. Unreadable
        buffers and half-created ones (``.tmp``, a crash during creation) go when older than
        ``min_age_s``, so a file another process is creating at this moment is left alone."""
        removed = freed = 0
        if not self.dir.is_dir():
            return 0, 0
        now = time.time()
        for stream_dir in self.dir.iterdir():
            if not stream_dir.is_dir():
                continue
            for path in stream_dir.iterdir():
                try:
                    if path.name.endswith(".logbuffer"):
                        try:
                            lb = LogBuffer.open(path)
                        except (LogBufferError, ValueError):
                            stale = now - path.stat().st_mtime > min_age_s
                        else:
                            pid, beat = lb.publisher_pid, lb.publisher_heartbeat_ns
                            lb.close()
                            if pid == self._pid:
                                # Ours, or an earlier process's that had our pid (a container
                                # restarted gives its entry point the same pid): ours beat.
                                age = time.monotonic_ns() - beat
                                stale = age > self.liveness_ns or age < 0
                            else:
                                stale = not pid_alive(pid)
                    elif path.name.endswith(".logbuffer.tmp"):
                        stale = now - path.stat().st_mtime > min_age_s
                    else:
                        continue
                    if stale:
                        size = path.stat().st_size
                        path.unlink()
                        removed += 1
                        freed += size
                except OSError:
                    continue  # gone meanwhile, or not ours to remove
            markers = stream_dir / "subscribers"
            if markers.is_dir():
                for marker in markers.iterdir():
                    pid = doorbell_pid(marker.name)
                    if pid is not None and pid != self._pid and not pid_alive(pid):
                        try:
                            marker.unlink()
                            removed += 1
                        except OSError:
                            pass
        return removed, freed

    # ------------------------------------------------------------------ publications

    def add_publication(self, channel: ChannelUri, stream_id: int, exclusive: bool = True) -> ExclusivePublication:
        term_length = channel.term_length or self.default_term_length
        session_id = channel.session_id if channel.session_id is not None else self._rng.randrange(-(2**31), 2**31)
        if channel.has_initial_position:
            initial_term_id = channel.initial_term_id
            start = channel.initial_position(term_length)
        else:
            initial_term_id = self._rng.randrange(-(2**31), 2**31)
            start = 0
        path = self._stream_dir(stream_id) / f"{session_id}.logbuffer"
        if path.exists():
            try:
                other = LogBuffer.open(path)
                owner = other.publisher_pid
                other.close()
            except LogBufferError:
                owner = 0
            if pid_alive(owner):
                raise ValueError(f"IPC session {session_id} on stream {stream_id} is already published by pid {owner}")
        lb = LogBuffer.create(
            path, term_length, channel.mtu or DEFAULT_MTU, initial_term_id, session_id, stream_id, start
        )
        lb.publisher_heartbeat_ns = time.monotonic_ns()
        window = term_window(term_length)
        liveness = self.liveness_ns
        mypid = self._pid

        def limit_fn(pub: ExclusivePublication) -> int:
            now = time.monotonic_ns()
            lowest = None
            for slot, pid, pos, hb, _parked, _bell in lb.active_slots():
                if _peer_gone(pid, mypid, hb, now, liveness, self.peers_judgeable(now)):
                    lb.release_slot(slot)
                    continue
                if lowest is None or pos < lowest:
                    lowest = pos
            if lowest is None:
                return OfferResult.NOT_CONNECTED
            return lowest + window

        def ring_fn() -> None:
            for bell in lb.take_parked():
                ring(bell)

        bell: list[Doorbell] = []  # made on the first wait: most publications never wait

        def on_close(pub: ExclusivePublication) -> None:
            for doorbell in bell:
                doorbell.close()
            self._close_publication(pub)

        cls = ExclusivePublication if exclusive else Publication
        pub = cls(
            log=lb,
            channel=channel,
            stream_id=stream_id,
            session_id=session_id,
            start_position=start,
            limit_fn=limit_fn,
            ring_fn=ring_fn,
            on_close=on_close,
        )

        async def wait_impl(timeout: float) -> None:
            if pub.closed:
                await trio.lowlevel.checkpoint()
                return
            if not bell:
                bell.append(Doorbell())
            doorbell = bell[0]
            doorbell.drain()
            lb.park_publisher(doorbell.name)
            try:
                # Re-check after parking: a subscriber that moved before it could see the flag
                # did not ring.
                if pub._limit_fn(pub) <= pub.position:
                    await doorbell.wait(timeout)
                else:
                    await trio.lowlevel.checkpoint()
            finally:
                lb.unpark_publisher()

        pub._wait_impl = wait_impl
        self._pubs.append(pub)
        # Tell the subscriptions already waiting for this stream.
        subs_dir = self._stream_dir(stream_id) / "subscribers"
        if subs_dir.is_dir():
            for marker in subs_dir.iterdir():
                if not ring(marker.name.encode(), NEW_PUBLICATION):
                    try:
                        marker.unlink()  # its process is gone
                    except OSError:
                        pass
        log.debug("ipc publication added", stream_id=stream_id, session_id=session_id, path=str(path))
        return pub

    def _close_publication(self, pub: ExclusivePublication) -> None:
        lb = pub.log
        lb.publisher_position = pub.position
        lb.end_of_stream_position = pub.position
        for bell in lb.take_parked():
            ring(bell)
        for _slot, _pid, _pos, _hb, _parked, bell in lb.active_slots():
            ring(bell)
        lb.unlink()
        if pub in self._pubs:
            self._pubs.remove(pub)

    # ------------------------------------------------------------------ subscriptions

    def add_subscription(
        self,
        channel: ChannelUri,
        stream_id: int,
        doorbell: Doorbell | None = None,
        max_wait_s: float | None = 0.5,
        **callbacks,
    ) -> Subscription:
        """A subscription of ``stream_id`` (``session-id`` in the channel: that publication only).

        ``doorbell``: a doorbell shared with other subscriptions (and anything else the owner
        waits for), so that one thread can wait for all of them at once without a task each:
        it parks them with :meth:`Subscription.set_parked`, waits on the doorbell, and calls
        :meth:`rescan` when the doorbell's drain reports a new publication. Without it, the
        subscription has a doorbell of its own and :meth:`Subscription.wait` does all that.

        ``max_wait_s``: the longest a :meth:`Subscription.wait` lasts, whatever its caller asks,
        so that a caller whose own loop runs :meth:`do_work` (heartbeats, liveness, which add and
        drop images) gets to run it. None: no cap, for a caller that runs :meth:`do_work`
        elsewhere in the same thread (the media driver's conductor): image changes made there
        ring the waiting subscription, and writers and new publications ring it anyway.
        """
        sub = Subscription(channel=channel, stream_id=stream_id, **callbacks)
        own = doorbell is None
        if doorbell is None:
            doorbell = Doorbell()
        directory = self._stream_dir(stream_id)
        marker = directory / "subscribers" / doorbell.name.decode()
        make_private_dir(marker.parent)
        marker.touch(mode=FILE_MODE)
        state = _IpcSub(sub, doorbell, marker, directory, own)
        self._subs.append(state)

        def park_impl(parked: bool) -> None:
            for st in list(state.images.values()):
                if not st.image.closed:
                    st.image.log.set_slot_parked(st.slot, parked)

        sub._park_impl = park_impl

        async def wait_impl(timeout: float) -> None:
            park = sub.writers_ring
            if park:
                park_impl(True)
            try:
                # Re-check once parked: an append made before the flags were set rang nobody.
                if not sub.has_data():
                    state.waiting = True
                    await doorbell.wait(timeout if max_wait_s is None else min(timeout, max_wait_s))
            finally:
                state.waiting = False
                if park:
                    park_impl(False)
            if NEW_PUBLICATION in doorbell.drain():
                state.rescan = True
                self._scan(state, time.monotonic_ns())

        def close_impl(_sub: Subscription) -> None:
            self._close_subscription(state)

        sub._wait_impl = wait_impl
        sub._close_impl = close_impl
        self._scan(state, time.monotonic_ns())
        return sub

    def _scan(self, state: _IpcSub, now_ns: int) -> None:
        state.rescan = False
        if not state.dir.is_dir():
            return
        wanted = state.sub.channel.session_id  # aeron:ipc?session-id=N: that publication only
        for path in state.dir.glob("*.logbuffer"):
            key = path.name
            if key in state.images:
                continue
            if wanted is not None and key != f"{wanted}.logbuffer":
                continue
            try:
                lb = LogBuffer.open(path)
            except (LogBufferError, ValueError, OSError):
                continue
            if lb.end_of_stream_position != MAX_POSITION or not pid_alive(lb.publisher_pid):
                lb.close()
                continue
            join = _scan_to_tail(lb, lb.publisher_position)
            slot = lb.claim_slot(join, now_ns, state.doorbell.name)
            if slot == NO_SLOT:
                log.warning("ipc publication has no free subscriber slot", path=str(path))
                lb.close()
                continue
            # The publisher may have appended between the scan and the claim: catch up to the end
            # again so we start exactly where our slot holds it.
            image = Image(
                log=lb,
                subscription=state.sub,
                join_position=join,
                source_identity=f"ipc:pid={lb.publisher_pid}",
                position_offset=lb.slot_position_offset(slot),
                eos_fn=lambda lb=lb: None if (e := lb.end_of_stream_position) == MAX_POSITION else e,
                ring_publisher=lambda lb=lb: ring(lb.take_parked_publisher()),
            )
            ring(lb.take_parked_publisher())  # a publisher waiting to be connected
            state.images[key] = _IpcImageState(image, slot)
            self.images_available += 1
            state.sub._add_image(image)
            state.images_changed()

    def _close_subscription(self, state: _IpcSub) -> None:
        for st in state.images.values():
            st.image.log.release_slot(st.slot)
            ring(st.image.log.take_parked_publisher())  # its limit may have moved up
        state.images.clear()
        if state in self._subs:
            self._subs.remove(state)
        if state.own_doorbell:
            state.doorbell.close()
        if any(other.marker == state.marker for other in self._subs):
            return  # a shared doorbell still serves another subscription of this stream
        try:
            state.marker.unlink()
        except OSError:
            pass

    def rescan(self) -> None:
        """Look for new publications for every subscription now (a shared doorbell was rung with
        NEW_PUBLICATION: it does not say for which subscription)."""
        now = time.monotonic_ns()
        for state in list(self._subs):
            self._scan(state, now)

    # ------------------------------------------------------------------ duty cycle

    def next_deadline_ns(self) -> int:
        return self._last_heartbeat_ns + self.heartbeat_interval_ns

    def peers_judgeable(self, now_ns: int) -> bool:
        """Whether a peer's old heartbeat may be taken to mean it is gone.

        Not while this transport itself did not run for a while (a stall of its own process:
        SIGSTOP, an overloaded machine), nor for one liveness timeout after such a stall: the
        peer, often the other thread of the same stopped process, has not had the chance to
        beat yet. Without this, whichever side ran first after a stall dropped the other: a
        subscriber re-joined at the tail and skipped what was written meanwhile (a clustered
        service then diverged from its log), a publisher freed a slot and stopped waiting for
        its reader. A peer whose process is gone is still dropped at once (pid check)."""
        if self._last_heartbeat_ns == 0:
            return True  # no duty cycle yet: nothing says we stalled
        return now_ns >= self._grace_until_ns and now_ns - self._last_heartbeat_ns <= self.liveness_ns // 2

    def do_work(self, now_ns: int) -> int:
        """Heartbeats, liveness and discovery; cheap enough to run every heartbeat interval."""
        if now_ns - self._last_heartbeat_ns < self.heartbeat_interval_ns - self.timer_slack_ns:
            return 0
        if self._last_heartbeat_ns and now_ns - self._last_heartbeat_ns > self.liveness_ns // 2:
            self._grace_until_ns = now_ns + self.liveness_ns  # we stalled: peers get time to beat
            log.info(
                "ipc transport stalled, liveness judgements deferred",
                late_ms=(now_ns - self._last_heartbeat_ns) // 1_000_000,
            )
        self._last_heartbeat_ns = now_ns
        work = 0
        for pub in self._pubs:
            pub.log.publisher_heartbeat_ns = now_ns
            pub.log.publisher_position = pub.position
        rescan_all = now_ns - self._last_rescan_ns >= self.rescan_interval_ns
        if rescan_all:
            self._last_rescan_ns = now_ns
        for state in list(self._subs):
            for key, st in list(state.images.items()):
                image = st.image
                lb = image.log
                lb.set_slot_heartbeat(st.slot, now_ns)
                if image.is_end_of_stream:
                    self._drop_image(state, key, st, unlink=False)
                    work += 1
                    continue
                if _peer_gone(
                    lb.publisher_pid,
                    self._pid,
                    lb.publisher_heartbeat_ns,
                    now_ns,
                    self.liveness_ns,
                    self.peers_judgeable(now_ns),
                ):
                    if not image.has_data():
                        self._drop_image(state, key, st, unlink=True)
                        work += 1
            if state.rescan or rescan_all:
                self._scan(state, now_ns)
        return work

    def _drop_image(self, state: _IpcSub, key: str, st: _IpcImageState, unlink: bool) -> None:
        del state.images[key]
        st.image.log.release_slot(st.slot)
        ring(st.image.log.take_parked_publisher())
        if unlink and not pid_alive(st.image.log.publisher_pid):
            st.image.log.unlink()
        self.images_unavailable += 1
        state.sub._remove_image(st.image)
        state.images_changed()

    def close(self) -> None:
        for pub in list(self._pubs):
            pub.close()
        for state in list(self._subs):
            state.sub.close()
