"""Whom a connecting client asks next after a REDIRECT (cluster_node.client.cluster_client.redirect_order)."""

from __future__ import annotations

from cluster_node.client.cluster_client import redirect_order

ALL = {0: "h:0", 1: "h:1", 2: "h:2"}


def test_members_that_name_no_leader_are_asked_after_every_other_in_turn():
    """A leader cut off from the others answers REDIRECT without a leader for as long as the cut
    lasts: the client must not ask it again and again (issue 34), nor ping-pong between two such
    members while the third follows the new leader."""
    unhelpful: list[int] = []
    order = redirect_order(dict(ALL), 1, -1, unhelpful)
    assert list(order) == [0, 2, 1]
    order = redirect_order(dict(ALL), 0, -1, unhelpful)
    assert list(order) == [2, 1, 0]
    order = redirect_order(dict(ALL), 2, -1, unhelpful)
    assert list(order) == [1, 0, 2]
    assert unhelpful == [1, 0, 2]


def test_a_named_leader_is_asked_alone_and_a_member_naming_itself_is_asked_again():
    assert redirect_order({2: "h:2"}, 0, 2, []) == {2: "h:2"}
    assert redirect_order(dict(ALL), 1, 1, []) == {1: "h:1"}
