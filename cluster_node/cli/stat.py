"""``cluster-node stat``: print a node's counters, once or continuously.

It only maps the driver's counters file read-only, so it works on a live node without disturbing
it, and on a dead node's directory (showing the last values and that the owner is gone).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import click

from cluster_node.cli.signals import stop_on_signals
from cluster_node.consensus.node_files import MarkFileError, read_mark_file
from cluster_node.driver_dir import default_driver_dir
from cluster_node.media.counters import COUNTERS_FILE_NAME, CounterInfo, CountersError, CountersReader, CounterType


def find_counters_file(directory: Path) -> Path:
    """``DIR/counters.dat`` (a driver directory), or, for a node directory, the counters file of
    the driver directory its mark file names (by default one under /dev/shm, see
    ``cluster_node.driver_dir``), else of the default driver directory, else ``DIR/driver``."""
    if not directory.exists():
        raise click.ClickException(f"no such directory: {directory}")
    if not directory.is_dir():
        raise click.ClickException(f"not a directory: {directory}")
    candidates = [directory / COUNTERS_FILE_NAME]
    try:
        mark = read_mark_file(directory)
    except MarkFileError:
        mark = None
    if mark is not None and mark.driver_dir is not None:
        candidates.append(mark.driver_dir / COUNTERS_FILE_NAME)
    candidates += [default_driver_dir(directory) / COUNTERS_FILE_NAME, directory / "driver" / COUNTERS_FILE_NAME]
    candidates = list(dict.fromkeys(candidates))
    for path in candidates:
        if path.is_file():
            return path
    raise click.ClickException(f"no counters file in {directory} (looked for {', '.join(map(str, candidates))})")


def parse_type(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A type given by name (``sender_position``) or number (``2``)."""
    if value is None:
        return None
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        return CounterType[value.upper()]
    except KeyError:
        names = ", ".join(t.name for t in CounterType)
        raise click.BadParameter(f"unknown type {value!r}; use a number or one of {names}") from None


def type_name(type_id: int) -> str:
    try:
        return CounterType(type_id).name
    except ValueError:
        return str(type_id)


def format_timestamp_ms(timestamp_ms: int) -> str:
    """Local time, or the raw number if a damaged header holds an impossible date."""
    try:
        return datetime.fromtimestamp(timestamp_ms / 1000).isoformat(sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{timestamp_ms} ms since epoch (invalid)"


def render(path: Path, type_id: int | None, label_filter: str | None) -> str:
    """One snapshot of the file as text. The file is reopened each time so a restarted driver shows."""
    try:
        with CountersReader.open(path) as reader:
            alive = "alive" if reader.owner_alive() else "not running"
            started = format_timestamp_ms(reader.start_timestamp_ms)
            rows: list[CounterInfo] = reader.find(type_id=type_id, label_contains=label_filter)
            owner_pid = reader.owner_pid
    except CountersError as e:
        raise click.ClickException(str(e)) from None
    lines = [f"{path}  owner pid {owner_pid} ({alive})  started {started}"]
    cells = [(str(c.counter_id), type_name(c.type_id), f"{c.value:,}", c.label) for c in rows]
    headings = ("ID", "TYPE", "VALUE", "LABEL")
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headings[:3])]
    for row in [headings, *cells]:
        lines.append(f"{row[0]:>{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}")
    return "\n".join(lines)


@click.command("stat")
@click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(path_type=Path),
    help="Driver directory, or node directory holding driver/.",
)
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True, help="Seconds between redraws."
)
@click.option("--type", "type_id", metavar="TYPE", callback=parse_type, help="Only this counter type (name or id).")
@click.option("--filter", "label_filter", metavar="TEXT", help="Only counters whose label contains TEXT.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: the file's owner, every counter, "
    "and the consensus counters by member (keys in docs/operations.md).",
)
@click.option(
    "--prometheus",
    is_flag=True,
    help="The counters in the Prometheus text format: printed once, or served at /metrics with --listen.",
)
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="With --prometheus: serve /metrics here until Ctrl-C (a separate process; the node is not touched).",
)
@click.option("--node-label", default="", metavar="NAME", help="With --prometheus: a node=NAME label on every sample.")
def stat(
    directory: Path,
    watch: bool,
    interval: float,
    type_id: int | None,
    label_filter: str | None,
    as_json: bool,
    prometheus: bool,
    listen: str | None,
    node_label: str,
) -> None:
    """Show the counters of a media driver (and of the cluster node using it)."""
    if listen is not None and not prometheus:
        raise click.UsageError("--listen needs --prometheus")
    if as_json and (prometheus or watch):
        raise click.UsageError("--json prints one object: not with --prometheus or --watch")
    path = find_counters_file(directory)
    if as_json:
        from cluster_node.metrics import counters_snapshot

        try:
            snapshot = counters_snapshot(path)
        except CountersError as e:
            raise click.ClickException(str(e)) from None
        snapshot["counters"] = [
            c
            for c in snapshot["counters"]
            if (type_id is None or c["type_id"] == type_id) and (label_filter is None or label_filter in c["label"])
        ]
        click.echo(json.dumps(snapshot, indent=2))
        return
    if prometheus:
        _prometheus(path, listen, node_label)
        return
    if not watch:
        click.echo(render(path, type_id, label_filter))
        return
    stop_on_signals()
    try:
        while True:
            text = render(path, type_id, label_filter)
            click.clear()
            click.echo(text)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends: exit 0, no traceback


def _prometheus(path: Path, listen: str | None, node_label: str) -> None:
    """Print the exposition once, or serve it until Ctrl-C (each scrape reads the file afresh)."""
    from cluster_node.metrics import parse_listen, prometheus_text, serve_prometheus

    if listen is None:
        click.echo(prometheus_text(path, node_label), nl=False)
        return
    try:
        host, port = parse_listen(listen)
        server = serve_prometheus(path, host, port, node_label)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"cannot listen on {listen}: {e.strerror or e}") from None
    stop_on_signals()
    bound_host, bound_port = server.server_address[:2]
    click.echo(
        f"serving the counters of {path} at http://{listen.rpartition(':')[0] or bound_host}:{bound_port}/metrics",
        err=True,
    )
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
