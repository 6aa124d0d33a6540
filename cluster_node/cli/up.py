"""``cluster-node up``: a local cluster in one command, with a live table of its members.

It is a supervisor, not a node: every member is its own ``cluster-node run`` process (exactly
what an operator would start by hand), so killing one with ``kill -9`` is a real crash and the
others really elect a new leader. ``up`` only

1. decides the configs: generated into ``--dir`` with a block of free ports below the kernel's
   ephemeral range (:func:`cluster_node.ports.pick_base_port`), kept there so that a second ``up`` on the same
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

import os
import sys
import time
from pathlib import Path

import click

from cluster_node.cluster_table import Screen, leader_of, render_table, screen_lines
from cluster_node.local_cluster import LocalClusterError, Supervisor
from cluster_node.local_cluster_configs import members_from, plan_cluster

__all__ = ["up"]

_REFRESH_S = 0.5


@click.command("up")
@click.option("--nodes", type=int, default=None, help="Number of members (default 3; generated configs only).")
@click.option(
    "--dir",
    "base_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("var/cluster"),
    show_default=True,
    help="Cluster directory: generated configs and node<N>/ directories.",
)
@click.option("--service", default=None, help="echo, kv (default) or package.module:ClassName (generated configs).")
@click.option(
    "--config-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Start the node<N>.toml configs of DIR (e.g. configs/) instead of generating them.",
)
@click.option(
    "--fresh", is_flag=True, help="Remove the configs and node directories of --dir first (new ports, empty state)."
)
@click.option(
    "--no-pin",
    is_flag=True,
    help="Generated configs leave the members' CPUs to the OS (default: the leader gets a CPU of its own, "
    "the followers the others; see leader_cpus in cluster_node/config.py).",
)
@click.option(
    "--keep-cpus-awake",
    is_flag=True,
    help="Generated configs keep the members' CPUs out of the idle state while the log moves: lower "
    "latency on virtual machines, for CPU while traffic flows (see keep_cpus_awake in "
    "cluster_node/config.py).",
)
@click.option(
    "--once",
    is_flag=True,
    help="For scripts: print the table once a leader is elected, then a line UP leader=... client=..., "
    "then only event lines; keep running until SIGTERM/SIGINT.",
)
@click.option(
    "--start-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds for every member to start.",
)
@click.option(
    "--leader-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="With --once: seconds for a leader to be elected before giving up.",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds a member has to stop after SIGTERM before it is killed.",
)
def up(
    nodes: int | None,
    base_dir: Path,
    service: str | None,
    config_dir: Path | None,
    fresh: bool,
    no_pin: bool,
    keep_cpus_awake: bool,
    once: bool,
    start_timeout: float,
    leader_timeout: float,
    stop_timeout: float,
) -> None:
    """Start a local cluster (one process per member), show its members live, stop it on Ctrl-C."""
    try:
        _up(
            nodes,
            base_dir,
            service,
            config_dir,
            fresh,
            no_pin,
            keep_cpus_awake,
            once,
            start_timeout,
            leader_timeout,
            stop_timeout,
        )
    except LocalClusterError as e:
        raise click.ClickException(str(e)) from None


def _up(
    nodes: int | None,
    base_dir: Path,
    service: str | None,
    config_dir: Path | None,
    fresh: bool,
    no_pin: bool,
    keep_cpus_awake: bool,
    once: bool,
    start_timeout: float,
    leader_timeout: float,
    stop_timeout: float,
) -> None:
    os.umask(0o077)  # the members' consoles and directories are the user's alone, as the nodes' files
    plan = plan_cluster(nodes, base_dir, service, config_dir, fresh, pin=not no_pin, keep_cpus_awake=keep_cpus_awake)
    members = members_from(plan.node_config_paths)
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
    screen = Screen() if interactive else None
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
                screen.draw(screen_lines(header, members, sup, client_path, None))
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
                    echo_line = (
                        f"UP leader={now_leader[0]} term={now_leader[1]} members={len(members)}"
                        f" client={client_path if client_path else '-'}"
                    )
                    if not interactive:
                        echo(echo_line)
            leader = now_leader if now_leader is not None else leader
            shown_leader = now_leader
            if once and not announced and time.monotonic() > leader_deadline:
                sup.event(f"no leader elected within {leader_timeout:g}s")
                raise click.ClickException(
                    f"no leader elected within {leader_timeout:g}s; node logs in "
                    + ", ".join(str(m.log_file) for m in members)
                )
            if screen is not None and time.monotonic() >= next_draw:
                screen.draw(screen_lines(header, members, sup, client_path, shown_leader))
                next_draw = time.monotonic() + _REFRESH_S
            if all(m.exit_code == 0 for m in members) and not any(m.running_pid for m in members):
                # `cluster-node tool shutdown` or `abort`: every member stopped in order.
                sup.event("every member stopped (cluster shutdown or abort): up ends")
                break
            sup.wait(_REFRESH_S)
    except (click.ClickException, LocalClusterError):
        exit_code = 1
        raise
    finally:
        try:
            if screen is not None and screen.drawn:
                sup.refresh()
                screen.draw(screen_lines(header, members, sup, client_path, None, stopping=True))
                sup.on_event = echo
            stopped, killed = sup.stop_all(stop_timeout)
            codes = ",".join("-" if m.exit_code is None else str(m.exit_code) for m in members)
            if exit_code == 0:
                echo(f"STOPPED clean={stopped} killed={killed} exit_codes={codes}")
        finally:
            sup.restore_signals()
    if killed:
        raise click.ClickException(f"{killed} member(s) {sup.kill_reason} and were killed")
