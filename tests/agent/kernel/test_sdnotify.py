"""sd_notify against a real AF_UNIX datagram socket bound by the test (a path and an
abstract name), the watchdog's variables, and the watch's rule on the hot path's answers."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kernel.sdnotify import Notifier, forget, socket_address, watchdog_interval_s
from agent.watchdog import HotPathWatch, judge
from tests.support.notify import Message, NotifyListener


@pytest.fixture
def listener() -> Iterator[NotifyListener]:
    sock = NotifyListener()
    yield sock
    sock.close()


def test_ready_status_watchdog_and_stopping_reach_an_abstract_socket(
    listener: NotifyListener,
) -> None:
    notifier = Notifier(listener.env(watchdog_s=2.0))
    assert notifier.enabled
    assert notifier.ready("up: 1 pipeline")
    assert notifier.watchdog()
    assert notifier.status("line\nbreak")
    assert notifier.stopping()
    got = listener.receive(1.0)
    assert [m.fields for m in got] == [
        {"READY": "1", "STATUS": "up: 1 pipeline"},
        {"WATCHDOG": "1"},
        {"STATUS": "line break"},
        {"STOPPING": "1"},
    ]
    assert {m.pid for m in got} == {os.getpid()}


def test_a_socket_path_is_notified_too() -> None:
    with tempfile.TemporaryDirectory(prefix="sdn-") as d:
        listener = NotifyListener(Path(d) / "notify")
        try:
            assert Notifier(listener.env()).ready()
            assert [m.fields for m in listener.receive(1.0)] == [{"READY": "1"}]
        finally:
            listener.close()


def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    notifier = Notifier({"WATCHDOG_USEC": "2000000"})
    assert not notifier.enabled
    assert notifier.watchdog_s is None
    assert not notifier.ready()
    assert not notifier.watchdog()


def test_a_socket_nobody_listens_on_is_counted_not_raised() -> None:
    notifier = Notifier({"NOTIFY_SOCKET": "@edgefleet-test-nobody-listens-here"})
    assert not notifier.watchdog()
    assert notifier.failures == 1


def test_the_watchdog_interval_follows_watchdog_usec_and_watchdog_pid() -> None:
    me = str(os.getpid())
    assert watchdog_interval_s({"WATCHDOG_USEC": "20000000"}) == 20.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": me}) == 2.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval_s({}) is None
    notifier = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "3000000"})
    assert notifier.pet_interval_s == 1.5


def test_addresses_are_paths_or_abstract_names() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@sd") == b"\0sd"
    with pytest.raises(ValueError, match="neither"):
        socket_address("relative/notify")
    assert not Notifier({"NOTIFY_SOCKET": "relative"}).enabled


def test_forget_leaves_a_child_nothing_to_notify_with() -> None:
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin"}
    forget(env)
    assert env == {"PATH": "/bin"}


# -- the rule -----------------------------------------------------------------------------
def _loop(age: float, *, wedged: bool) -> dict[str, object]:
    return {"loop_age_s": age, "stall_s": 15.2, "threads_alive": True, "wedged": wedged}


def test_an_idle_pipeline_is_alive_and_a_wedged_one_is_not() -> None:
    idle = judge([True, {"pool": "ok", "pipelines": {"line1": _loop(0.2, wedged=False)}}])
    assert idle.alive
    assert "1 pipeline (line1)" in idle.status
    wedged = judge(
        [
            False,
            {
                "pipelines": {
                    "line1": _loop(0.1, wedged=False),
                    "line2": _loop(31.0, wedged=True),
                }
            },
        ]
    )
    assert not wedged.alive
    assert wedged.answered
    assert "line2 (no loop for 31.0 s)" in wedged.status


def test_no_answer_or_a_malformed_one_is_not_alive() -> None:
    assert not judge(None).alive
    assert not judge(None).answered
    assert not judge([True]).alive
    assert not judge([True, {"pipelines": {"a": 1}}]).alive


def test_a_pool_that_did_not_start_is_alive_but_said_so() -> None:
    verdict = judge(
        [False, {"pool": "not started", "pipelines": {}, "problems": ["pipeline p: no bundle"]}]
    )
    assert verdict.alive
    assert "pool not started" in verdict.status
    assert "pipeline p: no bundle" in verdict.status


def test_the_watch_pets_only_on_fresh_live_answers(listener: NotifyListener) -> None:
    answers: list[object] = [[True, {"pipelines": {"p": _loop(0.1, wedged=False)}}]]

    def probe(_timeout_s: float) -> object:
        return answers[0]

    watch = HotPathWatch(Notifier(listener.env(watchdog_s=0.4)), probe).start()
    try:
        ready = _tick_until(watch, listener, "READY")
        assert "deciding: 1 pipeline (p)" in ready.fields["STATUS"]
        _tick_until(watch, listener, "WATCHDOG")
        answers[0] = [True, {"pipelines": {"p": _loop(40.0, wedged=True)}}]
        said = _tick_until(watch, listener, "STATUS")
        assert "pipeline wedged: p" in said.fields["STATUS"]
        _tick_for(watch, listener, 0.3)  # the last live answer's half interval runs out
        petted = watch.pets
        _tick_for(watch, listener, 1.0)  # five half intervals
        assert watch.pets == petted
        answers[0] = [True, {"pipelines": {"p": _loop(0.1, wedged=False)}}]
        _tick_until(watch, listener, "WATCHDOG")
    finally:
        watch.stop()
    assert "STOPPING" in listener.receive(1.0)[-1].fields


def _tick_for(watch: HotPathWatch, listener: NotifyListener, seconds: float) -> None:
    for _ in range(int(seconds / 0.05)):
        watch.tick()
        listener.receive(0.05)


def _tick_until(watch: HotPathWatch, listener: NotifyListener, key: str) -> Message:
    """Tick the watch (as the owner's loop does) until ``key`` arrives (a bound of 5 s)."""
    for _ in range(100):
        watch.tick()
        for message in listener.receive(0.05):
            if key in message.fields:
                return message
    raise AssertionError(f"no {key}: {listener.messages[-5:]}")
