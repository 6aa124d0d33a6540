"""``cluster-node secret``: make the key files that members and clients share."""

from __future__ import annotations

from pathlib import Path

import click

from cluster_node.secret_file import SecretFileError, generate


@click.group()
def secret() -> None:
    """Key files for member-only traffic and client authentication (see docs/security.md)."""


@secret.command("generate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def generate_cmd(file: Path) -> None:
    """Write a new random 32-byte key to FILE (mode 0600); an existing FILE is never overwritten.

    Copy the file to every member over a channel you trust and name it in each member's config.
    """
    try:
        generate(file)
    except SecretFileError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote a new key to {file} (mode 0600)")
