"""A pipelined client of the ``kv`` example service, for tests and benchmarks.

:class:`KvClient` wraps a trio :class:`ClusterClient`: requests carry unique request ids, replies
are matched by id, and many requests may be in flight at once.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import trio

from cluster_node.client import open_cluster_client
from cluster_node.client.cluster_client import ClusterClient
from cluster_node.config import ClientConfig
from cluster_node.service.examples.kv import (
    Append,
    Get,
    Put,
    Reply,
    Status,
    decode_reply,
    encode_request,
)


class KvClient:
    """Pipelined kv requests over one trio ClusterClient (the client reconnects by itself)."""

    def __init__(self, client: ClusterClient, first_request_id: int = 1) -> None:
        self.client = client
        self._next_id = first_request_id
        self.replies: dict[int, Reply] = {}
        self._events: dict[int, trio.Event] = {}
        self.undecodable = 0

    def on_message(self, payload: memoryview, header) -> None:
        try:
            reply = decode_reply(payload)
        except msgspec.MsgspecError:
            self.undecodable += 1
            return
        self.replies[reply.request_id] = reply
        ev = self._events.pop(reply.request_id, None)
        if ev is not None:
            ev.set()

    def next_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    async def send(self, request, timeout: float = 10.0) -> int:
        """Offer one request (waiting out back-pressure and leader changes); its request id."""
        self._events[request.request_id] = trio.Event()
        await self.client.offer_wait(encode_request(request), timeout)
        return request.request_id

    async def wait_reply(self, request_id: int, timeout: float) -> Reply | None:
        if request_id in self.replies:
            return self.replies[request_id]
        ev = self._events.setdefault(request_id, trio.Event())
        with trio.move_on_after(timeout):
            await ev.wait()
        return self.replies.get(request_id)

    async def call(self, request, timeout: float = 10.0, resend_s: float | None = None) -> Reply:
        """Send ``request`` and wait for its reply. With ``resend_s`` (idempotent requests only),
        send it again whenever no reply came within that long, as an application does when a
        message may have gone to a leader that has just stepped down."""
        deadline = trio.current_time() + timeout
        while True:
            left = deadline - trio.current_time()
            if left <= 0:
                raise TimeoutError(f"no reply to {request!r} within {timeout}s")
            await self.send(request, left)
            wait = left if resend_s is None else min(left, resend_s)
            reply = await self.wait_reply(request.request_id, wait)
            if reply is not None:
                return reply
            if resend_s is None:
                raise TimeoutError(f"no reply to {request!r} within {timeout}s")

    async def put(self, key: str, value: bytes, timeout: float = 10.0, resend_s: float | None = None) -> Reply:
        return await self.call(Put(self.next_id(), key, value), timeout, resend_s)

    async def get(self, key: str, timeout: float = 10.0, resend_s: float | None = None) -> Reply:
        return await self.call(Get(self.next_id(), key), timeout, resend_s)

    async def append(self, key: str, value: bytes, timeout: float = 10.0) -> Reply:
        return await self.call(Append(self.next_id(), key, value), timeout)

    async def pipeline(
        self, requests: list, timeout: float = 30.0, window: int = 256, resend_s: float | None = None
    ) -> dict[int, Reply]:
        """Send ``requests`` with up to ``window`` in flight; wait for every reply (or raise).

        With ``resend_s`` (idempotent requests only), the requests in flight are sent again
        whenever the oldest has had no reply for that long: messages in flight when the leader
        steps down may never be applied, or be applied without a reply (the reference's
        semantics: the client resends)."""
        deadline = trio.current_time() + timeout
        by_id = {req.request_id: req for req in requests}
        pending: list[int] = []
        for req in requests:
            while len(pending) >= window:
                await self._await_first(pending, deadline, by_id, resend_s)
            await self.send(req, max(0.1, deadline - trio.current_time()))
            pending.append(req.request_id)
            pending = [rid for rid in pending if rid not in self.replies]
        while pending:
            await self._await_first(pending, deadline, by_id, resend_s)
            pending = [rid for rid in pending if rid not in self.replies]
        return {req.request_id: self.replies[req.request_id] for req in requests}

    async def _await_first(
        self, pending: list[int], deadline: float, by_id: dict | None = None, resend_s: float | None = None
    ) -> None:
        rid = pending[0]
        while True:
            left = deadline - trio.current_time()
            if left <= 0:
                break
            if await self.wait_reply(rid, left if resend_s is None else min(left, resend_s)) is not None:
                pending[:] = [r for r in pending if r not in self.replies]
                return
            if resend_s is None or by_id is None:
                break
            for r in [r for r in pending if r not in self.replies]:
                await self.send(by_id[r], max(0.1, deadline - trio.current_time()))
        raise TimeoutError(f"no reply to request {rid} in time ({len(pending)} pending)")


def open_kv_client(config: ClientConfig, first_request_id: int = 1, **kwargs):
    """``async with open_kv_client(cfg) as kv``: a connected :class:`KvClient`."""
    holder: list[KvClient] = []

    def handler(payload, header):
        holder[0].on_message(payload, header)

    class _Ctx:
        async def __aenter__(self) -> KvClient:
            self._cm = open_cluster_client(config, on_message=handler, **kwargs)
            kv = KvClient.__new__(KvClient)
            holder.append(kv)
            client = await self._cm.__aenter__()
            KvClient.__init__(kv, client, first_request_id)
            return kv

        async def __aexit__(self, *exc):
            return await self._cm.__aexit__(*exc)

    return _Ctx()


class BulkLoad:
    """Large PUTs in pipelined batches over one :class:`KvClient` until ``stopped()``: load that
    makes the log (and so the archive) grow fast, beside a test's own checked writes.

    The values cycle over ``keys`` keys (``bulk<n>``), so the service's state stays small while
    the log grows. ``written`` counts the value bytes acknowledged; ``paused`` holds the load
    between batches (a test that must measure something before the load goes on). ``run`` may
    be started again after it returned: the keys and values carry on where they stopped."""

    def __init__(
        self, kv: KvClient, stopped: Callable[[], bool], *, value_length: int, keys: int, batch: int = 32
    ) -> None:
        self.kv = kv
        self.stopped = stopped
        self.value_length = value_length
        self.keys = keys
        self.batch = batch
        self.paused = False
        self.written = 0
        self._next = 0

    async def run(self) -> None:
        while not self.stopped():
            if self.paused:
                await trio.sleep(0.05)
                continue
            i = self._next
            batch = [
                Put(self.kv.next_id(), f"bulk{(i + j) % self.keys}", bytes([(i + j) % 251]) * self.value_length)
                for j in range(self.batch)
            ]
            self._next += self.batch
            replies = await self.kv.pipeline(batch, timeout=60)
            assert all(r.status == Status.OK for r in replies.values()), "a bulk PUT was refused"
            self.written += self.batch * self.value_length
