"""``cluster-node client``: talk to a running cluster from the shell.

::

    cluster-node client --config var/cluster/client.toml put greeting hello     -> OK
    cluster-node client --config var/cluster/client.toml get greeting           -> hello
    cluster-node client --config var/cluster/client.toml delete greeting        -> OK
    cluster-node client --config configs/client.toml send "hi"                  -> hi (echo service)
    cluster-node client --config configs/client.toml watch                      -> events until Ctrl-C
    cluster-node client --credentials-file alice.cred snapshot                  -> OK (an admin request)

Each call opens one client session (a private media driver, connect, redirect to the leader),
does its work and closes the session. ``put``/``get``/``delete``/``append`` speak the ``kv``
service's protocol (``cluster_node.service.examples.kv``) and match the reply by request id;
``send`` offers raw text and prints the first reply (the ``echo`` service sends it back).

``--timeout`` is one deadline for the whole call: until it passes, the connect asks every member
again and again (a call made during an election waits for the new leader), and what is left of it
after the connect is the wait for the reply (``watch``: for the connect).

``--credentials-file`` names this client's id and key for a cluster that authenticates its
clients (shared-secret; one ``client-id hexkey`` line, mode 0600; see docs/security.md); it
overrides the config's ``client.credentials_file``. A refused client gets one line with the
cluster's reason ("authentication rejected: ...") and exit code 1.

Exit codes: 0 done; 1 an error (one line on stderr: no leader within ``--timeout``, naming what
each member said; no reply within ``--timeout``, the cluster refused the session, a bad config, the
service raised on the request: "the service failed on the message at log position P: ..."), also
a ``get``/``delete`` of a key that is not there; 130 interrupted.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import click

__all__ = ["client"]

DEFAULT_CONFIG = Path("var/cluster/client.toml")
"""Where ``cluster-node up`` (default ``--dir``) writes the client config."""


class _Ctx:
    def __init__(
        self, config_path: Path, timeout_s: float, verbose: bool, credentials_file: Path | None = None
    ) -> None:
        import time

        self.config_path = config_path
        self.credentials_file = credentials_file
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        """The whole call's deadline (``--timeout`` from the start)."""
        self.verbose = verbose

    def left_s(self) -> float:
        """What is left of ``--timeout`` (a little at least, so that a reply already there is read)."""
        import time

        return max(0.05, self.deadline - time.monotonic())


def _say(ctx: _Ctx, text: str) -> None:
    if ctx.verbose:
        click.echo(text, err=True)


def _connect(ctx: _Ctx, **kwargs):
    """A connected BlockingClusterClient, or a one-line ClickException."""
    from cluster_node.client import (
        BlockingClusterClient,
        ClusterClientError,
        ConnectTimeoutError,
        SharedSecretCredentials,
    )
    from cluster_node.config import ConfigError, load_client_config
    from cluster_node.secret_file import SecretFileError

    try:
        cfg = load_client_config(ctx.config_path)
        if ctx.credentials_file is not None:
            kwargs["credentials"] = SharedSecretCredentials.from_file(ctx.credentials_file)
        elif cfg.client.credentials_file:
            kwargs["credentials"] = SharedSecretCredentials.from_file(cfg.client.credentials_file)
    except (ConfigError, SecretFileError) as e:
        raise click.ClickException(str(e)) from None
    try:
        c = BlockingClusterClient(cfg, connect_timeout=ctx.left_s(), **kwargs)
    except ConnectTimeoutError as e:
        raise click.ClickException(f"no leader within {ctx.timeout_s:g}s ({e.members})") from None
    except ClusterClientError as e:
        raise click.ClickException(str(e)) from None
    except Exception as e:  # noqa: BLE001 - e.g. the driver cannot bind the egress port
        raise click.ClickException(f"cannot connect: {type(e).__name__}: {e}") from None
    _say(
        ctx,
        f"connected: session {c.cluster_session_id}, leader member {c.leader_member_id}, term {c.leadership_term_id}",
    )
    return c


def _text(payload: bytes) -> str:
    return payload.decode("utf-8", errors="backslashreplace")


def _request(ctx: _Ctx, make_payload: Callable[[int], bytes]) -> object:
    """Send one kv request and return its decoded Reply."""
    import trio

    from cluster_node.client import ClusterClientError
    from cluster_node.service.examples.kv import decode_reply

    request_id = random.getrandbits(62)

    def match(payload: bytes) -> bool:
        try:
            return decode_reply(payload).request_id == request_id
        except Exception:  # noqa: BLE001 - replies of other requests or other services
            return False

    with _connect(ctx) as c:
        try:
            raw = c.request(make_payload(request_id), timeout=ctx.left_s(), match=match)
        except (TimeoutError, trio.TooSlowError):
            raise click.ClickException(
                f"no reply within {ctx.timeout_s:g}s (leader member {c.leader_member_id}, term {c.leadership_term_id});"
                " is the cluster running the kv service, and does it have a majority?"
            ) from None
        except ClusterClientError as e:
            raise click.ClickException(str(e)) from None
        return decode_reply(raw)


def _status_error(reply, key: str) -> None:
    from cluster_node.service.examples.kv import Status

    if reply.status == Status.NOT_FOUND:
        raise click.ClickException(f"not found: {key}")
    if reply.status == Status.BAD_REQUEST:
        raise click.ClickException("the service refused the request (BAD_REQUEST: key over 1 KiB or value over 1 MiB?)")


def _interruptible(fn: Callable[..., None]) -> Callable[..., None]:
    """Ctrl-C ends a command with exit code 130 and no traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


@click.group("client")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Client TOML config (default {DEFAULT_CONFIG}, written by `cluster-node up`; or configs/client.toml).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.01),
    default=10.0,
    show_default=True,
    help="Seconds for the whole call: the connect (through an election) and the reply.",
)
@click.option("-v", "--verbose", is_flag=True, help="Print the session (id, leader, term) on stderr.")
@click.option(
    "--credentials-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="This client's `client-id hexkey` line (mode 0600) for a cluster that authenticates clients"
    " (overrides client.credentials_file).",
)
@click.pass_context
def client(
    ctx: click.Context, config_path: Path | None, timeout_s: float, verbose: bool, credentials_file: Path | None
) -> None:
    """Send requests to a running cluster: kv put/get/delete/append, raw send, watch events."""
    if config_path is None:
        if not DEFAULT_CONFIG.is_file():
            raise click.ClickException(
                f"no --config given and {DEFAULT_CONFIG} does not exist (start a cluster with"
                " `cluster-node up`, or pass --config configs/client.toml)"
            )
        config_path = DEFAULT_CONFIG
    from cluster_node import logsetup
    from cluster_node.cli.signals import stop_on_signals

    stop_on_signals()  # a clean end: the session is closed, the private driver removed

    # The client library logs its connects and leader changes; stdout is for results only.
    logsetup.configure("console", "info" if verbose else "error")
    ctx.obj = _Ctx(config_path, timeout_s, verbose, credentials_file)


@client.command()
@click.argument("key")
@click.argument("value")
@click.pass_obj
@_interruptible
def put(ctx: _Ctx, key: str, value: str) -> None:
    """Set KEY to VALUE (kv service); prints OK once committed."""
    from cluster_node.service.examples.kv import Put, encode_request

    reply = _request(ctx, lambda rid: encode_request(Put(rid, key, value.encode())))
    _status_error(reply, key)
    click.echo("OK")


@client.command()
@click.argument("key")
@click.pass_obj
@_interruptible
def get(ctx: _Ctx, key: str) -> None:
    """Print the value of KEY (kv service); exit 1 if there is none."""
    from cluster_node.service.examples.kv import Get, encode_request

    reply = _request(ctx, lambda rid: encode_request(Get(rid, key)))
    _status_error(reply, key)
    click.echo(_text(reply.value or b""))


@client.command()
@click.argument("key")
@click.pass_obj
@_interruptible
def delete(ctx: _Ctx, key: str) -> None:
    """Remove KEY (kv service); exit 1 if it was not there."""
    from cluster_node.service.examples.kv import Delete, encode_request

    reply = _request(ctx, lambda rid: encode_request(Delete(rid, key)))
    _status_error(reply, key)
    click.echo("OK")


@client.command()
@click.argument("key")
@click.argument("value")
@click.pass_obj
@_interruptible
def append(ctx: _Ctx, key: str, value: str) -> None:
    """Append VALUE to KEY (kv service); prints the new length."""
    from cluster_node.service.examples.kv import Append, encode_request

    reply = _request(ctx, lambda rid: encode_request(Append(rid, key, value.encode())))
    _status_error(reply, key)
    click.echo(str(int.from_bytes(reply.value or b"", "little")))


@client.command()
@click.argument("text")
@click.option("--no-reply", is_flag=True, help="Do not wait for a reply (exit once the message is sent).")
@click.pass_obj
@_interruptible
def send(ctx: _Ctx, text: str, no_reply: bool) -> None:
    """Send TEXT as one message and print the first reply (the echo service sends it back)."""
    import trio

    from cluster_node.client import ClusterClientError

    with _connect(ctx) as c:
        try:
            if no_reply:
                c.offer_wait(text.encode(), timeout=ctx.left_s())
                return
            raw = c.request(text.encode(), timeout=ctx.left_s())
        except (TimeoutError, trio.TooSlowError):
            raise click.ClickException(
                f"no reply within {ctx.timeout_s:g}s (leader member {c.leader_member_id}, term {c.leadership_term_id})"
            ) from None
        except ClusterClientError as e:
            raise click.ClickException(str(e)) from None
        click.echo(_text(raw))


@client.command()
@click.pass_obj
@_interruptible
def snapshot(ctx: _Ctx) -> None:
    """Ask the cluster for a snapshot on every member (an admin request; this client's principal
    must be allowed: auth.admin_principals). Prints OK, exit 0; otherwise the cluster's answer, exit 1."""
    import trio

    from cluster_node.client import ClusterClientError
    from cluster_node.codecs import AdminResponseCode

    with _connect(ctx) as c:
        try:
            response = c.request_snapshot(timeout=ctx.left_s())
        except (TimeoutError, trio.TooSlowError):
            raise click.ClickException(
                f"no answer within {ctx.timeout_s:g}s (leader member {c.leader_member_id}, term {c.leadership_term_id})"
            ) from None
        except ClusterClientError as e:
            raise click.ClickException(str(e)) from None
    code = response.response_code
    if code == AdminResponseCode.OK:
        click.echo("OK")
        return
    name = AdminResponseCode(code).name if code in AdminResponseCode._value2member_map_ else str(code)
    raise click.ClickException(f"{name}: {response.message or 'no message'}")


@client.command()
@click.pass_obj
def watch(ctx: _Ctx) -> None:
    """Keep a session open and print its egress and session events until Ctrl-C: messages for
    this session, new leaders (NewLeaderEvent), reconnects after a silent leader, the close."""
    import time

    from cluster_node.client import ClientClosedError, ServiceRequestError

    def stamp() -> str:
        return time.strftime("%H:%M:%S")

    def on_new_leader(term: int, leader: int) -> None:
        click.echo(f"{stamp()} new leader: member {leader}, term {term}")

    def on_reconnect(session_id: int) -> None:
        click.echo(f"{stamp()} reconnected: new session {session_id}")

    c = None
    try:
        c = _connect(ctx, on_new_leader=on_new_leader, on_reconnect=on_reconnect)
        click.echo(
            f"{stamp()} connected: session {c.cluster_session_id}, leader member {c.leader_member_id},"
            f" term {c.leadership_term_id} (Ctrl-C to stop)"
        )
        while True:
            try:
                got = c.receive(timeout=0.5)
            except ClientClosedError:
                reason = c.client.error or "closed"
                raise click.ClickException(f"session ended: {reason}") from None
            except ServiceRequestError as e:
                click.echo(f"{stamp()} service error: {e}")
                continue
            if got is not None:
                payload, header = got
                click.echo(
                    f"{stamp()} message: term {header.leadership_term_id}, timestamp {header.timestamp}:"
                    f" {_text(payload)}"
                )
    except KeyboardInterrupt:
        click.echo(f"{stamp()} closed", err=True)
    finally:
        if c is not None:
            c.close()
