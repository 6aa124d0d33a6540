"""The documentation describes this repository and nothing else, and what it shows exists.

* No tracked file points at files outside the repository (a design document or a facts file of
  the reference kept next to it).
* README.md stays a user's page (at most about 300 lines); history goes to CHANGELOG.md.
* Every relative link in README.md and docs/*.md points at a file of the repository (and, with
  an anchor into a Markdown file, at one of its headings).
* Every ``cluster-node`` command line the docs show names commands and options the CLI has, every
  ``scripts/...`` benchmark option they show is one the script takes, and every config key they
  show (``timeouts.snapshot_timeout``) is one the config schema has.
* docs/configuration.md is what ``scripts/gen_config_doc`` makes of the schema, and every key has
  a meaning.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import click
import msgspec
import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
# Spelt in pieces so that this file does not mention them itself.
OUTSIDE_POINTERS = ("DESIGN" + ".md", "../" + "shared", "aeron-" + "facts", "facts" + ".md")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p]


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_no_file_points_outside_the_repository():
    offenders = []
    for path in _tracked():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for needle in OUTSIDE_POINTERS:
                if needle in line:
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {needle}")
    assert not offenders, "files outside the repository are referred to:\n" + "\n".join(offenders)


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail into docs/"
    )


# ------------------------------------------------------------------------------------ links


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def _linking_files() -> list[Path]:
    return [
        *_doc_files(),
        *(p for p in (ROOT / "CHANGELOG.md", ROOT / "cluster_node" / "archive" / "spark" / "README.md") if p.exists()),
    ]


@pytest.mark.parametrize("doc", _linking_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(doc: Path):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_code_blocks(doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


# ------------------------------------------------------------------------------------ commands


def _snippets(text: str) -> list[str]:
    """Command lines the doc shows: lines of code blocks and inline code spans."""
    out = []
    in_code = False
    pending = ""
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            line = pending + line.split("#", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
            pending = ""
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            out.append(line.strip())
        else:
            out.extend(re.findall(r"`([^`]+)`", line))
    return [s for s in out if s]


def _command_words(snippet: str) -> list[str] | None:
    s = snippet.replace("\\|", "|").strip()
    s = re.sub(r"^\S*\.venv/bin/", "", s)
    if s.startswith("scripts/run") and "--bench-media" not in s:
        s = "cluster-node up" + s[len("scripts/run") :]
    if not s.startswith("cluster-node "):
        return None
    s = re.sub(r"<[^>]*>", "PLACEHOLDER", s)  # <node dir>, <leader's dir>
    s = s.replace("[", " ").replace("]", " ").replace("...", " ")
    try:
        return shlex.split(s)[1:]
    except ValueError:
        return s.split()[1:]


def _options(cmd: click.Command) -> dict[str, click.Option]:
    opts = {"--help": None, "-h": None}
    for p in cmd.params:
        if isinstance(p, click.Option):
            for name in (*p.opts, *p.secondary_opts):
                opts[name] = p
    return opts


def _check_command(words: list[str], root: click.Group) -> list[str]:
    problems = []
    alternatives = " ".join(words).split("|")
    cmd: click.Command = root
    path = ["cluster-node"]
    first = alternatives[0].split()
    i = 0
    while i < len(first):
        tok = first[i]
        if tok.startswith("-") and len(tok) > 1 and not tok[1:].isdigit():
            name = tok.split("=", 1)[0]
            opts = _options(cmd)
            if name not in opts:
                problems.append(f"{' '.join(path)}: no option {name}")
            elif opts[name] is not None and not opts[name].is_flag and not opts[name].count and "=" not in tok:
                i += 1  # its value
        elif isinstance(cmd, click.Group):
            if tok not in cmd.commands:
                problems.append(f"{' '.join(path)}: no command {tok!r}")
                return problems
            cmd = cmd.commands[tok]
            path.append(tok)
        i += 1
    # "tool --dir D describe | pid | is-leader": every alternative names a command of the group.
    if len(alternatives) > 1 and len(path) >= 2:
        group = root
        for name in path[1:-1]:
            group = group.commands[name]
        if isinstance(group, click.Group) and path[-1] in group.commands and not isinstance(cmd, click.Group):
            leaf_takes_words = any(isinstance(p, click.Argument) for p in cmd.params)
            for alt in alternatives[1:]:
                words_ = alt.split()
                if not words_:
                    continue
                if words_[0] not in group.commands and not leaf_takes_words:
                    problems.append(f"{' '.join(path[:-1])}: no command {words_[0]!r}")
                if words_[0] in group.commands:
                    sub = group.commands[words_[0]]
                    for w in words_[1:]:
                        if w.startswith("--") and w.split("=", 1)[0] not in _options(sub):
                            problems.append(f"{' '.join(path[:-1])} {words_[0]}: no option {w}")
    return problems


def _script_option_problems(snippet: str) -> list[str]:
    m = re.search(r"(scripts/[\w.]+)((?:\s+\S+)*)", snippet.replace("\\|", "|"))
    if not m:
        return []
    script = ROOT / m.group(1)
    if not script.is_file():
        return [f"{m.group(1)}: no such script"]
    if script.name in ("run", "test", "ab"):
        return []
    source = script.read_text(encoding="utf-8")
    wrapped = {"simulate": "sim_cli.py", "fuzz_cluster": "fuzz_cli.py"}  # shell wrappers of Python command lines
    if script.name in wrapped:
        source = (ROOT / "tests" / "support" / wrapped[script.name]).read_text(encoding="utf-8")
    return [
        f"{m.group(1)}: no option {opt}"
        for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2))
        if f'"{opt}"' not in source and f"'{opt}'" not in source and opt != "--help"
    ]


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_shown_exist(doc: Path):
    from cluster_node.cli import main

    problems = []
    for snippet in _snippets(doc.read_text(encoding="utf-8")):
        words = _command_words(snippet)
        if words is not None:
            problems += [f"`{snippet}`: {p}" for p in _check_command(words, main)]
        elif "scripts/" in snippet and "--" in snippet:
            problems += [f"`{snippet}`: {p}" for p in _script_option_problems(snippet)]
    assert not problems, f"{doc.relative_to(ROOT)}:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------ config keys


def _config_keys() -> dict[str, set[str]]:
    from cluster_node import config

    sections = {
        "node": config.NodeSection,
        "cluster": config.ClusterSection,
        "timeouts": config.TimeoutsSection,
        "driver": config.DriverSection,
        "archive": config.ArchiveSection,
        "logging": config.LoggingSection,
        "client": config.ClientSection,
        "auth": config.AuthSection,
    }
    return {name: {f.name.removesuffix("_ns") for f in msgspec.structs.fields(cls)} for name, cls in sections.items()}


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_config_keys_shown_exist(doc: Path):
    keys = _config_keys()
    text = _without_code_blocks(doc.read_text(encoding="utf-8"))
    shown = set()
    for span in (s for line in text.splitlines() for s in re.findall(r"`([^`]+)`", line)):
        shown |= set(
            re.findall(
                r"(?<![\w./])(node|cluster|timeouts|driver|archive|logging|client|auth)\.([a-z_]+)\b(?!\.)", span
            )
        )
        shown |= {
            (s, k)
            for s, k in re.findall(r"^\[(node|cluster|timeouts|driver|archive|logging|client|auth)\] ([a-z_]+)", span)
        }
    from cluster_node.service.api import Cluster

    service_api = set(dir(Cluster))  # `cluster.offer(...)`, `cluster.time`: the service's Cluster, not [cluster]
    unknown = sorted(
        f"{s}.{k}"
        for s, k in shown
        if k not in keys[s] and k not in ("toml", "py", "log", "dat") and not (s == "cluster" and k in service_api)
    )
    assert shown or doc.name != "README.md", "the README shows no config key: has the pattern stopped matching?"
    assert not unknown, f"{doc.relative_to(ROOT)}: config keys the schema does not have: {unknown}"


# ------------------------------------------------------------------------------------ configuration.md


def _config_doc_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_doc", ROOT / "scripts" / "config_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_matches_the_schema():
    doc = ROOT / "docs" / "configuration.md"
    assert doc.read_text(encoding="utf-8") == _config_doc_module().render(), (
        "docs/configuration.md differs from cluster_node/config.py: run scripts/gen_config_doc"
    )


def test_every_config_key_has_a_meaning():
    missing = [f"{section}.{key}" for section, key, _, _, meaning in _config_doc_module().keys() if not meaning]  # noqa: SIM118 - a function, not a dict
    assert not missing, (
        f"config keys without a docstring in cluster_node/config.py nor a line in scripts/config_doc.py: {missing}"
    )
