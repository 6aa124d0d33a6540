"""Config units: durations (``"200ms"``) and sizes (``"64m"``) as the TOML files write them, and
the one error every config problem is reported as."""

from __future__ import annotations

import re

__all__ = ["ConfigError", "parse_duration_ns", "format_duration", "parse_size", "format_size"]


class ConfigError(ValueError):
    """A configuration that cannot be used. The message is one line naming the file and the key."""


_S = 1_000_000_000
_MS = 1_000_000
_US = 1_000
_DURATION_UNITS = {
    "ns": 1,
    "us": _US,
    "µs": _US,
    "ms": _MS,
    "s": _S,
    "min": 60 * _S,
    "h": 3600 * _S,
}
_DURATION_RE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9_]+)?)\s*([a-zµ]+)\s*$")
_SIZE_RE = re.compile(r"^\s*([0-9][0-9_]*)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_duration_ns(value: object, key: str = "duration") -> int:
    """``"200ms"`` -> 200_000_000. Integers are refused here: a bare number has no unit."""
    if not isinstance(value, str):
        raise ConfigError(
            f'{key}: expected a duration with a unit such as "200ms" or "1s", got {value!r}'
            f" (or give nanoseconds as {key}_ns)"
        )
    m = _DURATION_RE.match(value)
    if not m or m.group(2) not in _DURATION_UNITS:
        raise ConfigError(
            f"{key}: {value!r} is not a duration (use a number and one of "
            f'{", ".join(u for u in _DURATION_UNITS if u != "µs")}, e.g. "200ms")'
        )
    number = m.group(1).replace("_", "")
    unit = _DURATION_UNITS[m.group(2)]
    if "." in number:
        whole, frac = number.split(".")
        ns = int(whole) * unit + int(frac.ljust(18, "0")[:18]) * unit // 10**18
    else:
        ns = int(number) * unit
    return ns


def format_duration(ns: int) -> str:
    """The shortest exact human form of a duration: 1_000_000_000 -> ``"1s"``, 1_500_000 -> ``"1500us"``."""
    for unit, mult in (("h", 3600 * _S), ("min", 60 * _S), ("s", _S), ("ms", _MS), ("us", _US)):
        if ns and ns % mult == 0:
            return f"{ns // mult}{unit}"
    return f"{ns}ns"


def parse_size(value: object, key: str = "size") -> int:
    """``"64k"`` -> 65536; integers pass through."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size in bytes, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(m.group(1).replace("_", "")) * _SIZE_MULT[m.group(2).lower()]
    raise ConfigError(f'{key}: {value!r} is not a size (bytes, or a number with k, m or g, e.g. "64m")')


def format_size(n: int) -> str | int:
    for suffix, mult in (("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if n and n % mult == 0:
            return f"{n // mult}{suffix}"
    return n


def _prefixed(source: str, ex: ConfigError) -> ConfigError:
    """The error with ``<source>: `` in front, once."""
    msg = str(ex)
    return ex if msg.startswith(f"{source}: ") else ConfigError(f"{source}: {msg}")
