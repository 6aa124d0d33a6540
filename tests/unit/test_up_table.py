"""The ``up`` table: each member's election count and, from the leader's counters, its lag."""

from __future__ import annotations

import os

from cluster_node.cluster_table import render_table
from cluster_node.identifiers import CounterTypes
from cluster_node.local_cluster import Member
from cluster_node.media.counters import CountersManager


class RunningChild:
    """Stands for the member process ``up`` started (this test process writes its counters)."""

    pid = os.getpid()

    def poll(self) -> None:
        return None


def test_the_table_shows_elections_and_each_members_lag_behind_the_leader(tmp_path):
    appends = {0: 4096, 1: 4096, 2: 1024}
    managers, members = [], []
    for member_id in range(3):
        path = tmp_path / f"node{member_id}" / "driver" / "counters.dat"
        manager = CountersManager.create(path, max_counters=32)
        managers.append(manager)
        role = 2 if member_id == 0 else 0
        for name, type_id, value in (
            ("role", CounterTypes.NODE_ROLE, role),
            ("election-state", CounterTypes.ELECTION_STATE, 17),
            ("leadership-term-id", CounterTypes.LEADERSHIP_TERM_ID, 3),
            ("append-pos", CounterTypes.APPEND_POSITION, appends[member_id]),
            ("election-count", CounterTypes.ELECTION_COUNT, member_id + 1),
        ):
            manager.allocate(f"cluster {name}: member {member_id}", type_id, member_id).set(value)
        for peer in range(3):
            # The leader heard member 2 at 1024 (it lags by 3072); the followers hear nobody (-1).
            position = appends[peer] if member_id == 0 else -1
            manager.allocate(
                f"cluster peer {peer} append-pos: member {member_id}", CounterTypes.PEER_APPEND_POSITION, peer
            ).set(position)
        m = Member(member_id, tmp_path / "c.toml", tmp_path / f"node{member_id}", path, tmp_path / "log")
        m.proc = RunningChild()
        m.refresh()
        members.append(m)
    try:
        lines = render_table(members)
        headings = lines[0].split()
        assert headings == [
            "MEMBER",
            "PID",
            "ALIVE",
            "ROLE",
            "TERM",
            "ELECTION",
            "ELECTIONS",
            "COMMIT",
            "APPEND",
            "LAG",
            "ERRORS",
        ]
        rows = {int(line.split()[0]): dict(zip(headings, line.split())) for line in lines[1:]}
        assert rows[0]["ROLE"] == "LEADER"
        assert [rows[i]["ELECTIONS"] for i in range(3)] == ["1", "2", "3"]
        assert [rows[i]["LAG"] for i in range(3)] == ["0", "0", "3,072"]
        # Without a settled leader nobody's lag is known.
        members[0].view.values["role"] = 0
        assert [line.split()[9] for line in render_table(members)[1:]] == ["-", "-", "-"]
    finally:
        for manager in managers:
            manager.close()


def test_generated_configs_share_a_member_key_of_their_own(tmp_path):
    """`cluster-node up` makes a member key per local cluster (mode 0600) and sets it in every
    generated member config; generating again keeps it; removing the generated files removes it."""
    import stat

    from cluster_node.config import load_node_config
    from cluster_node.local_cluster_configs import MEMBER_KEY_FILE, _remove_generated, write_cluster_configs
    from cluster_node.secret_file import read_key

    paths, _client = write_cluster_configs(tmp_path, 3, "echo", pin=False)
    key_path = tmp_path / MEMBER_KEY_FILE
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    key = read_key(key_path)
    assert {load_node_config(p).cluster.secret_file for p in paths} == {str(key_path.resolve())}
    write_cluster_configs(tmp_path, 3, "echo", pin=False)
    assert read_key(key_path) == key
    _remove_generated(tmp_path)
    assert not key_path.exists()
