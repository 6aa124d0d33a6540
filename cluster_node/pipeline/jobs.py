"""The pipeline's jobs over the ``cluster_log`` table: audit, stats, export.

Audit: do the nodes hold the same committed log?
================================================
Each node *holds* its log up to the end of its last complete message (``held``). A position is
*committed* once a majority of the cluster holds it, so the committed position is the
majority-th highest ``held`` (with 3 nodes: the second highest), and node n's committed length is
``min(held_n, committed)``. The audit takes, on every node, the messages starting below that
node's committed length and checks, for every position, that each node that should hold it (its
committed length is beyond the position) has a message starting there with the same frame hash
and length (the frame hash leaves out the frame headers' transport session id, which each node
picks for its own copy of the log: see ``cluster_node.archive.spark.frames``). With the committed parts
compared position by position, a node whose frame boundaries
went astray (a changed length field) shows as a position one side lacks.

For every pair of nodes the first position where they disagree is reported with both frames
decoded; the exit status of ``cluster-node pipeline audit`` is 1 on any disagreement.

Caveat of the rule: an old leader's tail that no majority ever held but that a majority holds
*differently* (the new leader overwrote it and the old leader has not rejoined yet) is reported
as a divergence too: it is one, only not a committed one on the old leader's side. The report
names the terms of both frames, which shows this case at a glance.

If a node has several recordings of the log stream, the one reaching furthest is its log.

Stats
=====
On the committed log of one node (the one holding most of it): messages and bytes per leadership
term and per session, per-second throughput (every second from the first message to the last,
zero where nothing was appended), session lifecycles (open, close, reason, duration), and the
election timeline (each term's NewLeadershipTermEvent: leader, base position, time, and the gap
since the previous term's last message, an upper bound on the election's length). Times are the
table's ``time_ns`` (the decoder converts with the time unit the log declares).

Export
======
The decoded log of every node, as Parquet partitioned by cluster, member and date, staged and
moved into place partition by partition: see :mod:`cluster_node.pipeline.export`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

__all__ = [
    "AuditResult",
    "Divergence",
    "NodeLength",
    "audit",
    "export",
    "load_log",
    "node_lengths",
    "stats",
]

MAX_DETAILED_MISMATCHES = 10_000


def load_log(spark: SparkSession, paths: list[str], *, mode: str = "failfast", parquet: bool = False) -> DataFrame:
    """The cluster log table from archives (``cluster_log`` source) or from an export's Parquet
    (``parquet=True``: ``paths`` are export outputs or their ``log.parquet`` directories)."""
    if parquet:
        from cluster_node.archive.spark.layout import join
        from cluster_node.pipeline.export import DATA_DIR

        roots = [p if p.rstrip("/").endswith(DATA_DIR) else join(p, DATA_DIR) for p in paths]
        return (
            spark.read.option("basePath", roots[0]).parquet(*roots) if len(roots) == 1 else (spark.read.parquet(*roots))
        )
    return spark.read.format("cluster_log").option("mode", mode).load(paths)


def _aligned_end(df: DataFrame):
    return df["position"] + F.expr("CAST(((frame_length + 31) DIV 32) * 32 AS BIGINT)")


@dataclass
class NodeLength:
    node: str
    member_id: int | None
    recording_id: int
    held_position: int
    committed_length: int
    messages: int


def node_lengths(df: DataFrame, cluster_size: int | None = None) -> tuple[list[NodeLength], int]:
    """Per node its log recording, held and committed lengths; and the committed position."""
    per_recording = (
        df.groupBy("node", "member_id", "recording_id")
        .agg(F.max(_aligned_end(df)).alias("held"), F.count(F.lit(1)).alias("messages"))
        .collect()
    )
    best: dict[str, Any] = {}
    for r in sorted(per_recording, key=lambda r: (r["node"], r["recording_id"])):
        if r["node"] not in best or r["held"] > best[r["node"]]["held"]:
            best[r["node"]] = r
    nodes = sorted(best.values(), key=lambda r: (r["member_id"] if r["member_id"] is not None else 1 << 30, r["node"]))
    size = cluster_size or len(nodes)
    majority = size // 2 + 1
    helds = sorted((r["held"] for r in nodes), reverse=True)
    committed = helds[majority - 1] if len(helds) >= majority else 0
    return (
        [
            NodeLength(
                r["node"], r["member_id"], r["recording_id"], r["held"], min(r["held"], committed), r["messages"]
            )
            for r in nodes
        ],
        committed,
    )


def _committed_part(spark: SparkSession, df: DataFrame, lengths: list[NodeLength]) -> DataFrame:
    limits = spark.createDataFrame(
        [(n.node, n.recording_id, n.committed_length) for n in lengths],
        "node STRING, recording_id BIGINT, committed_length BIGINT",
    )
    return (
        df.join(F.broadcast(limits), ["node", "recording_id"])
        .where(F.col("position") < F.col("committed_length"))
        .drop("committed_length")
    )


@dataclass
class FrameSide:
    node: str
    present: bool
    leadership_term_id: int | None = None
    message_type: str | None = None
    cluster_session_id: int | None = None
    timestamp: int | None = None
    frame_length: int | None = None
    fragments: int | None = None
    frame_hash: int | None = None
    payload_prefix_hex: str | None = None
    """Up to 64 bytes of the message after the frame header (for a session message: its session
    header, then the application payload), read back from the segment file."""
    decode_error: str | None = None


@dataclass
class Divergence:
    node_a: str
    node_b: str
    position: int
    leadership_term_id: int | None
    """The term of the frames at the divergence (node_a's, or node_b's when node_a lacks one)."""
    a: FrameSide
    b: FrameSide
    first_differing_byte_position: int | None = None
    """The stream position of the first byte that differs between the two recordings (read back
    from the segment files), when both nodes have a message here. Frame headers' session ids are
    not compared: each node records its own copy of the log under a session id of its own."""


@dataclass
class Dissent:
    node: str
    member_id: int | None
    position: int
    leadership_term_id: int | None
    majority: int
    """How many of the ``expected`` nodes agree with each other here."""
    expected: int


@dataclass
class CorruptNode:
    node: str
    member_id: int | None
    error: str
    """One line: the file and the stream position, or why the archive could not be opened."""
    position: int | None = None


@dataclass
class AuditResult:
    agreed: bool
    cluster_size: int
    committed_position: int
    nodes: list[NodeLength]
    positions_compared: int
    rows_compared: int
    mismatched_positions: int
    divergences: list[Divergence] = field(default_factory=list)
    incomplete: bool = False
    """True when more mismatching positions existed than were examined for first divergences."""
    dissenters: list[Dissent] = field(default_factory=list)
    """Nodes that disagree with a majority, each at the first position where it does."""
    corrupt_nodes: list[CorruptNode] = field(default_factory=list)
    """Nodes whose archive could not be read (to the end): each a finding; the audit disagrees."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _side(node: str, row: Any | None, archive: str | None) -> FrameSide:
    if row is None:
        return FrameSide(node, False)
    from cluster_node.archive.spark.layout import read_recorded_bytes

    try:
        if archive is None:
            raise ValueError("no archive")  # audited from Parquet: the table's columns only
        recorded = read_recorded_bytes(archive, row["recording_id"], row["position"], min(row["frame_length"], 96))
        payload = recorded[32:96]
    except (OSError, ValueError):
        payload = None  # files not readable from the driver: the table's columns only
    return FrameSide(
        node,
        True,
        row["leadership_term_id"],
        row["message_type"],
        row["cluster_session_id"],
        row["timestamp"],
        row["frame_length"],
        row["fragments"],
        row["frame_hash"],
        None if payload is None else payload.hex(),
        row["decode_error"],
    )


def _first_differing_byte(
    position: int, ra: Any | None, rb: Any | None, archive_a: str | None, archive_b: str | None
) -> int | None:
    if ra is None or rb is None or archive_a is None or archive_b is None:
        return None
    from cluster_node.archive.spark.layout import read_recorded_bytes

    length = max(ra["frame_length"], rb["frame_length"])
    try:
        a = read_recorded_bytes(archive_a, ra["recording_id"], position, length)
        b = read_recorded_bytes(archive_b, rb["recording_id"], position, length)
    except (OSError, ValueError):
        return None  # the files are not readable from the driver (a real cluster): tables only
    from cluster_node.archive.spark.frames import first_differing_byte

    offset = first_differing_byte(a, b)  # frame headers' session ids differ by design: not counted
    return None if offset is None else position + offset


def audit(
    spark: SparkSession,
    df: DataFrame,
    cluster_size: int | None = None,
    archives: dict[str, str] | None = None,
    unreadable: list[CorruptNode] | None = None,
) -> AuditResult:
    """``archives``: node -> archive location, to read divergent frames' bytes back (optional).
    ``unreadable``: nodes the caller could not plan a read of (findings, not in ``df``).
    Read ``df`` with ``mode=permissive`` to have a corrupt segment reported as a finding."""
    # The data source decodes every column whatever is selected, so read once and keep the
    # narrow columns the audit needs; payload bytes of divergent frames are read from the files.
    has_errors = "read_error" in df.columns
    narrow = df.select(
        "node",
        "member_id",
        "recording_id",
        "position",
        "frame_length",
        "frame_hash",
        "leadership_term_id",
        "message_type",
        "cluster_session_id",
        "timestamp",
        "fragments",
        "decode_error",
        F.col("read_error") if has_errors else F.lit(None).cast("string").alias("read_error"),
    ).persist()
    try:
        errors = narrow.where(F.col("read_error").isNotNull())
        corrupt = [
            CorruptNode(r["node"], r["member_id"], r["read_error"], r["position"])
            for r in errors.select("node", "member_id", "read_error", "position").orderBy("node", "position").collect()
        ]
        first_error: dict[str, CorruptNode] = {}
        for c in corrupt:
            first_error.setdefault(c.node, c)
        result = _audit(spark, narrow.where(F.col("read_error").isNull()), cluster_size, archives or {})
        result.corrupt_nodes = list(unreadable or []) + list(first_error.values())
        if result.corrupt_nodes:
            result.agreed = False
        return result
    finally:
        narrow.unpersist()


def _dissenters(
    bad_positions: list[int], by_position: dict[int, dict[str, Any]], lengths: list[NodeLength]
) -> list[Dissent]:
    """Per node, the first position where it is outside a strict majority of the nodes that should
    hold the position (a missing message counts as a disagreement)."""
    first: dict[str, Dissent] = {}
    members = {n.node: n.member_id for n in lengths}
    for p in bad_positions:
        expected = [n.node for n in lengths if p < n.committed_length]
        groups: dict[Any, list[str]] = {}
        for node in expected:
            r = by_position.get(p, {}).get(node)
            key = None if r is None else (r["frame_hash"], r["frame_length"])
            groups.setdefault(key, []).append(node)
        majority = [g for k, g in groups.items() if k is not None and len(g) * 2 > len(expected)]
        if not majority:
            continue
        for node in expected:
            if node not in majority[0] and node not in first:
                r = by_position.get(p, {}).get(node)
                first[node] = Dissent(
                    node,
                    members.get(node),
                    p,
                    None if r is None else r["leadership_term_id"],
                    len(majority[0]),
                    len(expected),
                )
    return sorted(first.values(), key=lambda d: (d.position, d.node))


def _audit(spark: SparkSession, df: DataFrame, cluster_size: int | None, archives: dict[str, str]) -> AuditResult:
    lengths, committed = node_lengths(df, cluster_size)
    size = cluster_size or len(lengths)
    part = _committed_part(spark, df, lengths)
    # How many nodes must hold a message starting at each position: those whose committed part
    # reaches beyond it.
    expected = F.lit(0)
    for n in lengths:
        expected = expected + F.when(F.col("position") < F.lit(n.committed_length), 1).otherwise(0)
    per_position = part.groupBy("position").agg(
        F.count(F.lit(1)).alias("holders"),
        F.min("frame_hash").alias("min_hash"),
        F.max("frame_hash").alias("max_hash"),
        F.min("frame_length").alias("min_length"),
        F.max("frame_length").alias("max_length"),
    )
    per_position = per_position.withColumn("expected", expected).withColumn(
        "bad",
        (F.col("holders") != F.col("expected"))
        | (F.col("min_hash") != F.col("max_hash"))
        | (F.col("min_length") != F.col("max_length")),
    )
    totals = per_position.agg(
        F.count(F.lit(1)).alias("positions"),
        F.sum("holders").alias("rows"),
        F.sum(F.col("bad").cast("long")).alias("bad"),
    ).collect()[0]
    bad = per_position.where(F.col("bad")).select("position")
    mismatched = int(totals["bad"] or 0)
    bad_positions = (
        [r["position"] for r in bad.orderBy("position").limit(MAX_DETAILED_MISMATCHES).collect()] if mismatched else []
    )
    divergences: list[Divergence] = []
    if bad_positions:
        wanted = spark.createDataFrame([(p,) for p in bad_positions], "position BIGINT")
        details = part.join(F.broadcast(wanted), "position").collect()
        by_position: dict[int, dict[str, Any]] = {}
        for r in details:
            by_position.setdefault(r["position"], {})[r["node"]] = r
        limit = {n.node: n.committed_length for n in lengths}
        names = [n.node for n in lengths]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                for p in bad_positions:
                    if p >= limit[a] or p >= limit[b]:
                        continue
                    ra, rb = by_position.get(p, {}).get(a), by_position.get(p, {}).get(b)
                    same = (
                        ra is not None
                        and rb is not None
                        and ra["frame_hash"] == rb["frame_hash"]
                        and ra["frame_length"] == rb["frame_length"]
                    )
                    if not same:
                        term = (ra or rb)["leadership_term_id"]
                        divergences.append(
                            Divergence(
                                a,
                                b,
                                p,
                                term,
                                _side(a, ra, archives.get(a)),
                                _side(b, rb, archives.get(b)),
                                _first_differing_byte(p, ra, rb, archives.get(a), archives.get(b)),
                            )
                        )
                        break
        dissenters = _dissenters(bad_positions, by_position, lengths)
    else:
        dissenters = []
    return AuditResult(
        agreed=not bad_positions,
        cluster_size=size,
        committed_position=committed,
        nodes=lengths,
        positions_compared=int(totals["positions"] or 0),
        rows_compared=int(totals["rows"] or 0),
        mismatched_positions=int(mismatched),
        divergences=divergences,
        incomplete=len(bad_positions) >= MAX_DETAILED_MISMATCHES,
        dissenters=dissenters,
    )


# ------------------------------------------------------------------------------------ stats


@dataclass
class StatsResult:
    node: str
    committed_length: int
    messages: int
    terms: list[dict]
    sessions: list[dict]
    elections: list[dict]
    throughput: list[dict]
    """Per second: second (epoch s), messages, bytes, leadership_term_id (of the second's first message)."""
    message_types: list[dict]


def stats(
    spark: SparkSession, df: DataFrame, cluster_size: int | None = None, out_dir: str | None = None
) -> StatsResult:
    """``out_dir`` (a local path or a URI Spark can write) receives the full tables as Parquet."""
    from cluster_node.archive.spark.layout import join

    lengths, committed = node_lengths(df, cluster_size)
    if not lengths:
        return StatsResult("", 0, 0, [], [], [], [], [])
    ref = max(lengths, key=lambda n: n.committed_length)
    log = (
        df.where((F.col("node") == ref.node) & (F.col("recording_id") == ref.recording_id))
        .where(F.col("position") < ref.committed_length)
        .drop("payload")
    )
    log = log.cache()
    try:
        terms = (
            log.groupBy("leadership_term_id")
            .agg(
                F.count(F.lit(1)).alias("messages"),
                F.sum(F.when(F.col("message_type") == "SessionMessage", 1).otherwise(0)).alias("session_messages"),
                F.sum("frame_length").alias("bytes"),
                F.min("position").alias("first_position"),
                F.max(_aligned_end(log)).alias("end_position"),
                F.min("time_ns").alias("first_time_ns"),
                F.max("time_ns").alias("last_time_ns"),
            )
            .withColumn("duration_s", (F.col("last_time_ns") - F.col("first_time_ns")) / F.lit(1e9))
            .withColumn(
                "messages_per_s",
                F.when(F.col("duration_s") > 0, F.col("messages") / F.col("duration_s")),
            )
            .withColumn("bytes_per_s", F.when(F.col("duration_s") > 0, F.col("bytes") / F.col("duration_s")))
            .orderBy("leadership_term_id")
        )
        session_rows = log.where(F.col("cluster_session_id").isNotNull())
        sessions = (
            session_rows.groupBy("cluster_session_id")
            .agg(
                F.sum(F.when(F.col("message_type") == "SessionMessage", 1).otherwise(0)).alias("messages"),
                F.sum(F.when(F.col("message_type") == "SessionMessage", F.col("frame_length")).otherwise(0)).alias(
                    "bytes"
                ),
                F.min(F.when(F.col("message_type") == "SessionOpenEvent", F.col("time_ns"))).alias("open_time_ns"),
                F.min(F.when(F.col("message_type") == "SessionOpenEvent", F.col("leadership_term_id"))).alias(
                    "open_term"
                ),
                F.min(F.when(F.col("message_type") == "SessionOpenEvent", F.col("position"))).alias("open_position"),
                F.max(F.when(F.col("message_type") == "SessionCloseEvent", F.col("time_ns"))).alias("close_time_ns"),
                F.max(
                    F.when(F.col("message_type") == "SessionCloseEvent", F.get_json_object("detail", "$.close_reason"))
                ).alias("close_reason"),
                F.min("time_ns").alias("first_time_ns"),
                F.max("time_ns").alias("last_time_ns"),
            )
            .withColumn("duration_s", (F.col("close_time_ns") - F.col("open_time_ns")) / F.lit(1e9))
            .withColumn("kind", F.when(F.col("cluster_session_id") < 0, "service").otherwise("client"))
            .orderBy("cluster_session_id")
        )
        last_of_term = log.groupBy("leadership_term_id").agg(F.max("time_ns").alias("term_last_time_ns"))
        w = Window.orderBy("leadership_term_id")
        elections = (
            log.where(F.col("message_type") == "NewLeadershipTermEvent")
            .select(
                "leadership_term_id",
                F.get_json_object("detail", "$.leader_member_id").cast("int").alias("leader_member_id"),
                F.get_json_object("detail", "$.log_session_id").cast("int").alias("log_session_id"),
                F.get_json_object("detail", "$.term_base_log_position").cast("bigint").alias("term_base_log_position"),
                F.col("position"),
                F.col("time_ns"),
            )
            .join(last_of_term, "leadership_term_id", "left")
            .withColumn("previous_term_last_time_ns", F.lag("term_last_time_ns").over(w))
            .withColumn(
                "gap_since_previous_term_s", (F.col("time_ns") - F.col("previous_term_last_time_ns")) / F.lit(1e9)
            )
            .drop("term_last_time_ns")
            .orderBy("leadership_term_id")
        )
        per_second = (
            log.where(F.col("time_ns").isNotNull())
            .withColumn("second", F.floor(F.col("time_ns") / F.lit(1_000_000_000)).cast("bigint"))
            .groupBy("second")
            .agg(
                F.count(F.lit(1)).alias("messages"),
                F.sum("frame_length").cast("bigint").alias("bytes"),
                F.min("leadership_term_id").alias("leadership_term_id"),
            )
        )
        # Every second from the first to the last, with zeros where the log has nothing (an
        # election gap is silence, and a table or plot without those rows would hide it).
        low, high = per_second.agg(F.min("second"), F.max("second")).collect()[0]
        if low is None:
            throughput = per_second
        else:
            throughput = (
                spark.range(low, high + 1)
                .withColumnRenamed("id", "second")
                .join(per_second, "second", "left")
                .fillna(0, ["messages", "bytes"])
                .orderBy("second")
            )
        types = log.groupBy("leadership_term_id", "message_type").count().orderBy("leadership_term_id", "message_type")
        if out_dir:
            for name, frame in (
                ("terms", terms),
                ("sessions", sessions),
                ("elections", elections),
                ("throughput", throughput),
                ("message_types", types),
            ):
                frame.write.mode("overwrite").parquet(join(out_dir, f"{name}.parquet"))
        as_dicts = lambda frame: [r.asDict() for r in frame.collect()]  # noqa: E731
        return StatsResult(
            node=ref.node,
            committed_length=ref.committed_length,
            messages=log.count(),
            terms=as_dicts(terms),
            sessions=as_dicts(sessions),
            elections=as_dicts(elections),
            throughput=as_dicts(throughput),
            message_types=as_dicts(types),
        )
    finally:
        log.unpersist()


def export(spark: SparkSession, paths: list[str], out: str, *, incremental: bool = False):
    """See :mod:`cluster_node.pipeline.export`."""
    from cluster_node.pipeline.export import export_spark

    return export_spark(spark, paths, out, incremental=incremental)
