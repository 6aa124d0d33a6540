"""A node's components that fail end the process with their own exit code and one line.

The driver's and the archive's tasks run under cluster_node.media.task_failure; the node hooks them to
cluster_node.exit_codes.fail (``exit_on_component_failure``). A child process runs a real
driver (and archive) so wired, and a task of it is made to fail from the test's own script.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster_node.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import sys, trio
from cluster_node.media.driver import open_media_driver
from cluster_node.archive.conductor import open_archive
from cluster_node.exit_codes import ExitCode
from cluster_node.node import exit_on_component_failure

async def main(tmp):
    async with open_media_driver(dir=tmp + "/driver") as driver:
        exit_on_component_failure(driver, ExitCode.DRIVER_FAILED)
        async with open_archive(driver, dir=tmp + "/archive") as archive:
            exit_on_component_failure(archive, ExitCode.ARCHIVE_FAILED)
            print("READY", flush=True)
            {fault}
            await trio.sleep(30)
    sys.exit(99)  # not reached: the failure ends the process

trio.run(main, sys.argv[1])
"""


def _run_child(tmp_path, fault: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(_CHILD).replace("{fault}", fault)
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "fault,code,line",
    [
        (
            "driver._conductor_pass = lambda now: 1 // 0; driver._conductor_event.set()",
            ExitCode.DRIVER_FAILED,
            "media driver task 'conductor' failed: ZeroDivisionError",
        ),
        (
            "driver.receive_work = lambda: [][1]; driver._rx_wait.evict(); driver._park_timer.arm_at(0)",
            ExitCode.DRIVER_FAILED,
            "media driver task 'receiver' failed: IndexError",
        ),
        (
            "archive._on_request_bytes = lambda *a: {}['x']; "
            "trio.lowlevel.spawn_system_task(__import__('cluster_node.archive.client', fromlist=['x']).ArchiveClient.connect, driver)",
            ExitCode.ARCHIVE_FAILED,
            "archive task 'control' failed: KeyError",
        ),
    ],
    ids=["driver-conductor", "driver-receiver", "archive-control"],
)
def test_a_failed_component_task_ends_the_node_with_its_code_and_one_line(tmp_path, fault, code, line):
    done = _run_child(tmp_path, fault)
    assert done.returncode == int(code), done.stderr
    err = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"error: {line}") and err[0].endswith(f"(exit code {int(code)})"), (
        done.stderr
    )
