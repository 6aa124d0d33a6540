"""``cluster-node up``: a local cluster in one command, with a live table of its members.

It is a supervisor, not a node: every member is its own ``cluster-node run`` process (exactly
what an operator would start by hand), so killing one with ``kill -9`` is a real crash and the
others really elect a new leader. ``up`` only

1. decides the configs: generated into ``--dir`` with a block of free ports below the kernel's
   ephemeral range (:func:`pick_base_port`), kept there so that a second ``up`` on the same
   directory restarts the same cluster with its state; or taken from ``--config-dir``
   (e.g. ``configs/``). Generated configs pin the members by role (``leader_cpus`` /
   ``follower_cpus``: the leader on a CPU of its own, the followers on the others), because
   members sharing a machine otherwise lose a fifth of their speed to the scheduler putting a
   woken follower on the leader's CPU (:mod:`cluster_node.affinity`); ``--no-pin`` does not.
   ``--keep-cpus-awake`` sets ``keep_cpus_awake`` in generated configs
   (:mod:`cluster_node.keep_awake`: lower latency on virtual machines, for CPU while traffic flows).
   Generated configs also get a member key of their own (``member.key`` in ``--dir``, set as
   ``cluster.secret_file``): member traffic is MAC'd by default (docs/security.md);
2. checks that no member's port is taken, then starts the members; each one's stdout and stderr
   go to ``<node dir>/logs/console.log`` and its ``READY member=<id> pid=<pid>`` line there says
   it runs (a member that exits first is a start failure, reported with the file's last lines);
3. shows each member's state, read from the counters its driver publishes in
   ``counters.dat`` of its driver directory (role, leadership term, election state, commit and append
   positions, errors: the consensus agent's counters); it never talks to the members;
4. on Ctrl-C / SIGTERM / SIGHUP sends SIGTERM to every member (a graceful stop), waits
   ``--stop-timeout`` and SIGKILLs what is left; a second Ctrl-C kills at once.

Members run in sessions of their own, so the terminal's Ctrl-C reaches ``up`` alone, which stops
them in order; on Linux each member also gets SIGTERM if ``up`` itself dies (PR_SET_PDEATHSIG),
so a killed supervisor leaves no orphaned cluster behind. When every member exits 0 (the cluster
was shut down or aborted with ``cluster-node tool``), ``up`` ends too. A member that dies while
``up`` runs is shown as down; one restarted by hand (``cluster-node run --config <dir>/node1.toml``) shows up
again in the table, and is stopped with the others.

Output
======
On a terminal the table is redrawn about twice a second, with the latest events under it. With
``--once``, or when stdout is not a terminal, output is lines, for scripts and tests::

    cluster of 3 (kv service), configs generated in var/cluster
    12:00:01 member 0 started, pid 4242 (var/cluster/node0.toml)     (one line per event)
    12:00:03 member 0 is running                                      (its READY line)
    12:00:04 leader: member 2, term 0
    <the table>                       (at each new leader; with --once only the first time)
    UP leader=2 term=0 members=3 client=/abs/path/client.toml        (once)
    12:00:09 member 2 exited (SIGKILL)
    12:00:12 leader: member 0, term 1
    STOPPED clean=2 killed=0 exit_codes=0,-9,0                        (after the stop)

A leader counts as elected when exactly one running member has the leader role with its
election CLOSED and a majority of the members are in that term with their election closed: from
then on a client can connect and commit.

``--once`` also gives up (stopping the members, exit 1) if no leader is elected within
``--leader-timeout``.
"""

from __future__ import annotations

import collections
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import click

from cluster_node.exit_codes import ExitCode

__all__ = [
    "up",
    "Supervisor",
    "Member",
    "MemberView",
    "read_member_view",
    "render_table",
    "leader_of",
    "plan_cluster",
    "pick_base_port",
    "write_cluster_configs",
]

ROLE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}
LEADER_ROLE = 2
CLOSED_ELECTION_STATE = 17
CONSOLE_LOG_NAME = "console.log"
_TAIL_LINES = 8
_EVENTS_SHOWN = 10
_REFRESH_S = 0.5
_ERROR_LINE = re.compile(r"^\s*(Error: |[\w.]*(Error|Exception)\b: )")


# --------------------------------------------------------------------------------------------
# Reading a member's counters
# --------------------------------------------------------------------------------------------


def _counter_types() -> dict[str, int]:
    """The consensus agent's counter type ids, by the names the table uses."""
    from cluster_node.consensus.agent import CounterTypes

    return {
        "role": CounterTypes.NODE_ROLE,
        "commit": CounterTypes.COMMIT_POSITION,
        "state": CounterTypes.ELECTION_STATE,
        "term": CounterTypes.LEADERSHIP_TERM_ID,
        "append": CounterTypes.APPEND_POSITION,
        "errors": CounterTypes.ERRORS,
        "elections": CounterTypes.ELECTION_COUNT,
        "peer": CounterTypes.PEER_APPEND_POSITION,
    }


def election_state_name(code: int | None) -> str:
    if code is None:
        return "-"
    try:
        from cluster_node.consensus.election import ElectionState

        return ElectionState(code).name
    except (ImportError, ValueError):
        return str(code)


@dataclass(frozen=True)
class MemberView:
    """What the counters file of one member says, at one moment."""

    owner_pid: int | None = None
    owner_alive: bool = False
    values: dict[str, int] = field(default_factory=dict)

    def get(self, name: str) -> int | None:
        return self.values.get(name)


class _CounterIds:
    """Counter ids found by label, kept while the file's owner and start time stay the same
    (a scan of every slot is the costly part of a read; a restarted driver writes a new file)."""

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.ids: dict[str, int] = {}


def read_member_view(counters_path: Path, member_id: int, cache: _CounterIds | None = None) -> MemberView:
    """The member's cluster counters from its driver's counters file (a missing or unreadable
    file gives an empty view: the member has not started yet, or its directory is gone)."""
    from media.counters import CountersError, CountersReader

    try:
        reader = CountersReader.open(counters_path)
    except (CountersError, OSError, ValueError):
        return MemberView()
    with reader:
        key = (reader.owner_pid, reader.start_timestamp_ms)
        if cache is None or cache.key != key or not cache.ids:
            types = _counter_types()
            by_type = {type_id: name for name, type_id in types.items()}
            ids: dict[str, int] = {}
            suffix = f": member {member_id}"
            for info in reader.counters():
                name = by_type.get(info.type_id)
                if name is not None and info.label.startswith("cluster ") and info.label.endswith(suffix):
                    if name == "peer":  # one per member, keyed by its id: "peer<id>"
                        name = f"peer{info.registration_id}"
                    ids[name] = info.counter_id
            if cache is not None:
                cache.key, cache.ids = key, ids
        else:
            ids = cache.ids
        values: dict[str, int] = {}
        for name, counter_id in ids.items():
            try:
                values[name] = reader.get(counter_id)
            except CountersError:
                if cache is not None:
                    cache.ids = {}  # freed or reused: scan again next time
        return MemberView(reader.owner_pid, reader.owner_alive(), values)


# --------------------------------------------------------------------------------------------
# One member process
# --------------------------------------------------------------------------------------------


def _die_with_parent_fn() -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when ``up`` dies (resolved here, in
    the parent: a forked child must not import or load libraries before exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    return preexec


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    try:
        meaning = ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        return f"exit code {code}"
    return f"exit code {code}: {meaning}"


def _tail(path: Path, lines: int, start_offset: int = 0) -> list[str]:
    """The last ``lines`` non-empty lines of a file from ``start_offset`` (reads at most 64 KiB)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            begin = max(start_offset, size - 65536)
            f.seek(begin)
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _looks_like_member(pid: int) -> bool:
    """Whether ``pid`` runs ``cluster-node run`` (before ``up`` signals a process it did not
    start, found through a counters file: a pid alone may have been reused)."""
    args = _cmdline(pid)
    if not args:
        return sys.platform != "linux"  # no /proc: trust the counters file's live owner
    return "run" in args and any("cluster-node" in a or "cluster_node" in a for a in args)


class Member:
    """One ``cluster-node run`` child and how to read its state."""

    def __init__(self, member_id: int, config_path: Path, node_dir: Path, counters_path: Path, log_file: Path) -> None:
        self.member_id = member_id
        self.config_path = config_path
        self.node_dir = node_dir
        self.counters_path = counters_path
        self.log_file = log_file
        self.console_path = node_dir / "logs" / CONSOLE_LOG_NAME
        self.console_offset = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = False
        self.exit_code: int | None = None
        self.view = MemberView()
        self._ids = _CounterIds()

    # ---------------------------------------------------------------- process

    def start(self, preexec: Callable[[], None] | None) -> None:
        self.console_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.console_path, "ab") as console:
            console.write(f"--- cluster-node up: starting member {self.member_id} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            console.flush()
            self.console_offset = console.tell()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cluster_node.cli", "run", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=preexec,
            )
        self.ready = False
        self.exit_code = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """The child's exit code once it exited (recorded once), else None."""
        if self.proc is None:
            return self.exit_code
        code = self.proc.poll()
        if code is not None:
            self.exit_code = code
        return code

    @property
    def child_running(self) -> bool:
        return self.proc is not None and self.poll() is None

    def check_ready(self) -> bool:
        if not self.ready:
            for line in _tail(self.console_path, 50, self.console_offset):
                if line.startswith(f"READY member={self.member_id} "):
                    self.ready = True
                    break
        return self.ready

    def console_tail(self, lines: int = _TAIL_LINES) -> list[str]:
        return _tail(self.console_path, lines, self.console_offset)

    def last_error_event(self) -> str | None:
        """The newest error/warning event in the node's JSON log, shortened to one line."""
        for line in reversed(_tail(self.log_file, 200)):
            m = re.search(r'"level":\s*"(error|warning|critical)"', line)
            if m:
                ev = re.search(r'"event":\s*"((?:[^"\\]|\\.)*)"', line)
                text = ev.group(1) if ev else line
                return f"{m.group(1)}: {text}"[:160]
        return None

    # ---------------------------------------------------------------- state

    def refresh(self) -> MemberView:
        self.view = read_member_view(self.counters_path, self.member_id, self._ids)
        return self.view

    @property
    def adopted_pid(self) -> int | None:
        """A live member process ``up`` did not start (restarted by hand after a crash)."""
        v = self.view
        if self.child_running or not v.owner_alive or v.owner_pid is None or v.owner_pid == self.pid:
            return None
        return v.owner_pid if _looks_like_member(v.owner_pid) else None

    @property
    def running_pid(self) -> int | None:
        if self.child_running:
            return self.pid
        return self.adopted_pid

    @property
    def alive_text(self) -> str:
        if self.child_running:
            return "yes" if self.ready else "starting"
        if self.adopted_pid is not None:
            return "yes"
        if self.proc is None:
            return "-"
        return "down"


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------

_HEADINGS = ("MEMBER", "PID", "ALIVE", "ROLE", "TERM", "ELECTION", "ELECTIONS", "COMMIT", "APPEND", "LAG", "ERRORS")


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def member_lag(m: Member, leader: Member | None) -> int | None:
    """How far ``m``'s append position, as the running leader last heard it, is behind the
    leader's own (None without a running leader, or when it has not heard from ``m``)."""
    if leader is None or leader.running_pid is None:
        return None
    position = leader.view.get(f"peer{m.member_id}")
    append = leader.view.get("append")
    if position is None or position < 0 or append is None:
        return None
    return max(0, append - position)


def member_row(m: Member, leader: Member | None = None) -> tuple[str, ...]:
    v = m.view
    running = m.running_pid is not None
    role = v.get("role")
    role_text = ROLE_NAMES.get(role, str(role)) if running and role is not None else "-"
    if role == LEADER_ROLE and running:
        role_text = "LEADER"
    down_note = ""
    if not running and m.exit_code is not None:
        down_note = f" ({_exit_text(m.exit_code)})"
    pid = m.running_pid or m.pid
    return (
        str(m.member_id),
        str(pid) if pid is not None else "-",
        m.alive_text + down_note,
        role_text,
        _num(v.get("term")) if (v.get("term") or 0) >= 0 else "-",
        election_state_name(v.get("state")) if running else "-",
        _num(v.get("elections")),
        _num(v.get("commit")),
        _num(v.get("append")),
        _num(member_lag(m, leader)),
        _num(v.get("errors")),
    )


def render_table(members: list[Member]) -> list[str]:
    leading = [m for m in members if m.running_pid is not None and m.view.get("role") == LEADER_ROLE
               and m.view.get("state") == CLOSED_ELECTION_STATE]
    leader = leading[0] if len(leading) == 1 else None
    rows = [_HEADINGS, *(member_row(m, leader) for m in members)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADINGS))]
    right = {0, 1, 4, 6, 7, 8, 9, 10}
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append("  ".join(cells).rstrip())
    return out


def leader_of(members: list[Member]) -> tuple[int, int] | None:
    """``(member_id, term)`` when one running member leads with its election closed and a
    majority of the members are in that term with their election closed (a client can then
    connect and commit); else None."""
    leaders = []
    for m in members:
        v = m.view
        if m.running_pid is not None and v.get("role") == LEADER_ROLE and v.get("state") == CLOSED_ELECTION_STATE:
            leaders.append((m.member_id, v.get("term")))
    if len(leaders) != 1:
        return None
    leader_id, term = leaders[0]
    settled = sum(
        1 for m in members
        if m.running_pid is not None and m.view.get("term") == term and m.view.get("state") == CLOSED_ELECTION_STATE
    )
    return (leader_id, term) if settled * 2 > len(members) else None


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


@dataclass
class ClusterPlan:
    node_config_paths: list[Path]
    client_config_path: Path | None
    generated: bool
    service: str


_NODE_TOML = re.compile(r"^node(\d+)\.toml$")


def _node_tomls(directory: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in directory.glob("node*.toml") if (m := _NODE_TOML.match(p.name))]
    return [p for _, p in sorted(found)]


def plan_cluster(nodes: int | None, base_dir: Path, service: str | None, config_dir: Path | None, fresh: bool,
                 pin: bool = True, keep_cpus_awake: bool = False) -> ClusterPlan:
    """Which configs to start (see the module docstring); raises ClickException on a mistake.

    ``pin``: generated configs give the members ``leader_cpus`` / ``follower_cpus``
    (:func:`cluster_node.affinity.split_for_shared_machine`); ``False`` (``--no-pin``) leaves
    them out, and refuses existing configs that pin. ``keep_cpus_awake`` (``--keep-cpus-awake``):
    generated configs set it; existing ones must set it themselves."""
    from cluster_node.config import ConfigError, load_node_config

    def check_unpinned(paths: list[Path], where: Path) -> None:
        configs = _load_all(paths)
        if not pin and any(c.node.leader_cpus or c.node.follower_cpus for c in configs):
            raise click.ClickException(
                f"--no-pin applies to generated configs; the configs in {where} set leader_cpus/follower_cpus"
                " (remove them there, or use --fresh to generate new ones)")
        if keep_cpus_awake and not all(c.node.keep_cpus_awake for c in configs):
            raise click.ClickException(
                f"--keep-cpus-awake applies to generated configs; set keep_cpus_awake = true in [node] of the"
                f" configs in {where}, or use --fresh to generate new ones")

    if config_dir is not None:
        if service is not None:
            raise click.ClickException(
                f"--service applies to generated configs; the configs in {config_dir} name their own service ([node] service)")
        if fresh:
            raise click.ClickException("--fresh applies to generated configs, not to --config-dir")
        if not config_dir.is_dir():
            raise click.ClickException(f"--config-dir: no such directory: {config_dir}")
        paths = _node_tomls(config_dir)
        if not paths:
            raise click.ClickException(f"--config-dir: no node<N>.toml files in {config_dir}")
        if nodes is not None and nodes != len(paths):
            raise click.ClickException(f"--nodes {nodes}, but {config_dir} holds {len(paths)} node configs")
        check_unpinned(paths, config_dir)
        client = config_dir / "client.toml"
        return ClusterPlan(paths, client if client.is_file() else None, False, _service_of(paths))

    if nodes is not None and not 1 <= nodes <= 64:
        raise click.ClickException(f"--nodes must be from 1 to 64, got {nodes}")
    if base_dir.exists() and not base_dir.is_dir():
        raise click.ClickException(f"--dir: not a directory: {base_dir}")
    existing = _node_tomls(base_dir) if base_dir.is_dir() else []
    if existing and fresh:
        _check_ports(_load_all(existing))  # never wipe the files of a cluster that is running
        _remove_generated(base_dir)
        existing = []
    if existing:
        if nodes is not None and nodes != len(existing):
            raise click.ClickException(
                f"{base_dir} holds a {len(existing)}-node cluster; use --nodes {len(existing)}, --fresh, or another --dir")
        have = _service_of(existing)
        if service is not None and service != have:
            raise click.ClickException(
                f"{base_dir} holds a cluster running the {have!r} service; use --fresh to start over with {service!r}, or another --dir")
        check_unpinned(existing, base_dir)
        client = base_dir / "client.toml"
        return ClusterPlan(existing, client if client.is_file() else None, False, have)
    n = 3 if nodes is None else nodes
    svc = service or "kv"
    try:
        paths, client = write_cluster_configs(base_dir, n, svc, pin=pin, keep_cpus_awake=keep_cpus_awake)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"cannot write configs into {base_dir}: {e.strerror or e}") from None
    # Validate a custom service name now rather than as three start failures.
    try:
        load_node_config(paths[0])
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    return ClusterPlan(paths, client, True, svc)


def _ephemeral_port_low() -> int:
    """The lowest port the kernel hands out for port-0 binds (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _ports_free(host: str, ports: list[int]) -> bool:
    socks = []
    try:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(s)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def pick_base_port(nodes: int, host: str = "127.0.0.1", rng=None) -> int:
    """A base port whose block (see ``generate_loopback_cluster``: base+i, base+100+i, base+200+i,
    base+300+i) is free now and lies below the kernel's ephemeral range.

    Why not port-0 "free ports": the configs are kept and reused by the next ``up``, and a port
    taken from the ephemeral range is soon handed to some other process's port-0 bind (a client's
    egress, an archive's response channel), which then blocks the member from starting. Below
    the range only an explicit bind can take it. Blocks start at 21000, clear of configs/.
    """
    import random

    rng = rng or random.Random()
    high = min(_ephemeral_port_low(), 65536) - 500
    bases = list(range(21000, max(high, 21001), 500))
    rng.shuffle(bases)
    for base in bases:
        if _ports_free(host, [base + 100 * k + i for k in range(4) for i in range(nodes)]):
            return base
    raise click.ClickException(f"no free block of {4 * nodes} UDP ports on {host} between 21000 and {high + 500}")


def write_cluster_configs(base_dir: Path, nodes: int, service: str, pin: bool = True,
                          keep_cpus_awake: bool = False) -> tuple[list[Path], Path]:
    """Generate and write ``node<i>.toml`` and ``client.toml`` into ``base_dir`` (node directories
    ``base_dir/node<i>``, absolute, so the configs work from any working directory).

    ``pin``: every member gets ``leader_cpus`` / ``follower_cpus`` for this machine (all members
    share it: see :mod:`cluster_node.affinity` for why the leader wants a CPU of its own)."""
    import msgspec

    from cluster_node.affinity import split_for_shared_machine
    from cluster_node.config import client_config_to_toml, generate_loopback_cluster, node_config_to_toml

    base_port = pick_base_port(nodes)
    leader_cpus, follower_cpus = split_for_shared_machine() if pin and nodes > 1 else ((), ())
    base_dir.mkdir(parents=True, exist_ok=True)
    # Its own member key, so a local cluster is safe by default: nobody else on the machine
    # (another user's process, a stray client) can speak as one of its members.
    key_path = member_key_file(base_dir)
    configs, client = generate_loopback_cluster(nodes, base_dir.resolve(), service=service, base_port=base_port,
                                                leader_cpus=leader_cpus, follower_cpus=follower_cpus,
                                                keep_cpus_awake=keep_cpus_awake, secret_file=key_path.resolve())
    # Many clients may run at once (a watch and a put): each picks its own egress port.
    client = msgspec.structs.replace(
        client, client=msgspec.structs.replace(client.client, egress_endpoint="127.0.0.1:0")).validate()
    paths = []
    for cfg in configs:
        p = base_dir / f"node{cfg.member_id}.toml"
        p.write_text(node_config_to_toml(
            cfg, header=f"Member {cfg.member_id} of a {nodes}-node local cluster, written by `cluster-node up`."))
        paths.append(p)
    cp = base_dir / "client.toml"
    cp.write_text(client_config_to_toml(client, header=f"Client of the {nodes}-node local cluster in {base_dir.resolve()}."))
    return paths, cp


MEMBER_KEY_FILE = "member.key"


def member_key_file(base_dir: Path) -> Path:
    """``base_dir/member.key``, the generated cluster's member key: made (mode 0600) unless a
    usable one is there already (a regenerated config keeps the key its members share)."""
    from cluster_node.secret_file import SecretFileError, generate, read_key

    path = base_dir / MEMBER_KEY_FILE
    try:
        if path.exists():
            read_key(path)
        else:
            generate(path)
    except SecretFileError as e:
        raise click.ClickException(str(e)) from None
    return path


def _load_all(paths: list[Path]):
    from cluster_node.config import ConfigError, load_node_config

    configs = []
    for p in paths:
        try:
            configs.append(load_node_config(p))
        except ConfigError as e:
            raise click.ClickException(str(e)) from None
    return configs


def _service_of(paths: list[Path]) -> str:
    return _load_all(paths[:1])[0].node.service


def _remove_generated(base_dir: Path) -> None:
    """Remove what ``up`` generated in ``base_dir``: node<N>.toml, client.toml, node<N>/ (only
    names of that shape, so a mistaken --dir loses nothing else)."""
    for p in base_dir.iterdir():
        if _NODE_TOML.match(p.name) or p.name in ("client.toml", MEMBER_KEY_FILE):
            p.unlink()
        elif p.is_dir() and re.fullmatch(r"node\d+", p.name):
            shutil.rmtree(p)


def _check_ports(configs) -> None:
    """Every fixed UDP port of the members must be free (else a one-line error naming it)."""
    from media.channel import parse_endpoint

    seen = set()
    for cfg in configs:
        for m in cfg.cluster.members:
            for name in ("ingress", "consensus", "log", "archive"):
                host, port = parse_endpoint(getattr(m, name))
                if port == 0 or (host, port) in seen:
                    continue
                seen.add((host, port))
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    try:
                        s.bind((host, port))
                    except OSError as e:
                        why = "is in use" if e.errno in (98, 48) else f"cannot be bound ({e.strerror})"
                        raise click.ClickException(
                            f"port {host}:{port} (member {m.id} {name}) {why}: is this cluster already running? "
                            f"(stop it, or use --fresh / another --dir for new ports)"
                        ) from None


# --------------------------------------------------------------------------------------------
# The supervisor
# --------------------------------------------------------------------------------------------


class StartError(click.ClickException):
    """A member could not start; the message ends with the last lines of its output."""


class Supervisor:
    """Starts, watches and stops the members. Signals arrive through a wake-up pipe, so the
    loop sleeps in ``select`` and reacts to Ctrl-C or a child's exit at once."""

    def __init__(self, members: list[Member], echo: Callable[[str], None]) -> None:
        self.members = members
        self.echo = echo
        self.events: collections.deque[str] = collections.deque(maxlen=_EVENTS_SHOWN)
        self.stop_requests = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._old_handlers: dict[int, object] = {}
        self._old_wakeup_fd = -1
        self._last: dict[int, tuple] = {}
        self.on_event: Callable[[str], None] | None = None

    # ---------------------------------------------------------------- signals

    def install_signals(self) -> None:
        def on_stop(signum, frame) -> None:
            self.stop_requests += 1

        self._old_wakeup_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, on_stop)
        # A handler (doing nothing) makes a child's exit write to the wake-up pipe too.
        self._old_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda s, f: None)

    def restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def wait(self, timeout_s: float) -> None:
        """Sleep until ``timeout_s`` passes, a signal arrives or a child exits."""
        if timeout_s > 0:
            try:
                select.select([self._wake_r], [], [], timeout_s)
            except InterruptedError:
                pass
        try:
            while os.read(self._wake_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # ---------------------------------------------------------------- events

    def event(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        self.events.append(line)
        if self.on_event is not None:
            self.on_event(line)

    def refresh(self) -> None:
        """Read every member's counters and turn changes into events."""
        for m in self.members:
            code_before = m.exit_code
            code = m.poll()
            m.refresh()
            if m.proc is not None and code is not None and code_before is None:
                self.event(f"member {m.member_id} exited ({_exit_text(code)})")
            v = m.view
            running_pid = m.running_pid
            key = (running_pid, v.get("role") if running_pid else None, v.get("term"), v.get("errors"))
            old = self._last.get(m.member_id)
            self._last[m.member_id] = key
            if old is None:
                continue
            old_pid, old_role, old_term, old_errors = old
            if running_pid is not None and running_pid != old_pid and not m.child_running:
                self.event(f"member {m.member_id} is back, pid {running_pid} (not started by up)")
            if running_pid is not None and key[1] is not None and key[1] != old_role and key[1] != LEADER_ROLE:
                # (a new leader is announced once its election closed, by the caller)
                role = ROLE_NAMES.get(key[1], str(key[1]))
                term = key[2]
                self.event(f"member {m.member_id} is {role}" + (f" (term {term})" if term is not None and term >= 0 else ""))
            errors = key[3]
            if errors is not None and old_errors is not None and errors > old_errors:
                detail = m.last_error_event()
                self.event(f"member {m.member_id} errors {old_errors} -> {errors}" + (f" (last {detail})" if detail else ""))

    # ---------------------------------------------------------------- start and stop

    def start_all(self, start_timeout_s: float, tick: Callable[[], None] | None = None) -> None:
        """Start every member and wait for each one's READY; raises StartError (after stopping
        the others) when one exits first or the deadline passes, and returns early on a stop
        request."""
        preexec = _die_with_parent_fn()
        for m in self.members:
            try:
                m.start(preexec)
            except OSError as e:
                self.stop_all(5.0)
                raise StartError(f"cannot start member {m.member_id}: {e.strerror or e}") from None
            self.event(f"member {m.member_id} started, pid {m.pid} ({m.config_path})")
        deadline = time.monotonic() + start_timeout_s
        while True:
            for m in self.members:
                if not m.ready and m.check_ready():
                    self.event(f"member {m.member_id} is running")
            if all(m.ready for m in self.members):
                break
            if self.stop_requests:
                return
            for m in self.members:
                code = m.poll()
                if code is not None and not m.ready:
                    tail = m.console_tail() or _tail(m.log_file, _TAIL_LINES)
                    self.stop_all(5.0)
                    raise StartError(self._start_failure(m, f"exited during start-up ({_exit_text(code)})", tail))
            left = deadline - time.monotonic()
            if left <= 0:
                late = next(m for m in self.members if not m.ready)
                tail = late.console_tail() or _tail(late.log_file, _TAIL_LINES)
                self.stop_all(5.0)
                raise StartError(self._start_failure(late, f"not running after {start_timeout_s:g}s", tail))
            if tick is not None:
                tick()
            self.wait(min(0.1, left))
        self.refresh()

    @staticmethod
    def _start_failure(m: Member, what: str, tail: list[str]) -> str:
        """One line (the member, what happened, the error it printed last), then its last lines."""
        where = m.console_path if tail else m.log_file
        cause = next((line.strip() for line in reversed(tail) if _ERROR_LINE.search(line)), None)
        first = f"member {m.member_id} {what}" + (f": {cause}" if cause else "")
        lines = [f"{first}; last lines of {where}:" if tail else f"{first} (no output)"]
        lines += [f"  {line}" for line in tail]
        return "\n".join(lines)

    def stop_all(self, timeout_s: float) -> tuple[int, int]:
        """SIGTERM every running member, wait up to ``timeout_s`` (a further stop request cuts
        the wait short), SIGKILL the rest. Returns (stopped cleanly, killed)."""
        requests_before = self.stop_requests
        targets: list[tuple[Member, int, bool]] = []  # member, pid, is our child
        for m in self.members:
            if m.child_running:
                targets.append((m, m.pid, True))
            else:
                m.refresh()
                pid = m.adopted_pid
                if pid is not None:
                    targets.append((m, pid, False))
        for m, pid, _ in targets:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s

        def running(entry) -> bool:
            m, pid, child = entry
            if child:
                return m.poll() is None
            from media.counters import pid_alive

            return pid_alive(pid)

        while any(running(t) for t in targets):
            left = deadline - time.monotonic()
            if left <= 0 or self.stop_requests > requests_before:
                break
            self.wait(min(0.05, left))
        killed = 0
        for entry in targets:
            if running(entry):
                m, pid, child = entry
                killed += 1
                self.event(f"member {m.member_id} did not stop within {timeout_s:g}s: SIGKILL")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if child:
                    try:
                        m.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    m.poll()
        return len(targets) - killed, killed


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def _members_from(paths: list[Path]) -> list[Member]:
    members = []
    ids = set()
    configs = _load_all(paths)
    first = configs[0]
    for cfg, path in zip(configs, paths):
        if cfg.cluster.members != first.cluster.members:
            raise click.ClickException(f"{path}: cluster.members differ from those of {paths[0]}: not one cluster")
        if cfg.member_id in ids:
            raise click.ClickException(f"{path}: member {cfg.member_id} appears in two configs")
        ids.add(cfg.member_id)
        members.append(Member(cfg.member_id, path, cfg.node_dir, cfg.driver_dir / "counters.dat", cfg.log_file))
    missing = {m.id for m in first.cluster.members} - ids
    if missing:
        raise click.ClickException(f"no config for member(s) {sorted(missing)} of the cluster in {paths[0].parent}")
    _check_ports(configs)
    return sorted(members, key=lambda m: m.member_id)


class _Screen:
    """Redraws the table in place on a terminal (cursor home, each line cleared to its end)."""

    def __init__(self) -> None:
        self.drawn = False

    def draw(self, lines: list[str]) -> None:
        out = ["\x1b[H\x1b[2J" if not self.drawn else "\x1b[H"]
        out += [line + "\x1b[K\n" for line in lines]
        out.append("\x1b[J")
        sys.stdout.write("".join(out))
        sys.stdout.flush()
        self.drawn = True


@click.command("up")
@click.option("--nodes", type=int, default=None, help="Number of members (default 3; generated configs only).")
@click.option("--dir", "base_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("var/cluster"),
              show_default=True, help="Cluster directory: generated configs and node<N>/ directories.")
@click.option("--service", default=None, help="echo, kv (default) or package.module:ClassName (generated configs).")
@click.option("--config-dir", type=click.Path(path_type=Path), default=None,
              help="Start the node<N>.toml configs of DIR (e.g. configs/) instead of generating them.")
@click.option("--fresh", is_flag=True, help="Remove the configs and node directories of --dir first (new ports, empty state).")
@click.option("--no-pin", is_flag=True,
              help="Generated configs leave the members' CPUs to the OS (default: the leader gets a CPU of its own, "
                   "the followers the others; see leader_cpus in cluster_node/config.py).")
@click.option("--keep-cpus-awake", is_flag=True,
              help="Generated configs keep the members' CPUs out of the idle state while the log moves: lower "
                   "latency on virtual machines, for CPU while traffic flows (see keep_cpus_awake in "
                   "cluster_node/config.py).")
@click.option("--once", is_flag=True,
              help="For scripts: print the table once a leader is elected, then a line UP leader=... client=..., "
                   "then only event lines; keep running until SIGTERM/SIGINT.")
@click.option("--start-timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds for every member to start.")
@click.option("--leader-timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="With --once: seconds for a leader to be elected before giving up.")
@click.option("--stop-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds a member has to stop after SIGTERM before it is killed.")
def up(nodes: int | None, base_dir: Path, service: str | None, config_dir: Path | None, fresh: bool, no_pin: bool,
       keep_cpus_awake: bool, once: bool, start_timeout: float, leader_timeout: float, stop_timeout: float) -> None:
    """Start a local cluster (one process per member), show its members live, stop it on Ctrl-C."""
    os.umask(0o077)  # the members' consoles and directories are the user's alone, as the nodes' files
    plan = plan_cluster(nodes, base_dir, service, config_dir, fresh, pin=not no_pin, keep_cpus_awake=keep_cpus_awake)
    members = _members_from(plan.node_config_paths)
    interactive = sys.stdout.isatty() and not once
    client_path = plan.client_config_path.resolve() if plan.client_config_path is not None else None

    def echo(line: str) -> None:
        # A reader that goes away (``up --once | head``) must not take the cluster down: the
        # members keep running until a signal, only the output stops.
        try:
            click.echo(line)
        except (BrokenPipeError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

    sup = Supervisor(members, echo)
    screen = _Screen() if interactive else None
    if not interactive:
        sup.on_event = echo
    origin = "generated in" if plan.generated else "from"
    header = f"cluster of {len(members)} ({plan.service} service), configs {origin} {plan.node_config_paths[0].parent}"
    sup.install_signals()
    exit_code = 0
    try:
        if not interactive:
            echo(header)
        next_draw = 0.0

        def draw_start() -> None:
            nonlocal next_draw
            if screen is not None and time.monotonic() >= next_draw:
                sup.refresh()
                screen.draw(_screen_lines(header, members, sup, client_path, None))
                next_draw = time.monotonic() + _REFRESH_S

        sup.start_all(start_timeout, tick=draw_start)
        leader: tuple[int, int] | None = None
        announced = False
        leader_deadline = time.monotonic() + leader_timeout
        while not sup.stop_requests:
            sup.refresh()
            now_leader = leader_of(members)
            if now_leader is not None and now_leader != leader:
                sup.event(f"leader: member {now_leader[0]}, term {now_leader[1]}")
                if not interactive and (not once or not announced):
                    for line in render_table(members):
                        echo(line)
                if not announced:
                    announced = True
                    echo_line = (f"UP leader={now_leader[0]} term={now_leader[1]} members={len(members)}"
                                 f" client={client_path if client_path else '-'}")
                    if not interactive:
                        echo(echo_line)
            leader = now_leader if now_leader is not None else leader
            shown_leader = now_leader
            if once and not announced and time.monotonic() > leader_deadline:
                sup.event(f"no leader elected within {leader_timeout:g}s")
                raise click.ClickException(f"no leader elected within {leader_timeout:g}s; node logs in "
                                           + ", ".join(str(m.log_file) for m in members))
            if screen is not None and time.monotonic() >= next_draw:
                screen.draw(_screen_lines(header, members, sup, client_path, shown_leader))
                next_draw = time.monotonic() + _REFRESH_S
            if all(m.exit_code == 0 for m in members) and not any(m.running_pid for m in members):
                # `cluster-node tool shutdown` or `abort`: every member stopped in order.
                sup.event("every member stopped (cluster shutdown or abort): up ends")
                break
            sup.wait(_REFRESH_S)
    except click.ClickException:
        exit_code = 1
        raise
    finally:
        try:
            if screen is not None and screen.drawn:
                sup.refresh()
                screen.draw(_screen_lines(header, members, sup, client_path, None, stopping=True))
                sup.on_event = echo
            stopped, killed = sup.stop_all(stop_timeout)
            codes = ",".join("-" if m.exit_code is None else str(m.exit_code) for m in members)
            if exit_code == 0:
                echo(f"STOPPED clean={stopped} killed={killed} exit_codes={codes}")
        finally:
            sup.restore_signals()
    if killed:
        raise click.ClickException(f"{killed} member(s) did not stop within {stop_timeout:g}s and were killed")


def _screen_lines(header: str, members: list[Member], sup: Supervisor, client_path: Path | None,
                  leader: tuple[int, int] | None, stopping: bool = False) -> list[str]:
    now = time.strftime("%H:%M:%S")
    lead = f"leader: member {leader[0]}, term {leader[1]}" if leader else "leader: none"
    lines = [f"{header}    {now}", lead, ""]
    lines += render_table(members)
    lines.append("")
    lines += sup.events
    lines.append("")
    if stopping:
        lines.append("stopping the members (SIGTERM; Ctrl-C again to kill at once) ...")
    else:
        if client_path is not None:
            lines.append(f"client:  cluster-node client --config {client_path} put k v | get k")
        down = [m for m in members if m.running_pid is None and m.proc is not None]
        if down:
            lines.append(f"restart: cluster-node run --config {down[0].config_path}")
        lines.append("Ctrl-C stops the cluster.")
    return lines
