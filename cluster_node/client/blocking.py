"""A blocking cluster client for scripts and the CLI: a ClusterClient in a trio loop of its own thread.

::

    with BlockingClusterClient(load_client_config("configs/client.toml")) as client:
        client.offer_wait(b"hello")
        payload, header = client.receive(timeout=5.0)

Every call crosses into the client's thread (``trio.from_thread``), a few tens of microseconds
each: fine for scripts and tools, not for throughput (use the trio API there).

The session is the trio client's, with its reconnects (a silent leader, requests unanswered for
the leader-silence timeout, a session the cluster closed): a ``request`` whose session was
replaced on the way times out and is not sent again; the caller decides whether to repeat it.
Keyword arguments go to ``open_cluster_client`` (``reconnect_when_unanswered=False`` for a
service that does not answer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio

from cluster_node.client.cluster_client import ClusterClient, open_cluster_client
from cluster_node.client.errors import ClientClosedError, ServiceRequestError
from cluster_node.codecs import SessionMessageHeader
from cluster_node.config import ClientConfig

__all__ = ["BlockingClusterClient"]


class BlockingClusterClient:
    """Connects in the constructor (raising the connect error, if any); ``close()`` or ``with``."""

    def __init__(self, config: ClientConfig, **client_kwargs) -> None:
        self._config = config
        self._kwargs = client_kwargs
        self._client: ClusterClient | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="cluster-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as ex:  # noqa: BLE001 - handed to the constructing thread
            if not self._ready.is_set():
                self._error = ex
        finally:
            self._ready.set()

    async def _main(self) -> None:
        async with open_cluster_client(self._config, **self._kwargs) as client:
            self._client = client
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()

    # ---------------------------------------------------------------- calls into the client thread

    def _sync(self, fn: Callable, *args):
        if self._token is None or not self._thread.is_alive():
            raise ClientClosedError("client is closed")
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosedError("client is closed") from None

    def _async(self, fn: Callable, *args):
        if self._token is None or not self._thread.is_alive():
            raise ClientClosedError("client is closed")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosedError("client is closed") from None

    @property
    def client(self) -> ClusterClient:
        """The underlying client; read its attributes, call its methods only via this wrapper."""
        assert self._client is not None
        return self._client

    @property
    def cluster_session_id(self) -> int:
        return self.client.cluster_session_id

    @property
    def leader_member_id(self) -> int:
        return self.client.leader_member_id

    @property
    def leadership_term_id(self) -> int:
        return self.client.leadership_term_id

    def offer(self, payload: bytes) -> int:
        """Position (> 0) or a negative OfferResult; never waits."""
        return self._sync(self.client.offer, payload)

    def offer_wait(self, payload: bytes, timeout: float = 5.0) -> int:
        """Offer until accepted; raises trio.TooSlowError after ``timeout`` seconds."""
        return self._async(self.client.offer_wait, payload, timeout)

    def receive(self, timeout: float | None = None) -> tuple[bytes, SessionMessageHeader] | None:
        """The next session message, or None at the timeout; raises ServiceRequestError when
        the next in line is the service's error for one of our messages."""
        return self._async(self.client.receive, timeout)

    def request(self, payload: bytes, timeout: float = 5.0, match: Callable[[bytes], bool] | None = None) -> bytes:
        """Send ``payload`` and return the first reply for which ``match`` is true (any reply
        without ``match``); raises ServiceRequestError when the service raised on it instead
        (an error event for a message that starts as ``payload`` does), TimeoutError when
        neither comes within ``timeout`` seconds."""

        async def go() -> bytes:
            with trio.move_on_after(timeout):
                await self.client.offer_wait(payload, timeout)
                while True:
                    try:
                        got = await self.client.receive()
                    except ServiceRequestError as e:
                        if e.is_for(payload):
                            raise
                        continue  # an earlier message's failure
                    if got is not None and (match is None or match(got[0])):
                        return got[0]
            raise TimeoutError(f"no reply within {timeout:g}s")

        return self._async(go)

    def request_snapshot(self, timeout: float = 10.0):
        """Ask the cluster for a snapshot (an admin request); returns the AdminResponse."""
        return self._async(self.client.request_snapshot, timeout)

    def close(self) -> None:
        if self._token is not None and self._thread.is_alive() and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout=10)

    def __enter__(self) -> BlockingClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
