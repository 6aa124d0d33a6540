"""``python -m cluster_node.cli``: the ``cluster-node`` command, as a member started by ``up`` runs it."""

from cluster_node.cli import main

main()
