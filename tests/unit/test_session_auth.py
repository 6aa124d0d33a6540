"""Authentication, session binding and admin requests in the sessions core
(cluster_node.consensus.sessions with cluster_node.consensus.auth)."""

from __future__ import annotations

import itertools

from cluster_node.codecs import (
    CLIENT_PROTOCOL_VERSION,
    NULL_VALUE,
    AdminRequest,
    AdminRequestType,
    AdminResponse,
    AdminResponseCode,
    Challenge,
    EventCode,
    SessionConnectRequest,
    SessionEvent,
    SessionOpenEvent,
)
from cluster_node.consensus.auth import (
    AllowListAuthorisation,
    SharedSecretAuthenticator,
    challenge_answer,
)
from cluster_node.consensus.pending import PendingServiceMessages
from cluster_node.consensus.sessions import (
    AppendSessionEvent,
    ClusterSessions,
    ForeignMessage,
    SendEgress,
    SessionSettings,
    TakeSnapshot,
)
from cluster_node.consensus.snapshot import (
    decode_cm_snapshot,
    encode_cm_snapshot,
    restore_cm_snapshot,
    take_cm_snapshot,
)
from cluster_node.consensus.timers import Timers

S = 1_000_000_000
MS = 1_000_000
KEY = bytes(range(32))
CHANNEL = "aeron:udp?endpoint=127.0.0.5:9999"
IMG = 41


def nonces():
    counter = itertools.count(1)
    return lambda n: next(counter).to_bytes(n, "big")


def make(authenticator=None, authorisation=None, hosts=None, **settings) -> ClusterSessions:
    kw = {}
    if authenticator is not None:
        kw["authenticator"] = authenticator
    if authorisation is not None:
        kw["authorisation"] = authorisation
    hosts = hosts or {}
    return ClusterSessions(
        member_id=1,
        ingress_endpoints="0=h:1,1=h:2",
        settings=SessionSettings(**settings),
        image_source_host=lambda image: hosts.get(image, ""),
        **kw,
    )


def shared(timeout_ms=5_000) -> SharedSecretAuthenticator:
    return SharedSecretAuthenticator({b"alice": KEY}, nonces(), timeout_ms)


def connect(s, credentials=b"alice", corr=7, now=0, image=IMG):
    req = SessionConnectRequest(corr, 102, CLIENT_PROTOCOL_VERSION, CHANNEL, credentials)
    return s.on_connect_request(
        req, is_leader=True, leader_member_id=1, leadership_term_id=3, now_ns=now, image_session_id=image
    )


def sent(effects, kind):
    return [e.message for e in effects if isinstance(e, SendEgress) and type(e.message) is kind]


def answer(s, challenge: Challenge, credentials: bytes, now=MS, image=IMG) -> bool:
    return s.on_challenge_response(
        challenge.correlation_id,
        challenge.cluster_session_id,
        credentials,
        leadership_term_id=3,
        leader_member_id=1,
        now_ns=now,
        image_session_id=image,
    )


def challenged(s, **kw) -> Challenge:
    assert connect(s, **kw) is None  # not open yet: challenged
    (challenge,) = sent(s.drain_effects(), Challenge)
    return challenge


def test_shared_secret_right_answer_opens_with_the_client_id_as_principal():
    s = make(shared())
    challenge = challenged(s)
    assert challenge.correlation_id == 7 and len(challenge.encoded_challenge) == 32
    assert not s.sessions and list(s.pending) == [challenge.cluster_session_id]
    assert answer(s, challenge, challenge_answer(KEY, challenge.encoded_challenge, b"alice"))
    effects = s.drain_effects()
    (opened,) = [e.message for e in effects if isinstance(e, AppendSessionEvent)]
    assert type(opened) is SessionOpenEvent and opened.encoded_principal == b"alice"
    (ok,) = sent(effects, SessionEvent)
    assert ok.code == EventCode.OK and ok.cluster_session_id == challenge.cluster_session_id
    assert s.sessions[challenge.cluster_session_id].encoded_principal == b"alice" and not s.pending


def rejection(effects) -> SessionEvent:
    (event,) = sent(effects, SessionEvent)
    assert event.code == EventCode.AUTHENTICATION_REJECTED
    assert not [e for e in effects if isinstance(e, AppendSessionEvent)]
    return event


def test_wrong_key_unknown_id_and_no_credentials_are_rejected_with_a_reason():
    s = make(shared())
    challenge = challenged(s)
    answer(s, challenge, challenge_answer(b"x" * 32, challenge.encoded_challenge, b"alice"))
    assert "wrong key" in rejection(s.drain_effects()).detail
    assert connect(s, credentials=b"mallory", corr=8) is None
    assert "unknown client id" in rejection(s.drain_effects()).detail
    assert connect(s, credentials=b"", corr=9) is None
    effects = s.drain_effects()
    assert "no credentials" in rejection(effects).detail
    assert not s.sessions and not s.pending and s.auth_rejected == 3
    # Rejected at once: answered on a one-shot publication (rate-bounded by the executor), not
    # on a session egress publication of its own.
    (reply,) = [e for e in effects if isinstance(e, SendEgress)]
    assert reply.cluster_session_id == NULL_VALUE


def test_a_replayed_answer_to_an_older_challenge_fails():
    s = make(shared())
    first = challenged(s)
    recorded = challenge_answer(KEY, first.encoded_challenge, b"alice")
    answer(s, first, recorded)
    s.drain_effects()
    second = challenged(s, corr=8)
    assert second.encoded_challenge != first.encoded_challenge
    answer(s, second, recorded)
    rejection(s.drain_effects())
    # And a second answer to the same challenge is not taken (the nonce is used up).
    third = challenged(s, corr=9)
    answer(s, third, b"wrong")
    s.drain_effects()
    assert not answer(s, third, challenge_answer(KEY, third.encoded_challenge, b"alice"))
    assert list(s.sessions) == [first.cluster_session_id]


def test_an_unanswered_challenge_is_rejected_after_its_timeout():
    s = make(shared(timeout_ms=2_000))
    challenge = challenged(s, now=0)
    s.process_pending(3, 1, 2 * S)
    assert s.drain_effects() == [] and s.pending
    s.process_pending(3, 1, 2 * S + MS + 1)
    assert "not answered within 2000 ms" in rejection(s.drain_effects()).detail
    assert not s.pending
    assert not answer(s, challenge, challenge_answer(KEY, challenge.encoded_challenge, b"alice"))


def test_an_authenticator_that_never_decides_is_cut_off_by_the_session_timeout():
    class Undecided:
        def on_connect_request(self, *a):
            pass

        def on_challenge_response(self, *a):
            pass

        def on_connected_session(self, proxy, now_ms):
            pass

        def on_challenged_session(self, proxy, now_ms):
            pass

    s = make(Undecided(), session_timeout_ns=3 * S)
    assert connect(s) is None
    s.process_pending(3, 1, 3 * S + 1)
    assert rejection(s.drain_effects()).detail == "authentication timed out"


def test_an_authenticator_that_raises_rejects_the_client_and_is_reported():
    class Broken:
        def on_connect_request(self, *a):
            raise RuntimeError("boom")

    s = make(Broken())
    assert connect(s) is None
    effects = s.drain_effects()
    assert rejection(effects).detail == "authenticator error"
    assert any(type(e).__name__ == "AuthenticatorFailed" and "boom" in e.error for e in effects)


def test_a_challenge_response_from_another_image_is_foreign():
    s = make(shared())
    challenge = challenged(s)
    assert not answer(s, challenge, challenge_answer(KEY, challenge.encoded_challenge, b"alice"), image=IMG + 1)
    assert [type(e) for e in s.drain_effects()] == [ForeignMessage]
    assert answer(s, challenge, challenge_answer(KEY, challenge.encoded_challenge, b"alice"))


def test_pending_sessions_count_towards_the_limit_and_die_with_the_leadership():
    s = make(shared(), max_sessions=1)
    challenged(s)
    assert connect(s, corr=8) is None
    (event,) = sent(s.drain_effects(), SessionEvent)
    assert event.code == EventCode.ERROR and event.detail == "concurrent session limit"
    s.rollback(commit_position=0)
    assert not s.pending


# ---------------------------------------------------------------------------- binding


def test_an_open_session_takes_messages_only_from_its_own_image():
    s = make()
    session = connect(s)
    s.drain_effects()
    assert s.on_ingress(3, session.id, 3, 1, IMG)
    assert not s.on_ingress(3, session.id, 3, 1, IMG + 1, count=5)
    assert not s.on_keep_alive(3, session.id, 3, 1, IMG + 1)
    assert not s.on_close_request(3, session.id, 3, 1, IMG + 1)
    assert s.foreign_dropped == 5 + 1 + 1
    kinds = [e.kind for e in s.drain_effects() if isinstance(e, ForeignMessage)]
    assert kinds == ["session message", "keep-alive", "close request"]
    assert session.id in s.sessions
    assert s.on_close_request(3, session.id, 3, 1, IMG)


def test_after_an_election_an_inherited_session_binds_to_an_image_of_its_clients_host():
    follower = make(hosts={50: "127.0.0.9", 51: "127.0.0.5", 52: "127.0.0.5"})
    follower.on_log_session_open(SessionOpenEvent(3, 7, 4, 0, 102, CHANNEL, b"alice"), 96)
    follower.rollback(commit_position=96, leadership_term_id=3)
    follower.on_new_leadership(is_leader=True, is_startup=False, leadership_term_id=4, leader_member_id=1, now_ns=0)
    follower.drain_effects()
    assert not follower.on_ingress(4, 4, 4, 1, 50)  # another host: refused, not bound
    assert follower.on_ingress(4, 4, 4, 1, 51)  # the client's host: bound
    assert not follower.on_ingress(4, 4, 4, 1, 52)  # the same host, but not the bound image
    assert follower.rebound == 1 and follower.foreign_dropped == 2
    # The next election unbinds it again (the client moves its ingress to the next leader).
    follower.on_new_leadership(is_leader=True, is_startup=False, leadership_term_id=5, leader_member_id=1, now_ns=0)
    assert follower.on_ingress(5, 4, 5, 1, 52)


# ---------------------------------------------------------------------------- admin requests


def admin(s, session_id, request_type=AdminRequestType.SNAPSHOT, image=IMG, can_snapshot=True):
    return s.on_admin_request(
        AdminRequest(3, session_id, 55, int(request_type)),
        current_term_id=3,
        now_ns=1,
        image_session_id=image,
        can_snapshot=can_snapshot,
    )


def admin_answer(effects) -> AdminResponse:
    (response,) = sent(effects, AdminResponse)
    assert response.correlation_id == 55
    return response


def test_admin_requests_are_denied_by_default():
    s = make()
    session = connect(s)
    s.drain_effects()
    assert admin(s, session.id)
    effects = s.drain_effects()
    assert admin_answer(effects).response_code == AdminResponseCode.UNAUTHORISED_ACCESS
    assert not [e for e in effects if isinstance(e, TakeSnapshot)]


def test_an_allow_listed_principal_gets_a_snapshot_and_an_unknown_type_an_error():
    s = make(shared(), AllowListAuthorisation(frozenset({b"alice"})))
    challenge = challenged(s)
    answer(s, challenge, challenge_answer(KEY, challenge.encoded_challenge, b"alice"))
    s.drain_effects()
    sid = challenge.cluster_session_id
    assert admin(s, sid)
    effects = s.drain_effects()
    assert admin_answer(effects).response_code == AdminResponseCode.OK and TakeSnapshot(sid) in effects
    assert admin(s, sid, request_type=9)
    response = admin_answer(s.drain_effects())
    assert response.response_code == AdminResponseCode.ERROR and "unknown request type 9" in response.message
    assert admin(s, sid, can_snapshot=False)
    effects = s.drain_effects()
    assert admin_answer(effects).response_code == AdminResponseCode.ERROR
    assert not [e for e in effects if isinstance(e, TakeSnapshot)]
    # From another image: not answered at all.
    assert not admin(s, sid, image=IMG + 1)
    assert [type(e) for e in s.drain_effects()] == [ForeignMessage]


def test_the_principal_survives_a_consensus_snapshot():
    s = make()
    s.on_log_session_open(SessionOpenEvent(3, 7, 4, 0, 102, CHANNEL, b"alice"), 96)
    snap = take_cm_snapshot(200, 3, s, Timers(), PendingServiceMessages())
    back = decode_cm_snapshot(encode_cm_snapshot(snap))
    restored = make(authorisation=AllowListAuthorisation(frozenset({b"alice"})))
    restore_cm_snapshot(back, restored, Timers(), PendingServiceMessages())
    assert restored.sessions[4].encoded_principal == b"alice"
