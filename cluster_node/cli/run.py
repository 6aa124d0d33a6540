"""``cluster-node run --config node.toml``: one cluster member in this process."""

from __future__ import annotations

import os
import sys

import click
import trio

from cluster_node.config import ConfigError, load_node_config


@click.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The member's TOML config (see configs/node0.toml).",
)
@click.option(
    "--log-mode",
    type=click.Choice(["json", "console"]),
    default=None,
    help="Override [logging] mode: json lines to the node's log file, or console to stderr.",
)
def run(config_path: str, log_mode: str | None) -> None:
    """Run one cluster member until SIGTERM/SIGINT (graceful) or kill -9 (a crash it survives).

    Exits 0 only when asked to stop (a signal, a cluster SHUTDOWN or ABORT) and stopped; every
    failure has its own exit code and one line on stderr (cluster_node/exit_codes.py,
    docs/operations.md)."""
    from cluster_node.exit_codes import NodeFailure
    from cluster_node.node import NodeStartError, run_node
    from cluster_node.service.api import ServiceLoadError

    cfg = _start_process(load_node_config, config_path, log_mode)
    try:
        trio.run(run_node, cfg)
    except (NodeStartError, ServiceLoadError) as e:
        raise click.ClickException(str(e)) from None
    except NodeFailure as e:
        _node_failure(e)
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseExceptionGroup as group:
        failure = _find(group, NodeFailure)
        if failure is not None:
            _node_failure(failure)
        # Start-up failures that are the operator's to fix (a port in use, a bad channel, a
        # directory that cannot be written) come wrapped by the task groups: one line for them.
        leaf = _operator_error(group)
        if leaf is None:
            _internal_error(group)
        raise click.ClickException(str(leaf)) from None
    except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback, one line here
        _internal_error(e)


def _start_process(load, config_path: str, log_mode: str | None):
    """What a long-running process (a member, a backup) does before it starts: its files private
    to its user, its config loaded (a bad one is one line), its logging set up; returns the
    config. ``load`` is the config loader of the process's kind."""
    # Every file the process makes is its user's alone, also those libraries make without a mode
    # (cluster_node.media.private_files sets explicit modes where the node creates files).
    os.umask(0o077)
    try:
        cfg = load(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    _configure_logging(cfg.logging, cfg.log_file, log_mode)
    return cfg


def _configure_logging(section, log_file, log_mode: str | None) -> None:
    """The ``[logging]`` table's setup (``--log-mode`` overrides its mode): json lines to the log
    file, or console lines to stderr."""
    from cluster_node import logsetup

    mode = log_mode or section.mode
    if mode == "json":
        logsetup.configure(
            "json", section.level, log_file, max_file_bytes=section.max_file_bytes, max_files=section.max_files
        )
    else:
        logsetup.configure("console", section.level)


def _node_failure(failure) -> None:
    """A failure with an exit code of its own (``NodeFailure``, e.g. a damaged file): its one line
    on stderr, as :func:`cluster_node.exit_codes.fail` writes it, and its code."""
    import structlog

    structlog.get_logger("node").error("node failed", exit_code=int(failure.code), reason=str(failure))
    click.echo(f"error: {failure} (exit code {int(failure.code)})", err=True)
    sys.exit(int(failure.code))


def _find(group: BaseExceptionGroup, kind: type) -> BaseException | None:
    for e in group.exceptions:
        found = _find(e, kind) if isinstance(e, BaseExceptionGroup) else (e if isinstance(e, kind) else None)
        if found is not None:
            return found
    return None


def _internal_error(error: BaseException) -> None:
    import structlog

    from cluster_node.exit_codes import ExitCode

    leaf = error
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    structlog.get_logger("node").error("node failed", error=repr(leaf), exc_info=error)
    click.echo(
        f"error: internal error: {type(leaf).__name__}: {leaf} (exit code {int(ExitCode.INTERNAL)}; "
        f"the node log has the traceback)",
        err=True,
    )
    sys.exit(int(ExitCode.INTERNAL))


def _operator_error(group: BaseExceptionGroup) -> BaseException | None:
    from cluster_node.media.channel import ChannelError

    wanted = (ChannelError, PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            found = _operator_error(e)
            if found is not None:
                return found
        elif isinstance(e, wanted):
            return e
    return None
