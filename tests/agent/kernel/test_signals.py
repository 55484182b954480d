"""SignalRelay: a SIGTERM that arrives while the main thread holds the lock inside the very
Event the handler sets still stops the process (a handler calling Event.set() hangs it);
callbacks run in order, and one that raises does not end the relay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from agent.kernel.signals import SignalRelay

# The main thread takes the Event's internal lock (as Event.wait() does around its wait),
# and SIGTERM arrives right then: the handler runs on this thread before the lock is let go.
_PROGRAM = """
import os, signal, sys, threading
from agent.kernel.signals import SignalRelay

stop = threading.Event()
if sys.argv[1] == "relay":
    SignalRelay().on(signal.SIGTERM, stop.set)
else:
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
with stop._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # bytecodes: the handler runs among them
        pass
print("stopped" if stop.wait(10) else "not stopped", flush=True)
"""


def _run(mode: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROGRAM), mode],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_a_handler_that_sets_the_event_hangs_while_the_main_thread_holds_its_lock() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        _run("handler", timeout_s=5.0)


def test_the_relay_stops_the_process_while_the_main_thread_holds_the_event_lock() -> None:
    done = _run("relay", timeout_s=30.0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped", done.stdout + done.stderr


def test_callbacks_run_in_order_off_the_main_thread_and_survive_a_failing_one() -> None:
    calls: list[tuple[str, str]] = []
    second = threading.Event()

    def fails() -> None:
        calls.append(("fails", threading.current_thread().name))
        raise RuntimeError("a callback that fails")

    previous = signal.getsignal(signal.SIGUSR2)
    try:
        relay = SignalRelay(name="test-signals")
        relay.on(signal.SIGUSR2, fails, lambda: calls.append(("after", "")), second.set)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert second.wait(10), calls
        second.clear()
        os.kill(os.getpid(), signal.SIGUSR2)  # the relay still runs after the failure
        assert second.wait(10), calls
    finally:
        signal.signal(signal.SIGUSR2, previous)
    time.sleep(0.1)
    assert [name for name, _ in calls] == ["fails", "after", "fails", "after"]
    assert calls[0][1] == "test-signals"
