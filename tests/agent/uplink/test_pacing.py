"""The drain's pacing controller and the hot path's latency window, without I/O: values
in, rates and snapshots out (a fake clock where time matters)."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict

import pytest

from agent.livelatency import MIN_COUNT, LatencyWindow, LiveLoad
from agent.uplink import UplinkConfig
from agent.uplink.pacing import DECREASE, QUIET_WINDOWS, Pacer, PacingSettings

SETTINGS = PacingSettings(cap_per_s=100.0, min_per_s=2.0, target_ratio=1.2, increase_per_s=5.0)


def load(p99_ms: float | None, baseline_ms: float | None = None) -> LiveLoad:
    return LiveLoad(p99_ms, baseline_ms, 100 if p99_ms is not None else 0, 1.0)


def idle_pacer(idle_ms: float = 10.0, settings: PacingSettings = SETTINGS) -> Pacer:
    pacer = Pacer(settings)
    for _ in range(QUIET_WINDOWS):
        pacer.update(load(idle_ms), quiet=True, limited=False)
    return pacer


# -- the controller ----------------------------------------------------------------------


def test_quiet_windows_teach_the_idle_p99_and_the_drain_starts_at_the_minimum() -> None:
    pacer = idle_pacer(10.0)
    assert pacer.baseline_ms() == pytest.approx(10.0)
    assert pacer.rate_per_s == SETTINGS.min_per_s
    assert pacer.reason == "idle"


def test_slow_start_doubles_the_rate_while_the_line_has_headroom() -> None:
    pacer = idle_pacer(10.0)
    rates = [pacer.update(load(10.5), quiet=False, limited=True) for _ in range(4)]
    assert rates == [4.0, 8.0, 16.0, 32.0]


def test_a_p99_over_the_target_cuts_the_rate_and_ends_slow_start() -> None:
    pacer = idle_pacer(10.0)
    for _ in range(4):
        pacer.update(load(10.0), quiet=False, limited=True)
    assert pacer.rate_per_s == 32.0
    cut = pacer.update(load(12.5), quiet=False, limited=True)  # 1.25 x idle > 1.2
    assert cut == pytest.approx(32.0 * DECREASE)
    assert pacer.decreases == 1
    grown = pacer.update(load(11.9), quiet=False, limited=True)  # at or under 1.2 x
    assert grown == pytest.approx(32.0 * DECREASE + SETTINGS.increase_per_s)  # additive now


def test_the_rate_never_goes_under_the_minimum_however_high_the_p99() -> None:
    pacer = idle_pacer(10.0)
    for _ in range(50):
        rate = pacer.update(load(500.0), quiet=False, limited=True)
        assert rate >= SETTINGS.min_per_s
    assert pacer.rate_per_s == SETTINGS.min_per_s


def test_the_operators_rate_is_a_hard_cap() -> None:
    pacer = idle_pacer(10.0)
    rates = [pacer.update(load(9.0), quiet=False, limited=True) for _ in range(200)]
    assert max(rates) == SETTINGS.cap_per_s
    assert all(r <= SETTINGS.cap_per_s for r in rates)


def test_the_rate_holds_while_the_drain_is_not_rate_bound() -> None:
    pacer = idle_pacer(10.0)
    pacer.update(load(10.0), quiet=False, limited=True)
    held = [pacer.update(load(10.0), quiet=False, limited=False) for _ in range(5)]
    assert held == [4.0] * 5


def test_no_live_figure_falls_back_to_the_fixed_rate() -> None:
    pacer = idle_pacer(10.0)
    assert pacer.update(None, quiet=False, limited=True) == SETTINGS.cap_per_s
    assert pacer.update(load(None), quiet=False, limited=True) == SETTINGS.cap_per_s
    assert pacer.reason == "no live figure: fixed rate"
    # the figure back: paced again from where it was, not from the cap
    assert pacer.update(load(10.0), quiet=False, limited=True) == 4.0


def test_fixed_mode_ignores_the_live_p99() -> None:
    pacer = Pacer(PacingSettings(mode="fixed", cap_per_s=50.0))
    assert pacer.update(load(1000.0, 1.0), quiet=False, limited=True) == 50.0
    assert pacer.decreases == 0


def test_without_quiet_windows_the_loads_baseline_is_the_idle_p99() -> None:
    pacer = Pacer(SETTINGS)
    assert pacer.update(load(30.0), quiet=False, limited=True) == SETTINGS.min_per_s
    assert pacer.reason == "no idle p99 yet: holding"
    assert pacer.update(load(11.0, baseline_ms=10.0), quiet=False, limited=True) == 4.0
    assert pacer.update(load(13.0, baseline_ms=10.0), quiet=False, limited=True) < 4.0


def test_a_quiet_spell_after_a_drain_restarts_from_the_minimum() -> None:
    pacer = idle_pacer(10.0)
    for _ in range(5):
        pacer.update(load(10.0), quiet=False, limited=True)
    assert pacer.rate_per_s > SETTINGS.min_per_s
    assert pacer.update(load(10.0), quiet=True, limited=False) == SETTINGS.min_per_s
    assert pacer.slow_start


def test_the_stats_are_json() -> None:
    pacer = idle_pacer(10.0)
    pacer.update(load(20.0), quiet=False, limited=True)
    stats = json.loads(json.dumps(pacer.stats()))
    assert stats["mode"] == "headroom"
    assert stats["rate_per_s"] == SETTINGS.min_per_s
    assert stats["live_p99_ms"] == 20.0
    assert stats["baseline_p99_ms"] == 10.0
    assert stats["decreases"] == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_per_s", 0.0), ("min_per_s", 200.0), ("target_ratio", 1.0), ("increase_per_s", 0.0)],
)
def test_settings_out_of_range_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.split("_", maxsplit=1)[0]):
        PacingSettings(**{"cap_per_s": 100.0, field: value})  # type: ignore[arg-type]


def test_the_uplink_config_gives_the_pacing_settings() -> None:
    cfg = UplinkConfig(drain_rate_per_s=40, drain_min_rate_per_s=80, drain_target_p99_ratio=1.5)
    settings = cfg.pacing()
    assert settings.mode == "headroom"
    assert settings.cap_per_s == 40
    assert settings.min_per_s == 40  # never above the cap
    assert settings.target_ratio == 1.5
    assert UplinkConfig(drain_pacing="fixed").pacing().mode == "fixed"


# -- the latency window ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_gives_the_p99_of_its_last_window_only() -> None:
    clock = Clock()
    window = LatencyWindow(window_s=1.0, clock=clock)
    for _ in range(100):
        window.record(50.0)
    clock.now += 2.0  # those fall out of the window
    for i in range(100):
        window.record(float(i + 1))
    snap = window.snapshot()
    assert snap.count == 100
    assert snap.p99_ms == 99.0
    assert snap.window_s == 1.0


def test_too_few_decisions_give_no_p99() -> None:
    window = LatencyWindow(clock=Clock())
    for _ in range(MIN_COUNT - 1):
        window.record(5.0)
    snap = window.snapshot()
    assert snap.p99_ms is None
    assert snap.count == MIN_COUNT - 1


def test_the_baseline_is_the_lower_quartile_of_recent_window_p99s() -> None:
    clock = Clock()
    window = LatencyWindow(window_s=1.0, clock=clock)
    assert window.snapshot().baseline_p99_ms is None
    for p99 in (10.0, 40.0, 12.0, 11.0, 50.0, 13.0, 10.0, 60.0):
        clock.now += 1.5  # one window's figures each, none overlapping
        for _ in range(20):
            window.record(p99)
        window.snapshot()
    snap = window.snapshot()
    assert snap.baseline_p99_ms == 10.0


def test_a_snapshot_is_a_frozen_json_able_dataclass() -> None:
    window = LatencyWindow(clock=Clock())
    for _ in range(20):
        window.record(3.5)
    snap = window.snapshot()
    assert json.loads(json.dumps(asdict(snap))) == {
        "p99_ms": 3.5, "baseline_p99_ms": None, "count": 20, "window_s": 1.0,
    }  # fmt: skip
    with pytest.raises(AttributeError):
        snap.p99_ms = 1.0  # type: ignore[misc]


def test_many_threads_record_while_another_takes_snapshots() -> None:
    window = LatencyWindow(window_s=60.0, capacity=100_000)
    stop = threading.Event()
    counts: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            counts.append(window.snapshot().count)

    def writer() -> None:
        for _ in range(10_000):
            window.record(1.0)

    snapper = threading.Thread(target=reader)
    snapper.start()
    writers = [threading.Thread(target=writer) for _ in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    snapper.join()
    assert window.snapshot().count == 40_000  # none lost
    assert counts == sorted(counts)


def test_a_window_with_bad_arguments_is_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        LatencyWindow(window_s=0)
