"""Archives from a real three-member run, for the pipeline tests, and what the client saw.

:func:`run_cluster_with_failover` drives :class:`tests.support.cluster.TestCluster` through one
failover and leaves the members' archives final and complete:

1. start three ``cluster-node run`` processes (kv service), wait for a leader (term ``T1``);
2. one client session writes ``before`` PUTs, each acknowledged (pipelined);
3. it offers ``in_doubt`` more PUTs without waiting for replies, and the leader is killed
   (``kill -9``) as soon as its append position moves: each of these may be committed and
   acknowledged, replicated but not acknowledged, in the dead leader's log only (then dropped
   when it rejoins), or never received, whatever the crash decided;
4. a new leader is elected (term ``T2 > T1``); the client follows it and writes ``after`` PUTs,
   each acknowledged;
5. the client closes its session; the live members reach one commit position;
6. the killed member restarts and catches up (same term, same commit position as the others);
7. every member stops with SIGTERM, followers first, so that nothing is appended meanwhile (a
   leader stopping first would make the others elect a leader of a new term, which appends).

What is recorded (:class:`RunRecord`): every request's id, phase and key; each acknowledged
request's term as its reply's session header carried it; the client's session ids; the terms
and leaders; each member's commit position when all had caught up (the final commit position:
the log cannot grow after that, since no client remains and followers stop first).

PUT request bytes carry their request id (``[1, request_id, key, value]``), so a test can find
each acknowledged request in the log and check which term it was appended in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import trio

from tests.support.cluster import NodeCounters, Put, Status, TestCluster, open_kv_client

CONNECT_TIMEOUT_S = 20.0
NO_COUNTERS = NodeCounters(role=-1, commit=-1, election=-1, term=-1, append=-1, errors=-1)


@dataclass
class RunRecord:
    base_dir: Path
    node_dirs: list[Path]
    """``<base>/cluster/node<i>``, member i's node directory (its archive in ``archive/``)."""
    first_leader: int = -1
    first_term: int = -1
    second_leader: int = -1
    second_term: int = -1
    request_phase: dict[int, str] = field(default_factory=dict)
    """request id -> "before", "in_doubt" or "after"."""
    acked_term: dict[int, int] = field(default_factory=dict)
    """request id -> the leadership term in its reply's session header (acknowledged requests)."""
    session_ids: list[int] = field(default_factory=list)
    """The client's cluster session ids, in the order it had them (one unless it reconnected)."""
    final_commit: dict[int, int] = field(default_factory=dict)
    """member id -> commit position once every member had caught up (all equal)."""
    exit_codes: dict[int, int] = field(default_factory=dict)

    @property
    def commit_position(self) -> int:
        (position,) = set(self.final_commit.values())
        return position

    def acked_in(self, phase: str) -> dict[int, int]:
        return {rid: t for rid, t in self.acked_term.items() if self.request_phase[rid] == phase}


def put_request_id(payload: bytes) -> int | None:
    """The request id of a kv PUT's bytes (the application payload of a session message)."""
    try:
        request = msgspec.msgpack.decode(payload)
    except (msgspec.MsgspecError, ValueError):
        return None
    if isinstance(request, list) and len(request) == 4 and request[0] == 1 and isinstance(request[1], int):
        return request[1]
    return None


def run_cluster_with_failover(base_dir: Path, *, before: int = 300, in_doubt: int = 20, after: int = 200) -> RunRecord:
    """Run the scenario of the module docstring in ``base_dir``; the members are stopped on return."""
    with TestCluster(base_dir) as cluster:
        record = RunRecord(base_dir, [n.dir for n in cluster.nodes])
        record.first_leader = cluster.start()
        record.first_term = cluster.counters()[record.first_leader].term
        trio.run(_write_across_failover, cluster, record, before, in_doubt, after)
        all_members = [n.member_id for n in cluster.nodes]
        killed = record.first_leader
        cluster.restart(killed)
        cluster.wait_for(
            lambda: cluster.followers_settled([killed], record.second_term),
            30,
            f"member {killed} follows in term {record.second_term}",
        )
        cluster.wait_for(lambda: cluster.caught_up(all_members), 30, "every member caught up")
        counters = cluster.counters()
        record.final_commit = {m: counters[m].commit for m in all_members}
        leader = record.second_leader
        assert cluster.leader() == leader, "the leader changed after the failover\n" + cluster.diagnostics()
        for m in [m for m in all_members if m != leader] + [leader]:
            record.exit_codes[m] = cluster.nodes[m].terminate()
    return record


async def _write_across_failover(
    cluster: TestCluster, record: RunRecord, before: int, in_doubt: int, after: int
) -> None:
    reply_terms: dict[int, int] = {}

    async with open_kv_client(cluster.client_config) as kv:
        handler = kv.client._on_message

        def on_message(payload, header) -> None:  # the reply's term, beside the kv client's own matching
            handler(payload, header)
            try:
                request_id = msgspec.msgpack.decode(payload)[0]
            except (msgspec.MsgspecError, ValueError, IndexError, TypeError):
                return
            reply_terms.setdefault(request_id, header.leadership_term_id)

        kv.client._on_message = on_message
        record.session_ids.append(kv.client.cluster_session_id)

        async def put_all(phase: str, count: int) -> None:
            requests = [Put(kv.next_id(), f"{phase}-{i:04d}", f"{phase} value {i}".encode()) for i in range(count)]
            for r in requests:
                record.request_phase[r.request_id] = phase
            try:
                replies = await kv.pipeline(requests, timeout=30)
            except TimeoutError as e:
                raise AssertionError(f"{phase} puts not acknowledged: {e}\n{cluster.diagnostics()}") from None
            assert all(r.status == Status.OK for r in replies.values()), f"{phase} puts refused"

        await put_all("before", before)
        # Offered, not awaited; the leader dies as soon as it has appended anything new, so
        # each of these may be committed and answered, replicated only, in its log only, or lost.
        leader_node = cluster.nodes[record.first_leader]
        append_before = leader_node.counters().append
        for i in range(in_doubt):
            r = Put(kv.next_id(), f"in_doubt-{i:04d}", b"in doubt")
            record.request_phase[r.request_id] = "in_doubt"
            await kv.client.offer_wait(msgspec.msgpack.encode(r), 5)
        await cluster.await_for(
            lambda: (leader_node.counters() or NO_COUNTERS).append > append_before,
            10,
            "the leader appends an in-doubt PUT",
            interval=0.001,
        )
        leader_node.kill()
        record.second_leader = await cluster.await_leader(
            15, min_term=record.first_term + 1, exclude=[record.first_leader]
        )
        record.second_term = cluster.counters()[record.second_leader].term
        await cluster.await_for(
            lambda: kv.client.is_connected and kv.client.leader_member_id == record.second_leader,
            CONNECT_TIMEOUT_S,
            f"the client follows leader {record.second_leader}",
        )
        if kv.client.cluster_session_id != record.session_ids[-1]:
            record.session_ids.append(kv.client.cluster_session_id)
        await put_all("after", after)
        if kv.client.cluster_session_id != record.session_ids[-1]:
            record.session_ids.append(kv.client.cluster_session_id)
        record.acked_term = dict(reply_terms)
        commit_before_close = cluster.counters()[record.second_leader].commit
    live = [n.member_id for n in cluster.nodes if n.member_id != record.first_leader]
    # The session's close is appended and committed; after it nothing more is written.
    await cluster.await_for(
        lambda: cluster.caught_up(live) and cluster.counters()[record.second_leader].commit > commit_before_close,
        20,
        f"the session close committed on members {live}",
    )
