"""Loggers for code that runs inside other people's processes (the cluster client library and
the media driver it embeds): silent unless the application configured logging.

structlog's default, when nobody configured it, prints every event, debug included, to stdout:
an application that only imported the client found driver and client lines in its own output.
A :class:`LibraryLogger` sends each event to structlog when the process configured structlog
(``cluster-node`` does, see ``cluster_node.logsetup``), and otherwise to the standard ``logging``
logger of the same name, which has a ``NullHandler``: nothing is printed unless the application
configures ``logging`` (``logging.basicConfig(level=logging.INFO)`` shows them).
"""

from __future__ import annotations

import logging

import structlog

__all__ = ["LibraryLogger", "library_logger"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class LibraryLogger:
    """``debug``/``info``/``warning``/``error(event, **fields)`` like a structlog logger."""

    __slots__ = ("name", "_structlog", "_logging")

    def __init__(self, name: str) -> None:
        self.name = name
        self._structlog = structlog.get_logger(name)
        self._logging = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in self._logging.handlers):
            self._logging.addHandler(logging.NullHandler())

    def _emit(self, level: str, event: str, fields: dict) -> None:
        if structlog.is_configured():
            getattr(self._structlog, level)(event, **fields)
            return
        std = self._logging
        number = _LEVELS[level]
        if not std.isEnabledFor(number):
            return
        exc_info = fields.pop("exc_info", None)
        text = " ".join([event, *(f"{k}={v!r}" for k, v in fields.items())])
        std.log(number, "%s", text, exc_info=exc_info)

    def debug(self, event: str, **fields) -> None:
        self._emit("debug", event, fields)

    def info(self, event: str, **fields) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields) -> None:
        self._emit("error", event, fields)


def library_logger(name: str) -> LibraryLogger:
    return LibraryLogger(name)
