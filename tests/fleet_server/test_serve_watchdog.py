"""``fleet-server serve`` under systemd's notification protocol, as a real process with its
managed Mosquitto: READY=1 once the API answers and the broker runs, WATCHDOG=1 from its
main loop at half a short ``WATCHDOG_USEC``, none while the process is stopped,
STOPPING=1 on SIGTERM; only the main process notifies (not Mosquitto)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    http,
    make_repository,
)
from tests.fleet_server.test_fleet_serve import write_config
from tests.support.broker import free_port
from tests.support.notify import NotifyListener

WATCHDOG_S = 2.0
START_S = 60.0
UNIT = Path(__file__).parents[2] / "packaging/systemd/edgefleet-fleet-server.service"
STOP_S = float(re.search(r"^TimeoutStopSec=(\d+)$", UNIT.read_text(), re.M)[1])  # type: ignore[index]
"""As long as systemd lets the service stop before it kills it."""


@pytest.fixture
def listener() -> Iterator[NotifyListener]:
    sock = NotifyListener()
    yield sock
    sock.close()


def test_serve_is_ready_with_api_and_broker_petted_and_stopping(
    tmp_path: Path, listener: NotifyListener
) -> None:
    api, mqtt = free_port(), free_port()
    config = write_config(tmp_path, make_repository(tmp_path / "repo"), api, mqtt)
    env = dict(os.environ) | listener.env(watchdog_s=WATCHDOG_S)
    env.pop("CREDENTIALS_DIRECTORY", None)
    env |= {"EDGEFLEET_KEY_PASSPHRASE": PASSPHRASE, TOKEN_ENV: OPERATOR_TOKEN}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_server.cli.server", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        ready = listener.wait_for("READY", START_S)
        assert ready.pid == proc.pid
        assert f":{api}" in ready.fields.get("STATUS", ""), ready
        # ready means serving: the API answers at once, with the broker up
        health = http("GET", f"http://127.0.0.1:{api}/healthz")
        assert health.status == 200, health.body
        pets = [m for m in listener.receive(2 * WATCHDOG_S) if "WATCHDOG" in m.fields]
        assert len(pets) >= 2, log.read_text(errors="replace")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            listener.receive(WATCHDOG_S / 2)  # one may have been in flight
            quiet = listener.receive(2 * WATCHDOG_S)
            assert not [m for m in quiet if "WATCHDOG" in m.fields], quiet
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        listener.wait_for("WATCHDOG", START_S)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)  # every thread's stack, into the log
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            tail = log.read_text(errors="replace")[-12_000:]
            raise AssertionError(
                f"fleet-server did not stop within {STOP_S:g} s:\n{tail}"
            ) from None
    assert code == 0, log.read_text(errors="replace")
    listener.receive(0.5)
    assert any("STOPPING" in m.fields for m in listener.messages)
    assert {m.pid for m in listener.messages} == {proc.pid}, "only the main process notifies"
    assert "stopped in" in log.read_text(errors="replace")
