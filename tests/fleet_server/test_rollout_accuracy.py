"""The accuracy gates on review labels: ``min_accuracy`` judged by the Wilson interval
after ``min_labels`` labels (a wave waits while it is not shown and fails at the end of
its soak), ``accuracy_drop`` by a one-sided two-proportion test; a failure stops the
rollout and reverts the done waves like a failed health gate."""

from __future__ import annotations

from typing import Any

from fleet_server.rollout import (
    DeviceSample,
    GateFail,
    GatePass,
    GateWait,
    LabelCounts,
    LabelReport,
    Phase,
    Resume,
    RevertDirective,
    evaluate,
    parse_spec,
    plan,
)
from fleet_server.rollout.spec import GatePolicy
from tests.fleet_server.test_rollout_machine import T0, Fleet, _devices

DONE = [DeviceSample("a", settled=True, done=True)]


def _policy(**kw: Any) -> GatePolicy:
    return GatePolicy.model_validate(kw)


def _judge(policy: GatePolicy, labels: LabelCounts, *, soak_over: bool = True) -> Any:
    return evaluate(policy, DONE, None, soak_over=soak_over, labels=labels)


def test_min_accuracy_waits_for_min_labels_then_judges_the_wilson_interval() -> None:
    policy = _policy(min_accuracy=0.9, min_labels=100)
    early = _judge(policy, LabelCounts(40, 40), soak_over=False)
    assert isinstance(early, GateWait)
    assert early.metrics["accuracy_status"] == "waiting: 40 of 100 labels"
    assert early.reason == "waiting: 40 of 100 labels"
    good = _judge(policy, LabelCounts(196, 200))  # 0.98, lower bound ~0.95
    assert isinstance(good, GatePass)
    assert good.metrics["accuracy_status"] == "shown"
    assert good.metrics["accuracy_lower"] >= 0.9  # type: ignore[operator]
    bad = _judge(policy, LabelCounts(150, 200), soak_over=False)  # 0.75, upper ~0.80
    assert isinstance(bad, GateFail)
    assert "upper bound" in bad.reason
    assert "min_accuracy 0.9" in bad.reason
    assert bad.metrics["accuracy_upper"] < 0.9  # type: ignore[operator]
    assert bad.metrics["accuracy_labels"] == 200


def test_accuracy_between_the_bounds_keeps_the_wave_and_fails_it_at_the_soak_end() -> None:
    policy = _policy(min_accuracy=0.9, min_labels=100)
    between = LabelCounts(91, 100)  # 0.91: interval ~0.84..0.95 straddles 0.9
    during = _judge(policy, between, soak_over=False)
    assert isinstance(during, GateWait)
    assert "lower bound" in during.reason
    after = _judge(policy, between, soak_over=True)
    assert isinstance(after, GateFail)
    assert after.reason.startswith("accuracy not shown by the end of the soak")
    assert after.devices == ()
    short = _judge(policy, LabelCounts(10, 10), soak_over=True)
    assert isinstance(short, GateFail)
    assert "waiting: 10 of 100 labels" in short.reason


def test_accuracy_drop_fails_only_when_larger_than_allowed_and_significant() -> None:
    policy = _policy(accuracy_drop=0.03, min_labels=100, accuracy_alpha=0.05)
    big = _judge(policy, LabelCounts(850, 1000, 900, 1000), soak_over=False)
    assert isinstance(big, GateFail)
    assert "dropped by 0.050" in big.reason
    assert big.metrics["accuracy_drop"] == 0.05
    assert big.metrics["accuracy_p_value"] < 0.05  # type: ignore[operator]
    noisy = _judge(policy, LabelCounts(85, 100, 90, 100))  # same drop, p ~0.14
    assert isinstance(noisy, GatePass)
    assert noisy.metrics["accuracy_p_value"] > 0.05  # type: ignore[operator]
    small = _judge(policy, LabelCounts(8800, 10000, 9000, 10000))  # significant, 0.02
    assert isinstance(small, GatePass)
    assert small.metrics["accuracy_p_value"] < 0.05  # type: ignore[operator]
    no_base = _judge(policy, LabelCounts(85, 100, 10, 10), soak_over=False)
    assert isinstance(no_base, GateWait)
    assert no_base.reason == "waiting: 10 of 100 labels of the previous version"


def test_accuracy_gates_are_off_by_default_and_report_nothing() -> None:
    verdict = _judge(GatePolicy(), LabelCounts(0, 500))
    assert isinstance(verdict, GatePass)
    assert not [k for k in verdict.metrics if k.startswith("accuracy")]


def _fleet(**policy: Any) -> Fleet:
    spec = parse_spec(
        {"bundle": "det@2.0.0", "selector": "profile=orin", "waves": "1,50%,100%",
         "soak_s": "10m", "policy": policy}
    )  # fmt: skip
    return Fleet(plan("ro-1", spec, 2, _devices(10), T0, budget_ms=50.0))


def test_a_failed_min_accuracy_in_wave_two_reverts_the_done_waves() -> None:
    f = _fleet(gates={"min_accuracy": 0.9, "min_labels": 100})
    f.send(LabelReport(f.now, LabelCounts(190, 200)))
    f.run(until=lambda r: r.wave == 1 and r.phase is Phase.SOAKING)
    assert f.r.waves[0].passed_at is not None
    assert f.r.waves[0].metrics["accuracy_status"] == "shown"
    assert f.r.labels == LabelCounts(190, 200)
    f.send(LabelReport(f.now, LabelCounts(300, 400)))  # 0.75: the new version is worse
    assert f.r.phase is Phase.ROLLING_BACK
    assert "gate failed in wave 2" in f.r.reason
    assert "labelled accuracy 0.750 over 400 labels" in f.r.reason
    done = [d for d in f.r.order if f.r.devices[d].wave is not None]
    assert len(done) == 5
    assert sorted(f.reverts()) == sorted(done)
    assert all(c.release == 1 for c in f.cmds if isinstance(c, RevertDirective))
    assert f.notes("gate_failed")


def test_a_wave_short_of_labels_fails_at_the_end_of_its_soak_and_reverts() -> None:
    f = _fleet(gates={"min_accuracy": 0.9, "min_labels": 100})
    f.send(LabelReport(f.now, LabelCounts(40, 40)))
    f.run(until=lambda r: r.phase is Phase.SOAKING)
    f.tick(300)
    assert f.r.phase is Phase.SOAKING  # the soak is not over: waiting for labels
    assert f.r.gate["accuracy_status"] == "waiting: 40 of 100 labels"
    f.tick(300)
    assert f.r.phase is Phase.ROLLING_BACK
    assert "accuracy not shown by the end of the soak: waiting: 40 of 100 labels" in f.r.reason


def test_without_rollback_an_accuracy_failure_pauses_and_resume_gives_another_soak() -> None:
    f = _fleet(gates={"min_accuracy": 0.9, "min_labels": 100}, rollback_done_waves_on_failure=False)
    f.run()
    assert f.r.phase is Phase.PAUSED
    assert "accuracy not shown" in f.r.reason
    assert f.r.resume_to is Phase.SOAKING
    f.send(Resume(f.now))
    f.send(LabelReport(f.now, LabelCounts(198, 200)))
    f.run()
    assert f.r.phase is Phase.COMPLETED
