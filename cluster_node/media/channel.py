"""Channel URIs: where a publication sends and a subscription listens (core).

Grammar, as in the reference system::

    aeron:<media>[?<key>=<value>[|<key>=<value>]...]

``media`` is ``udp`` or ``ipc``. The parameters this project understands:

=================  ==========================================================================
``endpoint``       ``host:port``. Publication: where data is sent. Subscription: where to bind.
``control``        ``host:port``. Multi-destination-cast publication: where the publication's
                   socket binds, so receivers' status messages and NAKs reach it.
``control-mode``   ``manual``: destinations are added and removed at run time (MDC publication,
                   multi-destination subscription). ``dynamic`` is parsed but not supported.
``term-length``    power of two from 64 KiB to 1 GiB; ``k``, ``m``, ``g`` suffixes allowed.
``mtu``            32..65504, a multiple of 32: the largest datagram, header included.
``session-id``     int32: fixes the publication's session id instead of a random one.
``init-term-id``,  all three together: an exclusive publication that starts at a position
``term-id``,       (a new leader continues the log where it ends).
``term-offset``
``alias``          free text, shown by tools.
``auth``           ``mac``: every datagram carries a keyed MAC (cluster_node.media.mac) made and checked with
                   the driver's key; one without a valid MAC is dropped before it is parsed.
``linger``,        accepted for compatibility with the reference; durations in ns.
``eos``, ...
=================  ==========================================================================

A malformed URI raises :class:`ChannelError` naming the URI and what is wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = [
    "ChannelError",
    "ChannelUri",
    "parse",
    "parse_endpoint",
    "reply_channel_refusal",
    "DEFAULT_MTU",
    "MAX_UDP_PAYLOAD",
    "MIN_TERM_LENGTH",
    "MAX_TERM_LENGTH",
    "DEFAULT_NETWORK_TERM_LENGTH",
    "DEFAULT_IPC_TERM_LENGTH",
]

DEFAULT_MTU = 1408
MAX_UDP_PAYLOAD = 65504
MIN_TERM_LENGTH = 64 * 1024
MAX_TERM_LENGTH = 1024 * 1024 * 1024
DEFAULT_NETWORK_TERM_LENGTH = 16 * 1024 * 1024
DEFAULT_IPC_TERM_LENGTH = 64 * 1024 * 1024

_PREFIX = "aeron:"
_INT_KEYS = {"session-id", "init-term-id", "term-id", "term-offset", "mtu", "term-length"}
# Keys of the reference system that we accept and keep but do not act on.
_PASSIVE_KEYS = {
    "linger",
    "eos",
    "sparse",
    "tether",
    "rejoin",
    "reliable",
    "ttl",
    "group",
    "tags",
    "spies-simulate-connection",
    "ssc",
    "flow-control",
    "fc",
    "gtag",
    "cc",
    "socket-sndbuf",
    "socket-rcvbuf",
    "receiver-window",
    "nak-delay",
    "untethered-window-limit-timeout",
}
_KNOWN_KEYS = {"endpoint", "control", "control-mode", "alias", "interface", "auth"} | _INT_KEYS | _PASSIVE_KEYS


class ChannelError(ValueError):
    """A channel URI that cannot be used, with the URI and the reason in the message."""


def _parse_size(text: str) -> int:
    t = text.strip().lower()
    mult = 1
    if t and t[-1] in "kmg":
        mult = {"k": 1024, "m": 1024 * 1024, "g": 1024 * 1024 * 1024}[t[-1]]
        t = t[:-1]
    return int(t) * mult


def parse_endpoint(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (IPv6 as ``[addr]:port``) into ``(host, port)``; raise ChannelError."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ChannelError(f"endpoint {text!r} must look like [addr]:port")
        host, port_text = text[1:end], text[end + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ChannelError(f"endpoint {text!r} must look like host:port")
    if not host:
        raise ChannelError(f"endpoint {text!r} has no host")
    try:
        port = int(port_text)
    except ValueError:
        raise ChannelError(f"endpoint {text!r} has a port that is not a number") from None
    if not 0 <= port <= 65535:
        raise ChannelError(f"endpoint {text!r} has a port outside 0..65535")
    return host, port


def _format_endpoint(ep: tuple[str, int]) -> str:
    host, port = ep
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class ChannelUri:
    """A parsed channel. ``str(uri)`` gives back a canonical URI text."""

    media: str
    endpoint: tuple[str, int] | None = None
    control: tuple[str, int] | None = None
    control_mode: str | None = None
    term_length: int | None = None
    mtu: int | None = None
    session_id: int | None = None
    initial_term_id: int | None = None
    term_id: int | None = None
    term_offset: int | None = None
    alias: str | None = None
    interface: tuple[str, int] | None = None
    """``interface=host[:port]``: the local address a UDP publication sends from (port 0: any),
    as the reference's ``interface``; its ``/prefix`` form (an address of a subnet) is not
    supported."""
    auth: str | None = None
    """``mac``: the channel's datagrams are authenticated with the driver's key (cluster_node.media.mac)."""
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def is_udp(self) -> bool:
        return self.media == "udp"

    @property
    def is_ipc(self) -> bool:
        return self.media == "ipc"

    @property
    def is_manual(self) -> bool:
        return self.control_mode == "manual"

    @property
    def has_initial_position(self) -> bool:
        return self.initial_term_id is not None

    def initial_position(self, term_length: int) -> int:
        """The stream position the three ``init-term-id/term-id/term-offset`` values name."""
        if self.initial_term_id is None or self.term_id is None or self.term_offset is None:
            return 0
        terms = (self.term_id - self.initial_term_id + 2**31) % 2**32 - 2**31  # term ids wrap
        return terms * term_length + self.term_offset

    def starting_at(self, position: int, initial_term_id: int, term_length: int) -> ChannelUri:
        """A copy whose publication's first byte lands at stream ``position`` of a stream with
        ``initial_term_id`` and ``term_length`` (the inverse of :meth:`initial_position`): how a
        replay or a new leader's log continues a recording at the same positions."""
        term_id = (initial_term_id + position // term_length + 2**31) % 2**32 - 2**31  # term ids wrap
        return self.with_params(
            term_length=term_length,
            initial_term_id=initial_term_id,
            term_id=term_id,
            term_offset=position % term_length,
        )

    def with_params(self, **changes: object) -> ChannelUri:
        """A copy with some fields changed, validated again (e.g. ``session_id=...``)."""
        return parse(str(replace(self, **changes)))

    def __str__(self) -> str:
        params: list[str] = []
        if self.endpoint is not None:
            params.append(f"endpoint={_format_endpoint(self.endpoint)}")
        if self.control is not None:
            params.append(f"control={_format_endpoint(self.control)}")
        if self.control_mode is not None:
            params.append(f"control-mode={self.control_mode}")
        if self.term_length is not None:
            params.append(f"term-length={self.term_length}")
        if self.mtu is not None:
            params.append(f"mtu={self.mtu}")
        if self.session_id is not None:
            params.append(f"session-id={self.session_id}")
        if self.initial_term_id is not None:
            params.append(f"init-term-id={self.initial_term_id}")
            params.append(f"term-id={self.term_id}")
            params.append(f"term-offset={self.term_offset}")
        if self.alias is not None:
            params.append(f"alias={self.alias}")
        if self.interface is not None:
            host, port = self.interface
            params.append(
                f"interface={_format_endpoint(self.interface) if port else (f'[{host}]' if ':' in host else host)}"
            )
        if self.auth is not None:
            params.append(f"auth={self.auth}")
        params.extend(f"{k}={v}" for k, v in self.extra)
        return f"{_PREFIX}{self.media}" + ("?" + "|".join(params) if params else "")


def _parse_interface(text: str, err) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> ``(host, port)`` (port 0: any)."""
    if "/" in text:
        raise err(f"interface={text}: a subnet (/prefix) is not supported; name the address to send from")
    if text.startswith("[") and text.endswith("]"):
        return text[1:-1], 0
    if text.count(":") == 1 or text.startswith("["):
        try:
            return parse_endpoint(text)
        except ChannelError as e:
            raise err(f"interface: {e}") from None
    if not text:
        raise err("interface needs an address")
    return text, 0


def parse(uri: str) -> ChannelUri:
    """Parse and validate a channel URI; raise :class:`ChannelError` with a clear reason."""
    if not isinstance(uri, str):
        raise ChannelError(f"channel must be a string, not {type(uri).__name__}")
    text = uri.strip()
    if not text.startswith(_PREFIX):
        raise ChannelError(f"channel {uri!r} must start with 'aeron:' (e.g. aeron:udp?endpoint=host:port)")
    body = text[len(_PREFIX) :]
    media, _, query = body.partition("?")
    if media not in ("udp", "ipc"):
        raise ChannelError(f"channel {uri!r}: media must be 'udp' or 'ipc', not {media!r}")

    raw: dict[str, str] = {}
    if query:
        for part in query.split("|"):
            if not part:
                continue
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ChannelError(f"channel {uri!r}: parameter {part!r} must look like key=value")
            if key not in _KNOWN_KEYS:
                raise ChannelError(f"channel {uri!r}: unknown parameter {key!r}")
            if key in raw:
                raise ChannelError(f"channel {uri!r}: parameter {key!r} given twice")
            raw[key] = value.strip()

    def err(msg: str) -> ChannelError:
        return ChannelError(f"channel {uri!r}: {msg}")

    ints: dict[str, int] = {}
    for key in _INT_KEYS & raw.keys():
        try:
            ints[key] = _parse_size(raw[key]) if key in ("term-length", "mtu") else int(raw[key])
        except ValueError:
            raise err(f"{key} must be a whole number, not {raw[key]!r}") from None

    term_length = ints.get("term-length")
    if term_length is not None:
        if not (MIN_TERM_LENGTH <= term_length <= MAX_TERM_LENGTH) or term_length & (term_length - 1):
            raise err(f"term-length must be a power of two from 64k to 1g, not {term_length}")
    mtu = ints.get("mtu")
    if mtu is not None and (mtu < 64 or mtu > MAX_UDP_PAYLOAD or mtu % 32):
        raise err(f"mtu must be a multiple of 32 from 64 to {MAX_UDP_PAYLOAD}, not {mtu}")
    session_id = ints.get("session-id")
    if session_id is not None and not -(2**31) <= session_id < 2**31:
        raise err("session-id must fit in 32 bits")

    pos_keys = ("init-term-id", "term-id", "term-offset")
    present = [k for k in pos_keys if k in ints]
    if present and len(present) != 3:
        raise err("init-term-id, term-id and term-offset must be given together")
    if present:
        for k in pos_keys:
            if not -(2**31) <= ints[k] < 2**31:
                raise err(f"{k} must fit in 32 bits")
        if ints["term-offset"] < 0 or ints["term-offset"] % 32:
            raise err("term-offset must be a non-negative multiple of 32")
        if term_length is not None and ints["term-offset"] >= term_length:
            raise err("term-offset must be less than term-length")
        if (ints["term-id"] - ints["init-term-id"] + 2**31) % 2**32 - 2**31 < 0:  # term ids wrap
            raise err("term-id must not be before init-term-id")

    try:
        endpoint = parse_endpoint(raw["endpoint"]) if "endpoint" in raw else None
        control = parse_endpoint(raw["control"]) if "control" in raw else None
    except ChannelError as e:
        raise err(str(e)) from None
    interface = None
    if "interface" in raw:
        interface = _parse_interface(raw["interface"], err)
    control_mode = raw.get("control-mode")
    if control_mode is not None and control_mode not in ("manual", "dynamic"):
        raise err(f"control-mode must be 'manual' or 'dynamic', not {control_mode!r}")
    auth = raw.get("auth")
    if auth is not None and auth != "mac":
        raise err(f"auth must be 'mac', not {auth!r}")
    if control_mode == "dynamic":
        raise err("control-mode=dynamic is not supported; use control-mode=manual and add destinations")

    if media == "ipc":
        for key in ("endpoint", "control", "control-mode", "interface", "auth"):
            if key in raw:
                raise err(f"{key} has no meaning for aeron:ipc")
    else:
        if endpoint is None and control is None and control_mode != "manual":
            raise err("a udp channel needs endpoint=host:port, or control=host:port with control-mode=manual")

    extra = tuple((k, v) for k, v in raw.items() if k in _PASSIVE_KEYS)
    return ChannelUri(
        media=media,
        endpoint=endpoint,
        control=control,
        control_mode=control_mode,
        term_length=term_length,
        mtu=mtu,
        session_id=session_id,
        initial_term_id=ints.get("init-term-id"),
        term_id=ints.get("term-id"),
        term_offset=ints.get("term-offset"),
        alias=raw.get("alias"),
        interface=interface,
        auth=auth,
        extra=extra,
    )


def reply_channel_refusal(channel: str, source_host: str | None) -> str | None:
    """Why a channel a remote request names for its replies is refused, or None when it may be
    used. A member (a cluster's ingress, an archive's control port) sends to whatever channel a
    request names: left open, that sends its traffic anywhere (a spoofed source reflects it at a
    third party) and lets the request pick the term length, the control mode and the rest.
    Accepted: ``aeron:udp?endpoint=H:P`` and nothing else, H the address the request came from
    (``source_host``; None for a request over IPC, from this host, which may name any channel),
    P not 0. The kind of refusal is the text before the first colon."""
    try:
        uri = parse(channel)
    except ChannelError:
        return "unparsable: the response channel is not a channel URI"
    if uri.is_ipc and source_host is None:
        return None
    if not uri.is_udp or uri.endpoint is None:
        return f"not udp: the response channel must be aeron:udp?endpoint=H:P, not {channel[:80]!r}"
    others = [
        name
        for name in (
            "control",
            "control_mode",
            "term_length",
            "mtu",
            "session_id",
            "initial_term_id",
            "term_id",
            "term_offset",
            "alias",
            "interface",
            "auth",
        )
        if getattr(uri, name) is not None
    ]
    if others or uri.extra:
        return f"parameters: the response channel may name its endpoint only, not {', '.join(others) or 'more'}"
    host, port = uri.endpoint
    if port == 0:
        return "port: the response endpoint's port is 0"
    if source_host is not None and host != source_host:
        return f"source: the response endpoint's host {host} is not the address the request came from ({source_host})"
    return None
