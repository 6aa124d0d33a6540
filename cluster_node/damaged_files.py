"""The node's own files, read before anything starts: a damaged one ends the start with one line.

The archive catalog, ``recording.log`` and ``node-state.dat`` are decoded again where the
archive and the consensus module open them, deep inside the driver's and the archive's task
groups; a damaged one surfaced there as a traceback or an "internal error". Reading them first,
with the same decoders, gives the operator one line that names the file, the offset where the
damage was found and what to do, and a distinct exit code (``ExitCode.DATA_DAMAGED``), before any
file is changed. A file that does not exist yet is not damage: the node creates it.

Damage the node repairs by itself is not refused here: a ``recording.log`` torn at its tail by a
crash mid-append (cut off and logged), a torn node-state slot (the other slot is used), a catalog
record whose checksum alone is wrong, and the mark file, which every start rewrites.
"""

from __future__ import annotations

from pathlib import Path

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import CatalogError
from cluster_node.archive.storage import CATALOG_FILE_NAME
from cluster_node.consensus.node_files import NODE_STATE_FILE_NAME, NodeStateError, NodeStateFile
from cluster_node.consensus.recording_log import NULL_VALUE, RecordingLog, RecordingLogError
from cluster_node.consensus.recording_log_file import RECORDING_LOG_FILE_NAME
from cluster_node.exit_codes import ExitCode, NodeFailure

__all__ = ["check_node_files", "damaged", "rebuild_hint"]


def rebuild_hint(node_dir: Path) -> str:
    """What always works for a member of a cluster: the others still have the log."""
    return (
        f"rebuild this member from the others: move {node_dir} aside and start the node again "
        f"(it copies the log from the leader)"
    )


def damaged(message: str) -> NodeFailure:
    """The failure a damaged file ends the start with; ``message`` names the file, the offset and
    what to do."""
    return NodeFailure(ExitCode.DATA_DAMAGED, message)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    # Any other OSError (permissions, a directory) is not damage: the open that follows reports it.
    except OSError:
        return None


def check_node_files(node_dir: Path, archive_dir: Path) -> None:
    """Raise :func:`damaged` for the first damaged file of the node; nothing when all can be used."""
    node_dir, archive_dir = Path(node_dir), Path(archive_dir)
    rebuild = rebuild_hint(node_dir)

    catalog = None
    path = archive_dir / CATALOG_FILE_NAME
    data = _read(path)
    if data is not None:
        try:
            catalog = Catalog.from_bytes(data, strict=False)
        except CatalogError as e:
            raise damaged(f"{path} is damaged ({e}): restore it from a backup, or {rebuild}") from None

    path = node_dir / RECORDING_LOG_FILE_NAME
    data = _read(path)
    if data is not None:
        try:
            rl = RecordingLog.decode(data)
        except RecordingLogError as e:
            raise damaged(f"{path} is damaged ({e}): restore it from a backup, or {rebuild}") from None
        last = rl.last_term()
        # (A catalog with a damaged entry is the archive's to refuse, naming that entry: the
        # recording this file names may be the damaged one.)
        if (
            catalog is not None
            and not catalog.damaged
            and last is not None
            and last.recording_id != NULL_VALUE
            and catalog.find(last.recording_id) is None
        ):
            raise damaged(
                f"{path} is damaged or belongs to another archive (its TERM entry at offset "
                f"{rl._offsets[last.entry_index]} names log recording {last.recording_id}, which "
                f"{archive_dir / CATALOG_FILE_NAME} does not have): restore the node directory from "
                f"one backup, or {rebuild}"
            )

    path = node_dir / NODE_STATE_FILE_NAME
    data = _read(path)
    if data is not None:
        try:
            NodeStateFile._parse(path, data)
        except NodeStateError as e:
            raise damaged(f"{e}: restore it from a backup, or {rebuild}") from None
