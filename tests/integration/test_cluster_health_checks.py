"""The health checks every TestCluster test gets (tests.support.cluster): they must catch what
they are for.

The split-brain sampler is shown members' counters files written by this process (two members
claiming one term cannot be made to happen in a correct cluster); the error-line check and the
SIGTERM exit check run on real members.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from cluster_node.media.counters import CountersManager
from tests.support.cluster import _COUNTER_TYPES, CLOSED, LEADER, TestCluster


class _ThisProcess:
    """Stands in for a member's process: the counters file's owner is this test process."""

    pid = os.getpid()

    def poll(self):
        return None


def _fake_members(cluster: TestCluster) -> dict[int, dict[str, object]]:
    managers, counters = [], {}
    for n in cluster.nodes:
        m = CountersManager.create(n.counters_path, max_counters=16)
        managers.append(m)
        counters[n.member_id] = {
            name: m.allocate(f"cluster {name}: member {n.member_id}", type_id)
            for name, type_id in _COUNTER_TYPES.items()
        }
        n.proc = _ThisProcess()
    return counters, managers


@pytest.mark.parametrize("second_term,split", [(3, True), (4, False)])
def test_two_members_leading_one_term_fail_the_test(tmp_path, second_term, split):
    cluster = TestCluster(tmp_path, nodes=2)
    counters, managers = _fake_members(cluster)
    try:
        for member, term in ((0, 3), (1, second_term)):
            c = counters[member]
            c["role"].set(LEADER), c["election"].set(CLOSED), c["term"].set(term)
        cluster.leaders.start()
        cluster.wait_for(lambda: cluster.leaders.samples >= 3, 30, "the sampler reads the counters")
        # Member 0 steps down before the end: it was seen leading, which is what counts.
        counters[0]["role"].set(0)
        if split:
            with pytest.raises(AssertionError, match=r"members \[0, 1\] were each leader of term 3"):
                cluster.close()
        else:
            cluster.close()
            assert cluster.leaders.term_leaders == {3: {0}, 4: {1}}
    finally:
        cluster.leaders.stop()
        for m in managers:
            m.close()


def test_an_undeclared_error_line_fails_the_test(tmp_path):
    cluster = TestCluster(tmp_path, nodes=1)
    try:
        cluster.start()
        # An ERROR line as the node writes them (JSON), here appended by the test.
        with open(cluster.nodes[0].log_path, "a") as f:
            f.write(json.dumps({"event": "something broke", "level": "error"}) + "\n")
        with pytest.raises(AssertionError, match=r"node 0 logged an unexpected ERROR: .*something broke"):
            cluster.close()
    finally:
        cluster.close(check=False)


def test_a_declared_error_line_passes(tmp_path):
    with TestCluster(tmp_path, nodes=1, expected_errors=[r'"event": "something broke"']) as cluster:
        cluster.start()
        with open(cluster.nodes[0].log_path, "a") as f:
            f.write(json.dumps({"event": "something broke", "level": "error"}) + "\n")


def test_a_member_that_does_not_exit_0_on_sigterm_fails_the_test(tmp_path):
    cluster = TestCluster(tmp_path, nodes=1)
    try:
        cluster.start()
        # The member's process is swapped for one that SIGTERM kills (exit -15): the node
        # itself still stops normally beside it.
        stand_in = subprocess.Popen(["sleep", "600"])
        cluster._all_procs.append(stand_in)
        cluster.nodes[0].proc = stand_in
        with pytest.raises(AssertionError, match=r"node 0: exited -15 on SIGTERM, not 0"):
            cluster.close()
    finally:
        cluster.close(check=False)


def test_a_counted_error_fails_the_test_unless_declared(tmp_path):
    for declared in (False, True):
        cluster = TestCluster(tmp_path / str(declared), nodes=2, expect_counted_errors=declared)
        counters, managers = _fake_members(cluster)
        try:
            counters[1]["errors"].set(2)
            if declared:
                cluster.close()
            else:
                with pytest.raises(AssertionError, match=r"node 1: error counter is 2, not 0"):
                    cluster.close()
        finally:
            for m in managers:
                m.close()
