"""The outbox's drain paced by the line, against real parts (a managed Mosquitto with
TLS, a real outbox): the operator's rate stays a hard cap, and the drain slows down when
the live p99 the hot path publishes rises. The live latency is fed by the test; no
assertion depends on how fast this machine is."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agent.enrollment.identity import Identity
from agent.livelatency import LatencyWindow, LiveLoad
from agent.uplink import Uplink, UplinkConfig
from agent.wire import topics
from tests.agent.uplink.uplink_fixtures import FAST, wait_until
from tests.support.tls_peers import WAIT_S, Peer

QUIET = FAST.model_copy(update={"health_interval_s": 3600.0, "drain_pace_interval_s": 0.05})


def _events(uplink: Uplink, count: int) -> None:
    for i in range(count):
        uplink.event("alarm", {"alarm": "test", "n": i})


def _pacing(uplink: Uplink) -> dict[str, object]:
    pacing: dict[str, object] = uplink.stats()["drain_pacing"]
    return pacing


class Feeder:
    """Records ``level_ms`` into a latency window every 2 ms, as a busy line would."""

    def __init__(self, window: LatencyWindow, level_ms: float) -> None:
        self.window = window
        self.level_ms = level_ms
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.002):
            self.window.record(self.level_ms)


@pytest.fixture
def feeder() -> Iterator[Callable[[LatencyWindow, float], Feeder]]:
    made: list[Feeder] = []

    def _make(window: LatencyWindow, level_ms: float) -> Feeder:
        made.append(Feeder(window, level_ms))
        return made[-1]

    yield _make
    for f in made:
        f.stop.set()
        f.thread.join()


def test_the_drain_never_goes_over_drain_rate_per_s_however_much_headroom_the_line_has(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
) -> None:  # fmt: skip
    identity = enrolled("dev-cap")
    peer = fleet()
    peer.subscribe(topics.events("dev-cap"))
    cap, count = 20.0, 60
    config = QUIET.model_copy(update={"drain_rate_per_s": cap, "drain_window": 4})
    always = LiveLoad(p99_ms=5.0, baseline_p99_ms=5.0, count=500, window_s=0.2)  # all headroom
    uplink = Uplink(
        "dev-cap", identity, config, state=dict, health=dict, load=lambda: always
    )  # fmt: skip
    uplinks.append(uplink)
    _events(uplink, count)  # queued before the link is up: a backlog
    rates: list[float] = []
    t0 = time.monotonic()
    uplink.start()
    assert uplink.wait_connected(WAIT_S)

    def delivered() -> bool:
        rates.append(float(str(_pacing(uplink)["rate_per_s"])))
        return int(uplink.stats().get("delivered_event", 0)) >= count

    wait_until(delivered, timeout_s=60)
    elapsed = time.monotonic() - t0
    assert max(rates) == cap  # headroom all along: it grew to the cap ...
    assert all(r <= cap for r in rates)  # ... and never past it
    burst = config.drain_window
    assert elapsed >= (count - burst) / cap  # a slow machine only makes it longer
    stats = _pacing(uplink)
    assert stats["decreases"] == 0
    assert stats["cap_per_s"] == cap


def test_the_drain_slows_down_when_the_live_p99_rises_and_picks_up_when_it_falls(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
    feeder: Callable[[LatencyWindow, float], Feeder],
) -> None:  # fmt: skip
    identity = enrolled("dev-pace")
    peer = fleet()
    peer.subscribe(topics.events("dev-pace"))
    window = LatencyWindow(window_s=0.5)  # a few hundred decisions a window, even on a busy machine
    line = feeder(window, 5.0)
    config = QUIET.model_copy(
        update={"drain_rate_per_s": 40.0, "drain_min_rate_per_s": 2.0, "drain_window": 4}
    )
    uplink = Uplink(
        "dev-pace", identity, config, state=dict, health=dict, load=window.snapshot
    )  # fmt: skip
    uplinks.append(uplink)
    uplink.start()
    assert uplink.wait_connected(WAIT_S)
    # nothing to send: the drain learns the line's idle p99
    wait_until(lambda: uplink._drain.pacer.quiet_windows >= 3)
    assert _pacing(uplink)["baseline_p99_ms"] == 5.0

    count = 200
    _events(uplink, count)
    wait_until(lambda: float(str(_pacing(uplink)["rate_per_s"])) >= 16.0)  # slow start
    assert int(uplink.stats().get("delivered_event", 0)) < count

    line.level_ms = 50.0  # the line's p99 goes to 10 x idle
    wait_until(lambda: _pacing(uplink)["rate_per_s"] == config.drain_min_rate_per_s)
    slowed = _pacing(uplink)
    assert int(str(slowed["decreases"])) >= 1
    assert slowed["reason"] == "over target: decrease"
    assert slowed["live_p99_ms"] == 50.0
    assert int(uplink.stats().get("delivered_event", 0)) < count  # still draining, slowly

    line.level_ms = 5.0  # headroom again: it picks up and the backlog ends
    wait_until(lambda: int(uplink.stats().get("delivered_event", 0)) >= count, timeout_s=60)
    assert int(str(_pacing(uplink)["increases"])) > int(str(slowed["increases"]))


def test_without_a_live_figure_the_drain_sends_at_the_fixed_rate(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
) -> None:  # fmt: skip
    identity = enrolled("dev-fixed")
    peer = fleet()
    peer.subscribe(topics.events("dev-fixed"))
    config = QUIET.model_copy(update={"drain_rate_per_s": 500.0})
    uplink = Uplink("dev-fixed", identity, config, state=dict, health=dict, load=lambda: None)
    uplinks.append(uplink)
    _events(uplink, 5)
    uplink.start()
    wait_until(lambda: int(uplink.stats().get("delivered_event", 0)) >= 5)
    pacing = _pacing(uplink)
    assert pacing["rate_per_s"] == 500.0
    assert pacing["reason"] == "no live figure: fixed rate"


def test_a_load_source_that_fails_is_counted_and_the_drain_goes_on_at_the_fixed_rate(
    enrolled: Callable[[str], Identity], fleet: Callable[..., Peer], uplinks: list[Uplink],
) -> None:  # fmt: skip
    identity = enrolled("dev-broken")
    fleet().subscribe(topics.events("dev-broken"))

    def broken() -> LiveLoad:
        raise RuntimeError("the control channel is gone")

    uplink = Uplink("dev-broken", identity, QUIET, state=dict, health=dict, load=broken)
    uplinks.append(uplink)
    _events(uplink, 3)
    uplink.start()
    wait_until(lambda: int(uplink.stats().get("delivered_event", 0)) >= 3)
    assert int(uplink.stats().get("pacing_errors", 0)) >= 1
    assert _pacing(uplink)["rate_per_s"] == QUIET.drain_rate_per_s


def test_an_unknown_pacing_mode_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="drain_pacing"):
        UplinkConfig(drain_pacing="greedy")
