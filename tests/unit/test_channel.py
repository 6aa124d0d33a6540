"""Channel URIs (cluster_node.media.channel): what parses, what it means, what is refused and how it is explained."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.media.channel import (
    MAX_TERM_LENGTH,
    MAX_UDP_PAYLOAD,
    MIN_TERM_LENGTH,
    ChannelError,
    ChannelUri,
    parse,
    parse_endpoint,
)

# ----------------------------------------------------------------------------------- valid URIs


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.10", ("127.0.0.10", 0)),
        ("10.0.0.5:4000", ("10.0.0.5", 4000)),
        ("[::1]", ("::1", 0)),
        ("[::1]:4000", ("::1", 4000)),
    ],
)
def test_interface_is_the_address_a_publication_sends_from(text, expected):
    uri = parse(f"aeron:udp?endpoint=10.0.0.9:5000|interface={text}")
    assert uri.interface == expected and uri.extra == ()
    assert parse(str(uri)) == uri


@pytest.mark.parametrize(
    "channel, why",
    [
        ("aeron:udp?endpoint=10.0.0.9:5000|interface=10.0.0.0/24", "a subnet (/prefix) is not supported"),
        ("aeron:udp?endpoint=10.0.0.9:5000|interface=10.0.0.5:x", "not a number"),
        ("aeron:ipc?interface=10.0.0.5", "interface has no meaning for aeron:ipc"),
    ],
)
def test_interface_refusals(channel, why):
    with pytest.raises(ChannelError, match=re.escape(why)):
        parse(channel)


def test_ipc_minimal():
    uri = parse("aeron:ipc")
    assert uri == ChannelUri(media="ipc")
    assert uri.is_ipc and not uri.is_udp and not uri.is_manual
    assert not uri.has_initial_position
    assert uri.initial_position(MIN_TERM_LENGTH) == 0
    assert str(uri) == "aeron:ipc"


def test_udp_unicast_endpoint():
    uri = parse("aeron:udp?endpoint=localhost:40123")
    assert uri.is_udp and not uri.is_ipc
    assert uri.endpoint == ("localhost", 40123)
    assert uri.control is None and uri.control_mode is None
    assert str(uri) == "aeron:udp?endpoint=localhost:40123"


def test_ipv6_endpoint_in_brackets():
    uri = parse("aeron:udp?endpoint=[::1]:40123")
    assert uri.endpoint == ("::1", 40123)
    assert str(uri) == "aeron:udp?endpoint=[::1]:40123"
    # Without brackets the last colon separates the port; printing adds the brackets.
    assert str(parse("aeron:udp?endpoint=::1:80")) == "aeron:udp?endpoint=[::1]:80"


def test_mdc_publication_and_manual_subscription():
    pub = parse("aeron:udp?control=127.0.0.1:40456|control-mode=manual")
    assert pub.control == ("127.0.0.1", 40456) and pub.is_manual and pub.endpoint is None
    sub = parse("aeron:udp?control-mode=manual")
    assert sub.is_manual and sub.endpoint is None and sub.control is None
    # A control address alone is enough for udp.
    assert parse("aeron:udp?control=h:1").control == ("h", 1)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("64k", 64 * 1024),
        ("65536", 65536),
        ("1m", 1024 * 1024),
        ("16M", 16 * 1024 * 1024),
        ("1g", MAX_TERM_LENGTH),
    ],
)
def test_term_length_with_suffixes(text, expected):
    assert parse(f"aeron:ipc?term-length={text}").term_length == expected


@pytest.mark.parametrize(
    "text, expected", [("64", 64), ("1408", 1408), ("8k", 8192), (str(MAX_UDP_PAYLOAD), MAX_UDP_PAYLOAD)]
)
def test_mtu_values(text, expected):
    assert parse(f"aeron:udp?endpoint=h:1|mtu={text}").mtu == expected


def test_all_typed_parameters():
    uri = parse(
        "aeron:udp?endpoint=node1:9000|term-length=64k|mtu=1408|session-id=-7|alias=log"
        "|init-term-id=5|term-id=8|term-offset=4096"
    )
    assert uri.term_length == 65536 and uri.mtu == 1408 and uri.session_id == -7 and uri.alias == "log"
    assert (uri.initial_term_id, uri.term_id, uri.term_offset) == (5, 8, 4096)
    assert uri.has_initial_position
    assert uri.initial_position(65536) == 3 * 65536 + 4096
    assert uri.initial_position(1024 * 1024) == 3 * 1024 * 1024 + 4096


def test_session_id_bounds_accepted():
    assert parse("aeron:ipc?session-id=-2147483648").session_id == -(2**31)
    assert parse("aeron:ipc?session-id=2147483647").session_id == 2**31 - 1


def test_passive_keys_are_kept_in_order():
    uri = parse("aeron:udp?endpoint=h:1|linger=5000000000|eos=false|tags=1,2|receiver-window=128k")
    assert uri.extra == (("linger", "5000000000"), ("eos", "false"), ("tags", "1,2"), ("receiver-window", "128k"))
    assert str(uri) == "aeron:udp?endpoint=h:1|linger=5000000000|eos=false|tags=1,2|receiver-window=128k"


def test_whitespace_and_empty_parts_are_tolerated():
    assert parse("  aeron:ipc  ") == parse("aeron:ipc")
    uri = parse("aeron:udp?endpoint= h:1 ||alias=a|")
    assert uri.endpoint == ("h", 1) and uri.alias == "a"
    assert parse("aeron:ipc?") == parse("aeron:ipc")


def test_value_may_contain_equals_sign():
    assert parse("aeron:ipc?alias=a=b").alias == "a=b"


def test_canonical_order_of_parameters():
    a = parse("aeron:udp?alias=z|mtu=1408|endpoint=h:1|term-length=64k")
    assert str(a) == "aeron:udp?endpoint=h:1|term-length=65536|mtu=1408|alias=z"


ROUND_TRIP = [
    "aeron:ipc",
    "aeron:ipc?term-length=64m|alias=service",
    "aeron:udp?endpoint=localhost:40123",
    "aeron:udp?endpoint=[fe80::1]:0",
    "aeron:udp?endpoint=10.0.0.1:65535|mtu=8k|term-length=1g",
    "aeron:udp?control=h:2|control-mode=manual|session-id=2147483647",
    "aeron:udp?control-mode=manual|alias=",
    "aeron:udp?endpoint=h:1|init-term-id=-2147483648|term-id=-2147483648|term-offset=0",
    "aeron:udp?endpoint=h:1|init-term-id=0|term-id=2147483647|term-offset=65504|term-length=64k",
    "aeron:udp?endpoint=h:1|init-term-id=2147483647|term-id=-2147483648|term-offset=0",
    "aeron:udp?endpoint=h:1|linger=0|ssc=true|fc=min|gtag=7",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(text):
    uri = parse(text)
    again = parse(str(uri))
    assert again == uri
    assert str(again) == str(uri)


def test_with_params_revalidates():
    uri = parse("aeron:udp?endpoint=h:1")
    changed = uri.with_params(session_id=5, mtu=4096)
    assert changed.session_id == 5 and changed.mtu == 4096 and changed.endpoint == ("h", 1)
    assert uri.session_id is None  # frozen original untouched
    with pytest.raises(ChannelError, match="mtu"):
        uri.with_params(mtu=33)


_hosts = st.sampled_from(["localhost", "127.0.0.1", "node-1.example", "::1", "fe80::2"])
_endpoints = st.tuples(_hosts, st.integers(0, 65535))
_i32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def _uris(draw):
    media = draw(st.sampled_from(["udp", "ipc"]))
    kw: dict = {"media": media}
    if media == "udp":
        kind = draw(st.sampled_from(["unicast", "mdc", "manual"]))
        if kind == "unicast":
            kw["endpoint"] = draw(_endpoints)
        elif kind == "mdc":
            kw["control"] = draw(_endpoints)
            kw["control_mode"] = "manual"
        else:
            kw["control_mode"] = "manual"
    tl = draw(st.none() | st.sampled_from([MIN_TERM_LENGTH << i for i in range(15)]))
    kw["term_length"] = tl
    kw["mtu"] = draw(st.none() | st.integers(2, MAX_UDP_PAYLOAD // 32).map(lambda k: 32 * k))
    kw["session_id"] = draw(st.none() | _i32)
    if draw(st.booleans()):
        init = draw(_i32)
        kw["initial_term_id"] = init
        # term ids wrap: the term count (term id - init term id, as int32) is 0 .. 2**31 - 1
        kw["term_id"] = (init + draw(st.integers(0, 2**31 - 1)) + 2**31) % 2**32 - 2**31
        kw["term_offset"] = 32 * draw(st.integers(0, ((tl or MIN_TERM_LENGTH) // 32) - 1))
    kw["alias"] = draw(
        st.none()
        | st.text(st.characters(codec="ascii", exclude_characters="|\r\n\t\x0b\x0c\x1c\x1d\x1e\x1f "), max_size=8)
    )
    return ChannelUri(**kw)


@settings(max_examples=200, deadline=None)
@given(_uris())
def test_round_trip_property(uri):
    assert parse(str(uri)) == uri


# --------------------------------------------------------------------------------- invalid URIs


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("udp?endpoint=h:1", "must start with 'aeron:'"),
        ("", "must start with 'aeron:'"),
        ("aeron:", "media must be 'udp' or 'ipc', not ''"),
        ("aeron:tcp?endpoint=h:1", "media must be 'udp' or 'ipc', not 'tcp'"),
        ("aeron:UDP?endpoint=h:1", "media must be 'udp' or 'ipc'"),
        ("aeron:udp", "a udp channel needs endpoint=host:port"),
        ("aeron:udp?mtu=1408", "a udp channel needs endpoint=host:port"),
        ("aeron:udp?endpoint", "parameter 'endpoint' must look like key=value"),
        ("aeron:udp?endpoint=h:1|=5", "parameter '=5' must look like key=value"),
        ("aeron:udp?endpoint=h:1|colour=red", "unknown parameter 'colour'"),
        ("aeron:udp?endpoint=h:1|endpoint=h:2", "parameter 'endpoint' given twice"),
        ("aeron:udp?endpoint=h:1|mtu=abc", "mtu must be a whole number, not 'abc'"),
        ("aeron:udp?endpoint=h:1|mtu=1.5k", "mtu must be a whole number"),
        ("aeron:udp?endpoint=h:1|mtu=1400", "mtu must be a multiple of 32 from 64 to 65504, not 1400"),
        ("aeron:udp?endpoint=h:1|mtu=32", "mtu must be a multiple of 32"),
        ("aeron:udp?endpoint=h:1|mtu=65536", "mtu must be a multiple of 32"),
        ("aeron:udp?endpoint=h:1|mtu=-64", "mtu must be a multiple of 32"),
        ("aeron:ipc?term-length=65535", "term-length must be a power of two from 64k to 1g, not 65535"),
        ("aeron:ipc?term-length=32k", "term-length must be a power of two"),
        ("aeron:ipc?term-length=2g", "term-length must be a power of two"),
        ("aeron:ipc?term-length=0", "term-length must be a power of two"),
        ("aeron:ipc?term-length=big", "term-length must be a whole number"),
        ("aeron:ipc?session-id=2147483648", "session-id must fit in 32 bits"),
        ("aeron:ipc?session-id=-2147483649", "session-id must fit in 32 bits"),
        ("aeron:ipc?session-id=0x10", "session-id must be a whole number"),
        ("aeron:ipc?init-term-id=0", "init-term-id, term-id and term-offset must be given together"),
        ("aeron:ipc?init-term-id=0|term-id=0", "must be given together"),
        ("aeron:ipc?term-offset=0", "must be given together"),
        ("aeron:ipc?init-term-id=0|term-id=0|term-offset=33", "term-offset must be a non-negative multiple of 32"),
        ("aeron:ipc?init-term-id=0|term-id=0|term-offset=-32", "term-offset must be a non-negative multiple of 32"),
        (
            "aeron:ipc?init-term-id=0|term-id=0|term-offset=65536|term-length=64k",
            "term-offset must be less than term-length",
        ),
        ("aeron:ipc?init-term-id=0|term-id=-1|term-offset=0", "term-id must not be before init-term-id"),
        ("aeron:ipc?init-term-id=-1|term-id=2147483647|term-offset=0", "term-id must not be before init-term-id"),
        (
            "aeron:udp?endpoint=localhost",
            "channel 'aeron:udp?endpoint=localhost': endpoint 'localhost' must look like host:port",
        ),
        ("aeron:ipc?init-term-id=2147483648|term-id=0|term-offset=0", "init-term-id must fit in 32 bits"),
        ("aeron:ipc?init-term-id=0|term-id=2147483648|term-offset=0", "term-id must fit in 32 bits"),
        ("aeron:udp?endpoint=h:1|control-mode=auto", "control-mode must be 'manual' or 'dynamic', not 'auto'"),
        ("aeron:udp?control=h:1|control-mode=dynamic", "control-mode=dynamic is not supported"),
        ("aeron:ipc?endpoint=h:1", "endpoint has no meaning for aeron:ipc"),
        ("aeron:ipc?control=h:1", "control has no meaning for aeron:ipc"),
        ("aeron:ipc?control-mode=manual", "control-mode has no meaning for aeron:ipc"),
    ],
)
def test_invalid_uri_names_uri_and_problem(text, fragment):
    with pytest.raises(ChannelError) as info:
        parse(text)
    message = str(info.value)
    assert fragment in message
    assert repr(text) in message  # the URI itself is quoted so the operator can find it
    assert "\n" not in message


def test_non_string_channel():
    with pytest.raises(ChannelError, match="channel must be a string, not int"):
        parse(42)  # type: ignore[arg-type]
    with pytest.raises(ChannelError, match="not bytes"):
        parse(b"aeron:ipc")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "endpoint, fragment",
    [
        ("localhost", "endpoint 'localhost' must look like host:port"),
        (":80", "endpoint ':80' has no host"),
        ("h:x", "endpoint 'h:x' has a port that is not a number"),
        ("h:", "endpoint 'h:' has a port that is not a number"),
        ("h:70000", "endpoint 'h:70000' has a port outside 0..65535"),
        ("h:-1", "has a port outside 0..65535"),
        ("[::1", "endpoint '[::1' must look like [addr]:port"),
        ("[::1]80", "must look like [addr]:port"),
        ("[]:80", "endpoint '[]:80' has no host"),
    ],
)
def test_bad_endpoints(endpoint, fragment):
    with pytest.raises(ChannelError, match=fragment.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_endpoint(endpoint)
    # The same problems in a channel are ChannelErrors naming the endpoint.
    with pytest.raises(ChannelError, match="endpoint"):
        parse(f"aeron:udp?endpoint={endpoint}")
    with pytest.raises(ChannelError, match="endpoint"):
        parse(f"aeron:udp?control={endpoint}|control-mode=manual")


def test_parse_endpoint_valid():
    assert parse_endpoint("example.com:0") == ("example.com", 0)
    assert parse_endpoint(" 127.0.0.1:65535 ") == ("127.0.0.1", 65535)
    assert parse_endpoint("[2001:db8::1]:9000") == ("2001:db8::1", 9000)


def test_channel_error_is_a_value_error():
    assert issubclass(ChannelError, ValueError)


@pytest.mark.parametrize("itid", [0, 7, 2**31 - 2, -(2**31)])
@pytest.mark.parametrize("position", [0, 96, 65536, 3 * 65536 + 4096])
def test_starting_at_is_the_inverse_of_initial_position(itid, position):
    uri = parse("aeron:ipc?session-id=5").starting_at(position, itid, 65536)
    assert uri.initial_position(65536) == position
    assert (uri.initial_term_id, uri.term_length, uri.session_id) == (itid, 65536, 5)
    assert parse(str(uri)) == uri


def test_auth_mac_parses_round_trips_and_is_refused_elsewhere():
    from cluster_node.media.channel import ChannelError, parse, reply_channel_refusal

    uri = parse("aeron:udp?endpoint=127.0.0.1:4000|auth=mac")
    assert uri.auth == "mac" and parse(str(uri)).auth == "mac"
    assert parse(str(uri.with_params(auth=None))).auth is None
    for bad in ("aeron:udp?endpoint=127.0.0.1:4000|auth=none", "aeron:ipc?auth=mac"):
        try:
            parse(bad)
        except ChannelError:
            continue
        raise AssertionError(f"{bad} was accepted")
    # A remote request may not ask for it on its reply channel: the member decides that.
    assert reply_channel_refusal("aeron:udp?endpoint=127.0.0.1:4000|auth=mac", "127.0.0.1").startswith("parameters")
