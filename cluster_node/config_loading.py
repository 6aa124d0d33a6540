"""Reading config files: TOML into the schema's Structs, with the units spelled out (``"200ms"``,
``"64m"``), unknown keys refused with a hint at the nearest known one, and every problem one
``ConfigError`` line naming the file and the key; then the checks of ``config_validation``."""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from cluster_node.config_schema import (
    _SIZE_FIELDS,
    CLIENT_DRIVER_DEFAULTS,
    BackupConfig,
    ClientConfig,
    ClusterMember,
    ClusterSection,
    NodeConfig,
    parse_cluster_members,
)
from cluster_node.config_units import ConfigError, _prefixed, parse_duration_ns, parse_size


def _struct_type(tp: Any) -> type | None:
    """The Struct class in a field type (``X`` or ``X | None``), else None."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        for arg in typing.get_args(tp):
            if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
                return arg
    return None


def _hint(key: str, known: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _normalise(cls: type, table: object, path: str) -> dict[str, Any]:
    """Check keys of ``table`` against ``cls``'s fields, convert units, recurse into sub-tables."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path or 'config'}: expected a table, got {type(table).__name__}")
    fields = {f.name: f for f in msgspec.structs.fields(cls) if f.name != "source"}
    accepted = set(fields) | {n[:-3] for n in fields if n.endswith("_ns")}
    out: dict[str, Any] = {}
    for key, value in table.items():
        full = _join(path, key)
        if key in fields:
            name = key
            if name.endswith("_ns"):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(
                        f'{full}: expected an integer of nanoseconds, got {value!r} (or write {key[:-3]} = "1s")'
                    )
            elif name in _SIZE_FIELDS:
                value = parse_size(value, full)
            elif name == "members" and cls is ClusterSection:
                value = _members_value(value, full)
            else:
                sub = _struct_type(fields[name].type)
                if sub is not None:
                    value = _normalise(sub, value, full)
        elif key + "_ns" in fields:
            name = key + "_ns"
            value = parse_duration_ns(value, full)
        else:
            raise ConfigError(f"{full}: unknown key{_hint(key, accepted)}")
        if name in out:
            raise ConfigError(f"{full}: given twice (as {key[:-3] if key.endswith('_ns') else key} and {name})")
        out[name] = value
    return out


def _members_value(value: object, key: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [msgspec.structs.asdict(m) for m in parse_cluster_members(value, key)]
    if isinstance(value, list):
        return [_normalise(ClusterMember, item, f"{key}[{i}]") for i, item in enumerate(value)]
    raise ConfigError(
        f'{key}: expected a member string "id,ingress,consensus,log,catchup,archive|..." or an array of tables'
    )


_MSGSPEC_ERR = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$")


def _convert(cls: type, data: dict[str, Any], source: str) -> Any:
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as ex:
        m = _MSGSPEC_ERR.match(str(ex))
        what, where = (m.group(1), m.group(2)) if m else (str(ex), "")
        where = (where or "").lstrip(".")
        where = re.sub(r"\.members\[(\d+)\]", r".members[\1]", where)
        what = what.replace("`", "")
        what = what[0].lower() + what[1:] if what else what
        missing = re.match(r"object missing required field (\w+)", what)
        if missing:
            where = _join(where, missing.group(1))
            what = "missing required key"
        raise ConfigError(f"{source}: {where or 'config'}: {what}") from None


def _load_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as ex:
        raise ConfigError(f"not valid TOML: {ex}") from None


def _parse(
    kind: type,
    text: str,
    source: str,
    required: tuple[str, ...],
    prepare: Callable[[dict[str, Any]], None] | None = None,
):
    """A validated config of ``kind`` from TOML text: normalised, its ``required`` tables present,
    ``prepare`` applied to the tables, converted and validated; raises ConfigError."""
    try:
        data = _normalise(kind, _load_toml(text, source), "")
    except ConfigError as ex:
        raise _prefixed(source, ex) from None
    for table in required:
        if table not in data:
            raise ConfigError(f"{source}: [{table}]: missing table")
    if prepare is not None:
        prepare(data)
    cfg = _convert(kind, data, source)
    cfg = msgspec.structs.replace(cfg, source=source)
    return cfg.validate()


def parse_node_config(text: str, source: str = "<config>") -> NodeConfig:
    """A validated NodeConfig from TOML text; raises ConfigError."""
    return _parse(NodeConfig, text, source, ("node", "cluster"))


def _client_driver_defaults(data: dict[str, Any]) -> None:
    if "driver" in data:
        # Keys not given keep the client's defaults, not the node's.
        base = msgspec.structs.asdict(CLIENT_DRIVER_DEFAULTS)
        base.update(data["driver"])
        data["driver"] = base


def parse_client_config(text: str, source: str = "<config>") -> ClientConfig:
    """A validated ClientConfig from TOML text; raises ConfigError."""
    return _parse(ClientConfig, text, source, ("client",), _client_driver_defaults)


def parse_backup_config(text: str, source: str = "<config>") -> BackupConfig:
    """A validated BackupConfig from TOML text; raises ConfigError."""
    return _parse(BackupConfig, text, source, ("backup", "cluster"))


def load_backup_config(path: str | Path) -> BackupConfig:
    """Read and validate a backup's TOML file; raises ConfigError with a one-line message."""
    return parse_backup_config(_read(path), str(path))


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as ex:
        raise ConfigError(f"{path}: cannot read: {ex}") from None


def load_node_config(path: str | Path) -> NodeConfig:
    """Read and validate a node's TOML file; raises ConfigError with a one-line message."""
    return parse_node_config(_read(path), str(path))


def load_client_config(path: str | Path) -> ClientConfig:
    return parse_client_config(_read(path), str(path))
