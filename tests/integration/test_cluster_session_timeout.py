"""A live client that stops sending keep-alives loses its session to the session timeout.

Real cluster, real client in this process: after one acknowledged PUT the client goes on reading
its egress but sends nothing (its keep-alive is switched off). The leader must close the session
for TIMEOUT: the client is told so (a SessionEvent CLOSED whose detail is TIMEOUT, for its
session id), every member's service applies the close (``on_session_close`` with reason TIMEOUT,
which the test service records under ``__closed__<session id>``), and the leader counts it. The
client then opens a new session by itself and is served.
"""

from __future__ import annotations

import msgspec
import pytest

from cluster_node.codecs import EventCode
from cluster_node.media.counters import CountersReader
from tests.integration.test_cluster_e2e import assert_same_state
from tests.support.cluster import CLOSED_PREFIX, TEST_TIMEOUTS, S, Status, TestCluster, open_kv_client

SESSION_TIMEOUT = msgspec.structs.replace(TEST_TIMEOUTS, session_timeout_ns=3 * S)
CLIENT_TIMEOUT_COUNT_TYPE = 213


def _client_timeouts(cluster: TestCluster, member_id: int) -> int:
    node = cluster.nodes[member_id]
    with CountersReader.open(node.counters_path) as reader:
        (info,) = [c for c in reader.find(type_id=CLIENT_TIMEOUT_COUNT_TYPE) if c.label.endswith(f"member {member_id}")]
        return reader.get(info.counter_id)


@pytest.mark.slow
async def test_a_silent_client_is_closed_for_timeout_and_every_service_sees_the_close(tmp_path) -> None:
    with TestCluster(tmp_path, timeouts=SESSION_TIMEOUT) as cluster:
        leader = cluster.start()
        async with open_kv_client(cluster.client_config) as kv:
            client = kv.client
            assert (await kv.put("before", b"1")).status == Status.OK
            session = client.cluster_session_id
            told = []
            on_event = client._on_session_event

            def spy(event, image_session_id):
                told.append(event)
                on_event(event, image_session_id)

            client._on_session_event = spy
            client.send_keep_alive = lambda: False  # silent from here on, still reading egress
            await cluster.await_for(
                lambda: any(e.code == EventCode.CLOSED and e.cluster_session_id == session for e in told),
                60,
                f"the client told its session {session} is closed",
            )
            closed = next(e for e in told if e.code == EventCode.CLOSED)
            assert closed.detail == "TIMEOUT", closed
            await cluster.await_for(
                lambda: client.is_connected and client.cluster_session_id != session,
                60,
                f"the client on a new session ({client!r}, error {client.error}, reconnects {client.reconnects})",
            )
            # The close went through the log: the service recorded its reason, on every member.
            reply = await kv.get(f"{CLOSED_PREFIX}{session}", timeout=30, resend_s=2.0)
            assert reply.value == b"TIMEOUT", reply
            await assert_same_state(kv, cluster, "after-timeout")  # the close record on every member too
            assert _client_timeouts(cluster, leader) == 1
            assert (await kv.get("before", timeout=30, resend_s=2.0)).value == b"1"
