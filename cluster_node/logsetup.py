"""Logging configuration, in one place for every entry point.

Two renderings of the same structlog events:

* ``console``: readable, coloured when the stream is a terminal; for people running the CLI,
  benchmarks and tests.
* ``json``: one JSON object per line, appended to a file; for node processes, so that logs can be
  searched and fed to tools. Every line carries an ISO timestamp, the level and the logger name.

Library modules (``media``, ``archive``, ``cluster_node``) only ever call
``structlog.get_logger(name)``; what happens to the events is decided here, by the process that
starts up.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(
    mode: str = "console",
    level: str = "info",
    path: str | Path | None = None,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog for this process.

    ``mode`` is ``console`` or ``json``. With ``path`` the events go to that file (its parent directory
    is created), otherwise to ``stream`` (default stderr).
    """
    if mode not in ("console", "json"):
        raise ValueError(f"unknown log mode {mode!r}: use 'console' or 'json'")
    try:
        level_no = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(_LEVELS)}") from None

    if path is not None:
        path = Path(path)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        out: TextIO = open(fd, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    else:
        out = stream if stream is not None else sys.stderr

    processors: list = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if mode == "json":
        processors += [
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=out.isatty() if hasattr(out, "isatty") else False)]

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
