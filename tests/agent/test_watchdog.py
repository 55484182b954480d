"""``edge-agent run`` under systemd's notification protocol, as real processes: the test
binds the notify socket systemd would, with a short ``WATCHDOG_USEC``. READY=1 comes once
the hot path answers with its pipeline started; WATCHDOG=1 keeps coming while the line
is idle (a camera that delivers a frame a minute); a SIGSTOPped hot path stops it (and a
SIGCONT brings it back); SIGTERM says STOPPING=1. Only the supervisor notifies: its
children get no ``$NOTIFY_SOCKET``. ``--single-process`` does the same from one process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.procs import agent_children
from tests.agent.installer.installer_helpers import make_bundle
from tests.support.notify import NotifyListener

BIN = Path(sys.executable).parent
WATCHDOG_S = 2.0
"""Short, so that the test is: pets come every 1 s."""
START_S = 60.0
IDLE_FPS = 1 / 60
"""One frame at the start, then none for a minute: an idle line, not a wedged one."""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("wd-bundle"), name="cls").path


@pytest.fixture
def listener() -> Iterator[NotifyListener]:
    sock = NotifyListener()
    yield sock
    sock.close()


def _config(tmp: Path, bundle: Path) -> Path:
    path = tmp / "agent.toml"
    path.write_text(
        '[agent]\ndevice_id = "wd-dev"\nstate_dir = "state"\nprofile = "x86-gateway"\n'
        "[runtime]\nworkers = 1\npin = false\n"
        "[http]\nport = 0\n"
        '[decision_log]\nthumbnails = "none"\nflush_interval_s = 0.1\n'
        f'[[cameras]]\nname = "c1"\nkind = "synthetic"\nfps = {IDLE_FPS}\n'
        f'[[pipelines]]\nname = "p"\nsource = "c1"\nbundle = "{bundle}"\n'
    )
    return path


def _start(
    tmp: Path, bundle: Path, listener: NotifyListener, *extra: str
) -> subprocess.Popen[bytes]:
    env = dict(os.environ) | listener.env(watchdog_s=WATCHDOG_S)
    with (tmp / "agent.log").open("wb") as out:
        return subprocess.Popen(
            [str(BIN / "edge-agent"), "run", "--config", str(_config(tmp, bundle)), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise AssertionError("the agent did not stop within 30 s") from None


def _pets(listener: NotifyListener, seconds: float) -> int:
    return sum("WATCHDOG" in m.fields for m in listener.receive(seconds))


def test_ready_then_petted_while_idle_and_not_while_the_hot_path_is_stopped(
    tmp_path: Path, bundle: Path, listener: NotifyListener
) -> None:
    proc = _start(tmp_path, bundle, listener)
    log = tmp_path / "agent.log"
    try:
        ready = listener.wait_for("READY", START_S)
        assert ready.pid == proc.pid, "only the supervisor (the main process) notifies"
        assert "deciding: 1 pipeline (p)" in ready.fields.get("STATUS", ""), ready
        hot = agent_children(proc.pid)["hotpath"]
        environ = Path(f"/proc/{hot}/environ").read_bytes()
        assert b"NOTIFY_SOCKET=" not in environ
        # idle: the one frame was taken at the start; four intervals with no frame
        assert _pets(listener, 2 * WATCHDOG_S) >= 2, log.read_text(errors="replace")
        os.kill(hot, signal.SIGSTOP)
        try:
            listener.receive(WATCHDOG_S)  # a pet on the last answer may still be due
            quiet = listener.receive(2 * WATCHDOG_S)
            assert not [m for m in quiet if "WATCHDOG" in m.fields], quiet
            said = [m.fields.get("STATUS", "") for m in listener.messages]
            assert any("does not answer" in text for text in said), said
        finally:
            os.kill(hot, signal.SIGCONT)
        listener.wait_for("WATCHDOG", START_S)
        assert {m.pid for m in listener.messages} == {proc.pid}
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text(errors="replace")
    assert any("STOPPING" in m.fields for m in listener.receive(1.0) + listener.messages)


def test_single_process_is_ready_petted_and_stopping(
    tmp_path: Path, bundle: Path, listener: NotifyListener
) -> None:
    proc = _start(tmp_path, bundle, listener, "--single-process")
    log = tmp_path / "agent.log"
    try:
        ready = listener.wait_for("READY", START_S)
        assert ready.pid == proc.pid
        assert _pets(listener, 2 * WATCHDOG_S) >= 2, log.read_text(errors="replace")
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text(errors="replace")
    stopping = [m for m in listener.receive(1.0) + listener.messages if "STOPPING" in m.fields]
    assert stopping, listener.messages[-5:]
    pids = {m.pid for m in listener.messages}
    assert pids == {proc.pid}, "the runtime's workers must not notify"
