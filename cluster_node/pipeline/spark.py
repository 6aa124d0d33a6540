"""Starting Spark for the pipeline: local by default, quiet, with the project's data sources.

Facts this relies on (measured on the project's machines):

* For a local master (``local``, ``local[N]``, ``local[*]``) ``SPARK_LOCAL_IP=127.0.0.1`` keeps the
  driver on loopback and ``PYSPARK_PYTHON`` is set to this interpreter, so Python workers run with
  the project's packages (the venv), which they import to decode. For any other master neither is
  set: remote executors have no such interpreter path, and the driver must be reachable; ship the
  package instead (``--py-files``, see docs/pipeline.md).
* Filter pushdown for Python data sources is switched on: the archive source implements
  ``pushFilters``, which Spark refuses to call with it off.
* The UI is off and Spark's own logging is cut to errors, and off for the executor's and the task
  scheduler's reports of a failed task (each a full Python stack trace, printed again when the
  job fails; the CLI reports the one line that matters); progress bars appear only when stderr is
  a terminal. ``--conf`` pairs from the command line override any of these.
* ``fast_start`` adds ``-XX:TieredStopAtLevel=1`` to the driver JVM: about a third less CPU to
  start, at the price of slower long jobs (C1 code only). Tests want it, benchmarks do not.
* Never ``spark.jars.packages``: there is no network for Ivy.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile

__all__ = ["DEFAULT_MASTER", "is_local_master", "local_environment", "register_sources", "session"]

DEFAULT_MASTER = "local[*]"

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
"""


_log4j_path: str | None = None


def _log4j_file() -> str:
    """Spark's logging config, in a file of this process's own: a fixed name in the shared temp
    directory could be made first by another user, and the JVM would load theirs."""
    global _log4j_path
    if _log4j_path is None:
        fd, path = tempfile.mkstemp(prefix="cluster-node-pipeline-", suffix="-log4j2.properties")
        with os.fdopen(fd, "w") as f:
            f.write(_LOG4J2)
        atexit.register(_remove, path)
        _log4j_path = path
    return _log4j_path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def register_sources(spark) -> None:
    """Make ``archive_frames`` and ``cluster_log`` known to ``spark.read.format``."""
    from cluster_node.archive.spark.datasource import ArchiveDataSource
    from cluster_node.pipeline.source import ClusterLogDataSource

    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(ArchiveDataSource)
    spark.dataSource.register(ClusterLogDataSource)


def is_local_master(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[")


def local_environment(master: str | None) -> dict[str, str]:
    """What :func:`session` puts in the environment (unless already set): for a local master this
    interpreter for the Python workers and loopback for the driver; for any other, nothing."""
    if not is_local_master(master):
        return {}
    return {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    *,
    app_name: str = "cluster-node pipeline",
    fast_start: bool = False,
    progress: bool | None = None,
):
    """A SparkSession (created, or the active one reconfigured) with the data sources registered."""
    for key, value in local_environment(master).items():
        os.environ.setdefault(key, value)
    from pyspark.sql import SparkSession

    if progress is None:
        progress = sys.stderr.isatty()
    java_options = f"-Dlog4j.configurationFile=file:{_log4j_file()}"
    if fast_start:
        java_options += " -XX:TieredStopAtLevel=1"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true" if progress else "false",
        "spark.sql.shuffle.partitions": str(max(2, 2 * (os.cpu_count() or 1))),
        "spark.driver.extraJavaOptions": java_options,
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.sql.python.filterPushdown.enabled": "true",
    }
    settings.update(conf or {})
    builder = SparkSession.builder.master(master or DEFAULT_MASTER).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark
