"""Fixtures of the pipeline tests: one SparkSession for the whole run, and synthetic archives.

Starting Spark costs 6-12 s of two cores (more on a loaded machine), so the session is created
once, lazily, by the first test that asks for it, and shared: local[2], UI off, two shuffle
partitions, C1-only JIT for a cheaper start. Tests that need no Spark do not start it. Without
pyspark or Java the Spark tests are skipped, with the reason.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.synthetic_archive import build_log, write_cluster


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None and not __import__("os").environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (Spark needs Java 17+)")
    from cluster_node.pipeline.spark import session

    spark = session(
        "local[2]",
        {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        app_name="pipeline-tests",
        fast_start=True,
        progress=False,
    )
    yield spark
    spark.stop()


@pytest.fixture(scope="session")
def synthetic_log():
    return build_log(seed=11, terms=3, messages_per_term=250)


@pytest.fixture(scope="session")
def agreeing_cluster(tmp_path_factory, synthetic_log):
    return write_cluster(tmp_path_factory.mktemp("agree"), synthetic_log)


@pytest.fixture(scope="session")
def diverging_cluster(tmp_path_factory, synthetic_log):
    """Node 2 has one byte of a term-1 session message changed; node 0 stops early in term 2."""
    log = synthetic_log
    entry = [
        e
        for e in log.entries
        if e.leadership_term_id == 1 and e.message_type == "SessionMessage" and e.fragments == 1 and len(e.message) > 60
    ][3]
    return write_cluster(
        tmp_path_factory.mktemp("diverge"),
        log,
        diverge=(2, log.payload_byte_position(entry, 50)),
        cut_short={0: log.terms[2].base_position + 4000},
    )
