"""``cluster-node pipeline <job> ARCHIVES... --out DIR|URI``: audit, stats or export on Spark.

Exit status, as ``cmp`` has it: 0 done (audit: the committed logs agree), 1 the audit found a
divergence or an unreadable archive (a finding, named in the report), 2 trouble (a path that is
not an archive, two archives of one member, a corrupt file during stats or export, Spark missing or
failing), reported in one line. Progress goes to stderr, one line per stage (and Spark's progress bars when
stderr is a terminal); the result summary goes to stdout.
"""

from __future__ import annotations

import re
import sys
import time

import click

from cluster_node.identifiers import StreamIds

__all__ = ["pipeline"]

_CORRUPT = re.compile(r"(corrupt (?:archive file|catalog) [^\n]*)")
_NOT_ARCHIVE = re.compile(
    r"((?:not an archive|no such directory|not a directory|no recordings of [^\n]* in"
    r"|two archives (?:are named|claim)|unknown option|option \w+ must)[: ][^\n]*)"
)


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


def _plan_each(locations, decoder):
    """Per archive: None if its recordings can be planned, else the one-line reason (the audit
    reports such a node as a finding instead of failing)."""
    from cluster_node.archive.spark.layout import ArchiveCorruptError, ArchiveNotFoundError, plan_tasks

    reasons = {}
    for loc in locations:
        try:
            plan_tasks([loc], stream_ids=frozenset({StreamIds.LOG}), decoder=decoder)
        except (ArchiveCorruptError, ArchiveNotFoundError, OSError) as e:
            reasons[loc.node] = str(e).splitlines()[0]
    return reasons


@click.command("pipeline")
@click.argument("job", type=click.Choice(["audit", "stats", "export"]))
@click.argument("inputs", nargs=-1, required=True, metavar="ARCHIVES...")
@click.option(
    "--out",
    "out",
    required=True,
    metavar="DIR|URI",
    help="Where the results go: a directory or a pyarrow filesystem URI (file:///..., s3://...).",
)
@click.option("--master", default=None, metavar="URL", help="Spark master (default local[*]).")
@click.option("--conf", "conf_pairs", multiple=True, metavar="KEY=VALUE", help="Spark setting; repeatable.")
@click.option(
    "--cluster-size",
    type=click.IntRange(min=1),
    default=None,
    help="Members in the cluster, for the majority (default: the number of archives given).",
)
@click.option(
    "--incremental", is_flag=True, help="export: append only what lies past the high-water marks kept in OUT."
)
@click.option(
    "--local",
    "local",
    is_flag=True,
    help="export: read with the plain batch reader and write with pyarrow, in this process (no Spark).",
)
@click.option(
    "--from-parquet", is_flag=True, help="audit/stats: the inputs are export outputs (Parquet), not archives."
)
def pipeline(
    job: str,
    inputs: tuple[str, ...],
    out: str,
    master: str | None,
    conf_pairs: tuple[str, ...],
    cluster_size: int | None,
    incremental: bool,
    local: bool,
    from_parquet: bool,
) -> None:
    """Audit, analyse or export the archived logs of nodes (node or archive directories or URIs,
    globs allowed), or audit/analyse exported Parquet (--from-parquet).

    \b
    audit   do the committed logs agree? first divergence per node pair, the member that
            disagrees with the majority, unreadable archives; exit 1 if not
    stats   messages/bytes per second per term and session, session lifecycles, elections;
            Parquet tables, report.md/report.html with PNG plots
    export  the decoded log as Parquet (log.parquet/cluster_id=/member_id=/date=), staged and
            moved into place, replacing only the partitions written; --incremental, --local
    """
    from cluster_node.archive.spark.layout import ArchiveNotFoundError, DuplicateMemberError, expand_paths

    started = time.monotonic()

    def progress(text: str) -> None:
        click.echo(f"[{time.monotonic() - started:6.1f}s] {text}", err=True)

    if (incremental or local) and job != "export":
        raise PipelineError("--incremental and --local are options of export")
    if from_parquet and job == "export":
        raise PipelineError("--from-parquet is for audit and stats (export reads archives)")
    conf = _parse_conf(conf_pairs)
    paths = expand_paths(list(inputs))
    locations = []
    if not from_parquet:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise PipelineError("pyarrow is not installed: pip install -e '.[spark]'") from None
        from cluster_node.archive.spark.reader import locate
        from cluster_node.pipeline.decoder import ClusterLogDecoder

        try:
            locations = locate(paths, ClusterLogDecoder())
        except (ArchiveNotFoundError, DuplicateMemberError) as e:
            raise PipelineError(str(e)) from None
        if cluster_size is not None and cluster_size < len(locations):
            raise PipelineError(f"--cluster-size {cluster_size} is smaller than the {len(locations)} archives given")
    if local:
        from cluster_node.archive.spark.layout import ArchiveCorruptError
        from cluster_node.pipeline.export import export_local

        progress(
            f"exporting {len(locations)} archives with the plain batch reader: "
            + ", ".join(loc.node for loc in locations)
        )
        try:
            exported = export_local(paths, out, incremental=incremental)
        except (ArchiveCorruptError, ArchiveNotFoundError, OSError, ValueError) as e:
            raise PipelineError(str(e).splitlines()[0]) from None
        click.echo(f"{exported.rows} rows written to {exported.path} ({len(exported.partitions)} partitions)")
        return
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise PipelineError("pyspark is not installed: pip install -e '.[spark]'") from None

    from cluster_node.pipeline import jobs, report
    from cluster_node.pipeline.spark import DEFAULT_MASTER, session

    unreadable = []
    read_paths = paths
    if job == "audit" and locations:
        from cluster_node.pipeline.decoder import ClusterLogDecoder

        reasons = _plan_each(locations, ClusterLogDecoder())
        unreadable = [
            jobs.CorruptNode(loc.node, loc.member_id, reasons[loc.node]) for loc in locations if loc.node in reasons
        ]
        read_paths = [p for p, loc in zip(paths, locations) if loc.node not in reasons]
        for c in unreadable:
            progress(f"{c.node}: {c.error}")
    names = ", ".join(loc.node for loc in locations) if locations else ", ".join(paths)
    progress(f"starting Spark ({master or DEFAULT_MASTER}) for {job} of {len(paths)} inputs: {names}")
    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # embedded callers (tests) keep their session
    try:
        spark = session(master, conf)
    except Exception as e:  # noqa: BLE001 - no Java, a bad master URL, a bad setting
        raise _spark_failure(e) from None
    result = None
    try:
        if job == "audit":
            progress("auditing the committed logs")
            if read_paths:
                df = jobs.load_log(spark, read_paths, mode="permissive", parquet=from_parquet)
                archives = {loc.node: loc.archive_dir for loc in locations}
                result = jobs.audit(spark, df, cluster_size or (len(locations) or None), archives, unreadable)
            else:
                result = jobs.AuditResult(
                    False, cluster_size or len(locations), 0, [], 0, 0, 0, corrupt_nodes=unreadable
                )
            files = report.write_audit_report(result, out)
            click.echo(report.audit_markdown(result), nl=False)
        elif job == "stats":
            progress("computing statistics")
            df = jobs.load_log(spark, paths, parquet=from_parquet)
            stats_result = jobs.stats(spark, df, cluster_size, out)
            progress("writing the report")
            files = report.write_stats_report(stats_result, out)
            click.echo(
                f"{stats_result.messages} messages in the committed log of {stats_result.node}, "
                f"{len(stats_result.terms)} leadership terms, {len(stats_result.sessions)} sessions"
            )
        else:
            progress("exporting the decoded log" + (" (incremental)" if incremental else ""))
            from cluster_node.pipeline.export import export_spark

            exported = export_spark(spark, paths, out, incremental=incremental, locations=locations)
            files = [exported.path]
            click.echo(f"{exported.rows} rows written to {exported.path} ({len(exported.partitions)} partitions)")
    except click.ClickException:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the job: one line and its exit code
        raise _spark_failure(e) from None
    finally:
        if owned:
            spark.stop()
    progress("wrote " + ", ".join(str(f) for f in files))
    if result is not None and not result.agreed:
        sys.exit(1)
