"""Reports of the pipeline's jobs: Markdown and HTML text, JSON, and PNG plots.

Plots use matplotlib's Agg backend (files only, no display): messages and bytes per second (every
second, zero where nothing was appended) with each election's gap shaded (from the previous term's
last message to the new term's first) and the term boundaries marked, and messages per term. The
log records no client send times, so there is no latency plot; the report says so rather than
plotting a made-up figure.

Every file is written through ``pyarrow.fs`` (:func:`write_file`), so ``--out`` may be a URI. The
report's sessions table shows the first :data:`MAX_REPORT_SESSIONS` sessions; the full table is
``sessions.parquet``.
"""

from __future__ import annotations

import html
import json
import posixpath
from datetime import UTC, datetime

from cluster_node.pipeline.jobs import AuditResult, StatsResult

__all__ = ["MAX_REPORT_SESSIONS", "audit_markdown", "write_audit_report", "write_file", "write_stats_report"]

MAX_REPORT_SESSIONS = 50


def write_file(out_dir: str, name: str, data: bytes | str) -> str:
    """``out_dir/name`` (a local path or a URI), written through pyarrow's filesystem layer."""
    from cluster_node.archive.spark.layout import filesystem, join

    location = join(out_dir, name)
    fs, path = filesystem(location)
    fs.create_dir(posixpath.dirname(path), recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return location


def _time(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _table(headings: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
    for row in rows:
        lines.append("| " + " | ".join("-" if v is None else str(v) for v in row) + " |")
    return "\n".join(lines)


def audit_markdown(result: AuditResult) -> str:
    verdict = "AGREE" if result.agreed else "DIVERGE"
    lines = [
        f"# Log audit: the committed logs {verdict}",
        "",
        f"Cluster size {result.cluster_size}; committed position (held by a majority) "
        f"**{result.committed_position}**. Compared {result.rows_compared} messages at "
        f"{result.positions_compared} positions; {result.mismatched_positions} positions disagree.",
        "",
        _table(
            ["node", "member", "log recording", "held position", "committed length", "messages"],
            [
                [n.node, n.member_id, n.recording_id, n.held_position, n.committed_length, n.messages]
                for n in result.nodes
            ],
        ),
    ]
    if result.corrupt_nodes:
        lines += ["", "## Unreadable archives", ""]
        lines += [f"- **{c.node}** (member {c.member_id}): {c.error}" for c in result.corrupt_nodes]
    if result.dissenters:
        lines += ["", "## Members disagreeing with the majority", ""]
        lines += [
            f"- **{d.node}** (member {d.member_id}) from position {d.position} (leadership term "
            f"{d.leadership_term_id}): {d.majority} of {d.expected} members agree with each other there"
            for d in result.dissenters
        ]
    if result.divergences:
        lines += ["", "## First divergence per node pair", ""]
        for d in result.divergences:
            lines.append(f"### {d.node_a} / {d.node_b}: position {d.position}, leadership term {d.leadership_term_id}")
            lines.append("")
            if d.first_differing_byte_position is not None:
                lines.append(f"First differing byte at stream position {d.first_differing_byte_position}.")
                lines.append("")
            rows = []
            for side in (d.a, d.b):
                if not side.present:
                    rows.append([side.node, "no message starts here"] + [None] * 7)
                else:
                    rows.append(
                        [
                            side.node,
                            side.message_type,
                            side.leadership_term_id,
                            side.cluster_session_id,
                            side.timestamp,
                            side.frame_length,
                            side.fragments,
                            side.frame_hash,
                            side.payload_prefix_hex,
                        ]
                    )
            lines.append(
                _table(
                    [
                        "node",
                        "type",
                        "term",
                        "session",
                        "timestamp",
                        "length",
                        "fragments",
                        "hash",
                        "message bytes (hex, first 64)",
                    ],
                    rows,
                )
            )
            lines.append("")
    if result.incomplete:
        lines.append("(More positions disagree than were examined; the first divergences above are still exact.)")
    return "\n".join(lines) + "\n"


def write_audit_report(result: AuditResult, out_dir: str) -> list[str]:
    return [
        write_file(out_dir, "audit.md", audit_markdown(result)),
        write_file(out_dir, "audit.json", result.to_json()),
    ]


def _png(fig) -> bytes:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _plots(result: StatsResult, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if result.throughput:
        seconds = [r["second"] for r in result.throughput]
        t0 = seconds[0]
        fig, ax = plt.subplots(figsize=(9, 3.5))
        xs = [s - t0 for s in seconds]
        ax.plot(
            xs, [r["messages"] for r in result.throughput], drawstyle="steps-post", color="tab:blue", label="messages/s"
        )
        ax.set_ylim(bottom=0)
        right = ax.twinx()
        right.plot(
            xs,
            [r["bytes"] for r in result.throughput],
            drawstyle="steps-post",
            color="tab:green",
            linewidth=0.8,
            label="bytes/s",
        )
        right.set_ylim(bottom=0)
        right.set_ylabel("bytes / s", color="tab:green")
        for e in result.elections:
            x = e["time_ns"] / 1e9 - t0
            if e.get("previous_term_last_time_ns") is not None:
                ax.axvspan(e["previous_term_last_time_ns"] / 1e9 - t0, x, color="tab:red", alpha=0.15, linewidth=0)
            ax.axvline(x, color="tab:red", linestyle="--", linewidth=1)
            ax.text(
                x,
                ax.get_ylim()[1] * 0.95,
                f" term {e['leadership_term_id']}\n leader {e['leader_member_id']}",
                color="tab:red",
                fontsize=8,
                va="top",
            )
        ax.set_xlabel(f"seconds since {_time(t0 * 1_000_000_000)}")
        ax.set_ylabel("messages / s", color="tab:blue")
        ax.set_title("Log throughput (shaded: election gaps; dashed: new leadership terms)")
        fig.tight_layout()
        written.append(write_file(out_dir, "throughput.png", _png(fig)))
        plt.close(fig)
    if result.terms:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.bar([str(t["leadership_term_id"]) for t in result.terms], [t["messages"] for t in result.terms])
        ax.set_xlabel("leadership term")
        ax.set_ylabel("messages")
        ax.set_title("Messages per leadership term")
        fig.tight_layout()
        written.append(write_file(out_dir, "terms.png", _png(fig)))
        plt.close(fig)
    return written


def _fmt(v: object, digits: int = 1) -> object:
    return f"{v:,.{digits}f}" if isinstance(v, float) else v


def stats_markdown(result: StatsResult, plots: list[str]) -> str:
    lines = [
        "# Log statistics",
        "",
        f"Committed log of {result.node}: {result.messages} messages up to position {result.committed_length}.",
        "",
        "## Leadership terms",
        "",
        _table(
            ["term", "messages", "session msgs", "bytes", "positions", "first", "last", "msgs/s", "bytes/s"],
            [
                [
                    t["leadership_term_id"],
                    t["messages"],
                    t["session_messages"],
                    t["bytes"],
                    f"{t['first_position']}..{t['end_position']}",
                    _time(t["first_time_ns"]),
                    _time(t["last_time_ns"]),
                    _fmt(t["messages_per_s"]),
                    _fmt(t["bytes_per_s"], 0),
                ]
                for t in result.terms
            ],
        ),
        "",
        "## Elections",
        "",
        _table(
            ["term", "leader", "base position", "started", "gap since previous term (s)"],
            [
                [
                    e["leadership_term_id"],
                    e["leader_member_id"],
                    e["term_base_log_position"],
                    _time(e["time_ns"]),
                    _fmt(e["gap_since_previous_term_s"], 3),
                ]
                for e in result.elections
            ],
        ),
        "",
        "## Sessions",
        "",
        _table(
            ["session", "kind", "messages", "bytes", "opened", "term", "closed", "reason", "duration (s)"],
            [
                [
                    s["cluster_session_id"],
                    s["kind"],
                    s["messages"],
                    s["bytes"],
                    _time(s["open_time_ns"]),
                    s["open_term"],
                    _time(s["close_time_ns"]),
                    s["close_reason"],
                    _fmt(s["duration_s"], 3),
                ]
                for s in result.sessions[:MAX_REPORT_SESSIONS]
            ],
        ),
        "",
        *(
            [f"The first {MAX_REPORT_SESSIONS} of {len(result.sessions)} sessions; all are in sessions.parquet.", ""]
            if len(result.sessions) > MAX_REPORT_SESSIONS
            else []
        ),
        "## Plots",
        "",
    ]
    lines += [f"![{p.rsplit('/', 1)[-1]}]({p.rsplit('/', 1)[-1]})" for p in plots]
    lines += ["", "Latency: the log carries no client send times, so none is plotted."]
    return "\n".join(lines) + "\n"


def write_stats_report(result: StatsResult, out_dir: str) -> list[str]:
    plots = _plots(result, out_dir)
    md_text = stats_markdown(result, plots)
    md = write_file(out_dir, "report.md", md_text)
    body = []
    for line in md_text.splitlines():
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("![") and "](" in line:
            src = line[line.index("](") + 2 : -1]
            body.append(f'<p><img src="{html.escape(src)}"></p>')
        elif line.startswith("|---"):
            continue
        elif line.startswith("| "):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    text = "\n".join(body)
    # Wrap consecutive rows into tables.
    text = text.replace("</p>\n<tr>", "</p>\n<table border=1 cellspacing=0 cellpadding=3><tr>")
    text = text.replace("</tr>\n<h2>", "</tr></table>\n<h2>").replace("</tr>\n<p>", "</tr></table>\n<p>")
    page = write_file(
        out_dir, "report.html", f"<!doctype html><meta charset=utf-8><title>Log statistics</title>\n{text}\n"
    )
    summary = write_file(
        out_dir,
        "stats.json",
        json.dumps(
            {
                "node": result.node,
                "committed_length": result.committed_length,
                "messages": result.messages,
                "terms": result.terms,
                "elections": result.elections,
                "sessions": result.sessions[:MAX_REPORT_SESSIONS],
                "sessions_total": len(result.sessions),
            },
            indent=2,
            default=str,
        ),
    )
    return [md, page, summary, *plots]
