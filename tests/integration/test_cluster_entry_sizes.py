"""Log entries of every size, from one byte of value to the longest message the cluster takes,
through every path an entry travels, compared byte for byte on every member.

The sizes sit on the edges of the framing: the largest entry that fits one datagram (one frame of
``mtu`` bytes), one byte more (the first that is fragmented), a few datagrams, and the longest
message the ingress, the log and the egress accept (``cluster_node.media.frames.max_message_length`` of the
smallest term length a message crosses), exactly. One byte more than that is refused by the
client with its own error, and the cluster never sees it.

Paths: ingress to the leader's log; replication to a follower; catch-up of a follower that was
down while the entries were written (and a snapshot taken); a snapshot of the service (every
value in it: records far larger than a datagram) loaded at restart; the archive's replay of the
log after that snapshot at restart. After each, every member's service state (a digest of the
whole map, computed through the log at one position) and its recorded log (every frame, below the
commit position) are equal, and a GET of each key returns its value exactly.
"""

from __future__ import annotations

import random

import pytest
import trio

from cluster_node.codecs import SESSION_HEADER_LENGTH
from cluster_node.media.frames import HEADER_LENGTH, max_message_length
from cluster_node.media.publication import MessageTooLongError
from cluster_node.service.examples.kv import Put, encode_request
from tests.integration.test_cluster_e2e import assert_same_state, in_thread
from tests.integration.test_cluster_snapshots import atool, kill_all_and_restart, snapshots
from tests.support.cluster import Status, TestCluster, open_kv_client

REQUEST_ID = 10**12  # request ids of this size (msgpack uint64) in every sized PUT


def _message_length(key: str, value_length: int) -> int:
    """Bytes of the ingress message (session header + kv PUT) for a value of this length."""
    return SESSION_HEADER_LENGTH + len(encode_request(Put(REQUEST_ID, key, b"\0" * value_length)))


def _value_length_for(key: str, message_length: int) -> int:
    """The longest value whose PUT message is at most ``message_length`` bytes."""
    lo, hi = 0, message_length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _message_length(key, mid) <= message_length:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _value(key: str, length: int) -> bytes:
    return random.Random(key).randbytes(length)


def _sizes(cluster: TestCluster, prefix: str) -> dict[str, int]:
    """Value lengths per key: the edges of a datagram for the client's ingress and for the
    members' log (their MTUs may differ), a few datagrams, and the longest message every
    publication on the way takes (the client's ingress, the members' log, local log and egress)."""
    member, client = cluster.nodes[0].cfg, cluster.client_config
    limit = min(
        max_message_length(t)
        for t in (
            client.driver.term_length,
            member.driver.term_length,
            member.driver.ipc_term_length,
            member.cluster.log_term_length,
        )
    )
    edges = {}
    for who, mtu in (("client", client.driver.mtu), ("member", member.driver.mtu)):
        one_frame = mtu - HEADER_LENGTH  # the payload of one full datagram
        edges[f"{who}-one-frame"] = one_frame
        edges[f"{who}-two-frames"] = one_frame + 1
        edges[f"{who}-five-frames"] = 5 * one_frame - 3
    edges["limit"] = limit
    sizes = {}
    for name, message_length in edges.items():
        key = f"{prefix}-{name}"
        sizes[key] = _value_length_for(key, message_length)
        assert _message_length(key, sizes[key]) == message_length  # on the edge, exactly
    sizes[f"{prefix}-1"] = 1
    sizes[f"{prefix}-0"] = 0
    sizes[f"{prefix}-1000"] = 1000
    return sizes


async def _put_each(kv, cluster: TestCluster, sizes: dict[str, int]) -> dict[str, bytes]:
    written = {}
    for key, n in sizes.items():
        value = _value(key, n)
        reply = await kv.call(Put(REQUEST_ID + kv.next_id(), key, value), timeout=30)
        assert reply.status == Status.OK, (key, n, reply, cluster.diagnostics())
        written[key] = value
    return written


async def _assert_values(kv, cluster: TestCluster, expected: dict[str, bytes]) -> None:
    for key, value in expected.items():
        got = (await kv.get(key, timeout=30)).value
        assert got == value, (
            f"{key}: {len(value)} bytes written, {None if got is None else len(got)} read"
            f"{'' if got is None or len(got) != len(value) else ' (same length, other bytes)'}"
        )


@pytest.mark.slow
async def test_entries_of_every_size_through_every_path_are_equal_on_every_member(tmp_path) -> None:
    with TestCluster(tmp_path) as cluster:
        leader = cluster.start()
        away = next(n.member_id for n in cluster.nodes if n.member_id != leader)
        everyone = [n.member_id for n in cluster.nodes]
        async with open_kv_client(cluster.client_config) as kv:
            # Ingress and replication, with all three members.
            expected = await _put_each(kv, cluster, _sizes(cluster, "live"))
            await assert_same_state(kv, cluster, "live")
            await _assert_values(kv, cluster, expected)

            # One byte past the limit: refused by the client's own publication.
            limit_key = "live-limit"
            with pytest.raises(MessageTooLongError):
                kv.client.offer(encode_request(Put(REQUEST_ID, limit_key, b"\0" * (len(expected[limit_key]) + 1))))

            # Entries and a snapshot (of every value) while a follower is down: it catches up.
            await in_thread(cluster.nodes[away].kill)
            expected.update(await _put_each(kv, cluster, _sizes(cluster, "away")))
            await take_snapshot_of(cluster, leader, members=[m for m in everyone if m != away])
            expected.update(await _put_each(kv, cluster, _sizes(cluster, "after-snapshot")))
            await in_thread(cluster.restart, away)
            await assert_same_state(kv, cluster, "caught-up")

            # Every member restarts from the snapshot, then the archive replays the log after it.
            leader = await trio.to_thread.run_sync(kill_all_and_restart, cluster)
        for n in cluster.nodes:
            loaded = [e for e in n.log_events() if e.get("event") == "snapshot loaded"]
            assert loaded, f"member {n.member_id} loaded no snapshot\n{cluster.diagnostics()}"
        async with open_kv_client(cluster.client_config) as kv:
            await _assert_values(kv, cluster, expected)
            await assert_same_state(kv, cluster, "restarted")


async def take_snapshot_of(cluster: TestCluster, leader: int, members: list[int]) -> int:
    """``tool snapshot`` on the leader; its log position, once every one of ``members`` has a
    snapshot there."""
    r = await atool(cluster.nodes[leader].dir, "snapshot")
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{cluster.diagnostics()}"
    position = snapshots(cluster, leader)[-1].log_position
    await cluster.await_for(
        lambda: all(position in {e.log_position for e in snapshots(cluster, m)} for m in members),
        30,
        f"a snapshot at {position} on members {members}",
    )
    return position
