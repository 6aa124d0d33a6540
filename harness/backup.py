"""A ``cluster-node backup`` process and its directory, for the tests and the backup benchmark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.storage import CATALOG_FILE_NAME
from cluster_node.identifiers import StreamIds
from harness.cluster import ROOT, TestCluster, _node_command

__all__ = ["Backup"]


class Backup:
    """A ``cluster-node backup`` process and its directory."""

    def __init__(
        self,
        cluster: TestCluster,
        base: Path,
        query_interval: str = "1h",
        secret_file: str = "",
        image_liveness_timeout: str = "2s",
        progress_timeout: str | None = None,
        credentials_file: str = "",
    ) -> None:
        self.dir = base / "backup"
        self.config = base / "backup.toml"
        self.config.write_text(
            "[backup]\n"
            f'dir = "{self.dir}"\n'
            'host = "127.0.0.1"\n'
            f'query_interval = "{query_interval}"\n'
            'response_timeout = "1s"\n'
            'cool_down = "1s"\n'
            + (f'progress_timeout = "{progress_timeout}"\n' if progress_timeout is not None else "")
            + (f'credentials_file = "{credentials_file}"\n' if credentials_file else "")
            + "[cluster]\n"
            f'members = "{cluster.nodes[0].cfg.members_text}"\n'
            + (f'secret_file = "{secret_file}"\n' if secret_file else "")
            + "[driver]\n"
            f'image_liveness_timeout = "{image_liveness_timeout}"\n'
            'publication_connection_timeout = "2s"\n'
            'term_length = "4m"\n'
            'ipc_term_length = "4m"\n'
        )
        self.out = base / "backup.out"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [*_node_command(), "backup", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code once the process ended by itself within ``timeout_s``; None if it runs on."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(20)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stat(self) -> dict:
        r = subprocess.run(
            [*_node_command(), "stat", "--dir", str(self.dir), "--json"], capture_output=True, text=True, timeout=30
        )
        if r.returncode != 0:
            return {}
        return json.loads(r.stdout).get("backup", {})

    def describe(self) -> str:
        text = self.out.read_text(errors="replace")[-3000:] if self.out.exists() else ""
        logs = self.dir / "logs" / "backup.log"
        tail = "\n".join(logs.read_text(errors="replace").splitlines()[-30:]) if logs.exists() else ""
        return f"---- backup output ----\n{text}\n---- backup log ----\n{tail}"

    def events(self, name: str) -> list[dict]:
        """The backup's JSON log lines with this event name."""
        path = self.dir / "logs" / "backup.log"
        out = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == name:
                out.append(e)
        return out

    def log_recording(self):
        catalog = Catalog.from_bytes((self.dir / "archive" / CATALOG_FILE_NAME).read_bytes(), strict=False)
        recs = [d for d in catalog if d.stream_id == StreamIds.LOG]
        assert len(recs) == 1, recs
        return recs[0]
