"""The public API: what ``cluster_node`` exports for service authors and client applications.

* every name in ``cluster_node.__all__`` imports (``from cluster_node import X``), and is the object
  its module defines;
* ``import cluster_node`` imports none of them (nor trio, the media driver, msgspec): a service
  module or a script pays only for what it names;
* the Python examples in README.md and docs/service.md import the project through ``cluster_node``
  only, and every name they import from it is exported.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cluster_node

ROOT = Path(__file__).resolve().parents[2]
DOCS_WITH_EXAMPLES = ("README.md", "docs/service.md")


def test_all_is_sorted_and_covers_what_services_and_clients_need() -> None:
    assert cluster_node.__all__ == sorted(cluster_node.__all__)
    for name in (
        "ClusteredService",
        "Cluster",
        "ClientSession",
        "open_cluster_client",
        "BlockingClusterClient",
        "SharedSecretCredentials",
        "load_client_config",
        "ExitCode",
    ):
        assert name in cluster_node.__all__


@pytest.mark.parametrize("name", cluster_node.__all__)
def test_every_exported_name_imports(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from cluster_node import {name}", namespace)
    value = namespace[name]
    home = importlib.import_module(value.__module__)
    assert getattr(home, name) is value


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError):
        cluster_node.NoSuchName  # noqa: B018
    from cluster_node import codecs

    assert codecs.SCHEMA_ID == 111


def test_importing_the_package_imports_nothing_else() -> None:
    code = (
        "import sys, cluster_node; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('cluster_node', 'media', 'archive', 'trio', 'msgspec', 'structlog', 'typing')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "['cluster_node']"


def _python_blocks(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^ *```python\n(.*?)^ *```", text, re.S | re.M)]


@pytest.mark.parametrize("doc", DOCS_WITH_EXAMPLES)
def test_doc_examples_import_from_the_public_api(doc: str) -> None:
    imports = []
    for block in _python_blocks((ROOT / doc).read_text()):
        lines = block.splitlines()
        indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
        tree = ast.parse("\n".join(line[indent:] for line in lines))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("cluster_node",):
                imports.append(node)
            elif isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] in ("cluster_node",) for a in node.names)
    assert imports, f"{doc} shows no import of the project"
    for node in imports:
        assert node.module == "cluster_node", f"{doc}: 'from {node.module} import ...': import from cluster_node"
        missing = [a.name for a in node.names if a.name not in cluster_node.__all__]
        assert not missing, f"{doc}: {missing} are not in cluster_node.__all__"
