"""``cluster-node pipeline <job> ARCHIVE_DIRS... --out DIR``: audit, stats or export on Spark.

Exit status, as ``cmp`` has it: 0 done (audit: the committed logs agree), 1 the audit found a
divergence, 2 trouble (a path that is not an archive, a corrupt file, Spark missing or failing),
reported in one line. Progress goes to stderr, one line per stage (and Spark's progress bars when
stderr is a terminal); the result summary goes to stdout.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import click

__all__ = ["pipeline"]

_CORRUPT = re.compile(r"(corrupt (?:archive file|catalog) [^\n]*)")
_NOT_ARCHIVE = re.compile(r"((?:not an archive|no such directory|not a directory): [^\n]*)")


class PipelineError(click.ClickException):
    exit_code = 2


def _parse_conf(pairs: tuple[str, ...]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise PipelineError(f"--conf expects KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value
    return conf


def _spark_failure(e: BaseException) -> PipelineError:
    """One line for an exception that came back through Spark (the archive's own message if any)."""
    text = str(e)
    for pattern in (_CORRUPT, _NOT_ARCHIVE):
        match = pattern.search(text)
        if match:
            return PipelineError(match.group(1).strip())
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    return PipelineError(f"Spark job failed: {first[:300]}")


@click.command("pipeline")
@click.argument("job", type=click.Choice(["audit", "stats", "export"]))
@click.argument("archive_dirs", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the results (created if missing).")
@click.option("--master", default=None, metavar="URL", help="Spark master (default local[*]).")
@click.option("--conf", "conf_pairs", multiple=True, metavar="KEY=VALUE", help="Spark setting; repeatable.")
@click.option("--cluster-size", type=click.IntRange(min=1), default=None,
              help="Members in the cluster, for the majority (default: the number of archives given).")
def pipeline(job: str, archive_dirs: tuple[str, ...], out_dir: Path, master: str | None,
             conf_pairs: tuple[str, ...], cluster_size: int | None) -> None:
    """Audit, analyse or export the archived logs of nodes (node or archive directories, globs allowed).

    \b
    audit   do the committed logs agree? first divergence per node pair; exit 1 if not
    stats   messages/bytes per second per term and session, session lifecycles, elections;
            Parquet tables, report.md/report.html with PNG plots
    export  the decoded log of every node as Parquet (log.parquet/node=...)
    """
    from archive.spark.layout import ArchiveNotFoundError, expand_paths, find_archive

    started = time.monotonic()

    def progress(text: str) -> None:
        click.echo(f"[{time.monotonic() - started:6.1f}s] {text}", err=True)

    conf = _parse_conf(conf_pairs)
    paths = expand_paths(list(archive_dirs))
    try:
        locations = [find_archive(p) for p in paths]
    except ArchiveNotFoundError as e:
        raise PipelineError(str(e)) from None
    if cluster_size is not None and cluster_size < len(locations):
        raise PipelineError(f"--cluster-size {cluster_size} is smaller than the {len(locations)} archives given")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise PipelineError("pyspark is not installed: pip install -e '.[spark]'") from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PipelineError(f"cannot create {out_dir}: {e.strerror}") from None

    from cluster_node.pipeline import jobs, report
    from cluster_node.pipeline.spark import DEFAULT_MASTER, session

    progress(f"starting Spark ({master or DEFAULT_MASTER}) for {job} of {len(locations)} archives: "
             + ", ".join(loc.node for loc in locations))
    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # embedded callers (tests) keep their session
    try:
        spark = session(master, conf)
    except Exception as e:  # no Java, a bad master URL, a bad setting
        raise _spark_failure(e) from None
    try:
        df = jobs.load_log(spark, paths)
        if job == "audit":
            progress("auditing the committed logs")
            result = jobs.audit(spark, df, cluster_size)
            files = report.write_audit_report(result, str(out_dir))
            click.echo(report.audit_markdown(result), nl=False)
        elif job == "stats":
            progress("computing statistics")
            stats_result = jobs.stats(spark, df, cluster_size, str(out_dir))
            progress("writing the report")
            files = report.write_stats_report(stats_result, str(out_dir))
            click.echo(f"{stats_result.messages} messages in the committed log of {stats_result.node}, "
                       f"{len(stats_result.terms)} leadership terms, {len(stats_result.sessions)} sessions")
            result = None
        else:
            progress("exporting the decoded log")
            files = [jobs.export(df, str(out_dir))]
            result = None
    except click.ClickException:
        raise
    except Exception as e:
        raise _spark_failure(e) from None
    finally:
        if owned:
            spark.stop()
    progress("wrote " + ", ".join(str(f) for f in files))
    if result is not None and not result.agreed:
        sys.exit(1)
