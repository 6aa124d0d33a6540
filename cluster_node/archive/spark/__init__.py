"""Reading archived recordings as tables: the plain-Python reader and the PySpark data source.

This package knows the archive's files (catalog, segment files, data frames) and nothing of what
the frames carry. The layers:

``layout``      find archives on disk (a node directory or an archive directory, globs allowed),
                read their catalogs and cut every recording of the wanted streams into
                :class:`~cluster_node.archive.spark.layout.ReadTask` s: byte ranges of one segment file that start
                on a frame boundary (a transport term boundary, or the recording's start).
``frames``      turn one task's bytes into messages: the frame walk, checks, reassembly of
                fragmented messages and the frame hash, twice: row at a time (the reference, easy
                to read) and a batch at a time with numpy and pyarrow (what Spark runs).
``decoder``     the plug-in point for what the messages mean. :class:`MessageDecoder` adds columns
                decoded from each message; :class:`RawDecoder` adds none.
``reader``      the plain-Python reader: every row of a set of archives as tuples, single process.
``datasource``  the PySpark Python data source (imports pyspark; nothing else here does).

Why the decoder is a plug-in: ``archive`` may not import ``cluster_node`` (the layering rule), yet
the useful table is the *cluster log* with leadership terms, sessions and message types. So the
archive side owns the frames and the table's frame columns, and a decoder object supplied by the
caller owns the message columns. The cluster's decoder lives in ``cluster_node.pipeline`` and is
handed to the data source as an object (pickled to the Spark workers by its import path) or named
by the ``decoder`` option as ``"package.module:attribute"``. Nothing here names it.

pyspark, pyarrow and numpy are the ``spark`` extra: only ``datasource`` imports pyspark, and the
modules that need numpy/pyarrow import them at the top, so ``import cluster_node.archive.spark`` stays cheap.
"""
