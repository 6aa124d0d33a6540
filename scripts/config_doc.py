"""docs/configuration.md, generated from the config schema (``cluster_node/config_schema.py``).

    scripts/gen_config_doc            # rewrite docs/configuration.md
    scripts/gen_config_doc --check    # exit 1 if docs/configuration.md differs from the schema

Every key of every table, with its type or unit, its default and its meaning. The meaning is
the field's docstring in ``cluster_node/config_schema.py``; fields without one take theirs from
``MEANINGS`` below (tests/test_docs.py fails for a key that has neither, and when the doc and
the schema differ).
"""

from __future__ import annotations

import ast
import sys
import typing
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cluster_node import config  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"
SECTIONS: list[tuple[str, type, str]] = [
    ("node", config.NodeSection, "The member itself (node configs)."),
    (
        "cluster",
        config.ClusterSection,
        "The cluster: its members and its log (node configs; the same on every member).",
    ),
    ("timeouts", config.TimeoutsSection, "Consensus timing (node configs)."),
    (
        "driver",
        config.DriverSection,
        "The media driver (node and client configs). In a client config, `term_length` and "
        "`ipc_term_length` default to "
        f'`"{config.format_size(config.CLIENT_DRIVER_DEFAULTS.term_length)}"` and '
        f'`"{config.format_size(config.CLIENT_DRIVER_DEFAULTS.ipc_term_length)}"`.',
    ),
    ("archive", config.ArchiveSection, "The archive (node configs)."),
    ("logging", config.LoggingSection, "The node log (node configs)."),
    (
        "auth",
        config.AuthSection,
        "Client authentication and admin requests (node configs; the same on every member; see docs/security.md).",
    ),
    ("client", config.ClientSection, "A cluster client (client configs)."),
    (
        "backup",
        config.BackupSection,
        "A cluster backup (`cluster-node backup --config backup.toml`). A backup config "
        "also has `[cluster]` (the cluster's `members` and stream ids, as the members "
        "have them), and `[driver]`, `[archive]` and `[logging]` as a node config "
        "(the log file defaults to `<backup dir>/logs/backup.log`).",
    ),
]
MEANINGS: dict[tuple[str, str], str] = {
    ("node", "member_id"): "This member's id: one of the ids in `cluster.members`.",
    ("node", "dir"): "The member's directory: mark file, node state, recording.log, archive, logs "
    "(relative paths are taken from the working directory).",
    ("node", "cluster_id"): "The cluster's id, carried in the mark file and counters.",
    ("cluster", "members"): "Every member, `id,ingress,consensus,log,catchup,archive` (each `host:port`), "
    "entries separated by `|` (the reference's format). The same on every member.",
    ("cluster", "appointed_leader_id"): "A member id to be leader without an election contest; -1: elect one.",
    ("cluster", "max_sessions"): "How many client sessions the leader admits at once.",
    ("cluster", "log_stream_id"): "Stream id of the replicated log.",
    ("cluster", "ingress_stream_id"): "Stream id of client requests to the members.",
    ("cluster", "egress_stream_id"): "Stream id of replies and events to clients.",
    ("cluster", "replay_stream_id"): "Stream id of log replays from the archive to the consensus module.",
    ("cluster", "service_snapshot_stream_id"): "Stream id of the service's snapshots into the archive.",
    (
        "cluster",
        "consensus_module_snapshot_stream_id",
    ): "Stream id of the consensus module's snapshots into the archive.",
    ("cluster", "consensus_stream_id"): "Stream id of the members' consensus messages (votes, heartbeats, positions).",
    ("cluster", "consensus_term_length"): "Term length of the consensus stream's publications.",
    (
        "cluster",
        "wheel_tick_resolution",
    ): "Tick of the timer wheel that holds the cluster timers (`Cluster.schedule_timer`).",
    ("cluster", "ticks_per_wheel"): "Slots of the timer wheel (a power of two).",
    ("timeouts", "election_timeout"): "How long an election step (a canvass, a ballot) waits before it moves on.",
    ("timeouts", "election_status_interval"): "How often a member sends its election messages during an election.",
    (
        "timeouts",
        "leader_heartbeat_interval",
    ): "How often a leader with nothing else to send tells the followers it is alive.",
    (
        "timeouts",
        "leader_heartbeat_timeout",
    ): "A follower that hears nothing from its leader for this long starts an election.",
    ("timeouts", "startup_canvass_timeout"): "At start, how long a member waits to hear every other member before it "
    "settles for a majority.",
    ("timeouts", "session_timeout"): "A client session with no message or keep-alive for this long is closed.",
    ("timeouts", "termination_timeout"): "How long a shutdown or abort waits for the other members to acknowledge.",
    ("timeouts", "replication_progress_timeout"): "A log replication from another member's archive that makes no "
    "progress for this long fails.",
    ("driver", "mtu"): "Largest datagram the driver sends (1408 for Ethernet; more only on loopback).",
    ("driver", "ipc_term_length"): "Default term length of IPC publications (the local logs, the service streams).",
    ("driver", "initial_window"): "The receiver window a subscription grants before it reports its own.",
    ("driver", "image_liveness_timeout"): "An image (a publication seen by a subscriber) with no data or heartbeat for "
    "this long is gone.",
    ("driver", "publication_connection_timeout"): "A publication with no status message from its receivers for this "
    "long is not connected.",
    ("driver", "status_message_timeout"): "How often a receiver sends a status message (its position and window) "
    "without new data.",
    ("driver", "heartbeat_interval"): "How often a publication with nothing to send sends a heartbeat.",
    ("driver", "socket_buffer_bytes"): "SO_SNDBUF and SO_RCVBUF of the driver's UDP sockets.",
    ("archive", "segment_length"): "Size of a recording's segment files (a power of two from 64k to 1g, at least "
    "`cluster.log_term_length`).",
    ("archive", "file_sync_level"): "0: no explicit sync of recorded data; 1: sync data; 2: data and metadata.",
    ("archive", "catalog_file_sync_level"): "The same for the catalog.",
    ("archive", "control_request_stream_id"): "Stream id of requests to the archive.",
    ("archive", "control_response_stream_id"): "Stream id of the archive's responses.",
    ("archive", "max_concurrent_recordings"): "How many recordings may run at once.",
    ("archive", "max_concurrent_replays"): "How many replays may run at once.",
    ("archive", "connect_timeout"): "How long a connection to an archive (the node's own, another member's) may take.",
    ("logging", "level"): "`debug`, `info`, `warning` or `error`.",
    ("logging", "mode"): "`json` (JSON lines to `logging.file`) or `console` (readable lines on stderr).",
    ("client", "ingress_stream_id"): "Stream id of requests to the members (the cluster's `ingress_stream_id`).",
    ("client", "egress_stream_id"): "Stream id of the cluster's replies (the cluster's `egress_stream_id`).",
    ("client", "keep_alive_interval"): "How often an idle client tells the cluster it is alive (well inside "
    "`timeouts.session_timeout`).",
}


def _field_docs() -> dict[tuple[str, str], str]:
    """Attribute docstrings (a string right after a field) of the config structs, by class and field."""
    tree = ast.parse((ROOT / "cluster_node" / "config_schema.py").read_text(encoding="utf-8"))
    docs = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for here, after in zip(node.body, node.body[1:]):
                if (
                    isinstance(here, ast.AnnAssign)
                    and isinstance(here.target, ast.Name)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    docs[(node.name, here.target.id)] = after.value.value
    return docs


def _flat(text: str) -> str:
    text = " ".join(text.split())
    text = text.replace("``", "`")
    for role in (":mod:", ":class:", ":func:", ":meth:", ":attr:"):
        text = text.replace(role, "")
    return text.replace("|", "\\|")


def keys() -> list[tuple[str, str, str, str, str]]:
    """(section, key, type, default, meaning) of every config key, in schema order."""
    docs = _field_docs()
    rows = []
    for section, cls, _ in SECTIONS:
        for f in msgspec.structs.fields(cls):
            name = f.name
            key = name[:-3] if name.endswith("_ns") else name
            required = f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
            default = None if required else (f.default if f.default is not msgspec.NODEFAULT else f.default_factory())
            if name.endswith("_ns"):
                kind = "duration"
                shown = f'"{config.format_duration(default)}"' if not required else ""
            elif name in config._SIZE_FIELDS:
                kind = "size"
                shown = (
                    (
                        f'"{config.format_size(default)}"'
                        if isinstance(config.format_size(default), str)
                        else str(default)
                    )
                    if not required
                    else ""
                )
            elif f.type is bool:
                kind, shown = "bool", "" if required else str(default).lower()
            elif f.type is int:
                kind, shown = "integer", "" if required else str(default)
            elif f.type is str:
                kind, shown = "string", "" if required else f'"{default}"'
            elif typing.get_origin(f.type) is tuple:
                kind = "list" if section in ("node", "auth") else "string"
                shown = "" if required else ("[]" if default == () else str(list(default)))
            else:
                kind, shown = "string", "" if required else str(default)
            meaning = docs.get((cls.__name__, name)) or MEANINGS.get((section, key), "")
            rows.append((section, key, kind, "required" if required else f"`{shown}`", _flat(meaning)))
    return rows


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/gen_config_doc from cluster_node/config.py: do not edit by hand. -->",
        "",
        "A member reads one TOML file (`cluster-node run --config node.toml`), a client another",
        "(`cluster-node client --config client.toml`); `configs/` holds commented examples. Every key",
        "has the reference's (Aeron Cluster's) default, so a file holds only what differs. Loading is",
        "strict: an unknown key, a bad value or settings that contradict each other stop the start",
        "with one line naming the key.",
        "",
        'Units: a *duration* is a string with a unit, `ns`, `us`, `ms`, `s`, `min` or `h` (`"200ms"`);',
        "a key `<name>_ns` takes nanoseconds as an integer instead. A *size* is bytes, or a string with",
        '`k`, `m` or `g` (`"64m"`, powers of 1024).',
        "",
    ]
    rows = keys()
    for section, _, title in SECTIONS:
        lines += [f"## [{section}]", "", title, "", "| key | type | default | meaning |", "|---|---|---|---|"]
        lines += [
            f"| `{key}` | {kind} | {default} | {meaning} |" for s, key, kind, default, meaning in rows if s == section
        ]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not DOC.exists() or DOC.read_text(encoding="utf-8") != text:
            print(
                f"{DOC.relative_to(ROOT)} differs from the config schema: run scripts/gen_config_doc", file=sys.stderr
            )
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)} ({sum(1 for _ in keys())} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
