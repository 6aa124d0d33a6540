"""The data pipeline over the nodes' archived logs: the cluster log table, audit, stats, export.

Where the cut between ``cluster_node.archive.spark`` and this package lies, and why:

* ``cluster_node.archive.spark`` reads archives: catalogs, segment files, frames, fragments, the frame hash,
  the PySpark data source. It knows nothing of the cluster (the archive layer may not
  import the layers above it), so what a message *means* is a plug-in (``cluster_node.archive.spark.decoder``).
* Here: :class:`~cluster_node.pipeline.decoder.ClusterLogDecoder` (leadership terms, sessions,
  message types, from ``cluster_node.codecs``), the ``cluster_log`` data source (the archive data
  source with this decoder and the log stream preset), the Spark session set-up, and the jobs
  (``audit``, ``stats``, ``export``) with their report, run by ``cluster-node pipeline``.

Nothing here imports pyspark at module level except ``spark``/``jobs``/``source``; the decoder is
usable (and tested) without Spark, by the plain-Python reader.
"""
