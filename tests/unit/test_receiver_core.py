"""ImageReceiverCore (cluster_node.media.receiver_core): accepting runs, rebuild position, gaps and NAKs, status
messages, liveness and end of stream, with a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.media.frames import (
    FLAG_EOS,
    FLAG_SEND_SETUP,
    FLAG_UNFRAGMENTED,
    DataRun,
    Heartbeat,
    Nak,
    StatusMessage,
    decode_untrusted,
)
from cluster_node.media.receiver_core import Accept, ImageReceiverCore, ReceiverConfig

TL = 64 * 1024
MTU = 1408
SID = 31
STREAM = 1002
RID = 0x5EED
T0 = 1_000_000_000
US = 1_000
MS = 1_000_000
CFG = ReceiverConfig()
WINDOW = min(CFG.initial_window, TL // 2)
F = 160  # frame size used by the runs below


def make(*, itid=0, active=None, offset=0, config=CFG, now=T0) -> ImageReceiverCore:
    return ImageReceiverCore(
        session_id=SID,
        stream_id=STREAM,
        initial_term_id=itid,
        active_term_id=itid if active is None else active,
        term_offset=offset,
        term_length=TL,
        mtu=MTU,
        receiver_id=RID,
        now_ns=now,
        config=config,
    )


def run(core: ImageReceiverCore, position: int, length: int, covered: int | None = None) -> DataRun:
    return DataRun(
        position & (TL - 1),
        SID,
        STREAM,
        core.term_id_of(position),
        FLAG_UNFRAGMENTED,
        length,
        length if covered is None else covered,
    )


def frames(core: ImageReceiverCore, first: int, count: int, now: int = T0):
    return core.on_data(run(core, first * F, count * F), now)


def heartbeat(core: ImageReceiverCore, position: int, now: int, eos: bool = False) -> None:
    core.on_heartbeat(
        Heartbeat(
            FLAG_UNFRAGMENTED | (FLAG_EOS if eos else 0), position & (TL - 1), SID, STREAM, core.term_id_of(position)
        ),
        now,
    )


def work(core: ImageReceiverCore, now: int, send_setup: bool = False) -> tuple[list[Nak], list[StatusMessage]]:
    out: list = []
    core.do_work(now, out, send_setup)
    decoded = [decode_untrusted(b) for b in out]
    naks = [d for d in decoded if isinstance(d, Nak)]
    sms = [d for d in decoded if isinstance(d, StatusMessage)]
    assert len(naks) + len(sms) == len(out)
    return naks, sms


def quiet(core: ImageReceiverCore, now: int = T0) -> None:
    """Send the initial status message so that later ones are due only by interval or consumption."""
    _naks, sms = work(core, now)
    assert len(sms) == 1


# ------------------------------------------------------------------------------ join / accept


def test_join_position_from_setup():
    core = make(itid=5, active=7, offset=512)
    assert core.join_position == core.rebuild_position == core.hwm_position == core.consumption_position == 2 * TL + 512
    assert core.window == WINDOW == 32 * 1024
    assert make(config=ReceiverConfig(initial_window=4096)).window == 4096


def test_in_order_runs():
    core = make()
    assert frames(core, 0, 3) == (Accept.INSERT, 0)
    assert frames(core, 3, 3) == (Accept.INSERT, 3 * F)
    assert core.rebuild_position == core.hwm_position == 6 * F
    assert core.gap_start == -1
    assert core.stats.runs == 2 and core.stats.bytes == 6 * F


def test_out_of_order_then_fill():
    core = make()
    assert frames(core, 3, 3) == (Accept.INSERT, 3 * F)
    assert core.rebuild_position == 0 and core.hwm_position == 6 * F
    assert (core.gap_start, core.gap_length) == (0, 3 * F)
    assert frames(core, 8, 2) == (Accept.INSERT, 8 * F)
    assert core.hwm_position == 10 * F and (core.gap_start, core.gap_length) == (0, 3 * F)
    assert frames(core, 0, 3) == (Accept.INSERT, 0)
    assert core.rebuild_position == 6 * F  # up to the next gap
    assert (core.gap_start, core.gap_length) == (6 * F, 2 * F)
    assert frames(core, 6, 2) == (Accept.INSERT, 6 * F)
    assert core.rebuild_position == 10 * F and core.gap_start == -1


def test_duplicates():
    core = make()
    frames(core, 0, 5)
    assert frames(core, 0, 5) == (Accept.DUPLICATE, 0)
    assert frames(core, 2, 3) == (Accept.DUPLICATE, 2 * F)
    assert core.stats.duplicates == 2
    # A run straddling the rebuild position is taken (its new part is needed).
    assert frames(core, 3, 4) == (Accept.INSERT, 3 * F)
    assert core.rebuild_position == 7 * F
    # The same out-of-order run twice, then the fill: ranges merge.
    frames(core, 9, 2)
    frames(core, 9, 2)
    frames(core, 10, 3)
    frames(core, 7, 2)
    assert core.rebuild_position == 13 * F and core.gap_start == -1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 39), st.integers(1, 6)), min_size=1, max_size=60))
def test_rebuild_position_is_the_contiguous_prefix(runs):
    core = make()
    covered: set[int] = set()
    hwm = 0
    for first, count in runs:
        last = min(first + count, 40)
        before = core.rebuild_position
        action, position = core.on_data(run(core, first * F, (last - first) * F), T0)
        assert position == first * F
        assert action == (Accept.DUPLICATE if last * F <= before else Accept.INSERT)
        covered |= set(range(first, last))
        hwm = max(hwm, last * F)
        prefix = 0
        while prefix in covered:
            prefix += 1
        assert core.rebuild_position == prefix * F
        assert core.hwm_position == hwm
        if hwm > prefix * F:
            nxt = min(i for i in covered if i > prefix)
            assert (core.gap_start, core.gap_length) == (prefix * F, nxt * F - prefix * F)
        else:
            assert core.gap_start == -1


def test_overrun_beyond_consumption_plus_window():
    core = make()
    assert core.on_data(run(core, WINDOW - F, F + 32), T0)[0] == Accept.OVERRUN
    assert core.stats.overruns == 1
    assert core.hwm_position == 0  # an over-run is not evidence of anything
    assert core.on_data(run(core, WINDOW - F, F), T0)[0] == Accept.INSERT
    core.on_consumed(4096)
    assert core.on_data(run(core, WINDOW, 4096), T0)[0] == Accept.INSERT
    assert core.on_data(run(core, WINDOW + 4096, 32), T0)[0] == Accept.OVERRUN


def test_consumption_only_moves_forward():
    core = make()
    core.on_consumed(4096)
    core.on_consumed(1024)
    assert core.consumption_position == 4096


def test_header_only_padding_covers_the_term_end():
    core = make(offset=TL - 4096)
    core.on_consumed(TL - 4096)
    assert core.on_data(run(core, TL - 4096, 32, covered=4096), T0) == (Accept.INSERT, TL - 4096)
    assert core.rebuild_position == TL == core.hwm_position


# -------------------------------------------------------------------------------- gaps / NAKs


def test_gap_is_naked_after_the_delay_then_retried():
    core = make(itid=3)
    quiet(core)
    t1 = T0 + 5 * US
    frames(core, 0, 1, t1)
    frames(core, 3, 1, t1)
    assert core.next_deadline_ns() == t1 + CFG.nak_delay_ns
    assert work(core, t1 + CFG.nak_delay_ns - 1)[0] == []
    naks, _ = work(core, t1 + CFG.nak_delay_ns)
    assert naks == [Nak(SID, STREAM, 3, F, 2 * F)]
    assert core.stats.naks == 1
    t2 = t1 + CFG.nak_delay_ns
    assert work(core, t2 + CFG.nak_retry_ns - 1)[0] == []
    assert work(core, t2 + CFG.nak_retry_ns)[0] == [Nak(SID, STREAM, 3, F, 2 * F)]
    assert work(core, t2 + 2 * CFG.nak_retry_ns)[0] == [Nak(SID, STREAM, 3, F, 2 * F)]
    assert core.stats.naks == 3
    # Filled: no more NAKs.
    frames(core, 1, 2, t2 + 2 * CFG.nak_retry_ns + 1)
    assert core.gap_start == -1
    assert work(core, t2 + 10 * CFG.nak_retry_ns)[0] == []


def test_nak_timer_restarts_when_the_gap_moves():
    core = make()
    quiet(core)
    frames(core, 0, 1, T0)
    frames(core, 5, 1, T0)
    naks, _ = work(core, T0 + CFG.nak_delay_ns)
    assert naks == [Nak(SID, STREAM, 0, F, 4 * F)]
    t = T0 + CFG.nak_delay_ns + 1 * MS
    frames(core, 1, 2, t)  # the front of the gap arrives: a new gap [3F, 5F)
    assert (core.gap_start, core.gap_length) == (3 * F, 2 * F)
    assert work(core, t + CFG.nak_delay_ns - 1)[0] == []
    assert work(core, t + CFG.nak_delay_ns)[0] == [Nak(SID, STREAM, 0, 3 * F, 2 * F)]


def test_gap_shrinks_when_filled_from_behind():
    core = make()
    frames(core, 0, 1, T0)
    frames(core, 6, 1, T0)
    frames(core, 4, 2, T0)
    assert (core.gap_start, core.gap_length) == (F, 3 * F)


def test_tail_loss_seen_through_a_heartbeat():
    core = make()
    quiet(core)
    frames(core, 0, 2, T0)
    heartbeat(core, 6 * F, T0 + MS)
    assert core.hwm_position == 6 * F and core.stats.heartbeats == 1
    assert work(core, T0 + MS + CFG.nak_delay_ns)[0] == [Nak(SID, STREAM, 0, 2 * F, 4 * F)]


def test_heartbeats_outside_the_window_do_not_move_the_high_water_mark():
    core = make(offset=4096)
    heartbeat(core, 1024, T0)  # behind the rebuild position
    assert core.hwm_position == 4096 and core.gap_start == -1
    heartbeat(core, 4096 + WINDOW + TL + 32, T0)  # impossibly far ahead
    assert core.hwm_position == 4096 and core.gap_start == -1
    heartbeat(core, 4096 + WINDOW + TL, T0)
    assert core.hwm_position == 4096 + WINDOW + TL


def test_nak_stops_at_the_term_end():
    core = make(itid=10, offset=TL - 2 * F)
    core.on_consumed(TL - 2 * F)
    quiet(core)
    core.on_data(run(core, TL, F), T0)  # first frame of the next term; the last two of this one lost
    naks, _ = work(core, T0 + CFG.nak_delay_ns)
    assert naks == [Nak(SID, STREAM, 10, TL - 2 * F, 2 * F)]


def test_nak_term_ids_wrap():
    core = make(itid=2**31 - 1, active=-(2**31), offset=0)
    assert core.join_position == TL
    quiet(core)
    core.on_data(run(core, TL + 2 * F, F), T0)
    naks, _ = work(core, T0 + CFG.nak_delay_ns)
    assert naks == [Nak(SID, STREAM, -(2**31), 0, 2 * F)]
    assert core.position_of(2**31 - 1, 0) == 0 and core.term_id_of(TL) == -(2**31)


# -------------------------------------------------------------------------------- status messages


def test_first_status_message_at_once_then_by_interval():
    core = make(itid=4, active=6, offset=1024)
    _naks, sms = work(core, T0)
    assert sms == [StatusMessage(0, SID, STREAM, 6, 1024, WINDOW, RID)]
    assert core.stats.status_messages == 1
    assert work(core, T0 + CFG.status_interval_ns - 1) == ([], [])
    assert core.next_deadline_ns() == T0 + CFG.status_interval_ns
    assert len(work(core, T0 + CFG.status_interval_ns)[1]) == 1


def test_status_message_after_a_quarter_window_of_consumption():
    core = make()
    quiet(core)
    core.on_consumed(WINDOW // 4 - 32)
    assert not core.status_due(T0 + 1)
    assert work(core, T0 + 1) == ([], [])
    core.on_consumed(WINDOW // 4)
    assert core.status_due(T0 + 2)
    _naks, sms = work(core, T0 + 2)
    assert sms == [StatusMessage(0, SID, STREAM, 0, WINDOW // 4, WINDOW, RID)]
    # The next one needs another quarter window from there.
    core.on_consumed(WINDOW // 2 - 32)
    assert work(core, T0 + 3) == ([], [])
    core.on_consumed(WINDOW // 2)
    assert len(work(core, T0 + 4)[1]) == 1


def test_status_message_reports_consumption_across_terms():
    core = make(itid=-2)
    quiet(core)
    core.on_consumed(3 * TL + 640)
    _naks, sms = work(core, T0 + 1)
    assert (sms[0].consumption_term_id, sms[0].consumption_term_offset) == (1, 640)


def test_send_setup_flag_and_setup_again():
    core = make()
    quiet(core)
    _naks, sms = work(core, T0 + 1, send_setup=True)
    assert len(sms) == 1 and sms[0].flags == FLAG_SEND_SETUP and sms[0].wants_setup
    assert work(core, T0 + 2) == ([], [])
    core.on_setup_again(T0 + 3)
    _naks, sms = work(core, T0 + 3)
    assert len(sms) == 1 and not sms[0].wants_setup


def test_nak_and_status_in_one_duty_cycle():
    core = make()
    frames(core, 1, 1, T0)
    out: list = []
    core.do_work(T0 + CFG.nak_delay_ns, out)
    assert [type(decode_untrusted(b)).__name__ for b in out] == ["Nak", "StatusMessage"]


# ----------------------------------------------------------------------------- liveness / EOS


def test_liveness():
    core = make()
    timeout = CFG.image_liveness_timeout_ns
    assert core.is_alive(T0 + timeout) and not core.is_alive(T0 + timeout + 1)
    frames(core, 0, 1, T0 + 5 * MS)
    assert core.is_alive(T0 + 5 * MS + timeout) and not core.is_alive(T0 + 5 * MS + timeout + 1)
    heartbeat(core, F, T0 + 9 * MS)
    assert core.is_alive(T0 + 9 * MS + timeout)
    core.on_setup_again(T0 + 20 * MS)
    assert core.is_alive(T0 + 20 * MS + timeout)
    # Even a duplicate or an over-run shows the sender is there.
    core.on_data(run(core, 0, F), T0 + 30 * MS)
    assert core.is_alive(T0 + 30 * MS + timeout)
    assert core.next_deadline_ns() <= T0 + 30 * MS + timeout + 1


def test_a_stall_of_our_own_restarts_the_liveness_clock():
    """The driver found it ran late (its process stalled): the silence over the stall does not
    count, and the image lives a full timeout from then (cluster_node.media.receiver_core, a stall of our own)."""
    core = make()
    timeout = CFG.image_liveness_timeout_ns
    frames(core, 0, 1, T0 + 5 * MS)
    resumed = T0 + 5 * MS + 3 * timeout
    assert not core.is_alive(resumed)
    core.on_local_stall(resumed)
    assert core.is_alive(resumed) and core.is_alive(resumed + timeout) and not core.is_alive(resumed + timeout + 1)
    # What waited in the socket is then read, and the image goes on from where it was.
    assert frames(core, 1, 2, resumed + MS) == (Accept.INSERT, F)
    assert core.rebuild_position == 3 * F and core.is_alive(resumed + MS + timeout)
    # The clock never goes back.
    core.on_local_stall(resumed)
    assert core.last_packet_ns == resumed + MS


@pytest.mark.parametrize("deliver_first", [True, False])
def test_end_of_stream(deliver_first):
    core = make()
    end = 5 * F
    if deliver_first:
        frames(core, 0, 5, T0)
    heartbeat(core, end, T0 + 1, eos=True)
    assert core.eos_position == end
    if not deliver_first:
        assert core.hwm_position == end and core.gap_start == 0  # the tail is still to come
        frames(core, 0, 5, T0 + 2)
    assert not core.is_end_of_stream()
    core.on_consumed(end - F)
    assert not core.is_end_of_stream()
    core.on_consumed(end)
    assert core.is_end_of_stream()


def test_needs_clean_once_per_new_term():
    core = make(offset=TL - 1024)
    core.on_consumed(TL - 1024)
    assert core.needs_clean() is None
    core.on_data(run(core, TL - 512, 256), T0)  # out of order, still inside term 0
    assert core.needs_clean() is None
    core.on_data(run(core, TL - 1024, 512), T0)
    assert core.needs_clean() is None
    # The high-water mark reaches term 1 (a run ending exactly at the term end counts): zero the
    # partition of term 2.
    core.on_data(run(core, TL - 256, 256), T0)
    assert core.needs_clean() == TL
    assert core.needs_clean() is None
    core.on_data(run(core, TL, F), T0)
    assert core.needs_clean() is None
    core.on_consumed(TL + TL // 2)
    assert core.on_data(run(core, TL + F, TL - F), T0)[0] == Accept.INSERT
    core.on_consumed(2 * TL)
    assert core.on_data(run(core, 2 * TL, F), T0)[0] == Accept.INSERT
    assert core.needs_clean() == 2 * TL


def test_padding_wider_than_the_window_is_accepted():
    # A padding frame travels header-only: only its 32 bytes count against the window, however
    # much of the term it covers.
    core = make()
    pad_at = WINDOW - F  # the last frame slot inside the window
    assert core.on_data(run(core, 0, pad_at), T0)[0] == Accept.INSERT
    action, position = core.on_data(run(core, pad_at, 32, covered=TL - pad_at), T0)
    assert (action, position) == (Accept.INSERT, pad_at)
    assert core.rebuild_position == TL and core.stats.overruns == 0


def test_end_of_stream_from_one_source_behind_the_stream_is_ignored():
    # A catchup replay and the live log merge into one image; the replay ending must not end it.
    core = make()
    frames(core, 0, 10)
    heartbeat(core, 5 * F, T0, eos=True)  # the replay's end, behind what the image has
    assert core.eos_position is None
    heartbeat(core, 10 * F, T0, eos=True)
    assert core.eos_position == 10 * F
    frames(core, 10, 2)  # the live source goes on past it
    assert core.eos_position is None and not core.is_end_of_stream()
