"""A node's counters as data: one JSON object for scripts, the Prometheus text format for a
monitoring system.

Both are read from the driver's counters file (``cluster_node.media.counters``), mapped read-only, by any
process: ``cluster-node stat --json`` and ``cluster-node stat --prometheus --listen HOST:PORT``
work on a live node without touching its process, and an exporter serves whichever directory it
is pointed at. The exposition format is written by hand (it is a few lines of text per metric)
rather than through ``prometheus_client``: the values already live in another process's file, so
the client library's registry would only be copied into on every scrape.

Metric names (docs/operations.md lists them with what to alert on): the consensus module's
counters by their type id (:data:`CLUSTER_METRICS`), labelled with the member that owns them;
the driver's system counters (type 0) by their ``SystemCounter`` name; every counter also as
``pycluster_counter{id,type,label}``, so nothing in the file is out of reach.
"""

from __future__ import annotations

import re
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

from cluster_node.identifiers import CounterTypes
from cluster_node.media.counters import (
    CounterInfo,
    CountersError,
    CountersReader,
    CounterType,
    SystemCounter,
    pid_alive,
)
from cluster_node.service.errors import SERVICE_ERRORS_TYPE_ID

__all__ = ["CLUSTER_METRICS", "counters_snapshot", "prometheus_text", "serve_prometheus", "parse_listen"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metric(NamedTuple):
    name: str
    kind: str  # "gauge" or "counter" (Prometheus TYPE)
    help: str
    scale: float = 1.0  # multiply the raw value (nanoseconds -> seconds)


CLUSTER_METRICS: dict[int, Metric] = {
    CounterTypes.NODE_ROLE: Metric("pycluster_node_role", "gauge", "Role: 0 follower, 1 candidate, 2 leader."),
    CounterTypes.LEADERSHIP_TERM_ID: Metric("pycluster_leadership_term_id", "gauge", "Current leadership term."),
    CounterTypes.LEADER_MEMBER_ID: Metric(
        "pycluster_leader_member_id", "gauge", "Leader of the last completed election (-1: none yet)."
    ),
    CounterTypes.ELECTION_COUNT: Metric(
        "pycluster_elections_total", "counter", "Elections this node took part in since it started."
    ),
    CounterTypes.ELECTION_STATE: Metric("pycluster_election_state", "gauge", "Election state (CLOSED is 17)."),
    CounterTypes.COMMIT_POSITION: Metric("pycluster_commit_position", "gauge", "Committed log position (bytes)."),
    CounterTypes.APPEND_POSITION: Metric(
        "pycluster_append_position", "gauge", "Locally recorded log position (bytes)."
    ),
    CounterTypes.PEER_APPEND_POSITION: Metric(
        "pycluster_member_append_position",
        "gauge",
        "Each member's append position as the leader last heard it (-1 on a node that does not lead).",
    ),
    CounterTypes.CONSENSUS_MODULE_STATE: Metric(
        "pycluster_consensus_module_state",
        "gauge",
        "0 INIT, 1 ACTIVE, 2 SUSPENDED, 3 SNAPSHOT, 4 QUITTING, 5 TERMINATING, 6 CLOSED.",
    ),
    CounterTypes.ERRORS: Metric("pycluster_errors_total", "counter", "Errors of the consensus module."),
    SERVICE_ERRORS_TYPE_ID: Metric(
        "pycluster_service_errors_total", "counter", "Errors raised by the clustered service."
    ),
    CounterTypes.SNAPSHOT_COUNTER: Metric("pycluster_snapshots_total", "counter", "Snapshots taken."),
    CounterTypes.LAST_SNAPSHOT_DURATION: Metric(
        "pycluster_last_snapshot_duration_seconds", "gauge", "Duration of the last consensus module snapshot.", 1e-9
    ),
    CounterTypes.TOTAL_MAX_SNAPSHOT_DURATION: Metric(
        "pycluster_max_snapshot_duration_seconds", "gauge", "Longest consensus module snapshot since start.", 1e-9
    ),
    CounterTypes.CLIENT_TIMEOUT_COUNT: Metric(
        "pycluster_client_session_timeouts_total", "counter", "Client sessions closed for silence."
    ),
    CounterTypes.MAX_CYCLE_TIME: Metric(
        "pycluster_max_cycle_time_seconds", "gauge", "Longest consensus duty-cycle pass since start.", 1e-9
    ),
    CounterTypes.CYCLE_TIME_THRESHOLD_EXCEEDED: Metric(
        "pycluster_cycle_time_threshold_exceeded_total",
        "counter",
        "Duty-cycle passes longer than timeouts.cycle_threshold.",
    ),
}
"""Counter type id -> metric, for the counters every consensus module has."""

JSON_KEYS: dict[int, str] = {
    CounterTypes.NODE_ROLE: "role",
    CounterTypes.LEADERSHIP_TERM_ID: "leadership_term_id",
    CounterTypes.LEADER_MEMBER_ID: "leader_member_id",
    CounterTypes.ELECTION_COUNT: "election_count",
    CounterTypes.ELECTION_STATE: "election_state",
    CounterTypes.COMMIT_POSITION: "commit_position",
    CounterTypes.APPEND_POSITION: "append_position",
    CounterTypes.CONSENSUS_MODULE_STATE: "cm_state",
    CounterTypes.ERRORS: "errors",
    SERVICE_ERRORS_TYPE_ID: "service_errors",
    CounterTypes.SNAPSHOT_COUNTER: "snapshot_count",
    CounterTypes.LAST_SNAPSHOT_DURATION: "last_snapshot_duration_ns",
    CounterTypes.TOTAL_MAX_SNAPSHOT_DURATION: "max_snapshot_duration_ns",
    CounterTypes.CLIENT_TIMEOUT_COUNT: "client_session_timeouts",
    CounterTypes.MAX_CYCLE_TIME: "max_cycle_time_ns",
    CounterTypes.CYCLE_TIME_THRESHOLD_EXCEEDED: "cycle_time_threshold_exceeded",
}
"""Counter type id -> key of the ``cluster`` object of ``stat --json`` (and of ``tool describe --json``)."""

_MEMBER_SUFFIX = re.compile(r"member (\d+)$")


def owning_member(info: CounterInfo) -> int | None:
    """The member a cluster counter belongs to (its label ends ``member N``)."""
    match = _MEMBER_SUFFIX.search(info.label)
    return int(match.group(1)) if match else None


def type_name(type_id: int) -> str:
    try:
        return CounterType(type_id).name
    except ValueError:
        return str(type_id)


def cluster_values(counters: list[CounterInfo]) -> dict[int, dict[str, Any]]:
    """member id -> its consensus counters by JSON key, with ``member_append_positions`` (member id
    as a string -> position) for the per-member positions this node keeps as leader."""
    members: dict[int, dict[str, Any]] = {}
    for c in counters:
        if c.type_id not in JSON_KEYS and c.type_id != CounterTypes.PEER_APPEND_POSITION:
            continue
        member = owning_member(c)
        if member is None:
            continue
        values = members.setdefault(member, {})
        if c.type_id == CounterTypes.PEER_APPEND_POSITION:
            values.setdefault("member_append_positions", {})[str(c.registration_id)] = c.value
        else:
            values.setdefault(JSON_KEYS[c.type_id], c.value)
    return members


def counters_snapshot(path: Path) -> dict[str, Any]:
    """``stat --json``: the file's header, every counter, and the consensus counters by member.

    Keys: ``path``, ``owner_pid``, ``owner_alive``, ``start_timestamp_ms``, ``counters`` (a list of
    ``{id, type_id, type, registration_id, label, value}``), ``cluster`` (member id as a string ->
    ``{role, leadership_term_id, leader_member_id, election_count, ...}``), and for a backup
    process ``backup`` (``state``, ``state_name``, ``live_log_position``, ``last_backup_time_ms``,
    ``next_query_deadline_ms``, ``errors``). CountersError when the file cannot be read."""
    with CountersReader.open(path) as reader:
        rows = list(reader.counters())
        head = {
            "path": str(path),
            "owner_pid": reader.owner_pid,
            "owner_alive": reader.owner_alive(),
            "start_timestamp_ms": reader.start_timestamp_ms,
        }
    head["counters"] = [
        {
            "id": c.counter_id,
            "type_id": c.type_id,
            "type": type_name(c.type_id),
            "registration_id": c.registration_id,
            "label": c.label,
            "value": c.value,
        }
        for c in rows
    ]
    head["cluster"] = {str(k): v for k, v in sorted(cluster_values(rows).items())}
    backup = backup_values(rows)
    if backup:
        head["backup"] = backup
    return head


def backup_values(rows: list[CounterInfo]) -> dict[str, Any]:
    """A backup process's counters (``cluster-node backup``), by name; {} for a member."""
    from cluster_node.consensus.backup import BackupCounterTypes as T
    from cluster_node.consensus.backup import BackupState

    names = {
        T.STATE: "state",
        T.LIVE_LOG_POSITION: "live_log_position",
        T.NEXT_QUERY_DEADLINE: "next_query_deadline_ms",
        T.ERRORS: "errors",
        T.LAST_SUCCESS: "last_backup_time_ms",
    }
    out: dict[str, Any] = {names[c.type_id]: c.value for c in rows if c.type_id in names}
    if "state" in out:
        try:
            out["state_name"] = BackupState(out["state"]).name
        except ValueError:
            out["state_name"] = str(out["state"])
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}" if pairs else ""


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def prometheus_text(path: Path, node: str = "") -> str:
    """The counters file at ``path`` in the Prometheus text exposition format (version 0.0.4).

    ``pycluster_up`` is 1 when the file's owner process is alive, 0 when the values are a dead
    node's last ones (the other metrics are still given: they say where it stopped) and the only
    metric when the file cannot be read. ``node`` becomes a ``node`` label on every sample."""
    base = {"node": node} if node else {}
    families: dict[str, tuple[Metric, list[tuple[dict[str, str], float | int]]]] = {}

    def add(metric: Metric, labels: dict[str, str], value: float | int) -> None:
        families.setdefault(metric.name, (metric, []))[1].append(({**base, **labels}, value))

    up = Metric("pycluster_up", "gauge", "1 when the counters file's owner process is alive.")
    try:
        with CountersReader.open(path) as reader:
            rows = list(reader.counters())
            alive = pid_alive(reader.owner_pid, zombie_is_alive=False)
    except CountersError:
        add(up, {}, 0)
        rows, alive = [], False
    else:
        add(up, {}, 1 if alive else 0)
    generic = Metric("pycluster_counter", "gauge", "Every counter of the file, by id, type and label.")
    for c in rows:
        metric = CLUSTER_METRICS.get(c.type_id)
        member = owning_member(c) if metric is not None else None
        if metric is not None and member is not None:
            labels = {"member": str(member)}
            if c.type_id == CounterTypes.PEER_APPEND_POSITION:
                labels["peer"] = str(c.registration_id)
            add(metric, labels, c.value * metric.scale if metric.scale != 1.0 else c.value)
        elif c.type_id == CounterType.SYSTEM:
            try:
                name = SystemCounter(c.registration_id).name.lower()
            except ValueError:
                name = None
            if name is not None:
                add(
                    Metric(
                        f"pycluster_driver_{name}_total",
                        "counter",
                        f"Driver: {SystemCounter(c.registration_id).label}.",
                    ),
                    {},
                    c.value,
                )
        add(generic, {"id": str(c.counter_id), "type": type_name(c.type_id), "label": c.label}, c.value)
    lines = []
    for metric, samples in families.values():
        lines.append(f"# HELP {metric.name} {metric.help}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        for labels, value in samples:
            lines.append(f"{metric.name}{_labels(labels)} {_number(value)}")
    return "\n".join(lines) + "\n"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6) -> (host, port); ValueError with one line if not."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen wants HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve_prometheus(path: Path, host: str, port: int, node: str = "") -> ThreadingHTTPServer:
    """An HTTP server (not yet serving: call ``serve_forever``) answering ``GET /metrics`` (and
    ``/``) with :func:`prometheus_text` of ``path``, read afresh on every scrape so a restarted
    node's new file shows. OSError when the address cannot be bound."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the http.server name
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served")
                return
            body = prometheus_text(path, node).encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not news

    server_class = ThreadingHTTPServer
    if ":" in host:

        class V6(ThreadingHTTPServer):
            address_family = socket.AF_INET6

        server_class = V6
    server = server_class((host, port), Handler)
    server.daemon_threads = True
    return server
