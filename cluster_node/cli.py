"""The ``cluster-node`` command line.

Every subcommand is real; subcommands are added as the parts behind them land. Operator mistakes
(bad paths, bad config) end with a one-line error and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import click

from cluster_node import __version__
from cluster_node.archive_cmd import archive
from cluster_node.backup_cmd import backup
from cluster_node.run_cmd import run
from cluster_node.pipeline_cmd import pipeline
from cluster_node.secret_cmd import secret
from cluster_node.stat_cmd import stat
from cluster_node.up_cmd import up
from cluster_node.client_cmd import client
from cluster_node.tool_cmd import tool
from cluster_node import retention_cmd  # noqa: F401 - adds purge-log and the recording.log tools to `tool`


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

if __name__ == "__main__":  # pragma: no cover
    main()
