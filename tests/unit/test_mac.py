"""The MAC framing of authenticated channels (cluster_node.media.mac): a trailer over the whole datagram,
checked before anything is parsed."""

from __future__ import annotations

import pytest

from cluster_node.media.frames import Setup, encode_setup
from cluster_node.media.mac import MAC_LENGTH, MacKeys

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
DATAGRAM = encode_setup(Setup(0, 7, 9, 0, 0, 64 * 1024, 1408, 0))


def _buf(data: bytes) -> memoryview:
    return memoryview(bytearray(data + b"\0" * 64))  # a receive buffer is larger than the datagram


def test_signed_datagram_verifies_and_strips_to_the_original():
    keys = MacKeys(KEY)
    signed = keys.signed(DATAGRAM)
    assert len(signed) == len(DATAGRAM) + MAC_LENGTH
    assert signed[: len(DATAGRAM)] == DATAGRAM
    view = _buf(signed)
    n = keys.verify(view, len(signed))
    assert n == len(DATAGRAM)
    assert bytes(view[:n]) == DATAGRAM


def test_sign_is_the_trailer_of_signed_and_needs_no_copy_of_a_view():
    keys = MacKeys(KEY)
    view = memoryview(bytearray(DATAGRAM))
    assert keys.sign(view) == keys.signed(DATAGRAM)[-MAC_LENGTH:]


@pytest.mark.parametrize("index", [0, 5, len(DATAGRAM) - 1, len(DATAGRAM), len(DATAGRAM) + MAC_LENGTH - 1])
def test_any_altered_byte_fails(index):
    keys = MacKeys(KEY)
    signed = bytearray(keys.signed(DATAGRAM))
    signed[index] ^= 0x01
    assert keys.verify(_buf(bytes(signed)), len(signed)) == -1


def test_wrong_key_fails():
    signed = MacKeys(OTHER).signed(DATAGRAM)
    assert MacKeys(KEY).verify(_buf(signed), len(signed)) == -1


def test_an_unsigned_datagram_fails():
    assert MacKeys(KEY).verify(_buf(DATAGRAM), len(DATAGRAM)) == -1


@pytest.mark.parametrize("cut", [1, MAC_LENGTH, len(DATAGRAM)])
def test_truncated_datagram_fails(cut):
    keys = MacKeys(KEY)
    signed = keys.signed(DATAGRAM)[:-cut]
    assert keys.verify(_buf(signed), len(signed)) == -1


@pytest.mark.parametrize("n", [0, 1, MAC_LENGTH])
def test_datagrams_no_longer_than_a_trailer_fail(n):
    assert MacKeys(KEY).verify(_buf(b"\x01" * n), n) == -1


def test_previous_key_is_accepted_on_receive_but_never_used_to_sign():
    rotating = MacKeys(OTHER, previous=KEY)
    old_member = MacKeys(KEY)
    from_old = old_member.signed(DATAGRAM)
    assert rotating.verify(_buf(from_old), len(from_old)) == len(DATAGRAM)
    from_rotating = rotating.signed(DATAGRAM)
    assert from_rotating == MacKeys(OTHER).signed(DATAGRAM)
    # A member still on the old key alone does not take the new one: the order of the restarts
    # matters (docs/security.md).
    assert old_member.verify(_buf(from_rotating), len(from_rotating)) == -1
    # Without the previous key, the old one is refused.
    assert MacKeys(OTHER).verify(_buf(from_old), len(from_old)) == -1


def test_keys_of_a_bad_length_are_refused_and_never_shown():
    with pytest.raises(ValueError):
        MacKeys(b"short")
    with pytest.raises(ValueError):
        MacKeys(KEY, previous=b"x" * 65)
    assert KEY.hex() not in repr(MacKeys(KEY)) and "KEY" not in repr(MacKeys(KEY))
