"""The installer's rules without files, clock or runtime: planning, failure undo,
recovery after a stop at any point, rollback by hand, and the health verdict."""

from __future__ import annotations

import pytest

from agent.installer import health, machine
from agent.installer.machine import (
    BundleId,
    Journal,
    Marker,
    PlanKind,
    Pointer,
    SlotFacts,
    Status,
    Step,
)

V1 = BundleId("cls", "1.0.0", 1, "d1" * 32)
V2 = BundleId("cls", "2.0.0", 2, "d2" * 32)
V2_OTHER = BundleId("cls", "2.0.0", 2, "ee" * 32)


def good(bundle: BundleId, seq: int) -> SlotFacts:
    return SlotFacts(bundle, Marker(seq, bundle.digest), present=True)


def unmarked(bundle: BundleId | None) -> SlotFacts:
    return SlotFacts(bundle, None, present=True)


EMPTY = SlotFacts()


def running(step: Step, slot: str = "b", target: BundleId = V2) -> Journal:
    return Journal("cls", Status.RUNNING, step, slot=slot, target=target, source="test")


# -- planning ---------------------------------------------------------------------------


def test_first_install_goes_to_slot_a() -> None:
    plan = machine.plan_install(None, None, V1)
    assert (plan.kind, plan.slot) == (PlanKind.INSTALL, "a")


def test_next_install_goes_to_the_slot_that_is_not_committed() -> None:
    assert machine.plan_install(Pointer("a", "a"), V1, V2).slot == "b"
    assert machine.plan_install(Pointer("b", "b"), V1, V2).slot == "a"


def test_installing_the_committed_release_and_digest_is_a_noop() -> None:
    plan = machine.plan_install(Pointer("a", "a"), V1, V1)
    assert plan.kind is PlanKind.NOOP


def test_lower_release_is_refused_as_rollback_protection() -> None:
    plan = machine.plan_install(Pointer("b", "b"), V2, V1)
    assert plan.kind is PlanKind.REFUSE
    assert "lower than the committed release 2" in plan.reason


def test_same_release_with_other_content_is_refused() -> None:
    plan = machine.plan_install(Pointer("b", "b"), V2, V2_OTHER)
    assert plan.kind is PlanKind.REFUSE
    assert "other content" in plan.reason


@pytest.mark.parametrize(
    ("step", "restored"),
    [
        (Step.STAGE, None),
        (Step.LOAD, None),
        (Step.BENCHMARK, None),
        (Step.SWITCH, Pointer("a", "a")),
        (Step.HEALTH, Pointer("a", "a")),
        (Step.COMMIT, Pointer("a", "a")),
    ],
)
def test_failure_restores_the_pointer_only_once_the_switch_may_have_happened(
    step: Step, restored: Pointer | None
) -> None:
    assert machine.pointer_after_failure(step, Pointer("a", "a")) == restored


def test_switch_keeps_the_old_slot_as_last_known_good() -> None:
    assert machine.switched(Pointer("a", "a"), "b") == Pointer("b", "a")
    assert machine.switched(None, "a") == Pointer("a", None)


# -- recovery -------------------------------------------------------------------------


def test_consistent_state_needs_no_recovery() -> None:
    facts = {"a": good(V1, 1), "b": EMPTY}
    journal = Journal("cls", Status.COMMITTED, Step.COMMIT, slot="a", target=V1)
    rec = machine.decide_recovery("cls", Pointer("a", "a"), journal, facts)
    assert not rec.changed


@pytest.mark.parametrize("step", [Step.STAGE, Step.LOAD, Step.BENCHMARK, Step.SWITCH])
def test_stop_before_the_switch_keeps_the_old_slot_and_empties_the_new(step: Step) -> None:
    facts = {"a": good(V1, 1), "b": unmarked(None)}
    rec = machine.decide_recovery("cls", Pointer("a", "a"), running(step), facts)
    assert rec.pointer == Pointer("a", "a")
    assert not rec.write_pointer
    assert rec.wipe == ("b",)
    assert rec.journal is not None
    assert rec.journal.status is Status.FAILED
    assert f"interrupted during {step.value}" in rec.journal.reason


@pytest.mark.parametrize("step", [Step.HEALTH, Step.COMMIT])
def test_stop_on_trial_goes_back_to_the_committed_slot(step: Step) -> None:
    facts = {"a": good(V1, 1), "b": unmarked(V2)}
    rec = machine.decide_recovery("cls", Pointer("b", "a"), running(step), facts)
    assert rec.pointer == Pointer("a", "a")
    assert rec.write_pointer
    assert rec.wipe == ("b",)
    assert rec.journal is not None
    assert rec.journal.status is Status.FAILED


def test_stop_after_the_commit_pointer_finishes_the_commit() -> None:
    facts = {"a": good(V1, 1), "b": unmarked(V2)}
    rec = machine.decide_recovery("cls", Pointer("b", "b"), running(Step.COMMIT), facts)
    assert rec.pointer == Pointer("b", "b")
    assert not rec.write_pointer
    assert (rec.mark, rec.mark_seq) == ("b", 2)
    assert rec.wipe == ()
    assert rec.journal is not None
    assert rec.journal.status is Status.COMMITTED


def test_recovery_is_idempotent_once_applied() -> None:
    facts = {"a": good(V1, 1), "b": good(V2, 2)}
    journal = Journal("cls", Status.COMMITTED, Step.COMMIT, slot="b", target=V2)
    rec = machine.decide_recovery("cls", Pointer("b", "b"), journal, facts)
    assert not rec.changed


def test_unreadable_journal_falls_back_to_the_pointer_without_touching_slots() -> None:
    facts = {"a": good(V1, 1), "b": good(V2, 2)}
    rec = machine.decide_recovery("cls", Pointer("b", "b"), None, facts, journal_unreadable=True)
    assert rec.pointer == Pointer("b", "b")
    assert rec.wipe == ()
    assert rec.journal is not None
    assert rec.journal.status is Status.RECOVERED
    assert "unreadable" in rec.journal.reason


def test_missing_pointer_falls_back_to_the_highest_commit_marker() -> None:
    facts = {"a": good(V2, 3), "b": good(V1, 2)}  # rolled back by hand to a
    rec = machine.decide_recovery("cls", None, None, facts)
    assert rec.pointer == Pointer("a", "a")
    assert rec.write_pointer


def test_marker_of_other_content_does_not_count() -> None:
    facts = {"a": good(V1, 1), "b": SlotFacts(V2, Marker(2, V1.digest), present=True)}
    assert machine.last_known_good(None, facts)[0] == "a"


def test_damaged_committed_slot_falls_back_to_the_previous_good_one() -> None:
    facts = {"a": good(V1, 1), "b": SlotFacts(None, Marker(2, V2.digest), present=True)}
    slot, notes = machine.last_known_good(Pointer("b", "b"), facts)
    assert slot == "a"
    assert "does not load" in notes[0]


def test_nothing_installed_and_nothing_left_needs_no_recovery() -> None:
    facts = {"a": EMPTY, "b": EMPTY}
    assert not machine.decide_recovery("cls", None, None, facts).changed


def test_first_install_stopped_on_trial_leaves_no_bundle() -> None:
    facts = {"a": unmarked(V1), "b": EMPTY}
    rec = machine.decide_recovery("cls", Pointer("a", None), running(Step.HEALTH, "a"), facts)
    assert rec.pointer == Pointer(None, None)
    assert rec.wipe == ("a",)


# -- what to run, rollback by hand ----------------------------------------------------


def test_active_slot_is_the_trial_only_while_an_install_runs() -> None:
    facts = {"a": good(V1, 1), "b": unmarked(V2)}
    assert machine.active_slot(Pointer("b", "a"), facts, install_running=True) == "b"
    assert machine.active_slot(Pointer("b", "a"), facts, install_running=False) == "a"


def test_rollback_by_hand_goes_to_the_other_committed_slot() -> None:
    facts = {"a": good(V1, 1), "b": good(V2, 2)}
    plan = machine.plan_rollback(Pointer("b", "b"), facts)
    assert (plan.kind, plan.slot) == (PlanKind.INSTALL, "a")


def test_rollback_by_hand_is_refused_without_a_previous_committed_slot() -> None:
    facts = {"a": good(V1, 1), "b": unmarked(V2)}
    plan = machine.plan_rollback(Pointer("a", "a"), facts)
    assert plan.kind is PlanKind.REFUSE
    assert "slot-b" in plan.reason


# -- file formats ---------------------------------------------------------------------


def test_journal_round_trips_and_keeps_a_bounded_history() -> None:
    j = running(Step.HEALTH)
    for i in range(machine.HISTORY + 5):
        j = machine.finished(j, Status.FAILED, Step.HEALTH, f"try {i}", float(i))
    back = Journal.from_dict(j.as_dict())
    assert back == j
    assert len(back.history) == machine.HISTORY
    assert back.history[-1]["reason"] == f"try {machine.HISTORY + 4}"


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"status": "running"},
        {"name": "cls", "status": "dancing", "step": "stage"},
        {"name": "cls", "status": "running", "step": "stage", "slot": "c"},
        {"name": "cls", "status": "running", "step": "stage", "target": {"release": "2"}},
    ],
)
def test_malformed_journal_is_rejected(raw: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        Journal.from_dict(raw)


def test_malformed_pointer_and_marker_are_rejected() -> None:
    with pytest.raises((TypeError, ValueError)):
        Pointer.from_dict({"active": "z", "committed": "a"})
    with pytest.raises(TypeError):
        Marker.from_dict({"seq": True, "digest": "x"})


# -- health verdict -----------------------------------------------------------------


LIMITS = health.HealthLimits(budget_ms=50.0)


def test_health_passes_within_limits() -> None:
    c = health.HealthCounters(0, 0, 49.0, 10)
    assert health.judge(c, LIMITS).ok


@pytest.mark.parametrize(
    ("counters", "words"),
    [
        (health.HealthCounters(1, 0, 1.0), "worker crash"),
        (health.HealthCounters(0, 2, 1.0), "inference error"),
        (health.HealthCounters(0, 0, 51.0, 3), "over the budget of 50 ms"),
    ],
)
def test_health_fails_on_crash_error_or_latency(
    counters: health.HealthCounters, words: str
) -> None:
    verdict = health.judge(counters, LIMITS)
    assert not verdict.ok
    assert words in verdict.reason


def test_latency_is_not_judged_without_inferences() -> None:
    assert health.judge(health.HealthCounters(0, 0, 99.0, 0), LIMITS).ok


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_health_window_counts_from_the_switch_not_from_its_first_poll() -> None:
    """Errors the new bundle made before the window's first poll are its own: the probe
    reports counters since the switch, and the window judges them as they are."""
    clock = FakeClock()
    answers = iter([{"worker_crashes": 0, "inference_errors": 7, "p95_ms": 1.0}] * 11)
    verdict = health.run_window(
        lambda: next(answers), LIMITS, window_s=1.0, poll_s=0.1, clock=clock, sleep=clock.sleep
    )
    assert not verdict.ok
    assert "7 inference error(s)" in verdict.reason
    assert verdict.polls == 0


def test_health_window_within_limits_polls_for_the_whole_window() -> None:
    clock = FakeClock()
    answers = iter(
        [{"worker_crashes": 0, "inference_errors": 0, "p95_ms": 1.0, "inferences": 5}] * 11
    )
    verdict = health.run_window(
        lambda: next(answers), LIMITS, window_s=1.0, poll_s=0.1, clock=clock, sleep=clock.sleep
    )
    assert verdict.ok
    assert not verdict.idle
    assert verdict.polls == 10
    assert clock.now == pytest.approx(1.0)


def _counting(frames_per_poll: int, inferences_per_poll: int) -> health.HealthProbe:
    polls = iter(range(1000))

    def probe() -> dict[str, float]:
        n = next(polls)
        return {
            "worker_crashes": 0,
            "inference_errors": 0,
            "p95_ms": 0.0,
            "inferences": float(n * inferences_per_poll),
            "frames": float(n * frames_per_poll),
        }

    return probe


def test_a_window_with_frames_and_no_inference_fails_after_the_grace() -> None:
    """The bundle whose every inference hangs or fails slowly: frames came, nothing was
    decided, no error was counted yet. The window waits ``grace_s`` more, then fails."""
    clock = FakeClock()
    verdict = health.run_window(
        _counting(30, 0),
        LIMITS,
        window_s=1.0,
        poll_s=0.1,
        grace_s=2.0,
        clock=clock,
        sleep=clock.sleep,
    )
    assert not verdict.ok
    assert "no inference completed since the switch" in verdict.reason
    assert "input(s)" in verdict.reason
    assert verdict.counters is not None
    assert verdict.counters.frames == 30 * verdict.polls
    assert clock.now == pytest.approx(3.0)


def test_a_pipeline_without_inference_fails_though_another_decides() -> None:
    counters = health.HealthCounters(0, 0, 1.0, 40, 80, pipelines_without_inference=1)
    verdict = health.judge_end(counters, LIMITS)
    assert not verdict.ok
    assert "in 1 pipeline(s)" in verdict.reason


def test_a_first_inference_in_the_grace_passes() -> None:
    waiting = {"worker_crashes": 0, "inference_errors": 0, "p95_ms": 1.0, "frames": 3}
    answers = iter([{**waiting, "inferences": 0}] * 11 + [{**waiting, "inferences": 1}])
    clock = FakeClock()
    verdict = health.run_window(
        lambda: next(answers),
        LIMITS,
        window_s=1.0,
        poll_s=0.1,
        grace_s=5.0,
        clock=clock,
        sleep=clock.sleep,
    )
    assert verdict.ok, verdict.reason
    assert verdict.polls == 11
    assert clock.now == pytest.approx(1.1)


def test_an_idle_line_passes_marked_idle() -> None:
    """No frames at all: the bundle was judged by its self-benchmark alone (ADR 0019)."""
    clock = FakeClock()
    verdict = health.run_window(
        _counting(0, 0),
        LIMITS,
        window_s=1.0,
        poll_s=0.1,
        grace_s=2.0,
        clock=clock,
        sleep=clock.sleep,
    )
    assert verdict.ok
    assert verdict.idle
    assert "idle line" in verdict.reason
    assert clock.now == pytest.approx(1.0)  # no grace: nothing to wait for


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, True, "3"])
def test_a_malformed_frames_counter_fails_the_window(bad: object) -> None:
    clock = FakeClock()
    verdict = health.run_window(
        lambda: {"worker_crashes": 0, "inference_errors": 0, "p95_ms": 1.0, "frames": bad},  # type: ignore[dict-item]
        LIMITS,
        window_s=1.0,
        poll_s=0.5,
        clock=clock,
        sleep=clock.sleep,
    )
    assert not verdict.ok
    assert "frames" in verdict.reason


def test_health_window_fails_at_the_first_bad_poll() -> None:
    clock = FakeClock()
    errors = iter(range(100))
    verdict = health.run_window(
        lambda: {"worker_crashes": 0, "inference_errors": next(errors), "p95_ms": 1.0},
        LIMITS,
        window_s=10.0,
        poll_s=1.0,
        clock=clock,
        sleep=clock.sleep,
    )
    assert not verdict.ok
    assert verdict.polls == 1
    assert clock.now == pytest.approx(1.0)


@pytest.mark.parametrize(
    "answer", [{"worker_crashes": 0}, {"worker_crashes": 0, "inference_errors": 0, "p95_ms": "x"}]
)
def test_health_window_fails_on_a_malformed_probe_answer(answer: dict[str, object]) -> None:
    clock = FakeClock()
    verdict = health.run_window(
        lambda: answer,  # type: ignore[arg-type,return-value]
        LIMITS,
        window_s=1.0,
        poll_s=0.5,
        clock=clock,
        sleep=clock.sleep,
    )
    assert not verdict.ok
    assert "probe failed" in verdict.reason


def test_health_window_fails_when_the_probe_raises() -> None:
    def probe() -> dict[str, float]:
        raise RuntimeError("metrics endpoint gone")

    clock = FakeClock()
    verdict = health.run_window(
        probe, LIMITS, window_s=1.0, poll_s=0.5, clock=clock, sleep=clock.sleep
    )
    assert not verdict.ok
    assert "metrics endpoint gone" in verdict.reason
