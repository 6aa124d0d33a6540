"""``cluster-node run --config node.toml``: one cluster member in this process."""

from __future__ import annotations

import sys

import click
import trio

from cluster_node.config import ConfigError, load_node_config


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The member's TOML config (see configs/node0.toml).")
@click.option("--log-mode", type=click.Choice(["json", "console"]), default=None,
              help="Override [logging] mode: json lines to the node's log file, or console to stderr.")
def run(config_path: str, log_mode: str | None) -> None:
    """Run one cluster member until SIGTERM/SIGINT (graceful) or kill -9 (a crash it survives)."""
    from cluster_node import logsetup
    from cluster_node.node import NodeStartError, run_node
    from cluster_node.service.api import ServiceLoadError

    try:
        cfg = load_node_config(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    mode = log_mode or cfg.logging.mode
    if mode == "json":
        logsetup.configure("json", cfg.logging.level, cfg.log_file)
    else:
        logsetup.configure("console", cfg.logging.level)
    try:
        trio.run(run_node, cfg)
    except (NodeStartError, ServiceLoadError) as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseExceptionGroup as group:
        # Start-up failures that are the operator's to fix (a port in use, a bad channel, a
        # directory that cannot be written) come wrapped by the task groups: one line for them.
        leaf = _operator_error(group)
        if leaf is None:
            raise
        raise click.ClickException(str(leaf)) from None


def _operator_error(group: BaseExceptionGroup) -> BaseException | None:
    from media.channel import ChannelError

    wanted = (ChannelError, PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            found = _operator_error(e)
            if found is not None:
                return found
        elif isinstance(e, wanted):
            return e
    return None
