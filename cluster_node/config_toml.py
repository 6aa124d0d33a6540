"""Writing configs back as TOML that loads to equal Structs: durations and sizes in their short
form, sections with only default values left out, and the members one inline table a line.

Hand-written rather than ``tomli-w``: that library writes the member list as ``[[cluster.members]]``
tables after the other cluster keys, so a generated file would no longer read as the
reference's one-line-per-member layout the docs and the committed configs show."""

from __future__ import annotations

from typing import Any

import msgspec

from cluster_node.config_schema import _SIZE_FIELDS, CLIENT_DRIVER_DEFAULTS, ClientConfig, ClusterSection, NodeConfig
from cluster_node.config_units import format_duration, format_size

__all__ = ["node_config_to_toml", "client_config_to_toml"]


def _toml_value(name: str, value: Any) -> tuple[str, str]:
    if isinstance(value, bool):
        return name, "true" if value else "false"
    if name.endswith("_ns") and isinstance(value, int):
        return name[:-3], f'"{format_duration(value)}"'
    if name in _SIZE_FIELDS and isinstance(value, int):
        v = format_size(value)
        return name, f'"{v}"' if isinstance(v, str) else str(v)
    if isinstance(value, int):
        return name, str(value)
    if isinstance(value, str):
        return name, '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return name, "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return name, "[" + ", ".join(_toml_value(name, v)[1] for v in value) + "]"
    raise TypeError(f"cannot write {name}={value!r} as TOML")


def _toml_table(title: str, obj: msgspec.Struct, only_changed: bool) -> list[str]:
    default = type(obj)() if only_changed else None
    lines = [f"[{title}]"]
    for f in msgspec.structs.fields(obj):
        value = getattr(obj, f.name)
        if default is not None and getattr(default, f.name) == value:
            continue
        k, v = _toml_value(f.name, value)
        lines.append(f"{k} = {v}")
    return lines


def node_config_to_toml(cfg: NodeConfig, header: str = "") -> str:
    """TOML text that :func:`parse_node_config` reads back to an equal config (sections with only
    default values are left out; members use the reference's one-line format per member)."""
    out: list[str] = [f"# {line}" for line in header.splitlines()]
    out += _toml_table("node", cfg.node, only_changed=False)
    out.append("")
    out.append("[cluster]")
    out.append("members = [")
    for m in cfg.cluster.members:
        out.append(
            f'  {{ id = {m.id}, ingress = "{m.ingress}", consensus = "{m.consensus}", '
            f'log = "{m.log}", catchup = "{m.catchup}", archive = "{m.archive}" }},'
        )
    out.append("]")
    default_cluster = ClusterSection(members=())
    for f in msgspec.structs.fields(cfg.cluster):
        value = getattr(cfg.cluster, f.name)
        if f.name != "members" and value != getattr(default_cluster, f.name):
            k, v = _toml_value(f.name, value)
            out.append(f"{k} = {v}")
    for title in ("timeouts", "driver", "archive", "logging", "auth"):
        section = getattr(cfg, title)
        lines = _toml_table(title, section, only_changed=True)
        if len(lines) > 1:
            out.append("")
            out += lines
    return "\n".join(out) + "\n"


def client_config_to_toml(cfg: ClientConfig, header: str = "") -> str:
    out: list[str] = [f"# {line}" for line in header.splitlines()]
    out += _toml_table("client", cfg.client, only_changed=False)
    base = CLIENT_DRIVER_DEFAULTS
    lines = ["[driver]"]
    for f in msgspec.structs.fields(cfg.driver):
        value = getattr(cfg.driver, f.name)
        if getattr(base, f.name) != value:
            k, v = _toml_value(f.name, value)
            lines.append(f"{k} = {v}")
    if len(lines) > 1:
        out.append("")
        out += lines
    return "\n".join(out) + "\n"
