"""The ``cluster-node`` command line.

Every subcommand is real; subcommands are added as the parts behind them land. Operator mistakes
(bad paths, bad config) end with a one-line error and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import click

from cluster_node import __version__

# These add their commands to `tool`: purge-log and the recording.log tools; cluster control; the
# offline edits and describe-latest-snapshot.
from cluster_node.cli import retention, tool_control, tool_offline  # noqa: F401
from cluster_node.cli.archive import archive
from cluster_node.cli.backup import backup
from cluster_node.cli.client import client
from cluster_node.cli.pipeline import pipeline
from cluster_node.cli.run import run
from cluster_node.cli.secret import secret
from cluster_node.cli.stat import stat
from cluster_node.cli.tool import tool
from cluster_node.cli.up import up


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cluster-node")
def main() -> None:
    """Run and operate a fault-tolerant replicated state machine cluster."""


main.add_command(run)
main.add_command(stat)
main.add_command(pipeline)
main.add_command(archive)
main.add_command(up)
main.add_command(client)
main.add_command(tool)
main.add_command(secret)
main.add_command(backup)
