"""The rollout machine's shadow phase, driven without a broker: each wave runs the target
in its devices' shadow slot first and switches only when the pooled agreement's Wilson
lower bound meets ``min_agreement`` over ``shadow_min`` frames and the shadow p99 is
within budget; a disagreeing candidate stops the rollout with nothing switched."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleet_server.rollout import (
    MODE_ACTIVE,
    MODE_SHADOW,
    AssignDirective,
    DeviceStatus,
    InstallOutcome,
    Notify,
    Phase,
    RevertDirective,
    RolloutError,
    ShadowReport,
    Tick,
    dumps,
    loads,
    parse_spec,
    plan,
    step,
)
from fleet_server.rollout.shadowgate import ShadowSample, evaluate_shadow
from tests.fleet_server.test_rollout_machine import T0, Fleet, _devices

S = DeviceStatus


def _spec(waves: str = "1,100%", shadow: str = "2h", **kw: Any) -> Any:
    policy = kw.pop("policy", None)
    data = {
        "bundle": "det@2.0.0",
        "selector": "profile=orin",
        "waves": waves,
        "soak_s": "10m",
        "shadow_s": shadow,
        "shadow_min": 500,
        "min_agreement": 0.97,
        **kw,
    }
    return parse_spec(data | ({"policy": policy} if policy else {}))


@dataclass
class ShadowFleet(Fleet):
    """A :class:`Fleet` whose devices also take shadow directives: they report the shadow
    install, then, on :meth:`frames`, the shadow's totals at their agreement rate."""

    agreement: dict[str, float] = field(default_factory=dict)
    shadow_p99: float = 30.0
    shadow_fails: set[str] = field(default_factory=set)
    totals: dict[str, tuple[int, int]] = field(default_factory=dict)

    def answer(self) -> None:
        end = len(self.cmds)
        while self.handled < end:
            cmd = self.cmds[self.handled]
            self.handled += 1
            if isinstance(cmd, Notify) or cmd.device_id in self.silent:
                continue
            if isinstance(cmd, AssignDirective) and cmd.mode == MODE_SHADOW:
                self.install_shadow(cmd.device_id)
            elif isinstance(cmd, AssignDirective):
                self.totals.pop(cmd.device_id, None)  # a switch empties the shadow slot
                self.install(cmd.device_id, ok=cmd.device_id not in self.bad)
            elif isinstance(cmd, RevertDirective):
                self.totals.pop(cmd.device_id, None)
                self.report(cmd.device_id, active_bundle="det", active_release=1)

    def install_shadow(self, device_id: str) -> None:
        ok = device_id not in self.shadow_fails
        self.report(
            device_id,
            active_bundle="det",
            active_release=1,
            install=InstallOutcome.COMMITTED if ok else InstallOutcome.FAILED,
            install_bundle="det",
            install_release=2,
            install_shadow=True,
        )
        if ok:
            self.totals[device_id] = (0, 0)

    def frames(self, per_device: int) -> None:
        """Every device running the shadow decides ``per_device`` more sampled frames."""
        for device_id, (n, _agree) in sorted(self.totals.items()):
            rate = self.agreement.get(device_id, 1.0)
            n2 = n + per_device
            agree2 = round(n2 * rate)
            self.totals[device_id] = (n2, agree2)
            summary = ShadowReport("det", 2, "2.0.0", n2, agree2, self.shadow_p99)
            self.report(device_id, active_bundle="det", active_release=1, shadow=summary)

    def directives(self, device_id: str) -> list[str]:
        return [
            c.mode for c in self.cmds if isinstance(c, AssignDirective) and c.device_id == device_id
        ]

    def run_shadow(self, per_tick: int = 100, dt: float = 60.0, limit: int = 500) -> None:
        """Answer, feed frames and tick until the rollout stops or completes."""
        for _ in range(limit):
            if self.r.phase in (Phase.COMPLETED, Phase.ROLLING_BACK, Phase.PAUSED):
                return
            self.answer()
            self.frames(per_tick)
            self.tick(dt)
        raise AssertionError(f"still {self.r.phase}")


def _fleet(n: int = 4, spec: Any = None, **kw: Any) -> ShadowFleet:
    return ShadowFleet(plan("ro-1", spec or _spec(), 2, _devices(n), T0, budget_ms=50.0), **kw)


def test_a_shadow_rollout_sends_shadow_directives_then_switches_each_wave_on_agreement() -> None:
    f = _fleet(4)
    f.tick()
    canary = f.r.order[0]
    sent = [c for c in f.cmds if isinstance(c, AssignDirective)]
    assert sent == [AssignDirective(canary, "det", 2, MODE_SHADOW)]
    assert f.r.devices[canary].status is S.SHADOW_ASSIGNED
    f.answer()
    assert f.r.devices[canary].status is S.SHADOWING
    assert f.r.phase is Phase.SHADOW
    assert f.r.deadline == f.now + 7200
    f.frames(300)
    f.tick(60)
    assert f.r.phase is Phase.SHADOW  # 300 of 500 frames: not judged yet
    assert (f.r.gate["shadow_n"], f.r.gate["shadow_agree"]) == (300, 300)
    assert f.directives(canary) == [MODE_SHADOW]
    f.frames(300)
    f.tick(60)
    assert f.directives(canary) == [MODE_SHADOW, MODE_ACTIVE]
    assert f.r.devices[canary].status is S.ASSIGNED
    assert f.r.phase is Phase.ASSIGNING
    assert "shadow passed" in f.r.reason
    assert "n=600" in f.r.reason
    assert f.r.waves[0].shadow_passed_at == f.r.since
    f.run_shadow()
    assert f.r.phase is Phase.COMPLETED, f.r.reason
    for device_id in f.r.order:  # every device: a shadow directive, then one switch
        assert f.directives(device_id) == [MODE_SHADOW, MODE_ACTIVE]
    wave2 = f.r.waves[1]
    assert wave2.metrics["shadow_devices"] == 3
    assert wave2.metrics["shadow_n"] >= 500  # type: ignore[operator]
    assert wave2.metrics["shadow_lower"] >= 0.97  # type: ignore[operator]
    assert f.reverts() == []


def test_a_disagreeing_candidate_fails_in_its_shadow_phase_and_nothing_ever_switches() -> None:
    f = _fleet(4, _spec(waves="2,100%"), agreement=dict.fromkeys(_ids(4), 0.9))
    f.run_shadow()
    assert f.r.phase is Phase.ROLLING_BACK
    assert "gate failed in wave 1" in f.r.reason
    assert "agreement 0.9" in f.r.reason
    assert "n=" in f.r.reason
    assert "upper bound" in f.r.reason
    assert "min_agreement 0.97" in f.r.reason
    assert not [c for c in f.cmds if isinstance(c, AssignDirective) and c.mode == MODE_ACTIVE]
    wave1 = f.r.order[:2]
    assert sorted(f.reverts()) == sorted(wave1)  # the shadows are cleared
    reverts = [c for c in f.cmds if isinstance(c, RevertDirective)]
    assert all((c.bundle, c.release) == ("det", 1) for c in reverts)  # what they run
    assert f.r.gate["shadow_upper"] < 0.97  # type: ignore[operator]
    cause = f.r.reason
    f.answer()
    f.tick()
    assert f.r.phase is Phase.ROLLED_BACK
    # once rolled back, the reason still starts with why
    assert f.r.reason == f"{cause}; every reverted device runs its previous bundle"
    assert all(f.r.devices[d].active.release == 1 for d in f.r.order)  # type: ignore[union-attr]


def test_a_candidate_that_disagrees_in_wave_two_reverts_wave_one_and_wave_two_never_switches() -> (
    None
):
    f = _fleet(6, _spec(waves="1,100%"))
    canary, rest = f.r.order[0], f.r.order[1:]
    f.agreement = dict.fromkeys(rest, 0.5)
    f.run_shadow()
    assert f.r.phase is Phase.ROLLING_BACK
    assert "gate failed in wave 2" in f.r.reason
    assert f.directives(canary) == [MODE_SHADOW, MODE_ACTIVE]
    assert all(f.directives(d) == [MODE_SHADOW] for d in rest)
    assert sorted(f.reverts()) == sorted(f.r.order)


def test_too_few_shadow_frames_by_the_deadline_fail_the_rollout() -> None:
    f = _fleet(4, _spec(shadow="1h"))
    f.run_shadow(per_tick=2, dt=600)  # 2 frames per 10 min: never 500 within the hour
    assert f.r.phase is Phase.ROLLING_BACK
    assert "shadow not shown within 3600 s" in f.r.reason
    assert "of 500 sampled frames" in f.r.reason
    assert not [c for c in f.cmds if isinstance(c, AssignDirective) and c.mode == MODE_ACTIVE]


def test_without_rollback_a_shadow_failure_pauses_and_the_shadows_keep_running() -> None:
    spec = _spec(policy={"rollback_done_waves_on_failure": False})
    f = _fleet(4, spec, agreement=dict.fromkeys(_ids(4), 0.5))
    f.run_shadow()
    assert f.r.phase is Phase.PAUSED
    assert f.r.resume_to is Phase.SHADOW
    assert f.reverts() == []
    assert f.r.devices[f.r.order[0]].status is S.SHADOWING


def test_a_slow_shadow_over_the_latency_budget_does_not_pass() -> None:
    f = _fleet(4, _spec(shadow="1h"), shadow_p99=80.0)  # budget 50 ms
    f.run_shadow(per_tick=200)
    assert f.r.phase is Phase.ROLLING_BACK
    assert "shadow p99 80 ms > 50 ms" in f.r.reason


def test_a_failed_shadow_install_fails_the_device_and_the_gate() -> None:
    f = _fleet(4, _spec(waves="2,100%"))
    f.shadow_fails = {f.r.order[1]}
    f.run_shadow()
    assert f.r.phase is Phase.ROLLING_BACK
    assert f.r.devices[f.r.order[1]].status is S.REVERTING
    assert "1 install failures > 0 allowed" in f.r.reason
    assert not [c for c in f.cmds if isinstance(c, AssignDirective) and c.mode == MODE_ACTIVE]


def test_the_health_summary_alone_shows_the_shadow_running_and_another_release_does_not() -> None:
    f = _fleet(4)
    f.tick()
    canary = f.r.order[0]
    other = ShadowReport("det", 3, "3.0.0", 800, 800, 10.0)
    f.report(canary, active_bundle="det", active_release=1, shadow=other)
    assert f.r.devices[canary].status is S.SHADOW_ASSIGNED
    by_version = ShadowReport("det", None, "2.0.0", 40, 39, 10.0)  # no release: by version
    f.report(canary, active_bundle="det", active_release=1, shadow=by_version)
    assert f.r.devices[canary].status is S.SHADOWING
    assert (f.r.devices[canary].shadow_n, f.r.devices[canary].shadow_agree) == (40, 39)
    assert f.r.phase is Phase.SHADOW


def test_a_device_that_never_reports_the_shadow_pauses_the_rollout_after_assigning_s() -> None:
    f = _fleet(4, _spec(policy={"timeouts": {"assigning_s": 600}}))
    f.silent = {f.r.order[0]}
    f.run_shadow()
    assert f.r.phase is Phase.PAUSED
    assert "did not report the shadow running" in f.r.reason


def test_the_shadow_gate_uses_the_wilson_bounds_not_the_bare_ratio() -> None:
    spec = _spec()
    good = evaluate_shadow(spec, [ShadowSample("a", 500, 495, 10.0)], 50.0, over=False)
    assert type(good).__name__ == "GatePass"  # 0.99, lower bound ~0.977
    edge = evaluate_shadow(spec, [ShadowSample("a", 500, 488, 10.0)], 50.0, over=False)
    assert type(edge).__name__ == "GateWait"  # 0.976 but lower bound ~0.958
    assert edge.metrics["shadow_lower"] < 0.97 < edge.metrics["shadow_upper"]  # type: ignore[operator]
    late = evaluate_shadow(spec, [ShadowSample("a", 500, 488, 10.0)], 50.0, over=True)
    assert type(late).__name__ == "GateFail"
    # a wave of two: a pass rests on the less agreeing device's own records (capped)
    pair = [ShadowSample("a", 900, 899, 12.0), ShadowSample("b", 500, 496, 40.0)]
    verdict = evaluate_shadow(spec, pair, 50.0, over=False)
    assert (verdict.metrics["shadow_n"], verdict.metrics["shadow_agree"]) == (500, 496)
    assert verdict.metrics["shadow_p99_ms"] == 40.0  # the slower device
    assert type(verdict).__name__ == "GatePass"
    # three or more: the most and the least agreeing device are left out, the rest pooled
    wave = [*pair, ShadowSample("c", 300, 290, 45.0), ShadowSample("d", 400, 400, 60.0)]
    verdict = evaluate_shadow(spec, wave, 50.0, over=False)
    assert verdict.metrics["shadow_left_out"] == "c,d"
    assert (verdict.metrics["shadow_n"], verdict.metrics["shadow_agree"]) == (1000, 995)
    assert verdict.metrics["shadow_p99_ms"] == 45.0  # the slowest device left out
    assert type(verdict).__name__ == "GatePass"
    no_budget = evaluate_shadow(spec, [ShadowSample("a", 500, 495, None)], None, over=False)
    assert type(no_budget).__name__ == "GatePass"


def test_shadow_spec_fields_parse_durations_and_refuse_bad_values() -> None:
    spec = _spec(shadow="2h")
    assert (spec.shadow_s, spec.shadow_min, spec.min_agreement) == (7200, 500, 0.97)
    assert parse_spec({"bundle": "det@2.0.0", "selector": "*", "waves": "100%",
                       "soak_s": 0}).shadow_s == 0  # fmt: skip
    for bad, name in (
        ({"min_agreement": 1.5}, "min_agreement"),
        ({"shadow_min": 0}, "shadow_min"),
        ({"shadow_s": "soon"}, "shadow_s"),
    ):
        with pytest.raises(RolloutError) as err:
            _spec(**bad)
        assert err.value.field == name


def test_a_stored_rollout_from_before_the_shadow_fields_still_loads_and_steps() -> None:
    f = _fleet(4, _spec(shadow="0"))
    f.tick()
    f.answer()
    data = json.loads(dumps(f.r))
    r = data["rollout"]
    for key in ("shadow_s", "shadow_min", "min_agreement"):
        del r["spec"][key]
    for key in ("min_accuracy", "min_labels", "accuracy_drop", "accuracy_alpha",
                "accuracy_confidence", "shadow_confidence"):  # fmt: skip
        del r["spec"]["policy"]["gates"][key]
    for d in r["devices"].values():
        for key in ("shadow_n", "shadow_agree", "shadow_p99_ms"):
            del d[key]
    for w in r["waves"]:
        del w["shadow_passed_at"], w["shadow"]
    del r["labels"]
    old = loads(json.dumps(data))
    assert old == f.r
    assert old.spec.shadow_s == 0
    assert old.spec.policy.gates.min_accuracy is None
    assert step(old, Tick(f.now + 1)) == step(f.r, Tick(f.now + 1))


def _ids(n: int) -> list[str]:
    return [d.device_id for d in _devices(n)]


@pytest.mark.parametrize("seed", range(12))
def test_random_shadow_rollouts_never_switch_a_device_before_its_waves_shadow_passed(
    seed: int,
) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    ids = _ids(n)
    f = _fleet(n, _spec(waves=rng.choice(["1,100%", "1,50%,100%", "2,100%"]), shadow="1h"))
    rate = rng.choice([1.0, 0.998, 0.995, 0.9])
    f.agreement = {d: rate if rng.random() < 0.9 else 0.7 for d in ids}
    f.shadow_fails = {d for d in ids if rng.random() < 0.03}
    f.run_shadow(per_tick=rng.choice([20, 100, 400]), dt=rng.choice([60.0, 600.0]))
    for d in ids:
        modes = f.directives(d)
        assert modes in ([], [MODE_SHADOW], [MODE_SHADOW, MODE_ACTIVE]), (d, modes)
        wave = f.r.devices[d].wave
        if MODE_ACTIVE in modes:
            assert wave is not None
            assert f.r.waves[wave].shadow_passed_at is not None
    if f.r.phase is Phase.ROLLING_BACK and "shadow" in f.r.reason:
        failed = f.r.waves[f.r.wave].devices
        assert all(MODE_ACTIVE not in f.directives(d) for d in failed)
        assert set(failed) <= set(f.reverts())
