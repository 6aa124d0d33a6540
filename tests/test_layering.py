"""The project's layering rules (docs/architecture.md, "Layers"), checked on the source.

* Three layers in one package: ``cluster_node.media`` imports nothing else of ``cluster_node``;
  ``cluster_node.archive`` nothing but ``cluster_node.media``; the rest (consensus, service,
  clients, CLI) builds on both.
* A module whose docstring's first line ends with ``(core)`` is sans-I/O. "I/O" here means
  anything that waits, reads the world or changes it: an event loop or threads (trio, asyncio,
  threading, multiprocessing, concurrent), the network (socket, select, selectors), files and
  processes (os, io, pathlib, shutil, tempfile, mmap, fcntl, subprocess, signal), the clock (time,
  datetime) and logging (structlog, logging: a core reports what happened in its outputs, the
  shell logs it). A core imports none of these, and calls none of the builtins ``open``,
  ``print`` and ``input``. Time arrives as ``now_ns`` and randomness is injected (``random`` is
  allowed for the ``random.Random`` a caller passes in).
* Importing a core pulls in no I/O either: the project modules it imports at its top level
  (``TYPE_CHECKING`` imports aside), and theirs in turn, import none of the modules above. So a
  core cannot reach the clock or the disk through a helper module that is not marked.
* Outside ``media``, the media driver is used through its package (``cluster_node.media.driver``), never
  through its modules (conductor, sender and receiver agents, invoker...).
* ``cluster_node/cli/`` modules read the media layer's file formats only, and never import the
  consensus agent: the logic behind a command lives in a module it calls.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A layer is a subpackage of cluster_node, with what it may import of cluster_node besides itself.
LAYERS = {"media": ("cluster_node.media",), "archive": ("cluster_node.media", "cluster_node.archive")}
FORBIDDEN_IN_CORE = {
    # event loops and threads
    "trio",
    "asyncio",
    "threading",
    "multiprocessing",
    "concurrent",
    # the network
    "socket",
    "select",
    "selectors",
    # files and processes
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "mmap",
    "fcntl",
    "subprocess",
    "signal",
    # the clock
    "time",
    "datetime",
    # logging
    "structlog",
    "logging",
}
FORBIDDEN_CALLS_IN_CORE = {"open", "print", "input"}
# Modules that must be core: if one of them loses its marker the test fails instead of passing quietly.
EXPECTED_CORE = {
    "cluster_node/media/channel.py",
    "cluster_node/media/frames.py",
    "cluster_node/media/sender_core.py",
    "cluster_node/media/receiver_core.py",
    "cluster_node/media/loss.py",
    "cluster_node/media/framescan.py",
    "cluster_node/media/outcomes.py",
    "cluster_node/archive/segments.py",
    "cluster_node/archive/catalog.py",
    "cluster_node/archive/catalog_layout.py",
    "cluster_node/archive/checksums.py",
    "cluster_node/codecs/__init__.py",
    "cluster_node/codecs/messages.py",
    "cluster_node/codecs/schema.py",
    "cluster_node/codecs/session_message.py",
    "cluster_node/codecs/streams.py",
    "cluster_node/consensus/auth.py",
    "cluster_node/consensus/backup.py",
    "cluster_node/consensus/cluster_clock.py",
    "cluster_node/consensus/cluster_session.py",
    "cluster_node/consensus/effect_policy.py",
    "cluster_node/consensus/effects.py",
    "cluster_node/consensus/election.py",
    "cluster_node/consensus/members.py",
    "cluster_node/consensus/message_runs.py",
    "cluster_node/consensus/module.py",
    "cluster_node/consensus/pending.py",
    "cluster_node/consensus/module_inputs.py",
    "cluster_node/consensus/control_core.py",
    "cluster_node/consensus/snapshot_tracker.py",
    "cluster_node/consensus/termination_core.py",
    "cluster_node/consensus/recording_log.py",
    "cluster_node/consensus/response_channel.py",
    "cluster_node/consensus/session_effects.py",
    "cluster_node/consensus/session_proxy.py",
    "cluster_node/consensus/sessions.py",
    "cluster_node/consensus/snapshot.py",
    "cluster_node/consensus/timers.py",
    "cluster_node/service/agent.py",
}


def _modules():
    """Every module of the package, with its layer (``media``, ``archive`` or ``cluster_node``)."""
    for path in sorted((ROOT / "cluster_node").rglob("*.py")):
        parts = path.relative_to(ROOT / "cluster_node").parts
        yield (parts[0] if len(parts) > 1 and parts[0] in LAYERS else "cluster_node"), path


def _outside_layer(layer: str, name: str) -> bool:
    """Whether importing module ``name`` from ``layer`` reaches a layer above it."""
    if layer not in LAYERS or not (name == "cluster_node" or name.startswith("cluster_node.")):
        return False
    return not any(name == ok or name.startswith(ok + ".") for ok in LAYERS[layer])


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


_TREES = {_module_name(path): ast.parse(path.read_text(), filename=str(path)) for _, path in _modules()}


def _top_level_imports(tree: ast.Module) -> set[str]:
    """What importing the module imports: its module-level imports (inside ``if``/``try`` too),
    not those in functions (run later, by a caller that chose to) nor ``if TYPE_CHECKING:``
    ones (never run). ``from pkg import mod`` counts as importing ``pkg.mod`` when that is a
    module of the project."""
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(
                f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in _TREES
            )
    return names


def _project_closure(module: str) -> dict[str, str]:
    """Every project module importing ``module`` imports, with the module that imports it."""
    via: dict[str, str] = {}
    pending = [module]
    while pending:
        current = pending.pop()
        for name in _top_level_imports(_TREES[current]):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in _TREES and prefix not in via and prefix != module:
                    via[prefix] = current
                    pending.append(prefix)
    return via


def _is_core(tree: ast.Module) -> bool:
    doc = ast.get_docstring(tree) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return first.rstrip().rstrip(".").endswith("(core)")


@pytest.mark.parametrize("pkg,path", list(_modules()), ids=lambda v: str(v))
def test_module_respects_layers(pkg: str, path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = _imports(tree)
    tops = {name.split(".")[0] for name in imported}
    bad = sorted(name for name in imported if _outside_layer(pkg, name))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}, against the layering"
    if _is_core(tree):
        bad_core = tops & FORBIDDEN_IN_CORE
        assert not bad_core, f"core module {path.relative_to(ROOT)} imports {sorted(bad_core)}"
        calls = {
            node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS_IN_CORE
        }
        assert not calls, f"core module {path.relative_to(ROOT)} calls {sorted(calls)}"
    if pkg != "media":
        internals = sorted(name for name in imported if name.startswith("cluster_node.media.driver."))
        assert not internals, (
            f"{path.relative_to(ROOT)} imports {internals}: use the media driver through its "
            f"package, cluster_node.media.driver"
        )


CORE_MODULES = sorted(name for name, tree in _TREES.items() if _is_core(tree))


@pytest.mark.parametrize("module", CORE_MODULES)
def test_importing_a_core_module_imports_no_io(module: str) -> None:
    via = _project_closure(module)
    for dependency in [module, *sorted(via)]:
        bad = {name.split(".")[0] for name in _top_level_imports(_TREES[dependency])} & FORBIDDEN_IN_CORE
        if bad:
            chain = [dependency]
            while chain[-1] != module:
                chain.append(via[chain[-1]])
            pytest.fail(f"importing core module {module} imports {sorted(bad)} through {' <- '.join(chain)}")


def test_expected_core_modules_are_marked() -> None:
    for rel in sorted(EXPECTED_CORE):
        path = ROOT / rel
        if not path.exists():
            continue
        assert _is_core(ast.parse(path.read_text())), f"{rel} must be marked (core) in its docstring"


# The command line is a shell over what the package's modules do: a command may read the media
# layer's file formats (the counters file, the distinct-error tables, private file modes, channel
# text), never drive the media driver or the consensus agent itself.
CLI_MEDIA_ALLOWED = {
    "cluster_node.media.counters",
    "cluster_node.media.distinct_errors",
    "cluster_node.media.private_files",
    "cluster_node.media.channel",
}
CLI_FORBIDDEN = {"cluster_node.consensus.agent"}


@pytest.mark.parametrize("path", sorted((ROOT / "cluster_node" / "cli").glob("*.py")), ids=lambda p: p.name)
def test_cli_modules_import_no_driver_internals(path: Path) -> None:
    imported = _imports(ast.parse(path.read_text(), filename=str(path)))
    media = {name for name in imported if name == "cluster_node.media" or name.startswith("cluster_node.media.")}
    bad = (media - CLI_MEDIA_ALLOWED) | (imported & CLI_FORBIDDEN)
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: put that logic in a module the command calls"
