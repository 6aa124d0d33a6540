"""The project's layering rules (docs/architecture.md, "Layers"), checked on the source.

* ``media`` imports nothing from ``archive`` or ``cluster_node``; ``archive`` nothing from
  ``cluster_node``.
* A module whose docstring's first line ends with ``(core)`` is sans-I/O: it imports no trio, no
  sockets, no clock, no threads, no mmap. Time arrives as ``now_ns`` and randomness is injected.
* ``cluster_node/cli/`` modules read the media layer's file formats only, and never import the
  consensus agent: the logic behind a command lives in a module it calls.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("media", "archive", "cluster_node")
FORBIDDEN_LAYERS = {"media": {"archive", "cluster_node"}, "archive": {"cluster_node"}, "cluster_node": set()}
FORBIDDEN_IN_CORE = {"trio", "socket", "select", "selectors", "asyncio", "time", "threading", "mmap"}
# Modules that must be core: if one of them loses its marker the test fails instead of passing quietly.
EXPECTED_CORE = {
    "media/channel.py",
    "media/frames.py",
    "media/sender_core.py",
    "media/receiver_core.py",
    "media/loss.py",
    "media/framescan.py",
    "archive/segments.py",
    "archive/catalog.py",
    "archive/checksums.py",
    "cluster_node/consensus/backup.py",
    "cluster_node/consensus/effects.py",
    "cluster_node/consensus/election.py",
    "cluster_node/consensus/members.py",
    "cluster_node/consensus/module.py",
    "cluster_node/consensus/module_inputs.py",
    "cluster_node/consensus/control_core.py",
    "cluster_node/consensus/snapshot_tracker.py",
    "cluster_node/consensus/termination_core.py",
    "cluster_node/consensus/recording_log.py",
}


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _is_core(tree: ast.Module) -> bool:
    doc = ast.get_docstring(tree) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return first.rstrip().rstrip(".").endswith("(core)")


@pytest.mark.parametrize("pkg,path", list(_modules()), ids=lambda v: str(v))
def test_module_respects_layers(pkg: str, path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = _imports(tree)
    tops = {name.split(".")[0] for name in imported}
    bad = tops & FORBIDDEN_LAYERS[pkg]
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}, against the layering"
    if _is_core(tree):
        bad_core = tops & FORBIDDEN_IN_CORE
        assert not bad_core, f"core module {path.relative_to(ROOT)} imports {sorted(bad_core)}"


def test_expected_core_modules_are_marked() -> None:
    for rel in sorted(EXPECTED_CORE):
        path = ROOT / rel
        if not path.exists():
            continue
        assert _is_core(ast.parse(path.read_text())), f"{rel} must be marked (core) in its docstring"


# The command line is a shell over what the package's modules do: a command may read the media
# layer's file formats (the counters file, the distinct-error tables, private file modes, channel
# text), never drive the media driver or the consensus agent itself.
CLI_MEDIA_ALLOWED = {"media.counters", "media.distinct_errors", "media.private_files", "media.channel"}
CLI_FORBIDDEN = {"cluster_node.consensus.agent"}


@pytest.mark.parametrize("path", sorted((ROOT / "cluster_node" / "cli").glob("*.py")), ids=lambda p: p.name)
def test_cli_modules_import_no_driver_internals(path: Path) -> None:
    imported = _imports(ast.parse(path.read_text(), filename=str(path)))
    media = {name for name in imported if name == "media" or name.startswith("media.")}
    bad = (media - CLI_MEDIA_ALLOWED) | (imported & CLI_FORBIDDEN)
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: put that logic in a module the command calls"
