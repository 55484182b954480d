"""The station's handshake as a pure state machine: every trigger answered exactly once,
in trigger order, with the decision before the deadline and the fail-safe result after;
overruns answered, never dropped; result_valid written last and cleared on release."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.line.handshake import MAX_BACKLOG, Answer, Effects, Handshake

MS = 1_000_000
CODES = {"pass": 1, "reject": 2, "review": 3}


def _hs(deadline_ms: float = 100) -> Handshake:
    return Handshake(
        "st1", fail_safe="reject", outcome_codes=CODES, deadline_ns=int(deadline_ms * MS)
    )


def test_a_decision_within_the_deadline_is_written_with_result_valid_last() -> None:
    hs = _hs()
    fx = hs.trigger("P-1", 0, 1000.0)
    assert fx.writes == [{"busy": True, "result_valid": False}]
    assert fx.start is not None
    assert fx.start.part_id == "P-1"
    done = hs.decided(fx.start, Answer("pass", 0.9, "ok", "d-1", "m", "1.0"), 5 * MS)
    assert not done.deadline_missed
    (result,) = done.results
    assert (result.status, result.outcome, result.outcome_code, result.part_id) == (
        "ok", "pass", 1, "P-1")  # fmt: skip
    assert result.decision_id == "d-1"
    assert result.seq == 1
    assert result.trigger_to_result_ms == 5.0
    (values,) = done.writes
    assert list(values)[-1] == "result_valid"
    assert values["result_valid"] is True
    assert values["busy"] is False
    assert values["status"] == 1
    assert hs.state == "valid"
    assert hs.release().writes == [{"result_valid": False}]
    assert hs.state == "idle"


def test_no_decision_by_the_deadline_writes_the_fail_safe_and_marks_the_late_one() -> None:
    hs = _hs(50)
    trig = hs.trigger("P-2", 0, 0.0).start
    assert trig is not None
    assert hs.tick(49 * MS).results == []  # not yet
    fx = hs.tick(51 * MS)
    (result,) = fx.results
    assert (result.status, result.outcome, result.outcome_code) == ("deadline_missed", "reject", 2)
    late = hs.decided(trig, Answer("pass", 0.99), 70 * MS)
    assert late.deadline_missed
    assert late.writes == []
    assert late.results == []
    assert hs.counts.late_decisions == 1
    assert hs.counts.answered == 1


def test_a_decision_past_the_deadline_before_the_tick_is_still_answered_fail_safe() -> None:
    hs = _hs(10)
    trig = hs.trigger("", 0, 0.0).start
    assert trig is not None
    fx = hs.decided(trig, Answer("pass"), 11 * MS)
    assert fx.deadline_missed
    assert [r.status for r in fx.results] == ["deadline_missed"]


def test_triggers_while_busy_are_overruns_answered_after_the_current_in_order() -> None:
    hs = _hs()
    first = hs.trigger("A", 0, 0.0).start
    assert first is not None
    assert hs.trigger("B", 1 * MS, 0.0).start is None
    assert hs.trigger("C", 2 * MS, 0.0).start is None
    fx = hs.decided(first, Answer("pass"), 3 * MS)
    assert [(r.part_id, r.status, r.seq) for r in fx.results] == [
        ("A", "ok", 1), ("B", "overrun", 2), ("C", "overrun", 3)]  # fmt: skip
    assert [w["part_id"] for w in fx.writes] == ["A", "B", "C"]
    assert hs.counts.overruns == 2


def test_a_counter_that_skipped_counts_the_missed_steps_as_overruns() -> None:
    hs = _hs()
    fx = hs.trigger("X", 0, 0.0, missed=2)
    assert [r.status for r in fx.results] == ["overrun", "overrun"]
    assert fx.start is not None
    assert hs.state == "busy"


def test_a_storm_beyond_the_backlog_is_answered_at_once_and_counted() -> None:
    hs = _hs()
    first = hs.trigger("0", 0, 0.0).start
    folded = Effects()
    for i in range(MAX_BACKLOG + 5):
        fx = hs.trigger(str(i), i, 0.0)
        folded.results += fx.results
    assert len(folded.results) == 5
    assert hs.counts.overruns_folded == 5
    assert first is not None
    fx = hs.decided(first, Answer("pass"), MS)
    assert len(fx.results) == 1 + MAX_BACKLOG
    assert hs.counts.answered == hs.counts.triggers


events = st.lists(
    st.tuples(st.sampled_from(["trigger", "decide", "tick", "release"]), st.integers(0, 40)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_every_trigger_is_answered_exactly_once_in_order(steps: list[tuple[str, int]]) -> None:
    hs = _hs(20)
    now = 0
    started = []
    results = []
    for kind, dt in steps:
        now += dt * MS
        if kind == "trigger":
            fx = hs.trigger(f"p{now}", now, 0.0)
            if fx.start is not None:
                started.append(fx.start)
        elif kind == "decide" and started:
            fx = hs.decided(started[-1], Answer("pass"), now)
        elif kind == "release":
            fx = hs.release()
        else:
            fx = hs.tick(now)
        results += fx.results
    fx = hs.tick(now + 10_000 * MS)  # everything past its deadline by now
    results += fx.results
    assert hs.counts.answered == hs.counts.triggers == len(results)
    assert [r.trigger_seq for r in results] == sorted(r.trigger_seq for r in results)
    assert len({r.trigger_seq for r in results}) == len(results)
    assert [r.seq for r in results] == list(range(1, len(results) + 1))
    assert all(r.status == "ok" or r.outcome == "reject" for r in results)


def test_a_result_and_the_overruns_after_it_cost_the_plc_one_write() -> None:
    from agent.line.station import _last_of_runs

    hs = _hs()
    first = hs.trigger("A", 0, 0.0).start
    hs.trigger("B", 1, 0.0)
    hs.trigger("C", 2, 0.0)
    assert first is not None
    fx = hs.decided(first, Answer("pass"), 3 * MS)
    assert [r.seq for r in fx.results] == [1, 2, 3]  # every result to the listeners
    (written,) = _last_of_runs(fx.writes)  # the PLC: the last one, seq 3
    assert (written["seq"], written["part_id"], written["result_valid"]) == (3, "C", True)
    busy = {"busy": True, "result_valid": False}
    assert _last_of_runs([busy, *fx.writes]) == [busy, written]


def test_a_counter_that_jumps_by_millions_is_counted_not_answered_one_by_one() -> None:
    hs = _hs()
    fx = hs.trigger("X", 0, 0.0, missed=5_000_000)
    assert len(fx.results) == MAX_BACKLOG  # bounded work, whatever the jump
    assert hs.counts.overruns == 5_000_000
    assert hs.counts.triggers == hs.counts.answered + 1  # all but the one now deciding
    assert fx.start is not None
    assert fx.start.seq == 5_000_001
    done = hs.decided(fx.start, Answer("pass"), MS)
    assert done.results[0].seq == 5_000_001  # the PLC sees the jump in seq
