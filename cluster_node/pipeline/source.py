"""The ``cluster_log`` data source: the archive data source reading stream 100 with the cluster
log decoder, so that ``spark.read.format("cluster_log").load(node_dirs)`` gives the decoded log."""

from __future__ import annotations

from cluster_node.archive.spark.datasource import ArchiveDataSource
from cluster_node.identifiers import StreamIds
from cluster_node.pipeline.decoder import ClusterLogDecoder

__all__ = ["LOG_STREAM_ID", "ClusterLogDataSource"]

LOG_STREAM_ID = StreamIds.LOG


class ClusterLogDataSource(ArchiveDataSource):
    default_decoder = ClusterLogDecoder()
    default_stream_ids = frozenset({LOG_STREAM_ID})

    @classmethod
    def name(cls) -> str:
        return "cluster_log"
