"""Wave gates: each threshold fails the wave as soon as it is crossed, a pass needs settled
devices, evidence and the soak, and the outcome shift is the total variation distance."""

from __future__ import annotations

import random

import pytest

from fleet_server.rollout import DeviceSample, GateFail, GatePass, GatePolicy, GateWait, evaluate
from fleet_server.rollout.gates import tvd

BASE = {"pass": 900, "reject": 90, "review": 10}


def _done(device_id: str, **kw: object) -> DeviceSample:
    args: dict[str, object] = {
        "p99_ms": 20.0,
        "base_p99_ms": 20.0,
        "outcomes": dict(BASE),
        "base_outcomes": dict(BASE),
    }
    args.update(kw)
    return DeviceSample(device_id, settled=True, done=True, **args)  # type: ignore[arg-type]


def _failed(device_id: str, *, auto: bool = False) -> DeviceSample:
    return DeviceSample(
        device_id, settled=True, done=False, install_failed=True, auto_rollback=auto
    )


def _fleet(n: int) -> list[DeviceSample]:
    return [_done(f"d{i:02d}") for i in range(n)]


def test_healthy_settled_wave_passes_after_the_soak() -> None:
    result = evaluate(GatePolicy(), _fleet(5), 50.0, soak_over=True)
    assert isinstance(result, GatePass)
    assert result.metrics["devices"] == 5
    assert result.metrics["outcome_tvd"] == 0.0
    assert result.metrics["p99_ratio"] == 1.0


def test_healthy_wave_waits_while_soaking() -> None:
    result = evaluate(GatePolicy(), _fleet(5), 50.0, soak_over=False)
    assert isinstance(result, GateWait)
    assert result.reason == "soaking"


def test_wave_waits_for_unsettled_devices_even_after_the_soak() -> None:
    samples = [*_fleet(3), DeviceSample("d99", settled=False, done=False)]
    result = evaluate(GatePolicy(), samples, 50.0, soak_over=True)
    assert isinstance(result, GateWait)
    assert "1 devices not settled" in result.reason


def test_wave_without_a_done_device_has_no_evidence_to_pass() -> None:
    policy = GatePolicy(max_install_failures=5)
    result = evaluate(policy, [_failed("d1"), _failed("d2")], 50.0, soak_over=True)
    assert isinstance(result, GateWait)
    assert "no device done" in result.reason


def test_one_install_failure_fails_the_default_gate_at_once() -> None:
    samples = [*_fleet(3), _failed("d07"), DeviceSample("d08", settled=False, done=False)]
    result = evaluate(GatePolicy(), samples, 50.0, soak_over=False)
    assert isinstance(result, GateFail)
    assert "1 install failures > 0 allowed" in result.reason
    assert result.devices == ("d07",)


def test_install_failure_allowance_is_the_larger_of_count_and_fraction() -> None:
    policy = GatePolicy(max_install_failures=1, max_install_failure_fraction=0.2)
    ten = [*_fleet(8), _failed("f1"), _failed("f2")]
    assert isinstance(evaluate(policy, ten, None, soak_over=True), GatePass)
    eleven = [*ten, _failed("f3")]
    result = evaluate(policy, eleven, None, soak_over=True)
    assert isinstance(result, GateFail)
    assert result.metrics["install_failures_allowed"] == 2
    small = [*_fleet(2), _failed("f1")]
    assert isinstance(evaluate(policy, small, None, soak_over=True), GatePass)


def test_automatic_rollbacks_are_their_own_threshold() -> None:
    samples = [*_fleet(4), _failed("r1", auto=True)]
    result = evaluate(GatePolicy(max_install_failures=5), samples, None, soak_over=True)
    assert isinstance(result, GateFail)
    assert "automatic rollbacks" in result.reason
    assert result.metrics["install_failures"] == 0
    ok = evaluate(GatePolicy(max_auto_rollbacks=1), samples, None, soak_over=True)
    assert isinstance(ok, GatePass)


def test_worker_crashes_sum_over_devices() -> None:
    samples = [_done("a", worker_crashes=1), _done("b", worker_crashes=1), _done("c")]
    result = evaluate(GatePolicy(max_worker_crashes=1), samples, None, soak_over=True)
    assert isinstance(result, GateFail)
    assert result.devices == ("a", "b")
    assert result.metrics["worker_crashes"] == 2
    assert isinstance(
        evaluate(GatePolicy(max_worker_crashes=2), samples, None, soak_over=True), GatePass
    )


def test_p99_over_the_bundle_budget_fails() -> None:
    samples = [*_fleet(3), _done("slow", p99_ms=61.0, base_p99_ms=61.0)]
    result = evaluate(GatePolicy(), samples, 60.0, soak_over=True)
    assert isinstance(result, GateFail)
    assert result.devices == ("slow",)
    assert result.metrics["devices_over_budget"] == 1
    loose = GatePolicy(latency_budget_factor=1.1)
    assert isinstance(evaluate(loose, samples, 60.0, soak_over=True), GatePass)
    assert isinstance(evaluate(GatePolicy(), samples, None, soak_over=True), GatePass)


def test_p99_ratio_against_the_previous_version_uses_medians() -> None:
    slower = [_done(f"d{i}", p99_ms=26.0, base_p99_ms=20.0) for i in range(3)]
    result = evaluate(GatePolicy(), slower, 100.0, soak_over=True)
    assert isinstance(result, GateFail)
    assert "1.30x" in result.reason
    assert result.metrics["p99_ratio"] == 1.3
    one_outlier = [*_fleet(4), _done("x", p99_ms=80.0, base_p99_ms=20.0)]
    assert isinstance(evaluate(GatePolicy(), one_outlier, 100.0, soak_over=True), GatePass)
    off = GatePolicy(max_p99_ratio=None)
    assert isinstance(evaluate(off, slower, 100.0, soak_over=True), GatePass)


def test_no_baseline_latency_skips_the_ratio() -> None:
    samples = [_done("a", p99_ms=90.0, base_p99_ms=None)]
    result = evaluate(GatePolicy(), samples, 100.0, soak_over=True)
    assert isinstance(result, GatePass)
    assert "p99_ratio" not in result.metrics


def test_tvd_values() -> None:
    assert tvd({"pass": 10}, {"pass": 3}) == 0.0
    assert tvd({"pass": 10}, {"reject": 3}) == 1.0
    assert tvd({"pass": 80, "reject": 20}, {"pass": 50, "reject": 50}) == pytest.approx(0.3)
    assert tvd({}, {"pass": 1}) == 0.0
    rng = random.Random(3)
    for _ in range(200):
        p = {k: rng.randint(0, 50) for k in "abcd"}
        q = {k: rng.randint(0, 50) for k in "abce"}
        d = tvd(p, q)
        assert 0.0 <= d <= 1.0 + 1e-12
        assert d == pytest.approx(tvd(q, p))


def test_outcome_shift_beyond_the_threshold_fails() -> None:
    shifted = {"pass": 700, "reject": 290, "review": 10}
    samples = [_done("a", outcomes=shifted), _done("b", outcomes=shifted)]
    result = evaluate(GatePolicy(), samples, None, soak_over=True)
    assert isinstance(result, GateFail)
    assert "outcome distribution shifted" in result.reason
    assert result.metrics["outcome_tvd"] == 0.2
    assert result.devices == ("a", "b")
    loose = GatePolicy(max_outcome_tvd=0.25)
    assert isinstance(evaluate(loose, samples, None, soak_over=True), GatePass)


def test_outcome_shift_with_too_few_decisions_is_skipped_and_says_so() -> None:
    samples = [_done("a", outcomes={"reject": 50}, base_outcomes={"pass": 50})]
    result = evaluate(GatePolicy(min_outcome_samples=100), samples, None, soak_over=True)
    assert isinstance(result, GatePass)
    assert result.metrics["outcome_tvd"] == "skipped: too few decisions"
    strict = evaluate(GatePolicy(min_outcome_samples=50), samples, None, soak_over=True)
    assert isinstance(strict, GateFail)


def test_several_failed_checks_are_all_named() -> None:
    samples = [_failed("f", auto=True), _done("c", worker_crashes=3), _failed("g")]
    result = evaluate(GatePolicy(), samples, None, soak_over=False)
    assert isinstance(result, GateFail)
    for words in ("install failures", "automatic rollbacks", "worker crashes"):
        assert words in result.reason
    assert result.devices == ("c", "f", "g")


def test_random_samples_pass_only_when_every_threshold_holds() -> None:
    rng = random.Random(11)
    for _ in range(400):
        policy = GatePolicy(
            max_install_failures=rng.randint(0, 2),
            max_auto_rollbacks=rng.randint(0, 2),
            max_worker_crashes=rng.randint(0, 3),
        )
        samples = []
        for i in range(rng.randint(1, 8)):
            kind = rng.random()
            if kind < 0.15:
                samples.append(_failed(f"d{i}", auto=rng.random() < 0.5))
            elif kind < 0.25:
                samples.append(DeviceSample(f"d{i}", settled=False, done=False))
            else:
                samples.append(_done(f"d{i}", worker_crashes=rng.choice([0, 0, 0, 1, 2])))
        soak = rng.random() < 0.5
        result = evaluate(policy, samples, None, soak_over=soak)
        fails = sum(s.install_failed and not s.auto_rollback for s in samples)
        autos = sum(s.auto_rollback for s in samples)
        crashes = sum(s.worker_crashes for s in samples)
        over = (
            fails > policy.max_install_failures
            or autos > policy.max_auto_rollbacks
            or crashes > policy.max_worker_crashes
        )
        settled = all(s.settled for s in samples) and any(s.done for s in samples)
        assert isinstance(result, GateFail) == over
        assert isinstance(result, GatePass) == (not over and settled and soak)
