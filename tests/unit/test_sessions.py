"""ClusterSessions (cluster_node.consensus.sessions): who may connect, what goes into the log
and what each client is told."""

from __future__ import annotations

from cluster_node.codecs import (
    CLIENT_PROTOCOL_VERSION,
    CloseReason,
    EventCode,
    NewLeaderEvent,
    SessionCloseEvent,
    SessionConnectRequest,
    SessionOpenEvent,
    compose_semantic_version,
)
from cluster_node.consensus.sessions import (
    AppendSessionEvent,
    CloseEgress,
    ClusterSessions,
    SendEgress,
    SessionSettings,
)

S = 1_000_000_000
ENDPOINTS = "0=127.0.0.1:9010,1=127.0.0.1:9011,2=127.0.0.1:9012"


def make(**kw) -> ClusterSessions:
    return ClusterSessions(member_id=1, ingress_endpoints=ENDPOINTS, settings=SessionSettings(**kw))


IMG = 77
"""The ingress image the test client's messages come on."""


def connect(s: ClusterSessions, corr=7, leader=True, version=CLIENT_PROTOCOL_VERSION, now=0, image=IMG):
    req = SessionConnectRequest(corr, 102, version, "aeron:udp?endpoint=127.0.0.1:9999")
    return s.on_connect_request(
        req,
        is_leader=leader,
        leader_member_id=1 if leader else 0,
        leadership_term_id=3,
        now_ns=now,
        image_session_id=image,
    )


def events(effects):
    return [e.message for e in effects if isinstance(e, SendEgress)]


def appended(effects):
    return [e.message for e in effects if isinstance(e, AppendSessionEvent)]


def test_follower_redirects_to_the_leader_with_every_ingress_endpoint():
    s = make()
    assert connect(s, leader=False) is None
    (ev,) = events(s.drain_effects())
    assert ev.code == EventCode.REDIRECT and ev.detail == ENDPOINTS and ev.leader_member_id == 0
    assert ev.correlation_id == 7 and not s.sessions


def test_leader_opens_a_session_logs_it_then_answers_ok():
    s = make()
    session = connect(s, now=5)
    effects = s.drain_effects()
    assert [type(e) for e in effects] == [AppendSessionEvent, SendEgress]
    (opened,) = appended(effects)
    assert opened == SessionOpenEvent(3, 7, session.id, 5, 102, "aeron:udp?endpoint=127.0.0.1:9999")
    # Not in the log until the agent appends it; then at the position after the event.
    assert session.opened_log_position > 2**62
    s.on_event_appended(effects[0], 736)
    assert session.opened_log_position == 736
    (ok,) = events(effects)
    assert ok.code == EventCode.OK and ok.cluster_session_id == session.id and ok.leadership_term_id == 3
    assert connect(s, corr=8).id == session.id + 1


def test_wrong_major_version_and_session_limit_are_refused_without_logging():
    s = make(max_sessions=2)
    assert connect(s, version=compose_semantic_version(1, 0, 0)) is None
    (ev,) = events(s.drain_effects())
    assert ev.code == EventCode.ERROR and "invalid client version" in ev.detail
    connect(s), connect(s)
    s.drain_effects()
    assert connect(s) is None
    effects = s.drain_effects()
    assert appended(effects) == [] and events(effects)[0].detail == "concurrent session limit"
    assert s.rejected == 2


def test_ingress_refreshes_activity_and_a_silent_session_times_out():
    s = make(session_timeout_ns=10 * S)
    a = connect(s, now=0)
    b = connect(s, corr=8, now=0)
    s.drain_effects()
    assert s.on_ingress(3, a.id, 3, 9 * S, IMG)
    assert not s.on_ingress(2, a.id, 3, 9 * S, IMG)  # stale term: dropped, and told who leads now
    assert s.stale_term_dropped == 1
    (told,) = events(s.drain_effects())
    assert told == NewLeaderEvent(3, a.id, 1, ENDPOINTS)
    assert not s.on_ingress(2, a.id, 3, 9 * S + 1, IMG) and s.drain_effects() == []  # not again at once
    assert s.check_timeouts(3, 11 * S) == 1  # b only
    effects = s.drain_effects()
    assert appended(effects) == [SessionCloseEvent(3, b.id, 11 * S, CloseReason.TIMEOUT)]
    assert events(effects)[0].code == EventCode.CLOSED and CloseEgress(b.id) in effects
    assert list(s.sessions) == [a.id]
    assert not s.on_ingress(3, b.id, 3, 12 * S, IMG)


def test_client_close_is_logged_without_a_closed_event():
    s = make()
    a = connect(s)
    s.drain_effects()
    assert s.on_close_request(3, a.id, 3, 1, IMG)
    effects = s.drain_effects()
    assert appended(effects) == [SessionCloseEvent(3, a.id, 1, CloseReason.CLIENT_ACTION)]
    assert events(effects) == []


def test_followers_learn_sessions_from_the_log_and_the_next_leader_greets_them():
    s = make()
    s.on_log_session_open(SessionOpenEvent(2, 7, 41, 0, 102, "aeron:udp?endpoint=127.0.0.1:9999"), 128)
    s.on_log_session_open(SessionOpenEvent(2, 8, 42, 0, 102, "aeron:udp?endpoint=127.0.0.1:9998"), 256)
    s.on_log_session_close(SessionCloseEvent(2, 41, 0, CloseReason.CLIENT_ACTION))
    assert list(s.sessions) == [42] and s.next_session_id == 43
    s.on_new_leadership(is_leader=True, is_startup=False, leadership_term_id=3, leader_member_id=1, now_ns=5)
    (ev,) = events(s.drain_effects())
    assert ev == NewLeaderEvent(3, 42, 1, ENDPOINTS)


def test_after_a_full_restart_the_leader_closes_old_sessions():
    s = make()
    s.on_log_session_open(SessionOpenEvent(2, 7, 41, 0, 102, "aeron:udp?endpoint=127.0.0.1:9999"), 128)
    s.on_new_leadership(is_leader=True, is_startup=True, leadership_term_id=3, leader_member_id=1, now_ns=5)
    effects = s.drain_effects()
    assert appended(effects) == [SessionCloseEvent(3, 41, 5, CloseReason.TIMEOUT)] and not s.sessions
    # The client is told, in case it is still there (the leader alone restarted): it reconnects.
    (ev,) = events(effects)
    assert ev.code == EventCode.CLOSED and ev.detail == "TIMEOUT" and CloseEgress(41) in effects


def log(s: ClusterSessions, end_position: int) -> None:
    """The agent appends the leader's pending session events; the last ends at ``end_position``."""
    effects = [e for e in s.drain_effects() if isinstance(e, AppendSessionEvent)]
    for i, e in enumerate(effects):
        s.on_event_appended(e, end_position - 96 * (len(effects) - 1 - i))


def test_rollback_forgets_uncommitted_opens_and_reopens_uncommitted_closes():
    s = make()
    old = connect(s)
    log(s, 196)
    s.on_commit(200)
    s.on_close_request(3, old.id, 3, 1, IMG)
    log(s, 396)
    young = connect(s, corr=9)
    log(s, 496)
    s.rollback(commit_position=250)
    assert list(s.sessions) == [old.id] and s.sessions[old.id].state.name == "OPEN"
    assert young.id not in s.sessions


def test_an_event_ending_exactly_at_the_commit_position_is_committed():
    """Positions are those after each event, on the leader and on followers alike: a follower
    that applied an open ending at the commit position keeps the session through a rollback
    (a chaos run lost a client's session that way: the next leader had never heard of it)."""
    from cluster_node.codecs import SessionOpenEvent

    follower = make()
    follower.on_log_session_open(SessionOpenEvent(3, 9, 5, 0, 102, "aeron:udp?endpoint=127.0.0.1:9"), 1670880)
    follower.rollback(commit_position=1670880)
    assert list(follower.sessions) == [5]

    leader = make()
    session = connect(leader)
    leader.rollback(commit_position=1000)  # its open was never appended: gone
    assert not leader.sessions
    session = connect(leader, corr=8)
    log(leader, 1096)
    leader.rollback(commit_position=1096)
    assert list(leader.sessions) == [session.id]
    leader.on_close_request(3, session.id, 3, 1, IMG)
    log(leader, 1192)
    leader.on_commit(1192)  # the close ends at the commit position: final
    leader.rollback(commit_position=1192)
    assert not leader.sessions


# ------------------------------------------------------------------ a leader that steps down (issue 34)


def test_a_leader_stepping_down_tells_the_clients_of_sessions_the_log_will_not_keep():
    """Opened and answered OK, never committed: at the rollback the client is told CLOSED
    "election" on the session's own egress (so it connects again at once), with the term it
    connected in; a committed session stays and only its egress is released."""
    s = make()
    kept = connect(s)
    log(s, 196)
    s.on_commit(196)
    young = connect(s, corr=9)
    log(s, 292)
    s.rollback(commit_position=200, leadership_term_id=3, now_ns=10 * S)
    effects = s.drain_effects()
    (ev,) = events(effects)
    assert ev.cluster_session_id == young.id and ev.code == EventCode.CLOSED and ev.detail == "election"
    assert ev.leadership_term_id == 3 and ev.correlation_id == 9
    sends = [e for e in effects if isinstance(e, SendEgress)]
    assert sends[0].cluster_session_id == young.id  # the session's own publication, then released
    assert effects.index(CloseEgress(young.id)) > effects.index(sends[0])
    assert CloseEgress(kept.id) in effects and list(s.sessions) == [kept.id]
    assert s.rolled_back == 1 and (3, young.id) in s.gone


def test_a_member_that_does_not_lead_answers_a_rolled_back_session_again_and_never_a_flood():
    s = make(answer_interval_ns=S // 4)
    ghost = connect(s)
    s.drain_effects()
    s.rollback(commit_position=0, leadership_term_id=3, now_ns=10 * S)
    s.drain_effects()
    # Just told: not again at once (its offers still queued here come in a burst).
    assert not s.on_ingress_not_leading(3, ghost.id, leader_member_id=2, current_term_id=4, now_ns=10 * S + 1)
    # Its client missed the event and keeps offering: told again, at most every answer interval.
    assert s.on_ingress_not_leading(3, ghost.id, leader_member_id=2, current_term_id=4, now_ns=11 * S)
    assert not s.on_ingress_not_leading(3, ghost.id, leader_member_id=2, current_term_id=4, now_ns=11 * S + 1)
    (send,) = [e for e in s.drain_effects() if isinstance(e, SendEgress)]
    assert send.cluster_session_id == -1  # a short-lived publication: the session's was released
    assert send.response_channel == "aeron:udp?endpoint=127.0.0.1:9999"
    ev = send.message
    assert (ev.code, ev.detail, ev.leader_member_id, ev.leadership_term_id) == (EventCode.CLOSED, "election", 2, 3)
    assert s.on_ingress_not_leading(3, ghost.id, leader_member_id=2, current_term_id=4, now_ns=11 * S + S // 4)
    # The same id in another term is another session (ids start again with each leader).
    s.drain_effects()
    assert not s.on_ingress_not_leading(4, ghost.id, leader_member_id=2, current_term_id=4, now_ns=12 * S)
    # A client that closes it, or the session timeout, ends the answers.
    s.on_close_request_not_leading(3, ghost.id)
    assert not s.on_ingress_not_leading(3, ghost.id, leader_member_id=2, current_term_id=4, now_ns=13 * S)


def test_rolled_back_sessions_are_forgotten_after_the_session_timeout():
    s = make(session_timeout_ns=10 * S)
    ghost = connect(s)
    s.rollback(commit_position=0, leadership_term_id=3, now_ns=10 * S)
    s.drain_effects()
    assert not s.on_ingress_not_leading(3, ghost.id, leader_member_id=2, current_term_id=4, now_ns=21 * S)
    assert not s.gone


def test_a_follower_sends_a_session_it_knows_to_the_leader_it_follows():
    """A client offering to a follower (it missed the NewLeaderEvent) gets one naming the leader;
    while no leader is known there is nothing useful to say, and a session unknown here has no
    egress channel to say it on."""
    s = make()
    s.on_log_session_open(SessionOpenEvent(2, 7, 42, 0, 102, "aeron:udp?endpoint=127.0.0.1:9998"), 128)
    assert not s.on_ingress_not_leading(2, 42, leader_member_id=-1, current_term_id=3, now_ns=S)
    assert not s.on_ingress_not_leading(2, 42, leader_member_id=1, current_term_id=3, now_ns=S)  # 1 is this member
    assert s.on_ingress_not_leading(2, 42, leader_member_id=0, current_term_id=3, now_ns=S)
    (send,) = [e for e in s.drain_effects() if isinstance(e, SendEgress)]
    assert send.message == NewLeaderEvent(3, 42, 0, ENDPOINTS) and send.cluster_session_id == -1
    assert not s.on_ingress_not_leading(2, 42, leader_member_id=0, current_term_id=3, now_ns=S + 1)
    assert not s.on_ingress_not_leading(2, 43, leader_member_id=0, current_term_id=3, now_ns=2 * S)
    assert s.drain_effects() == []


def test_a_suspended_leader_tells_each_open_session_its_requests_wait_and_a_resume_restarts_timeouts():
    from cluster_node.consensus.sessions import SUSPENDED_DETAIL

    s = make(session_timeout_ns=10)
    a, b = connect(s, corr=7), connect(s, corr=8)
    s.drain_effects()
    assert s.remind_suspended(3) == 2
    told = events(s.drain_effects())
    assert sorted(e.cluster_session_id for e in told) == [a.id, b.id]
    assert all(e.code == EventCode.OK and e.detail == SUSPENDED_DETAIL and e.leadership_term_id == 3 for e in told)
    s.on_resume(now_ns=1_000)
    assert s.check_timeouts(3, 1_005) == 0  # silent since before the resume, but not counted
    assert s.check_timeouts(3, 1_011) == 2


def test_a_response_channel_must_be_a_plain_udp_endpoint_of_the_requests_source():
    from cluster_node.consensus.sessions import response_channel_refusal as refusal

    ok = "aeron:udp?endpoint=10.0.0.5:4000"
    assert refusal(ok, 102, "10.0.0.5", 102) is None
    assert refusal("aeron:ipc", 102, None, 102) is None  # over IPC: the same host
    cases = {
        ("aeron:udp?endpoint=10.0.0.9:4000", 102, "10.0.0.5"): "source",
        ("aeron:udp?endpoint=10.0.0.5:4000|control=10.0.0.5:4001", 102, "10.0.0.5"): "parameters",
        ("aeron:udp?endpoint=10.0.0.5:4000|term-length=1g", 102, "10.0.0.5"): "parameters",
        ("aeron:udp?endpoint=10.0.0.5:4000|interface=10.0.0.5", 102, "10.0.0.5"): "parameters",
        (ok, 7, "10.0.0.5"): "stream",
        ("aeron:udp?endpoint=10.0.0.5:0", 102, "10.0.0.5"): "port",
        ("aeron:ipc", 102, "10.0.0.5"): "not udp",
        ("aeron:udp?control-mode=manual", 102, "10.0.0.5"): "not udp",
        ("http://x", 102, "10.0.0.5"): "unparsable",
    }
    for (channel, stream, source), kind in cases.items():
        why = refusal(channel, stream, source, 102)
        assert why is not None and why.split(":")[0] == kind, (channel, why)
