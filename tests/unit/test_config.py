"""Node and client configuration: the shipped configs, defaults, units, and one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from cluster_node.config import (
    ClientConfig,
    ClusterSection,
    ConfigError,
    DriverSection,
    TimeoutsSection,
    client_config_to_toml,
    format_duration,
    generate_loopback_cluster,
    load_client_config,
    load_node_config,
    node_config_to_toml,
    parse_client_config,
    parse_cluster_members,
    parse_duration_ns,
    parse_ingress_endpoints,
    parse_node_config,
    parse_size,
    write_loopback_cluster,
)
from cluster_node.driver_dir import default_driver_dir

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"

MINIMAL = """
[node]
member_id = 1
dir = "var/n1"

[cluster]
members = "0,127.0.0.1:20110,127.0.0.1:20220,127.0.0.1:20330,127.0.0.1:0,127.0.0.1:8010|1,127.0.0.1:20111,127.0.0.1:20221,127.0.0.1:20331,127.0.0.1:0,127.0.0.1:8011"
"""


def _error(text: str, client: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        (parse_client_config if client else parse_node_config)(text, "node.toml")
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith("node.toml: "), msg
    return msg


# ------------------------------------------------------------------------------ shipped files


@pytest.mark.parametrize("i", [0, 1, 2])
def test_shipped_node_configs_validate(i: int) -> None:
    cfg = load_node_config(CONFIGS / f"node{i}.toml")
    assert cfg.member_id == i
    assert len(cfg.cluster.members) == 3
    assert cfg.this_member.id == i
    t = cfg.timeouts
    assert t.leader_heartbeat_interval_ns < t.leader_heartbeat_timeout_ns
    assert t.election_status_interval_ns < t.election_timeout_ns
    assert cfg.driver_dir == default_driver_dir(f"var/cluster/node{i}")


def test_shipped_configs_agree_and_client_points_at_them() -> None:
    nodes = [load_node_config(CONFIGS / f"node{i}.toml") for i in range(3)]
    assert len({n.members_text for n in nodes}) == 1
    assert len({n.node.dir for n in nodes}) == 3
    client = load_client_config(CONFIGS / "client.toml")
    assert client.ingress_endpoints == {m.id: m.ingress for m in nodes[0].cluster.members}


# ------------------------------------------------------------------------------ defaults, units


def test_reference_defaults() -> None:
    cfg = parse_node_config(MINIMAL)
    t = cfg.timeouts
    assert t.election_timeout_ns == 1_000_000_000
    assert t.election_status_interval_ns == 100_000_000
    assert t.leader_heartbeat_interval_ns == 200_000_000
    assert t.leader_heartbeat_timeout_ns == 10_000_000_000
    assert t.startup_canvass_timeout_ns == 60_000_000_000
    assert t.session_timeout_ns == 10_000_000_000
    assert t.termination_timeout_ns == 10_000_000_000
    c = cfg.cluster
    assert (c.log_stream_id, c.ingress_stream_id, c.egress_stream_id, c.consensus_stream_id) == (100, 101, 102, 108)
    assert (c.service_stream_id, c.consensus_module_stream_id) == (104, 105)
    assert c.max_sessions == 10 and c.appointed_leader_id == -1
    assert cfg.driver.mtu == 1408
    assert cfg.archive.segment_length == 128 * 1024 * 1024
    assert cfg.archive.frame_checksums is True
    assert cfg.member_id == 1 and cfg.this_member.ingress == "127.0.0.1:20111"
    assert cfg.ingress_endpoints_text == "0=127.0.0.1:20110,1=127.0.0.1:20111"
    assert cfg.archive_dir == Path("var/n1/archive")
    kw = cfg.driver_kwargs()
    assert kw["dir"] == default_driver_dir("var/n1") and kw["mtu"] == 1408


@pytest.mark.parametrize(
    "text,ns",
    [
        ("1s", 10**9),
        ("200ms", 2 * 10**8),
        ("1.5s", 1_500_000_000),
        ("250us", 250_000),
        ("7ns", 7),
        ("2min", 120 * 10**9),
        ("1h", 3600 * 10**9),
        ("1_000ms", 10**9),
    ],
)
def test_durations(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns
    assert parse_duration_ns(format_duration(ns)) == ns


@pytest.mark.parametrize("text,n", [("64k", 65536), ("16m", 16 << 20), ("1g", 1 << 30), ("64KiB", 65536), (4096, 4096)])
def test_sizes(text, n) -> None:
    assert parse_size(text) == n


def test_duration_in_ns_form_and_human_form() -> None:
    a = parse_node_config(MINIMAL + '\n[timeouts]\nelection_timeout = "2s"\n')
    b = parse_node_config(MINIMAL + "\n[timeouts]\nelection_timeout_ns = 2_000_000_000\n")
    assert a.timeouts == b.timeouts
    assert a.timeouts.election_timeout_ns == 2 * 10**9


def test_members_as_tables() -> None:
    text = """
[node]
member_id = 0
dir = "d"
[[cluster.members]]
id = 0
ingress = "localhost:9000"
consensus = "localhost:9001"
log = "localhost:9002"
catchup = "localhost:0"
archive = "localhost:9003"
"""
    cfg = parse_node_config(text)
    assert cfg.members_text == "0,localhost:9000,localhost:9001,localhost:9002,localhost:0,localhost:9003"


def test_member_text_round_trip() -> None:
    members = parse_cluster_members("0,a:1,a:2,a:3,a:0,a:4|1,b:1,b:2,b:3,b:0,b:4")
    assert [m.id for m in members] == [0, 1]
    assert "|".join(m.to_text() for m in members) == "0,a:1,a:2,a:3,a:0,a:4|1,b:1,b:2,b:3,b:0,b:4"
    assert parse_ingress_endpoints("0=a:1, 1=b:2") == {0: "a:1", 1: "b:2"}


# ------------------------------------------------------------------------------ errors


def test_unknown_key_is_named_with_a_hint() -> None:
    msg = _error(MINIMAL + '\n[timeouts]\nelecton_timeout = "1s"\n')
    assert "timeouts.electon_timeout: unknown key" in msg and "election_timeout" in msg
    assert "unknown key" in _error(MINIMAL + "\n[drivr]\nmtu = 1408\n")
    assert "node.colour: unknown key" in _error(MINIMAL.replace('dir = "var/n1"', 'dir = "var/n1"\ncolour = 1'))


@pytest.mark.parametrize(
    "old,new,expect",
    [
        (
            "127.0.0.1:20221",
            "127.0.0.1:20110",
            "cluster.members[1].consensus: port clash with cluster.members[0].ingress",
        ),
        ("127.0.0.1:20221", "localhost:20110", "port clash"),
        ("127.0.0.1:20221", "0.0.0.0:20110", "port clash"),
        ("127.0.0.1:20221", "127.0.0.1:99999", "cluster.members[1].consensus"),
        ("127.0.0.1:20221", "no-port", "must look like host:port"),
        ("127.0.0.1:20221", "127.0.0.1:0", "needs a fixed port"),
        ("|1,", "|0,", "member id 0 appears twice"),
        (",127.0.0.1:8011", "", "expected 6"),
        ("member_id = 1", "member_id = 5", "node.member_id: 5 is not one of"),
        ("member_id = 1", 'member_id = "one"', "node.member_id: expected int, got str"),
    ],
)
def test_bad_members_and_endpoints(old: str, new: str, expect: str) -> None:
    assert old in MINIMAL
    assert expect in _error(MINIMAL.replace(old, new, 1))


@pytest.mark.parametrize(
    "extra,expect",
    [
        (
            'leader_heartbeat_interval = "10s"',
            "timeouts.leader_heartbeat_interval: 10s must be shorter than timeouts.leader_heartbeat_timeout",
        ),
        (
            'election_status_interval = "1s"',
            "timeouts.election_status_interval: 1s must be shorter than timeouts.election_timeout",
        ),
        ('startup_canvass_timeout = "15s"', "timeouts.startup_canvass_timeout: 15s must be at least twice"),
        ("election_timeout = 1", "timeouts.election_timeout: expected a duration with a unit"),
        ('election_timeout = "soon"', "is not a duration"),
        ('election_timeout_ns = "1s"', "timeouts.election_timeout_ns: expected an integer of nanoseconds"),
        ('election_timeout = "1s"\nelection_timeout_ns = 1', "given twice"),
        ('session_timeout = "0s"', "timeouts.session_timeout_ns: must be positive"),
        ('commit_spin = "11ms"', "timeouts.commit_spin: must be from 0 to 10ms, got 11ms"),
        ("commit_spin_ns = -1", "timeouts.commit_spin: must be from 0 to 10ms"),
    ],
)
def test_contradicting_timeouts(extra: str, expect: str) -> None:
    assert expect in _error(MINIMAL + "\n[timeouts]\n" + extra + "\n")


@pytest.mark.parametrize(
    "section,extra,expect",
    [
        ("driver", "mtu = 1000", "driver.mtu: must be a multiple of 32"),
        ("driver", 'term_length = "3m"', "driver.term_length: must be a power of two"),
        ("driver", 'heartbeat_interval = "20s"', "driver.heartbeat_interval"),
        ("archive", 'segment_length = "1m"', "archive.segment_length: 1m must be at least cluster.log_term_length"),
        ("archive", "file_sync_level = 3", "archive.file_sync_level: must be 0, 1 or 2"),
        ("cluster", "appointed_leader_id = 9", "cluster.appointed_leader_id"),
        ("cluster", "retain_snapshots = 0", "cluster.retain_snapshots: must be at least 1"),
        ("archive", "low_space_threshold = -1", "archive.low_space_threshold: must be 0"),
        (
            "cluster",
            "egress_stream_id = 101",
            "cluster.egress_stream_id: stream id 101 is also cluster.ingress_stream_id",
        ),
        ("logging", 'level = "loud"', "logging.level"),
    ],
)
def test_bad_sections(section: str, extra: str, expect: str) -> None:
    text = (
        MINIMAL.replace("[cluster]\n", "[cluster]\n" + extra + "\n")
        if section == "cluster"
        else MINIMAL + f"\n[{section}]\n{extra}\n"
    )
    assert expect in _error(text)


def test_not_toml_and_missing_tables_and_files(tmp_path: Path) -> None:
    assert "not valid TOML" in _error("[node\n")
    assert "[cluster]: missing table" in _error('[node]\nmember_id = 0\ndir = "d"\n')
    assert "node.dir: missing required key" in _error(MINIMAL.replace('dir = "var/n1"', ""))
    with pytest.raises(ConfigError, match="no such config file"):
        load_node_config(tmp_path / "absent.toml")


# ------------------------------------------------------------------------------ client


CLIENT = """
[client]
ingress_endpoints = "0=127.0.0.1:20110,1=127.0.0.1:20111"
egress_endpoint = "127.0.0.1:0"
"""


def test_client_config_defaults_and_errors() -> None:
    cfg = parse_client_config(CLIENT)
    assert cfg.client.message_timeout_ns == 1 * 10**9
    assert cfg.client.connect_timeout_ns == 10 * 10**9
    assert cfg.ingress_endpoints == {0: "127.0.0.1:20110", 1: "127.0.0.1:20111"}
    assert cfg.driver.term_length == 1024 * 1024  # client defaults, not the node's
    cfg2 = parse_client_config(CLIENT + "\n[driver]\nmtu = 4096\n")
    assert cfg2.driver.mtu == 4096 and cfg2.driver.term_length == 1024 * 1024
    assert "client.egress_endpoint: port clash" in _error(CLIENT.replace("127.0.0.1:0", "127.0.0.1:20111"), client=True)
    assert "client.ingress_endpoints" in _error(CLIENT.replace("0=127", "zero=127"), client=True)
    assert "client.keep_alive_intervl: unknown key" in _error(CLIENT + 'keep_alive_intervl = "1s"\n', client=True)


# ------------------------------------------------------------------------------ generation


def _same(a: msgspec.Struct, b: msgspec.Struct) -> bool:
    return msgspec.structs.replace(a, source="") == msgspec.structs.replace(b, source="")


def test_generated_cluster_round_trips_through_toml(tmp_path: Path) -> None:
    nodes, client = generate_loopback_cluster(5, tmp_path / "cluster", service="echo")
    ports = set()
    for cfg in nodes:
        for m in cfg.cluster.members:
            for name in ("ingress", "consensus", "log", "archive"):
                ports.add(getattr(m, name))
        assert _same(parse_node_config(node_config_to_toml(cfg)), cfg)
    assert len(ports) == 20
    assert _same(parse_client_config(client_config_to_toml(client)), client)
    assert client.client.leader_silence_timeout_ns > nodes[0].timeouts.leader_heartbeat_timeout_ns


def test_write_loopback_cluster(tmp_path: Path) -> None:
    paths, client_path = write_loopback_cluster(tmp_path / "configs", 3, tmp_path / "var", base_port=31000)
    loaded = [load_node_config(p) for p in paths]
    assert [c.member_id for c in loaded] == [0, 1, 2]
    assert loaded[2].this_member.ingress == "127.0.0.1:31002"
    assert load_client_config(client_path).client.egress_endpoint == "127.0.0.1:31400"


def test_generated_cluster_with_a_host_per_member(tmp_path: Path) -> None:
    hosts = ["10.9.0.1", "10.9.0.2", "10.9.0.3"]
    nodes, client = generate_loopback_cluster(3, tmp_path / "c", base_port=32000, hosts=hosts, host="10.9.0.254")
    for i, m in enumerate(nodes[0].cluster.members):
        for name in ("ingress", "consensus", "log", "archive", "catchup"):
            assert getattr(m, name).startswith(f"{hosts[i]}:"), (name, m)
    assert client.client.egress_endpoint == "10.9.0.254:32400"
    assert client.ingress_endpoints == {i: f"{h}:{32000 + i}" for i, h in enumerate(hosts)}
    with pytest.raises(ConfigError, match="hosts: 2 given for 3 nodes"):
        generate_loopback_cluster(3, tmp_path / "c", hosts=hosts[:2])


def test_section_defaults_are_valid() -> None:
    # The structs' own defaults must pass validation (a default that contradicts another default
    # would make every minimal config fail).
    assert TimeoutsSection().leader_heartbeat_interval_ns < TimeoutsSection().leader_heartbeat_timeout_ns
    assert DriverSection().mtu == 1408
    assert ClusterSection(members=()).log_term_length == 64 * 1024 * 1024
    assert isinstance(ClientConfig, type)


# ------------------------------------------------------------------------------ cpu affinity


def test_cpu_sets_parse_validate_and_round_trip() -> None:
    cpu = min(os.sched_getaffinity(0))
    cfg = parse_node_config(
        MINIMAL.replace('dir = "var/n1"', f'dir = "var/n1"\nleader_cpus = [{cpu}]\nfollower_cpus = []')
    )
    assert cfg.node.leader_cpus == (cpu,) and cfg.node.follower_cpus == ()
    assert _same(parse_node_config(node_config_to_toml(cfg)), cfg)
    assert f"leader_cpus = [{cpu}]" in node_config_to_toml(cfg)
    assert parse_node_config(MINIMAL).node.leader_cpus == ()  # the default: the OS decides


@pytest.mark.parametrize(
    "line,expect",
    [
        ("leader_cpus = [4095]", "node.leader_cpus: CPU 4095 is not one this process may run on (it may run on "),
        ("follower_cpus = [-1]", "node.follower_cpus: CPU -1 is not one this process may run on"),
        ("follower_cpus = [CPU, CPU]", "node.follower_cpus: a CPU appears twice"),
        ('leader_cpus = "0"', "node.leader_cpus"),
    ],
)
def test_bad_cpu_sets_are_one_line_errors(line: str, expect: str) -> None:
    line = line.replace("CPU", str(min(os.sched_getaffinity(0))))
    assert expect in _error(MINIMAL.replace('dir = "var/n1"', f'dir = "var/n1"\n{line}'))


def test_generated_cluster_carries_cpu_sets(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    nodes, _ = generate_loopback_cluster(3, tmp_path, leader_cpus=(cpu,), follower_cpus=(cpu,))
    assert all(n.node.leader_cpus == (cpu,) and n.node.follower_cpus == (cpu,) for n in nodes)


def test_keep_cpus_awake_parses_round_trips_and_is_off_by_default(tmp_path: Path) -> None:
    assert parse_node_config(MINIMAL).node.keep_cpus_awake is False
    cfg = parse_node_config(MINIMAL.replace('dir = "var/n1"', 'dir = "var/n1"\nkeep_cpus_awake = true'))
    assert cfg.node.keep_cpus_awake is True
    assert _same(parse_node_config(node_config_to_toml(cfg)), cfg)
    assert "node.keep_cpus_awake" in _error(
        MINIMAL.replace('dir = "var/n1"', 'dir = "var/n1"\nkeep_cpus_awake = "yes"')
    )
    nodes, _ = generate_loopback_cluster(3, tmp_path, keep_cpus_awake=True)
    assert all(n.node.keep_cpus_awake for n in nodes)


def test_commit_spin_may_be_off() -> None:
    assert parse_node_config(MINIMAL).timeouts.commit_spin_ns == 1_000_000
    assert parse_node_config(MINIMAL + '\n[timeouts]\ncommit_spin = "0s"\n').timeouts.commit_spin_ns == 0


# ------------------------------------------------------------------------------ service errors


def test_service_errors_defaults_to_record_and_accepts_stop() -> None:
    assert parse_node_config(MINIMAL).node.service_errors == "record"
    text = MINIMAL.replace('dir = "var/n1"', 'dir = "var/n1"\nservice_errors = "stop"')
    cfg = parse_node_config(text)
    assert cfg.node.service_errors == "stop"
    assert parse_node_config(node_config_to_toml(cfg)).node.service_errors == "stop"  # written back


@pytest.mark.parametrize("value", ['"ignore"', '"Record"', '""', "1"])
def test_service_errors_other_values_are_one_line_errors(value: str) -> None:
    msg = _error(MINIMAL.replace('dir = "var/n1"', f'dir = "var/n1"\nservice_errors = {value}'))
    assert "service_errors" in msg


def test_generated_cluster_carries_service_errors(tmp_path: Path) -> None:
    configs, _client = generate_loopback_cluster(3, tmp_path, service_errors="stop")
    assert {c.node.service_errors for c in configs} == {"stop"}


def test_receive_bounds_parse_and_are_checked_against_the_terms_they_must_hold() -> None:
    cfg = parse_node_config(MINIMAL + '\n[driver]\nmax_receive_term_length = "128m"\nmax_images_per_source = 8\n')
    kwargs = cfg.driver_kwargs()
    assert (kwargs["max_receive_term_length"], kwargs["max_images_per_source"]) == (128 * 1024 * 1024, 8)
    with pytest.raises(ConfigError, match="driver.max_receive_term_length: .* smaller than cluster.log_term_length"):
        parse_node_config(MINIMAL + '\n[driver]\nterm_length = "1m"\nmax_receive_term_length = "1m"\n')
    with pytest.raises(ConfigError, match="driver.image_creations_per_s"):
        parse_node_config(MINIMAL + "\n[driver]\nimage_creations_per_s = 0\n")


def test_a_node_sends_from_its_members_host_and_a_client_from_its_egress_host(tmp_path) -> None:
    hosts = ["127.0.0.10", "127.0.0.11", "127.0.0.12"]
    nodes, client = generate_loopback_cluster(3, tmp_path / "c", hosts=hosts, host="127.0.0.1")
    assert [n.driver_kwargs()["publication_bind_host"] for n in nodes] == hosts
    assert client.driver_kwargs(tmp_path)["publication_bind_host"] == "127.0.0.1"
    anywhere = msgspec.structs.replace(
        client, client=msgspec.structs.replace(client.client, egress_endpoint="0.0.0.0:0")
    )
    assert anywhere.driver_kwargs(tmp_path)["publication_bind_host"] is None
