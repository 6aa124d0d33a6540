"""The backup's side of an authenticated query (cluster_node.backup_link.BackupLink) over a fake
driver: its query carries the credentials, a Challenge is answered to the member that was asked,
refusals are told apart (final or ask again), and messages answering nothing of ours are dropped."""

from types import SimpleNamespace

from cluster_node import codecs
from cluster_node.backup_link import BackupLink
from cluster_node.client.credentials import SharedSecretCredentials
from cluster_node.codecs import CONSENSUS_CODEC, EGRESS_CODEC
from cluster_node.consensus.auth import challenge_answer

KEY = bytes(range(32))


class Pub:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def offer(self, data: bytes) -> int:
        self.sent.append(bytes(data))
        return len(data)

    def close(self) -> None:
        pass


class Sub:
    def __init__(self) -> None:
        self.inbox: list[bytes] = []

    def poll(self, handler, limit: int) -> int:
        n = 0
        while self.inbox and n < limit:
            data = self.inbox.pop(0)
            handler(data, 0, len(data), None)
            n += 1
        return n

    def close(self) -> None:
        pass


class Driver:
    def __init__(self) -> None:
        self.pubs: dict[str, Pub] = {}
        self.sub = Sub()

    def add_subscription(self, channel: str, stream_id: int) -> Sub:
        return self.sub

    def add_publication(self, channel: str, stream_id: int, exclusive: bool = True) -> Pub:
        return self.pubs.setdefault(channel, Pub())


MEMBERS = [SimpleNamespace(id=i, consensus=f"127.0.0.1:{9000 + i}") for i in range(3)]


def link(credentials=None) -> tuple[BackupLink, Driver]:
    d = Driver()
    return BackupLink(
        d,
        MEMBERS,
        consensus_stream_id=108,
        consensus_term_length=65536,
        response_endpoint="127.0.0.1:7000",
        credentials=credentials,
    ), d


def sent(d: Driver, member_id: int) -> list:
    pub = d.pubs[f"aeron:udp?endpoint=127.0.0.1:{9000 + member_id}|term-length=65536"]
    return [CONSENSUS_CODEC.decode(b) for b in pub.sent]


def response(correlation_id: int, member_id: int) -> bytes:
    return CONSENSUS_CODEC.encode(codecs.BackupResponse(correlation_id, 3, 0, 0, 0, 0, 42, member_id, member_id))


def event(correlation_id: int, code, detail: str = "member 1: no") -> bytes:
    return EGRESS_CODEC.encode(
        codecs.SessionEvent(5, correlation_id, -1, -1, code, codecs.CLIENT_PROTOCOL_VERSION, detail)
    )


def test_the_challenge_is_answered_to_the_member_asked_and_the_answer_keeps_the_core_s_id() -> None:
    lk, d = link(SharedSecretCredentials(b"backup", KEY))
    lk.send_query(1, 500)
    (q,) = sent(d, 1)
    assert q.encoded_credentials == b"backup" and q.correlation_id != 500
    d.sub.inbox.append(EGRESS_CODEC.encode(codecs.Challenge(q.correlation_id, 1 << 57, b"nonce")))
    assert lk.poll() == []
    (_, answer) = sent(d, 1)
    assert answer == codecs.ChallengeResponse(q.correlation_id, 1 << 57, challenge_answer(KEY, b"nonce", b"backup"))
    assert sent(d, 0) == [] and sent(d, 2) == []
    d.sub.inbox.append(response(q.correlation_id, 1))
    (r,) = lk.poll()
    assert r.correlation_id == 500 and r.member_id == 1


def test_refusals_are_final_or_not_and_strays_are_dropped() -> None:
    lk, d = link()
    lk.send_query(1, 500)
    lk.send_query(2, 500)
    (q1,) = sent(d, 1)
    (q2,) = sent(d, 2)
    assert q1.encoded_credentials == b""
    d.sub.inbox += [
        EGRESS_CODEC.encode(codecs.Challenge(q1.correlation_id, 7, b"nonce")),  # no credentials to answer with
        event(q2.correlation_id, codecs.EventCode.ERROR, "member 2: busy"),
        event(12345, codecs.EventCode.AUTHENTICATION_REJECTED),  # answers nothing of ours
        response(q1.correlation_id + 1, 1),  # nor this
    ]
    assert lk.poll() == []
    refusals = lk.drain_refusals()
    assert refusals[0][0] == 1 and refusals[0][2] is True and "has none" in refusals[0][1]
    assert refusals[1] == (2, "member 2: busy", False)
    assert len(refusals) == 2 and lk.errors.total == 1 and lk.drain_refusals() == []
    lk.send_query(1, 501)
    (_, q1b) = sent(d, 1)
    d.sub.inbox.append(event(q1b.correlation_id, codecs.EventCode.AUTHENTICATION_REJECTED, "member 1: wrong key"))
    lk.poll()
    assert lk.drain_refusals() == [(1, "member 1: wrong key", True)]
