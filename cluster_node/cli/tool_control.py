"""``cluster-node tool`` cluster control commands, on the leader of a running cluster: ``suspend``,
``resume``, ``snapshot``, ``shutdown``, ``abort``. The ClusterControl protocol they speak is
``cluster_node.cluster_control``; a refusal there is the command's one line and exit 1."""

from __future__ import annotations

import click

from cluster_node import cluster_control
from cluster_node.cli.tool import _node, tool
from cluster_node.cluster_control import (
    SNAPSHOT_TIMEOUT_S,
    STATE_ACTIVE,
    STATE_SUSPENDED,
    TERMINATE_TIMEOUT_S,
    TOGGLE_ABORT,
    TOGGLE_RESUME,
    TOGGLE_SHUTDOWN,
    TOGGLE_SUSPEND,
)

__all__ = ["suspend", "resume", "snapshot", "shutdown", "abort"]


@tool.command()
@click.pass_context
def suspend(ctx: click.Context) -> None:
    """Leader only, state ACTIVE: stop taking client messages (they wait until resume)."""
    click.echo(cluster_control.toggle(_node(ctx), "suspend", TOGGLE_SUSPEND, STATE_ACTIVE, STATE_SUSPENDED))


@tool.command()
@click.pass_context
def resume(ctx: click.Context) -> None:
    """Leader only, state SUSPENDED: take client messages again."""
    click.echo(cluster_control.toggle(_node(ctx), "resume", TOGGLE_RESUME, STATE_SUSPENDED, STATE_ACTIVE))


@tool.command()
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=SNAPSHOT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the leader's snapshot set.",
)
@click.pass_context
def snapshot(ctx: click.Context, timeout_s: float) -> None:
    """Leader only, state ACTIVE: every member takes a snapshot at the same log position.

    Succeeds once a new snapshot set is in the leader's recording.log; fails when the leader
    finished without one (a service snapshot failed: see `tool errors`)."""
    for line in cluster_control.take_snapshot(_node(ctx), timeout_s):
        click.echo(line)


_WAIT_OPTION = click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait until the node's process has exited."
)
_TIMEOUT_OPTION = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=TERMINATE_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the request to be taken and the process to exit.",
)


@tool.command()
@_WAIT_OPTION
@_TIMEOUT_OPTION
@click.pass_context
def shutdown(ctx: click.Context, wait: bool, timeout_s: float) -> None:
    """Leader only: snapshot, then every member stops at the same log position.

    Taken in state ACTIVE or SUSPENDED; while a snapshot is under way, once it has ended."""
    cluster_control.terminate(_node(ctx), "shutdown", TOGGLE_SHUTDOWN, wait, timeout_s, click.echo)


@tool.command()
@_WAIT_OPTION
@_TIMEOUT_OPTION
@click.pass_context
def abort(ctx: click.Context, wait: bool, timeout_s: float) -> None:
    """Leader only: every member stops at the same log position, without a snapshot.

    Taken in state ACTIVE, SUSPENDED or SNAPSHOT (a snapshot under way is abandoned)."""
    cluster_control.terminate(_node(ctx), "abort", TOGGLE_ABORT, wait, timeout_s, click.echo)
