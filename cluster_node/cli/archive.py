"""``cluster-node archive``: look into an archive directory (list, describe, dump, verify), and
repair one offline (truncate, rebuild).

The tools read the catalog and the segment files directly, so they work on a stopped node and on
a running one (read-only commands). ``truncate`` changes the archive and refuses to run while an
archive holds the directory. ``--dir`` takes an archive directory (holding ``archive.catalog``) or
a node directory (holding ``archive/archive.catalog``).

``dump`` decodes what it recognises: cluster log messages (session messages and the other log
messages of ``cluster_node.codecs``); anything else is shown as the first bytes in hex.

Every command checks the catalog entries' checksums as it reads them: a damaged entry is named
(recording and offset) and never used. ``verify`` checks every frame too (its checksum, where the
recording has them; its structure; that its segment file holds all of it) and exits 1 with one
line per damaged recording. ``rebuild`` makes damaged catalog entries again from the segment
files (``cluster_node.archive.rebuild``); like ``truncate`` it needs the node stopped and locks the directory.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import click

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import CatalogError, RecordingDescriptor
from cluster_node.archive.codecs import NULL_POSITION
from cluster_node.archive.frame_walk import checks_text, iter_frames, verify_recording
from cluster_node.archive.rebuild import RebuildError, rebuild_catalog
from cluster_node.archive.recovery import recovered_end
from cluster_node.archive.segment_files import (
    attach_front,
    delete_detached_segments,
    detach_front,
    detached_segments,
    truncate_segments,
)
from cluster_node.archive.segments import FRAME_TYPE_DATA, is_aligned, segment_base_position
from cluster_node.archive.storage import (
    CATALOG_FILE_NAME,
    REBUILD_HINT,
    ArchiveStorageError,
    CatalogStore,
    list_segments,
    load_catalog,
)
from cluster_node.media.private_files import FILE_MODE
from cluster_node.text_table import format_table

_MARK = "archive-mark.dat"


def _archive_dir(directory: Path) -> Path:
    if not directory.exists():
        raise click.ClickException(f"no such directory: {directory}")
    for candidate in (directory, directory / "archive"):
        if (candidate / CATALOG_FILE_NAME).is_file():
            return candidate
    raise click.ClickException(
        f"no archive catalog in {directory} (looked for {CATALOG_FILE_NAME} and archive/{CATALOG_FILE_NAME})"
    )


def _catalog(directory: Path) -> Catalog:
    try:
        return load_catalog(directory / CATALOG_FILE_NAME)
    except ArchiveStorageError as e:
        raise click.ClickException(str(e)) from None


def _lenient_catalog(directory: Path) -> Catalog:
    path = directory / CATALOG_FILE_NAME
    try:
        return Catalog.from_bytes(path.read_bytes(), strict=False)
    except CatalogError as e:
        raise click.ClickException(f"{path}: {e}; {REBUILD_HINT.format(dir=directory)}") from None
    except OSError as e:
        raise click.ClickException(f"{path}: {e.strerror}") from None


def _locked(adir: Path, what: str) -> int:
    """Hold the archive directory's lock (the running archive holds it): a file descriptor."""
    fd = os.open(adir / _MARK, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise click.ClickException(f"an archive is running on {adir}: stop its node first, then {what}") from None
    return fd


def _descriptor(catalog: Catalog, recording_id: int) -> RecordingDescriptor:
    d = catalog.find(recording_id)
    if d is None:
        known = ", ".join(str(r.recording_id) for r in catalog) or "none"
        raise click.ClickException(f"no recording {recording_id} in the catalog (recordings: {known})")
    return d


def _stop_text(d: RecordingDescriptor) -> str:
    return "active" if d.stop_position == NULL_POSITION else str(d.stop_position)


@click.group("archive")
def archive() -> None:
    """Inspect and repair an archive directory (recordings and segment files)."""


_dir_option = click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(path_type=Path),
    help="archive directory, or node directory holding archive/",
)


_json_option = click.option(
    "--json", "as_json", is_flag=True, help="One JSON object with the fields of the text (keys in docs/operations.md)."
)


@archive.command("list")
@_dir_option
@_json_option
def list_cmd(directory: Path, as_json: bool) -> None:
    """List the recordings as a table."""
    adir = _archive_dir(directory)
    catalog = _catalog(adir)
    rows = [("id", "start", "stop", "bytes", "stream", "session", "segments", "channel")]
    recordings = []
    for d in catalog:
        stop = d.stop_position if d.stop_position != NULL_POSITION else recovered_end(adir, d)
        segments = len(list_segments(adir, d.recording_id))
        rows.append(
            (
                str(d.recording_id),
                str(d.start_position),
                _stop_text(d),
                str(stop - d.start_position),
                str(d.stream_id),
                str(d.session_id),
                str(segments),
                d.original_channel,
            )
        )
        recordings.append(
            {
                "recording_id": d.recording_id,
                "start_position": d.start_position,
                "stop_position": d.stop_position,
                "active": d.stop_position == NULL_POSITION,
                "end_position": stop,
                "bytes": stop - d.start_position,
                "stream_id": d.stream_id,
                "session_id": d.session_id,
                "segment_files": segments,
                "channel": d.original_channel,
            }
        )
    if as_json:
        click.echo(json.dumps({"archive_dir": str(adir), "recordings": recordings}, indent=2))
        return
    if len(rows) == 1:
        click.echo(f"no recordings in {adir}")
        return
    for line in format_table(rows, right=range(len(rows[0]) - 1)):
        click.echo(line)


@archive.command()
@_dir_option
@click.argument("recording_id", type=int)
@_json_option
def describe(directory: Path, recording_id: int, as_json: bool) -> None:
    """Every field of one recording's descriptor, and its segment files."""
    adir = _archive_dir(directory)
    d = _descriptor(_catalog(adir), recording_id)
    if as_json:
        fields = {name: getattr(d, name) for name in d.__struct_fields__}
        fields = {k: v if isinstance(v, (int, str, bool)) or v is None else str(v) for k, v in fields.items()}
        detached = set(detached_segments(adir, d))
        files = [f"{recording_id}-{b}.rec" for b in list_segments(adir, recording_id) if b not in detached]
        click.echo(
            json.dumps(
                {
                    "archive_dir": str(adir),
                    "descriptor": fields,
                    "checks": checks_text(d),
                    "segment_files": files,
                    "detached_segment_files": [f"{recording_id}-{b}.rec" for b in sorted(detached)],
                },
                indent=2,
            )
        )
        return
    for name in d.__struct_fields__:
        click.echo(f"{name:20} {getattr(d, name)}")
    click.echo(f"{'checks':20} {checks_text(d)}")
    detached = detached_segments(adir, d)
    bases = [b for b in list_segments(adir, recording_id) if b not in set(detached)]
    click.echo(f"{'segments':20} {len(bases)}: " + ", ".join(f"{recording_id}-{b}.rec" for b in bases))
    if detached:
        click.echo(
            f"{'detached segments':20} {len(detached)}: "
            + ", ".join(f"{recording_id}-{b}.rec" for b in detached)
            + " (before the start position: removed by the next purge, or taken back by attach-segments)"
        )


def _decode_payload(payload: bytes) -> str:
    try:
        from cluster_node import codecs as cc

        template_id = cc.peek_template_id(payload)
        if template_id == cc.SESSION_MESSAGE_TEMPLATE_ID:
            header, body = cc.decode_session_message(payload)
            return (
                f"SessionMessage term={header.leadership_term_id} session={header.cluster_session_id} "
                f"ts={header.timestamp} payload={len(body)}B {bytes(body[:16]).hex()}"
            )
        return repr(cc.decode_log(payload))
    except Exception:  # noqa: BLE001 - not a cluster message: show raw bytes
        return payload[:24].hex() + ("..." if len(payload) > 24 else "")


@archive.command()
@_dir_option
@click.argument("recording_id", type=int)
@click.option("--from", "from_position", type=int, default=None, help="first position (frame aligned)")
@click.option("--to", "to_position", type=int, default=None, help="position to stop before")
@click.option("--limit", type=int, default=1000, show_default=True, help="most frames to print (0: all)")
@click.option("--raw", is_flag=True, help="do not decode payloads")
def dump(
    directory: Path, recording_id: int, from_position: int | None, to_position: int | None, limit: int, raw: bool
) -> None:
    """Print frames: position, length, type, flags, session, and the decoded message where known."""
    adir = _archive_dir(directory)
    d = _descriptor(_catalog(adir), recording_id)
    if from_position is not None and (not is_aligned(from_position) or from_position < d.start_position):
        raise click.ClickException(f"--from {from_position} must be 32-byte aligned and >= {d.start_position}")
    shown = 0
    try:
        for f in iter_frames(adir, d, from_position, to_position):
            kind = "DATA" if f.frame_type == FRAME_TYPE_DATA else "PAD"
            text = (
                "" if f.frame_type != FRAME_TYPE_DATA else (f.payload[:24].hex() if raw else _decode_payload(f.payload))
            )
            click.echo(
                f"{f.position:>12} {f.frame_length:>6} {kind:4} {f.flags:#04x} session={f.session_id} "
                f"term={f.term_id} {text}"
            )
            shown += 1
            if limit and shown >= limit:
                break
    except ArchiveStorageError as e:
        raise click.ClickException(str(e)) from None


@archive.command()
@_dir_option
@click.argument("recording_id", type=int, required=False)
def verify(directory: Path, recording_id: int | None) -> None:
    """Check every catalog entry and every frame of every (or one) recording; one line per
    recording, the first damage of each; exit 1 when anything is damaged."""
    adir = _archive_dir(directory)
    catalog = _lenient_catalog(adir)
    bad = 0
    # Recordings with segment files and no sound entry: a damaged entry whose id field itself
    # is damaged is theirs when there is only one.
    orphans = sorted(
        {
            name.split("-", 1)[0]
            for name in os.listdir(adir)
            if name.endswith(".rec") and name.split("-", 1)[0].isdigit()
        }
        - {str(d.recording_id) for d, _ in catalog.all_records()}
    )
    for dr in catalog.damaged:
        rid = dr.recording_id
        if rid is not None and str(rid) not in orphans and len(orphans) == 1 and len(catalog.damaged) == 1:
            rid = int(orphans[0])
        if recording_id is not None and rid != recording_id:
            continue
        bad += 1
        who = f"recording {rid}" if rid is not None else "a recording (its id does not read)"
        click.echo(f"{who}: BAD catalog entry at offset {dr.offset}: {dr.reason}; " + REBUILD_HINT.format(dir=adir))
    if recording_id is not None and not bad:
        descriptors = [_descriptor(catalog, recording_id)]
    else:
        descriptors = [] if recording_id is not None else list(catalog)
    for d in descriptors:
        r = verify_recording(adir, d)
        if r.ok:
            click.echo(
                f"recording {d.recording_id}: OK, {r.frames} frames, [{d.start_position}, {r.checked_to}), "
                f"checked: {r.checks}"
            )
        else:
            bad += 1
            click.echo(
                f"recording {d.recording_id}: BAD at position {r.bad_position} "
                f"(after {r.frames} good frames): {r.reason} (checked: {r.checks})"
            )
    if bad:
        raise SystemExit(1)


@archive.command()
@_dir_option
def rebuild(directory: Path) -> None:
    """Rebuild damaged catalog entries from the segment files (the node must be stopped).

    Sound entries are kept; the old catalog is kept beside the new one. Run `verify` after it."""
    adir = (
        _archive_dir(directory)
        if (directory / CATALOG_FILE_NAME).exists() or (directory / "archive" / CATALOG_FILE_NAME).exists()
        else (directory / "archive" if (directory / "archive").is_dir() else directory)
    )
    fd = _locked(adir, "rebuild its catalog")
    try:
        try:
            result = rebuild_catalog(adir)
        except (RebuildError, OSError) as e:
            raise click.ClickException(f"cannot rebuild the catalog of {adir}: {e}") from None
    finally:
        os.close(fd)
    for line in result.notes:
        click.echo(line)
    if not result.rebuilt and result.old_catalog is None:
        return
    rebuilt = ", ".join(map(str, result.rebuilt)) or "none"
    click.echo(
        f"catalog of {adir} rebuilt: recordings rebuilt from their segment files: {rebuilt}; "
        f"kept: {', '.join(map(str, result.kept)) or 'none'}"
        + (f"; the old catalog is {result.old_catalog.name}" if result.old_catalog else "")
    )


@archive.command()
@_dir_option
@click.argument("recording_id", type=int)
@click.argument("position", type=int)
def truncate(directory: Path, recording_id: int, position: int) -> None:
    """Cut a stopped recording at POSITION (the archive must not be running)."""
    adir = _archive_dir(directory)
    fd = _locked(adir, "truncate (or truncate through it)")
    try:
        catalog = _catalog(adir)
        d = _descriptor(catalog, recording_id)
        stop = d.stop_position if d.stop_position != NULL_POSITION else recovered_end(adir, d)
        if not is_aligned(position) or not d.start_position <= position <= stop:
            raise click.ClickException(
                f"position {position} must be 32-byte aligned and within [{d.start_position}, {stop}]"
            )
        catalog.update_recording_stopped(recording_id, position, d.stop_timestamp if d.stop_timestamp >= 0 else 0)
        path = adir / CATALOG_FILE_NAME
        cfd = os.open(path, os.O_RDWR)
        try:
            for r in catalog.take_dirty():
                os.pwrite(cfd, catalog.view(r), r.start)
            os.fsync(cfd)
        finally:
            os.close(cfd)
        truncate_segments(adir, d, position, sync_level=1)
        click.echo(f"recording {recording_id} truncated at {position} (was {_stop_text(d)})")
    finally:
        os.close(fd)


def _store(adir: Path) -> CatalogStore:
    try:
        return CatalogStore(adir, sync_level=1)
    except ArchiveStorageError as e:
        raise click.ClickException(str(e)) from None


@archive.command("purge-segments")
@_dir_option
@click.argument("recording_id", type=int)
@click.option(
    "--before",
    "before",
    type=int,
    required=True,
    help="log position: every segment file wholly before it is removed (rounded down to a segment boundary)",
)
@_json_option
def purge_segments(directory: Path, recording_id: int, before: int, as_json: bool) -> None:
    """Remove the segment files of a recording wholly before a position (the node must be stopped).

    The recording's start position moves to the segment boundary at or before BEFORE, the catalog
    is synced, then the files go (oldest first). The segment holding the recording's last
    position is never removed. A running node does this itself (`cluster.purge_log`)."""
    adir = _archive_dir(directory)
    fd = _locked(adir, "purge segments")
    try:
        store = _store(adir)
        try:
            d = _descriptor(store.catalog, recording_id)
            end = d.stop_position if d.stop_position != NULL_POSITION else recovered_end(adir, d)
            if before < d.start_position:
                raise click.ClickException(
                    f"--before {before} precedes the recording's start position {d.start_position}"
                )
            new_start = segment_base_position(
                d.start_position, min(before, end), d.term_buffer_length, d.segment_file_length
            )
            first_end = (
                segment_base_position(d.start_position, d.start_position, d.term_buffer_length, d.segment_file_length)
                + d.segment_file_length
            )
            deleted = 0
            if new_start >= first_end:
                try:
                    detach_front(store, recording_id, new_start, end)
                except ValueError as e:
                    raise click.ClickException(str(e)) from None
            else:
                new_start = d.start_position
            deleted = delete_detached_segments(adir, store.catalog.get(recording_id), sync_level=2)
        finally:
            store.close()
    finally:
        os.close(fd)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "recording_id": recording_id,
                    "old_start_position": d.start_position,
                    "start_position": new_start,
                    "segment_files_removed": deleted,
                },
                indent=2,
            )
        )
    elif new_start == d.start_position and not deleted:
        click.echo(
            f"recording {recording_id}: nothing to purge before {before} (start position {d.start_position}, "
            f"segments of {d.segment_file_length} bytes)"
        )
    else:
        click.echo(
            f"recording {recording_id}: start position {d.start_position} -> {new_start}, "
            f"{deleted} segment file(s) removed"
        )


@archive.command("attach-segments")
@_dir_option
@click.argument("recording_id", type=int)
def attach_segments(directory: Path, recording_id: int) -> None:
    """Take back the detached segment files that join a recording's start (the node must be stopped)."""
    adir = _archive_dir(directory)
    fd = _locked(adir, "attach segments")
    try:
        store = _store(adir)
        try:
            d = _descriptor(store.catalog, recording_id)
            n = attach_front(store, recording_id)
            start = store.catalog.get(recording_id).start_position
        finally:
            store.close()
    finally:
        os.close(fd)
    click.echo(f"recording {recording_id}: {n} segment file(s) attached, start position {d.start_position} -> {start}")
