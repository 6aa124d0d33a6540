"""Backup queries through the authenticator (cluster_node.consensus.backup_auth), without I/O."""

from itertools import count

from cluster_node import codecs
from cluster_node.consensus.auth import NullAuthenticator, SharedSecretAuthenticator, challenge_answer
from cluster_node.consensus.backup_auth import (
    BACKUP_SESSION_ID_BASE,
    AnswerBackup,
    BackupAuthenticatorFailed,
    BackupQueryAuth,
    SendBackupReply,
)

MS = 1_000_000
KEY = bytes(range(32))
IMAGE = 77


_NONCE = count(1)


def nonces(n: int) -> bytes:
    return next(_NONCE).to_bytes(n, "big")


def shared_secret() -> SharedSecretAuthenticator:
    return SharedSecretAuthenticator({b"backup": KEY}, nonces, challenge_timeout_ms=5_000)


def core(authenticator, **kw) -> BackupQueryAuth:
    return BackupQueryAuth(
        authenticator, member_id=2, timeout_ns=5_000 * MS, session_id_base=BACKUP_SESSION_ID_BASE, **kw
    )


def query(cid=11, credentials=b"backup") -> codecs.BackupQuery:
    return codecs.BackupQuery(
        cid, 4242, codecs.CONSENSUS_PROTOCOL_VERSION, "aeron:udp?endpoint=127.0.0.9:7000", credentials
    )


def rejection(effects, code=codecs.EventCode.AUTHENTICATION_REJECTED) -> str:
    (e,) = [e for e in effects if type(e) is SendBackupReply and type(e.message) is codecs.SessionEvent]
    assert e.message.code == code
    assert e.response_stream_id == 4242 and e.response_channel.endswith("127.0.0.9:7000")
    return e.message.detail


def challenge_of(effects) -> codecs.Challenge:
    (e,) = effects
    assert type(e) is SendBackupReply and type(e.message) is codecs.Challenge
    return e.message


def test_null_authenticator_answers_at_once() -> None:
    c = core(NullAuthenticator())
    c.on_query(query(credentials=b""), IMAGE, 0)
    assert c.drain_effects() == [AnswerBackup(11, "aeron:udp?endpoint=127.0.0.9:7000", 4242, b"")]
    assert not c.pending


def test_trusted_answers_without_asking_the_authenticator() -> None:
    c = core(shared_secret(), trusted=True)
    c.on_query(query(credentials=b""), IMAGE, 0)
    assert [type(e) for e in c.drain_effects()] == [AnswerBackup]


def test_the_right_answer_to_the_challenge_gets_the_response() -> None:
    c = core(shared_secret())
    c.on_query(query(), IMAGE, 0)
    ch = challenge_of(c.drain_effects())
    assert ch.correlation_id == 11 and ch.cluster_session_id >= BACKUP_SESSION_ID_BASE
    answer = challenge_answer(KEY, ch.encoded_challenge, b"backup")
    assert c.on_challenge_response(codecs.ChallengeResponse(11, ch.cluster_session_id, answer), IMAGE, 1 * MS)
    assert c.drain_effects() == [AnswerBackup(11, "aeron:udp?endpoint=127.0.0.9:7000", 4242, b"backup")]
    assert not c.pending and c.answered == 1


def test_a_wrong_key_is_rejected() -> None:
    c = core(shared_secret())
    c.on_query(query(), IMAGE, 0)
    ch = challenge_of(c.drain_effects())
    answer = challenge_answer(bytes(32), ch.encoded_challenge, b"backup")
    assert c.on_challenge_response(codecs.ChallengeResponse(11, ch.cluster_session_id, answer), IMAGE, 1 * MS)
    assert rejection(c.drain_effects()) == "member 2: unknown client id or wrong key"
    assert not c.pending and c.rejected == 1


def test_no_credentials_and_an_unknown_id_are_rejected_without_a_challenge() -> None:
    for credentials, reason in ((b"", "no credentials"), (b"mallory", "unknown client id or wrong key")):
        c = core(shared_secret())
        c.on_query(query(credentials=credentials), IMAGE, 0)
        assert reason in rejection(c.drain_effects())
        assert not c.pending


def test_an_answer_from_another_image_or_correlation_is_not_taken() -> None:
    c = core(shared_secret())
    c.on_query(query(), IMAGE, 0)
    ch = challenge_of(c.drain_effects())
    answer = challenge_answer(KEY, ch.encoded_challenge, b"backup")
    assert not c.on_challenge_response(codecs.ChallengeResponse(11, ch.cluster_session_id, answer), IMAGE + 1, MS)
    assert not c.on_challenge_response(codecs.ChallengeResponse(12, ch.cluster_session_id, answer), IMAGE, MS)
    assert not c.on_challenge_response(codecs.ChallengeResponse(11, ch.cluster_session_id + 1, answer), IMAGE, MS)
    assert c.drain_effects() == [] and len(c.pending) == 1


def test_an_unanswered_challenge_is_rejected_and_forgotten() -> None:
    auth = shared_secret()
    c = core(auth)
    c.on_query(query(), IMAGE, 0)
    challenge_of(c.drain_effects())
    c.process(4_000 * MS)
    assert c.drain_effects() == [] and len(c.pending) == 1
    c.process(5_001 * MS)
    assert "not authenticated within 5000 ms" in rejection(c.drain_effects())
    assert not c.pending and not auth._pending  # the authenticator's nonce is gone too


class Undecided:
    """An authenticator that never decides: the core's own timeout must bound the table."""

    def __init__(self) -> None:
        self.forgotten: list[int] = []

    def on_connect_request(self, session_id, encoded_credentials, now_ms) -> None:
        pass

    def on_challenge_response(self, session_id, encoded_credentials, now_ms) -> None:
        pass

    def on_connected_session(self, proxy, now_ms) -> None:
        pass

    def on_challenged_session(self, proxy, now_ms) -> None:
        pass

    def forget(self, session_id) -> None:
        self.forgotten.append(session_id)


def test_the_table_is_bounded_and_a_duplicate_is_ignored() -> None:
    auth = Undecided()
    c = core(auth, capacity=3)
    for cid in range(3):
        c.on_query(query(cid), IMAGE, 0)
    c.on_query(query(0), IMAGE, 0)  # the same question again
    assert len(c.pending) == 3 and c.drain_effects() == []
    c.on_query(query(3), IMAGE, 0)
    assert "too many backup queries" in rejection(c.drain_effects(), codecs.EventCode.ERROR)
    assert len(c.pending) == 3
    c.process(6_000 * MS)
    assert len(c.drain_effects()) == 3 and not c.pending and len(auth.forgotten) == 3


class Raising(Undecided):
    def on_connected_session(self, proxy, now_ms) -> None:
        raise RuntimeError("boom")


def test_an_authenticator_that_raises_rejects_the_query() -> None:
    c = core(Raising())
    c.on_query(query(), IMAGE, 0)
    effects = c.drain_effects()
    assert BackupAuthenticatorFailed("RuntimeError: boom") in effects
    assert rejection(effects) == "member 2: authenticator error"
    assert not c.pending


def test_a_kept_proxy_can_do_nothing_later() -> None:
    kept = []

    class Keeper(Undecided):
        def on_connected_session(self, proxy, now_ms) -> None:
            kept.append(proxy)

    c = core(Keeper())
    c.on_query(query(), IMAGE, 0)
    assert not kept[0].authenticate(b"x") and c.drain_effects() == []
