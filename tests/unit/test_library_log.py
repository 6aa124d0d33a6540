"""The client library and its media driver print nothing unless the application configured
logging (structlog's unconfigured default prints every event to stdout)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_library_loggers_are_silent_unless_logging_is_configured():
    quiet = _run("""
        import cluster_node.client.cluster_client as c, cluster_node.media.driver as d
        c.log.info("connected", session=1); d.log.debug("udp publication added"); c.log.warning("reconnecting")
    """)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "" and quiet.stderr == ""
    configured = _run("""
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
        import cluster_node.client.cluster_client as c
        c.log.info("connected", session=1); c.log.debug("not shown")
    """)
    assert configured.stdout == "cluster_node.client connected session=1\n"


def test_library_loggers_follow_a_structlog_configuration():
    out = _run("""
        import structlog
        structlog.configure(processors=[structlog.processors.KeyValueRenderer(key_order=["event"])])
        import cluster_node.client.cluster_client as c
        c.log.info("connected", session=1)
    """)
    assert "event='connected' session=1" in out.stdout
