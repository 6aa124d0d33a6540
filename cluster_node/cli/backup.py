"""``cluster-node backup --config backup.toml``: keep a copy of a running cluster."""

from __future__ import annotations

import sys

import click
import trio

from cluster_node.config import load_backup_config


@click.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The backup's TOML config: [backup] dir and host, the cluster's [cluster] members (docs/configuration.md).",
)
@click.option(
    "--log-mode",
    type=click.Choice(["json", "console"]),
    default=None,
    help="Override [logging] mode: json lines to the backup's log file, or console to stderr.",
)
def backup(config_path: str, log_mode: str | None) -> None:
    """Copy a cluster's latest snapshots and follow its committed log into a directory a member
    can be started from, until SIGTERM/SIGINT. Its state and live log position are counters:
    ``cluster-node stat --dir <backup dir>`` (docs/operations.md, "Backup and restore")."""
    from cluster_node.backup_node import run_backup
    from cluster_node.cli.run import _find, _internal_error, _node_failure, _operator_error, _start_process
    from cluster_node.exit_codes import NodeFailure
    from cluster_node.node import NodeStartError

    cfg = _start_process(load_backup_config, config_path, log_mode)
    try:
        trio.run(run_backup, cfg)
    except KeyboardInterrupt:
        sys.exit(130)
    except NodeFailure as e:
        _node_failure(e)
    except BaseExceptionGroup as group:
        failure = _find(group, NodeFailure)
        if failure is not None:
            _node_failure(failure)  # (the cluster refused the backup's credentials)
        leaf = _operator_error(group)
        if leaf is None:
            _internal_error(group)
        raise click.ClickException(str(leaf)) from None
    except OSError as e:
        raise click.ClickException(f"cannot run the backup: {e.strerror or e}") from None
    except NodeStartError as e:  # (a key file that cannot be used)
        raise click.ClickException(str(e)) from None
    except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback, one line here
        _internal_error(e)
