"""``cluster-node tool --dir NODE_DIR <command>`` against a real three-member cluster.

One cluster serves the read-only tests of the module (starting one costs a few seconds): it is
started, a few kv puts are committed, and each read-only command is checked against the leader's
and a follower's directory, in process (click's runner) and, where exit codes and stderr matter,
as a real ``cluster-node`` process. A test that changes a cluster (suspend and resume, a snapshot,
a stopped follower) has a cluster of its own, so the tests pass in any order.

The snapshot, shutdown and abort commands are checked against the live cluster where they must
refuse (a follower, a suspended leader), a snapshot is taken on a live cluster, and the commands are checked against a stand-in node process
(``tests/support/snapshot_fixture.py fake-node``) that plays the leader's side of the control
protocol, so that every outcome the tool reports (applied, failed, refused, timed out, stopped)
is reached without stopping the shared cluster.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner

from cluster_node.cli import main
from cluster_node.service.examples.kv import Put
from tests.support.cluster import Status, TestCluster, open_kv_client

CLI = Path(sys.executable).with_name("cluster-node")
ROOT = Path(__file__).resolve().parents[2]
PUTS = 5


def tool(node_dir: Path, *args: str):
    return CliRunner().invoke(main, ["tool", "--dir", str(node_dir), *args])


def tool_process(node_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "tool", "--dir", str(node_dir), *args], capture_output=True, text=True, timeout=30)


def field(output: str, name: str) -> str:
    """The value of a ``name   value`` line of describe/recovery-plan output."""
    for line in output.splitlines():
        if line.strip().startswith(name + " "):
            return line.strip()[len(name) :].strip()
    raise AssertionError(f"no {name!r} line in:\n{output}")


@contextmanager
def _started_cluster(base: Path):
    """A running three-member cluster with PUTS keys committed on every member."""
    with TestCluster(base) as c:
        leader = c.start()

        async def write() -> None:
            async with open_kv_client(c.client_config) as kv:
                for i in range(PUTS):
                    reply = await kv.put(f"key{i}", b"value")
                    assert reply.status == Status.OK

        trio.run(write)
        c.wait_for(lambda: c.caught_up(range(3)), 10, "every member has the puts")
        c.leader_id = leader
        c.follower_id = next(i for i in range(3) if i != leader)
        yield c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The module's shared cluster, for the commands that change nothing (so the tests using it
    pass in any order)."""
    with _started_cluster(tmp_path_factory.mktemp("tool")) as c:
        yield c


@pytest.fixture
def own_cluster(tmp_path):
    """A cluster of the test's own, for a test that changes its state (suspends it, takes a
    snapshot, stops a member)."""
    with _started_cluster(tmp_path / "own") as c:
        yield c


def dirs(cluster):
    return cluster.nodes[cluster.leader_id].dir, cluster.nodes[cluster.follower_id].dir


def test_is_leader_exit_code_is_0_only_on_the_leader(cluster):
    leader_dir, follower_dir = dirs(cluster)
    on_leader = tool_process(leader_dir, "is-leader")
    assert on_leader.returncode == 0, on_leader.stdout + on_leader.stderr
    assert on_leader.stdout.startswith("LEADER")
    on_follower = tool_process(follower_dir, "is-leader")
    assert on_follower.returncode == 1
    assert on_follower.stdout.startswith("FOLLOWER"), on_follower.stdout
    assert "Traceback" not in on_follower.stderr


def test_pid_is_the_node_process(cluster):
    for node in (cluster.nodes[cluster.leader_id], cluster.nodes[cluster.follower_id]):
        result = tool_process(node.dir, "pid")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(node.pid)


def test_describe_shows_mark_file_counters_recording_log_and_archive(cluster):
    for member_id, role in ((cluster.leader_id, "LEADER"), (cluster.follower_id, "FOLLOWER")):
        node = cluster.nodes[member_id]
        counters = node.counters()
        result = tool(node.dir, "describe")
        assert result.exit_code == 0, result.output
        out = result.output
        assert field(out, "status") == f"running, pid {node.pid}"
        assert field(out, "member") == f"{member_id} (cluster 0)"
        assert field(out, "role") == role
        assert field(out, "election state") == "CLOSED (17)"
        assert field(out, "leadership term") == str(counters.term)
        assert int(field(out, "commit position")) >= counters.commit > 0
        assert int(field(out, "append position")) >= counters.commit
        assert field(out, "cm state") == "ACTIVE (1)"
        assert field(out, "errors") == "0"
        assert field(out, "recording.log").startswith("1 entries: 1 TERM, 0 SNAPSHOT, 0 invalid")
        assert field(out, "last term") == f"{counters.term} from position 0 (open), recording 0"
        assert field(out, "latest snapshot") == "none"
        assert "1 recording(s)" in field(out, "archive")
        log_line = field(out, "recording 0")
        assert re.match(r"log\s+0\.\.(\d+) \(recording\)", log_line), log_line
        assert int(re.match(r"log\s+0\.\.(\d+)", log_line).group(1)) >= counters.commit


def test_recording_log_lists_every_entry(cluster):
    _, follower_dir = dirs(cluster)
    term = cluster.nodes[cluster.follower_id].counters().term
    result = tool(follower_dir, "recording-log")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("recording.log: 1 entries, 64 bytes")
    assert lines[1].split() == [
        "INDEX",
        "TYPE",
        "VALID",
        "RECORDING",
        "TERM",
        "TERM_BASE",
        "LOG_POSITION",
        "TIMESTAMP",
        "SERVICE",
        "ENDPOINT",
    ]
    cells = lines[2].split()
    assert cells[:7] == ["0", "TERM", "valid", "0", str(term), "0", "open"]
    assert cells[8] == "0"
    assert len(lines) == 3


def test_recovery_plan_from_recording_log_and_archive(cluster):
    for member_id in (cluster.leader_id, cluster.follower_id):
        node = cluster.nodes[member_id]
        counters = node.counters()
        result = tool(node.dir, "recovery-plan")
        assert result.exit_code == 0, result.output
        out = result.output
        assert out.splitlines()[0] == "recovery plan (service count 1)"
        assert field(out, "last leadership term") == str(counters.term)
        assert field(out, "last term base position") == "0"
        appended = int(field(out, "appended log position").split()[0])
        assert appended >= counters.commit > 0
        assert field(out, "committed log position") == "0"  # no snapshot yet: only a snapshot proves it
        assert field(out, "log recording") == "0"
        assert field(out, "snapshots") == "none"
        assert field(out, "log replay") == f"0..{appended} ({appended:,} bytes)"


def test_list_members_from_the_directory_and_with_the_config(cluster):
    leader_dir, follower_dir = dirs(cluster)
    result = tool(follower_dir, "list-members")
    assert result.exit_code == 0, result.output
    assert field(result.output, "this node").startswith(f"member {cluster.follower_id}: running")
    assert field(result.output, "leader").startswith(f"member {cluster.leader_id} (")
    peers = field(result.output, "peers")
    others = [m for m in cluster.nodes[cluster.follower_id].cfg.cluster.members if m.id != cluster.follower_id]
    for m in others:
        assert m.consensus in peers

    follower = cluster.nodes[cluster.follower_id]
    with_config = tool(follower_dir, "list-members", "--config", str(follower.config_path))
    assert with_config.exit_code == 0, with_config.output
    rows = {line.split()[0]: line for line in with_config.output.splitlines() if re.match(r"\d+\s", line)}
    assert set(rows) == {"0", "1", "2"}
    assert "this" in rows[str(cluster.follower_id)]
    assert "leader" in rows[str(cluster.leader_id)]
    for m in follower.cfg.cluster.members:
        assert m.ingress in rows[str(m.id)] and m.consensus in rows[str(m.id)] and m.archive in rows[str(m.id)]

    wrong = tool(leader_dir, "list-members", "--config", str(follower.config_path))
    assert wrong.exit_code == 1
    assert f"is member {cluster.follower_id}'s config" in wrong.output


def test_errors_shows_log_warnings_and_the_counter(cluster):
    leader_dir, _ = dirs(cluster)
    result = tool(leader_dir, "errors")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-2:] == ["errors counter: 0", "service errors counter: 0"]


def json_of(node_dir: Path, *args: str) -> dict:
    result = tool(node_dir, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_describe_json_carries_the_fields_of_the_text_and_the_members_lag(cluster):
    def members_caught_up():
        doc = json_of(cluster.nodes[cluster.leader_id].dir, "describe")
        lags = doc["members"]
        return doc if len(lags) == 3 and all(m["lag"] == 0 for m in lags) else None

    cluster.wait_for(members_caught_up, 10, "the leader shows every member with lag 0")
    for member_id, role in ((cluster.leader_id, "LEADER"), (cluster.follower_id, "FOLLOWER")):
        node = cluster.nodes[member_id]
        text = tool(node.dir, "describe").output
        doc = json_of(node.dir, "describe")
        assert doc["status"] == field(text, "status") == f"running, pid {node.pid}"
        assert (doc["member_id"], doc["cluster_id"], doc["pid"], doc["running"]) == (member_id, 0, node.pid, True)
        c = doc["counters"]
        assert c["current"] is True
        assert c["role_name"] == field(text, "role") == role
        assert c["role"] == (2 if role == "LEADER" else 0)
        assert str(c["leadership_term_id"]) == field(text, "leadership term")
        assert c["leader_member_id"] == cluster.leader_id
        assert field(text, "leader") == f"member {cluster.leader_id}"
        assert c["election_count"] >= 1 and field(text, "elections") == str(c["election_count"])
        assert f"{c['election_state_name']} ({c['election_state']})" == field(text, "election state") == "CLOSED (17)"
        assert c["commit_position"] > 0 and c["append_position"] >= c["commit_position"]
        assert f"{c['cm_state_name']} ({c['cm_state']})" == field(text, "cm state")
        assert (c["errors"], c["service_errors"], c["snapshot_count"]) == (0, 0, 0)
        assert c["max_cycle_time_ns"] > 0 and c["cycle_time_threshold_exceeded"] >= 0
        assert c["client_session_timeouts"] == 0
        rl = doc["recording_log"]
        assert (rl["entries"], rl["terms"], rl["snapshots"], rl["invalid"]) == (1, 1, 0, 0)
        assert rl["last_term"]["open"] is True and rl["latest_snapshot"] is None
        (log_rec,) = doc["archive"]["recordings"]
        assert log_rec["log"] is True and log_rec["recording_id"] == 0 and log_rec["how"] == "recording"
        assert f"{log_rec['start_position']}..{log_rec['stop_position']}" in field(text, "recording 0")
        if role == "LEADER":
            assert {m["member_id"] for m in doc["members"]} == {0, 1, 2}
            for m in doc["members"]:
                assert f"append position {m['append_position']} (lag {m['lag']})" == field(
                    text, f"member {m['member_id']}"
                )
        else:
            assert doc["members"] == []


def test_list_members_json_and_the_lag_of_each_member_on_the_leader(cluster):
    leader = cluster.nodes[cluster.leader_id]
    follower = cluster.nodes[cluster.follower_id]
    doc = json_of(follower.dir, "list-members")
    assert doc["this_node"]["member_id"] == cluster.follower_id and doc["this_node"]["role"] == "FOLLOWER"
    assert doc["leader"]["member_id"] == cluster.leader_id
    assert doc["members"] == []  # a follower does not hear the others' positions
    assert all(m.consensus in doc["peers"] for m in follower.cfg.cluster.members if m.id != cluster.follower_id)

    with_config = json_of(leader.dir, "list-members", "--config", str(leader.config_path))
    text = tool(leader.dir, "list-members", "--config", str(leader.config_path)).output
    assert with_config["this_node"]["election_count"] >= 1
    rows = {line.split()[0]: line.split() for line in text.splitlines() if re.match(r"\d+\s", line)}
    assert text.splitlines()[3].split()[-2:] == ["POSITION", "LAG"]
    for m in with_config["members"]:
        assert m["this"] == (m["member_id"] == cluster.leader_id) == m["leader"]
        cfg = next(c for c in leader.cfg.cluster.members if c.id == m["member_id"])
        assert (m["ingress"], m["consensus"], m["archive"]) == (cfg.ingress, cfg.consensus, cfg.archive)
        assert m["append_position"] >= 0 and m["lag"] >= 0
        assert rows[str(m["member_id"])][-2:] == [str(m["append_position"]), str(m["lag"])]


def test_recording_log_and_errors_json(cluster):
    leader_dir, follower_dir = dirs(cluster)
    term = cluster.nodes[cluster.follower_id].counters().term
    doc = json_of(follower_dir, "recording-log")
    assert doc["path"].endswith("recording.log") and doc["length"] == 64 and doc["torn_tail_length"] == 0
    (entry,) = doc["entries"]
    assert entry == {
        "entry_index": 0,
        "type": "TERM",
        "valid": True,
        "recording_id": 0,
        "leadership_term_id": term,
        "term_base_log_position": 0,
        "log_position": -1,
        "open": True,
        "timestamp": entry["timestamp"],
        "service_id": 0,
        "archive_endpoint": entry["archive_endpoint"],
    }
    errs = json_of(leader_dir, "errors")
    assert (errs["errors"], errs["service_errors"], errs["skip_list"]) == (0, 0, [])
    assert errs["log_found"] is True and isinstance(errs["events"], list)
    assert errs["log_file"].endswith("node.log") and errs["counters_current"] is True


def test_suspend_stops_client_messages_and_resume_brings_them_back(own_cluster):
    cluster = own_cluster
    leader_dir, follower_dir = dirs(cluster)
    on_follower = tool_process(follower_dir, "suspend")
    assert on_follower.returncode == 1 and "Current node is not the leader" in on_follower.stderr
    assert tool_process(leader_dir, "resume").returncode == 1  # not suspended: refused

    async def put_while_suspended_then_resume() -> None:
        # Connected first: a suspended leader reads no ingress, connect requests included.
        async with open_kv_client(cluster.client_config) as kv:
            suspended = await trio.to_thread.run_sync(tool_process, leader_dir, "suspend")
            assert suspended.returncode == 0, suspended.stderr
            assert "SUSPEND applied successfully" in suspended.stdout
            again = await trio.to_thread.run_sync(tool_process, leader_dir, "suspend")
            assert again.returncode == 1 and "SUSPENDED, but needs to be ACTIVE" in again.stderr
            refused = await trio.to_thread.run_sync(tool_process, leader_dir, "snapshot")
            assert refused.returncode == 1
            assert refused.stderr.splitlines() == [
                "Unable to SNAPSHOT as the state of the consensus module is SUSPENDED, but needs to be ACTIVE"
            ]
            before = cluster.counters()[cluster.leader_id].commit
            request_id = await kv.send(Put(kv.next_id(), "suspended", b"x"))
            assert await kv.wait_reply(request_id, 2.0) is None  # not taken while suspended
            assert cluster.counters()[cluster.leader_id].commit == before
            resumed = await trio.to_thread.run_sync(tool_process, leader_dir, "resume")
            assert resumed.returncode == 0, resumed.stderr
            reply = await kv.wait_reply(request_id, 10.0)  # waited in the image, taken on resume
            assert reply is not None and reply.status == Status.OK
            assert (await kv.get("suspended", resend_s=1.0)).value == b"x"

    trio.run(put_while_suspended_then_resume)


def test_snapshot_shutdown_and_abort_on_a_follower_fail_with_one_line(cluster):
    _, follower_dir = dirs(cluster)
    for command in ("snapshot", "shutdown", "abort"):
        result = tool_process(follower_dir, command)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert result.stdout == ""
        assert result.stderr.splitlines() == [
            f"Current node is not the leader (member {cluster.follower_id} is FOLLOWER)"
        ], command
    assert cluster.nodes[cluster.follower_id].running and cluster.nodes[cluster.leader_id].running


def test_offline_snapshot_commands_on_a_running_node(cluster):
    leader_dir, _ = dirs(cluster)
    leader = cluster.nodes[cluster.leader_id]
    before = (leader_dir / "recording.log").read_bytes()
    refused = tool_process(leader_dir, "invalidate-latest-snapshot")
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"member {leader.member_id} runs in {leader_dir} (pid {leader.pid}): stop it before invalidating its snapshot"
    ]
    assert (leader_dir / "recording.log").read_bytes() == before
    described = tool_process(leader_dir, "describe-latest-snapshot")  # read only, on a running node
    assert described.returncode == 1
    assert described.stderr.splitlines() == [f"no valid snapshot in {leader_dir / 'recording.log'}"]


def test_snapshot_on_the_live_leader_is_taken_by_every_member(own_cluster):
    cluster = own_cluster
    leader_dir, follower_dir = dirs(cluster)
    result = tool_process(leader_dir, "snapshot")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "SNAPSHOT applied successfully"
    m = re.fullmatch(
        r"snapshot at log position (\d+), leadership term (\d+): consensus module recording (\d+), "
        r"service 0 recording (\d+)",
        lines[1],
    )
    assert m, lines
    position, term = int(m.group(1)), int(m.group(2))
    assert term == cluster.nodes[cluster.leader_id].counters().term
    assert field(tool(leader_dir, "describe").output, "snapshots taken") == "1"
    assert field(tool(leader_dir, "describe").output, "cm state") == "ACTIVE (1)"
    counters = json_of(leader_dir, "describe")["counters"]
    assert 0 < counters["last_snapshot_duration_ns"] <= counters["max_snapshot_duration_ns"]
    assert re.fullmatch(r"last \d+\.\d ms, max \d+\.\d ms", field(tool(leader_dir, "describe").output, "snapshot time"))

    # Every member snapshots at the same position; a follower's set lands when its service got there.
    cluster.wait_for(
        lambda: tool(follower_dir, "describe-latest-snapshot").exit_code == 0, 10, "the follower's snapshot set"
    )
    for node_dir in (leader_dir, follower_dir):
        described = tool(node_dir, "describe-latest-snapshot")
        assert described.exit_code == 0, described.output
        out = described.stdout
        assert out.splitlines()[0] == f"latest snapshot     log position {position}, leadership term {term}"
        assert f"marker            log position {position}, leadership term {term}" in out
        assert re.search(r"user records      \d+ \(", out), out
        plan = tool(node_dir, "recovery-plan")
        assert field(plan.stdout, "committed log position") == str(position)
        assert field(plan.stdout, "log replay").startswith(f"{position}..")


def test_a_directory_without_a_node_gives_one_line_and_exit_1(tmp_path):
    for command in (
        "describe",
        "pid",
        "is-leader",
        "recording-log",
        "recovery-plan",
        "errors",
        "list-members",
        "snapshot",
    ):
        result = tool_process(tmp_path, command)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert result.stdout == ""
        assert result.stderr.splitlines() == [f"Error: no cluster-mark.dat in {tmp_path}: not a node directory"]
    missing = tool_process(tmp_path / "nowhere", "describe")
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [f"Error: no such directory: {tmp_path / 'nowhere'}"]


def test_a_stopped_node_is_reported_as_not_running(own_cluster):
    cluster = own_cluster
    node = cluster.nodes[cluster.follower_id]
    pid = node.pid
    term = node.counters().term
    assert node.terminate() == 0

    # A warning line as the node writes them, then a torn line: errors shows the one, skips the other.
    with open(node.log_path, "a") as f:
        f.write(
            json.dumps(
                {"event": "example trouble", "level": "warning", "timestamp": "2030-01-01T00:00:00Z", "detail": 7}
            )
            + "\n"
        )
        f.write('{"torn line without end')

    described = tool_process(node.dir, "describe")
    assert described.returncode == 0, described.stderr
    assert field(described.stdout, "status").startswith(f"NOT RUNNING (pid {pid} is not running; last active ")
    assert field(described.stdout, "counters").endswith(f"(last values of pid {pid})")
    assert field(described.stdout, "leadership term") == str(term)
    log_line = field(described.stdout, "recording 0")
    assert re.match(r"log\s+0\.\.\d+ \(", log_line), log_line

    no_pid = tool_process(node.dir, "pid")
    assert no_pid.returncode == 1
    lines = no_pid.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"no node runs in {node.dir}: member {node.member_id}, pid {pid}")

    not_leader = tool_process(node.dir, "is-leader")
    assert not_leader.returncode == 1
    assert "is not running" in not_leader.stdout

    plan = tool(node.dir, "recovery-plan")
    assert plan.exit_code == 0, plan.output
    assert field(plan.output, "last leadership term") == str(term)

    errors = tool(node.dir, "errors", "-n", "5")
    assert errors.exit_code == 0, errors.output
    assert "WARNING  example trouble  detail=7" in errors.output
    assert errors.output.splitlines()[-2:] == [
        f"errors counter: 0 (last values of pid {pid})",
        f"service errors counter: 0 (last values of pid {pid})",
    ]


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1 << 20])
def test_reading_the_log_backwards_matches_reading_it_forwards(tmp_path, block_bytes):
    from cluster_node.node_inspect import iter_lines_backwards

    lines = [f'{{"i": {i}, "level": "{"warning" if i % 7 == 0 else "info"}"}}' + "x" * (i % 13) for i in range(300)]
    path = tmp_path / "node.log"
    path.write_text("\n".join(lines) + "\n\n")
    assert [b.decode() for b in iter_lines_backwards(path, block_bytes=block_bytes)] == lines[::-1]
    wanted = [line for line in lines if '"warning"' in line][::-1]
    assert [b.decode() for b in iter_lines_backwards(path, (b'"warning"',), block_bytes)] == wanted


# ------------------------------------------------------------------------------ against a stand-in node


@contextmanager
def fake_node(node_dir: Path, *args: str):
    """A stand-in node process in ``node_dir`` (see tests/support/snapshot_fixture.py), ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.snapshot_fixture", "fake-node", str(node_dir), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        assert line.strip() == "ready", (line, proc.poll())
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


def stderr_line(result) -> str:
    """The one line of a failed run (a CompletedProcess, or click's in-process Result)."""
    code = result.returncode if isinstance(result, subprocess.CompletedProcess) else result.exit_code
    assert code == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_snapshot_through_a_leader_reports_each_new_set(tmp_path):
    with fake_node(tmp_path) as proc:
        first = tool(tmp_path, "snapshot")
        assert first.exit_code == 0, first.stderr
        assert first.stdout.splitlines() == [
            "SNAPSHOT applied successfully",
            "snapshot at log position 8192, leadership term 1: consensus module recording 101, service 0 recording 100",
        ]
        second = tool(tmp_path, "snapshot")
        assert second.exit_code == 0, second.stderr
        assert second.stdout.splitlines()[1].startswith(
            "snapshot at log position 12288, leadership term 1: consensus module recording 103"
        )
        described = tool(tmp_path, "describe")
        assert "snapshots taken 2" in described.stdout
        assert proc.poll() is None


@pytest.mark.parametrize("extra", [(), ("--no-snapshot-count",)], ids=["counted", "no-count-counter"])
def test_snapshot_that_leaves_no_new_set_fails(tmp_path, extra):
    with fake_node(tmp_path, "--on-snapshot", "fail", *extra):
        result = tool(tmp_path, "snapshot")
        assert stderr_line(result) == (
            "snapshot failed: no new snapshot in recording.log (a service snapshot failed? see `tool errors`)"
        )
        assert result.stdout == ""


def test_snapshot_the_leader_never_finishes_times_out(tmp_path):
    with fake_node(tmp_path, "--on-snapshot", "ignore"):
        result = tool(tmp_path, "snapshot", "--timeout", "0.5")
        assert (
            stderr_line(result)
            == "snapshot: member 0 did not finish within 0.5 s (its control toggle is still SNAPSHOT)"
        )
        # An operator can always stop it: ABORT replaces the SNAPSHOT request still pending.
        again = tool(tmp_path, "abort")
        assert again.exit_code == 0, again.stderr
        assert again.stdout.splitlines()[0] == "ABORT applied successfully"


def test_control_commands_on_a_follower_or_a_suspended_leader_are_refused(tmp_path):
    follower, leader = tmp_path / "follower", tmp_path / "leader"
    with fake_node(follower, "--role", "follower", "--member-id", "1"), fake_node(leader, "--state", "SUSPENDED"):
        for command in ("snapshot", "shutdown", "abort", "suspend"):
            assert stderr_line(tool(follower, command)) == "Current node is not the leader (member 1 is FOLLOWER)"
        assert stderr_line(tool(leader, "snapshot")) == (
            "Unable to SNAPSHOT as the state of the consensus module is SUSPENDED, but needs to be ACTIVE"
        )


@pytest.mark.parametrize("command", ["shutdown", "abort"])
def test_a_suspended_leader_can_still_be_stopped(tmp_path, command):
    with fake_node(tmp_path, "--state", "SUSPENDED") as proc:
        result = tool(tmp_path, command)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.splitlines()[0] == f"{command.upper()} applied successfully"
        assert proc.wait(10) == 0


def test_a_refused_stop_names_the_state_it_stays_in(tmp_path):
    with fake_node(tmp_path, "--state", "SUSPENDED", "--on-terminate", "refuse"):
        assert stderr_line(tool(tmp_path, "abort")) == (
            "ABORT was not applied: member 0 released the control toggle and stays SUSPENDED (see `tool errors`)"
        )


def test_shutdown_waits_until_the_node_stopped_and_reports_where(tmp_path):
    with fake_node(tmp_path) as proc:
        result = tool_process(tmp_path, "shutdown")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [
            "SHUTDOWN applied successfully",
            "member 0 stopped at log position 8192 (leadership term 1)",
            "snapshot at log position 8192, leadership term 1: consensus module recording 101, service 0 recording 100",
        ]
        assert proc.wait(10) == 0
    stopped = tool_process(tmp_path, "snapshot")
    assert stderr_line(stopped).startswith(f"no node runs in {tmp_path} (member 0, pid ")


def test_abort_stops_without_a_snapshot_and_no_wait_returns_at_once(tmp_path):
    with fake_node(tmp_path) as proc:
        result = tool(tmp_path, "abort")
        assert result.exit_code == 0, result.stderr
        assert result.stdout.splitlines() == [
            "ABORT applied successfully",
            "member 0 stopped at log position 8192 (leadership term 1)",
        ]
        assert proc.wait(10) == 0
    assert "snapshots                none" in tool(tmp_path, "recovery-plan").stdout
    with fake_node(tmp_path / "again", "--stop-s", "2") as proc:
        result = tool(tmp_path / "again", "abort", "--no-wait")
        assert result.exit_code == 0, result.stderr
        assert result.stdout == "ABORT applied successfully\n"
        assert proc.poll() is None  # still stopping
        assert proc.wait(10) == 0


def test_shutdown_refused_not_taken_or_not_finished_in_time(tmp_path):
    with fake_node(tmp_path / "refuse", "--on-terminate", "refuse") as proc:
        result = tool(tmp_path / "refuse", "shutdown")
        assert stderr_line(result) == (
            "SHUTDOWN was not applied: member 0 released the control toggle and stays ACTIVE (see `tool errors`)"
        )
        assert proc.poll() is None
    with fake_node(tmp_path / "ignore", "--on-terminate", "ignore"):
        result = tool(tmp_path / "ignore", "shutdown", "--timeout", "0.5")
        assert stderr_line(result) == (
            "shutdown: member 0 did not take the request within 0.5 s (its control toggle is still SHUTDOWN)"
        )
    with fake_node(tmp_path / "slow", "--stop-s", "5") as proc:
        result = tool(tmp_path / "slow", "abort", "--timeout", "1")
        assert result.stdout == "ABORT applied successfully\n"
        assert stderr_line(result) == f"member 0 (pid {proc.pid}) is still running 1 s after the abort request"
