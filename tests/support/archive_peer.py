"""A media driver plus an archive in their own process, for the archive integration tests.

    python tests/support/archive_peer.py --dir NODE_DIR [--control-port P] [--replication-port R]
        [--response-port Q] [--segment-length N] [--term-length N] [--sync-level L] [--drop RATE]

The driver lives in ``NODE_DIR/driver`` (so a test process that opens a driver on the same
directory shares its IPC streams: the local control channel, recordings of IPC publications,
replays to IPC subscribers) and the archive in ``NODE_DIR/archive``. Prints ``READY pid=...``
once the archive serves requests, then runs until its stdin closes (or it is killed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cluster_node.archive.conductor import ArchiveConfig, open_archive
from cluster_node.media.driver import open_media_driver
from cluster_node.media.loss import LossConfig


def start_peer(args: list[str], name: str = "archive"):
    """Start this script as a child process; returns a ``tests.support.procs.Peer``."""
    import queue
    import subprocess
    import threading

    from tests.support.procs import ROOT, Peer

    peer = Peer.__new__(Peer)
    peer.name = name
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    peer.proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    peer.lines = queue.Queue()
    peer.seen = []
    peer.stderr = []
    threading.Thread(target=peer._pump, args=(peer.proc.stdout, peer.lines), daemon=True).start()
    threading.Thread(target=peer._pump_err, daemon=True).start()
    return peer


async def run(args) -> int:
    node = Path(args.dir)
    loss = None
    if args.drop:
        loss = LossConfig(drop_rate=args.drop, seed=args.seed, on_send=True, on_receive=True)
    async with open_media_driver(
        dir=node / "driver",
        network_term_length=args.term_length,
        ipc_term_length=args.term_length,
        status_message_timeout_ns=20_000_000,
        loss=loss,
        publication_linger_ns=5_000_000_000,
    ) as driver:
        config = ArchiveConfig(
            dir=node / "archive",
            control_channel=f"aeron:udp?endpoint=127.0.0.1:{args.control_port}" if args.control_port else None,
            replication_channel=(
                f"aeron:udp?endpoint=127.0.0.1:{args.replication_port}" if args.replication_port else None
            ),
            control_response_channel=(
                f"aeron:udp?endpoint=127.0.0.1:{args.response_port}" if args.response_port else None
            ),
            segment_file_length=args.segment_length,
            sync_level=args.sync_level,
        )
        async with open_archive(driver, config) as archive:
            repaired = ",".join(f"{r.recording_id}:{r.new_stop_position}" for r in archive.repairs) or "-"
            print(f"READY pid={os.getpid()} repaired={repaired}", flush=True)
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
    print("DONE", flush=True)
    return 0


def main() -> int:
    import logging

    import structlog

    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if os.environ.get("ARCHIVE_PEER_DEBUG") else logging.INFO
        ),
    )
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--control-port", type=int, default=0)
    p.add_argument("--replication-port", type=int, default=0)
    p.add_argument("--response-port", type=int, default=0)
    p.add_argument("--segment-length", type=int, default=1024 * 1024)
    p.add_argument("--term-length", type=int, default=256 * 1024)
    p.add_argument("--sync-level", type=int, default=0)
    p.add_argument("--drop", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    return trio.run(run, args)


if __name__ == "__main__":
    sys.exit(main())
