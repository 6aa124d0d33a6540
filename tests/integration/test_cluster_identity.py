"""A node directory belongs to one member, and members check that they see the same cluster.

Real processes from generated configs, as an operator would run them: a member's directory
started with another member's id is refused in one line (it used to become leader on the other
member's data); a member whose members list differs from the others' is refused loudly and
counted (it used to canvass for ever without a word).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.cluster import TestCluster, _node_command

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with TestCluster(tmp_path) as c:
        yield c


def test_a_directory_started_with_another_members_id_is_refused_in_one_line(cluster: TestCluster, tmp_path):
    cluster.start()
    for n in cluster.nodes:
        pid = n.pid
        assert n.terminate() == 0
        assert n.stdout_path.read_text().splitlines()[-1] == f"STOPPED member={n.member_id} pid={pid} reason=SIGTERM"
    one, two = cluster.nodes[1], cluster.nodes[2]
    # Member 2's config pointed at member 1's directory (a copy-paste slip in a config).
    text = two.config_path.read_text()
    wrong = re.sub(r'(?m)^dir = ".*"$', f'dir = "{one.dir}"', text, count=1)
    assert wrong != text
    config = tmp_path / "wrong.toml"
    config.write_text(wrong)
    done = subprocess.run(
        [*_node_command(), "run", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [
        f"Error: {one.dir} holds the data of member 1 of cluster 0 (from {one.dir / 'node-identity.json'}), but "
        f"this config is member 2 of cluster 0: start it with member 1's config, or give this member a "
        f"directory of its own"
    ]
    assert "READY" not in done.stdout
    # Its own config still starts it.
    cluster.start()


async def test_a_member_with_another_members_list_is_refused_loudly_and_counted(cluster: TestCluster) -> None:
    cluster.expect_errors(r'"event": "a member\'s view of the cluster differs from ours', counted=True)
    bad = cluster.nodes[0]
    text = bad.config_path.read_text()
    # A wrong port for member 2 in member 0's list only.
    port = re.search(r'\{ id = 2, ingress = "127\.0\.0\.1:(\d+)"', text).group(1)
    bad.config_path.write_text(
        text.replace(f'{{ id = 2, ingress = "127.0.0.1:{port}"', f'{{ id = 2, ingress = "127.0.0.1:{int(port) + 1}"', 1)
    )
    for n in cluster.nodes:
        n.start()
    for n in cluster.nodes:
        n.wait_ready(30)

    def refusals() -> list[dict]:
        return [
            e
            for m in (1, 2)
            for e in cluster.nodes[m].log_events()
            if e.get("event", "").startswith("a member's view of the cluster differs from ours")
        ]

    await cluster.await_for(lambda: refusals(), 20, "members 1 and 2 refuse member 0's view of the cluster")
    assert {e["member"] for e in refusals()} == {0}
    await cluster.await_for(
        lambda: all((cluster.counters()[m] or 0) and cluster.counters()[m].errors > 0 for m in (1, 2)),
        10,
        "the refusals counted",
    )
    # Said once per member and digest, not once per message.
    assert len([e for e in cluster.nodes[1].log_events() if e.get("event", "").startswith("a member's view")]) == 1
