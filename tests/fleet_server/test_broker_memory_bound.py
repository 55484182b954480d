"""The managed Mosquitto's memory bound holds as measured, not only as written (issue 26).

A real ``fleet-server serve`` (managed TLS Mosquitto, SQLite, its ingest) is stopped with
SIGSTOP, so its ingest reads and acknowledges nothing; one enrolled device then floods it
with large QoS 1 messages. The broker's peak RSS (``VmHWM``) may grow by no more than
:meth:`MosquittoConfig.client_memory_bound` for the ingest's Receive Maximum, the figure
the README states. After SIGCONT, ingest stores every message the broker held (the first
ones, in order, and another device's report sent before the flood); the rest were dropped
by the broker after their PUBACK, which it logs. Small limits keep the run short; the
arithmetic is the same at the defaults.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.wire import topics
from agent.wire.messages import Event, encode
from fleet_server.broker import MosquittoConfig
from fleet_server.ingest.worker import RECEIVE_MAXIMUM
from tests.fleet_server.fleet_api_support import (
    OPERATOR_TOKEN,
    PASSPHRASE,
    TOKEN_ENV,
    make_repository,
)
from tests.fleet_server.test_fleet_serve import write_config
from tests.security import hostile_fleet
from tests.security.hostile_fleet import HostileFleet, heartbeat

FLOODER = "flood"
VICTIM = "v1"
MIB = 1024 * 1024
LIMITS = {
    "max_queued_bytes": 4 * MIB,
    "max_inflight_bytes": 2 * MIB,
    "max_queued_messages": 1000,
}
"""What the test's broker runs with (the defaults: 256 MiB, 64 MiB, 100,000)."""
PAD_CHARS = 400_000
"""Each flood message carries this much padding: ~400 KB, under the 512 KiB payload limit,
so ingest stores every one it gets."""
FLOOD = 80
WAIT_S = 30.0


def _write_config(directory: Path, repository: tuple[Path, Path], api: int, mqtt: int) -> Path:
    path = write_config(directory, repository, api, mqtt)
    text = path.read_text()
    limits = "".join(f"{key} = {value}\n" for key, value in LIMITS.items())
    assert "persistence = false\n" in text
    path.write_text(text.replace("persistence = false\n", "persistence = false\n" + limits, 1))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileFleet]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CREDENTIALS_DIRECTORY", raising=False)
        mp.setenv("EDGEFLEET_KEY_PASSPHRASE", PASSPHRASE)
        mp.setenv(TOKEN_ENV, OPERATOR_TOKEN)
        mp.setattr(hostile_fleet, "write_config", _write_config)
        repo, keys = make_repository(tmp_path_factory.mktemp("bound-repo"))
        yield from hostile_fleet.serve(
            tmp_path_factory.mktemp("bound"), repo, keys, [FLOODER, VICTIM]
        )


def _broker_pid(fleet: HostileFleet) -> int:
    pids = list(fleet.state.rglob("mosquitto.pid"))
    assert len(pids) == 1, pids
    return int(pids[0].read_text().strip())


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _flood_message(i: int, pad: int = PAD_CHARS) -> bytes:
    event = Event(
        device_id=FLOODER,
        kind="alarm",
        event_id=f"flood-{i:04d}",
        ts=time.time(),
        payload={"pad": "x" * pad},
    )
    return encode(event)


def _stored_flood(fleet: HostileFleet) -> list[str]:
    rows = fleet.query(
        "SELECT event_id FROM events WHERE device_id = ? AND event_id LIKE 'flood-%'", FLOODER
    )
    return sorted(str(r[0]) for r in rows)


def _wait(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"{what} not within {WAIT_S} s"
        time.sleep(0.1)


def test_a_device_flooding_a_stalled_ingest_grows_the_broker_no_more_than_the_bound(
    fleet: HostileFleet,
) -> None:
    config = MosquittoConfig(**LIMITS)
    bound = config.client_memory_bound(RECEIVE_MAXIMUM)
    size = len(_flood_message(0))
    assert FLOOD * size > 2 * bound, "the flood must be able to break the bound"
    broker = _broker_pid(fleet)
    flooder = fleet.peer(FLOODER)
    victim = fleet.peer(VICTIM)
    stalled = False
    try:
        before_kib = _status_kib(broker, "VmRSS")
        os.kill(fleet.proc.pid, signal.SIGSTOP)  # the ingest (in fleet-server) stalls
        stalled = True
        topic, payload, beat_id = heartbeat(VICTIM)
        assert not victim.publish(topic, payload).is_failure
        for i in range(FLOOD):
            rc = flooder.publish(topics.events(FLOODER), _flood_message(i))
            # Mosquitto 2.0 acknowledges what it then drops for a full subscriber queue.
            assert not rc.is_failure, f"flood message {i}: {rc}"
        grown = (_status_kib(broker, "VmHWM") - before_kib) * 1024
        print(
            f"flood {FLOOD} x {size} B = {FLOOD * size / MIB:.1f} MiB; broker grew "
            f"{grown / MIB:.1f} MiB at its peak; bound {bound / MIB:.1f} MiB"
        )
        assert grown <= bound
        # Nothing throttles or disconnects the device; the broker's bound is what gives.
        assert not flooder.closed
    finally:
        if stalled:
            os.kill(fleet.proc.pid, signal.SIGCONT)
        victim.close()

    # The broker held at least max_queued_bytes + max_inflight_bytes of the flood (its
    # queue was full) and never more than one message beyond: those are stored, in order.
    held_min = (config.max_queued_bytes + config.max_inflight_bytes) // size
    _wait("the flood the broker held", lambda: len(_stored_flood(fleet)) >= held_min)
    # One more message marks the end of what was held: sent (the same id again) until
    # stored, since the broker drops it too while ingest has not yet acknowledged enough.
    marker = f"flood-{FLOOD:04d}"

    def marked() -> bool:
        if marker in _stored_flood(fleet):
            return True
        assert not flooder.publish(topics.events(FLOODER), _flood_message(FLOOD, 0)).is_failure
        return False

    try:
        _wait("the marker", marked)
    finally:
        flooder.close()
    stored = _stored_flood(fleet)
    kept = stored[:-1]
    assert kept == [f"flood-{i:04d}" for i in range(len(kept))], "not the first ones, in order"
    assert held_min <= len(kept) < FLOOD
    assert len(kept) * size <= config.max_queued_bytes + config.max_inflight_bytes + size
    sql = "SELECT count(*) FROM heartbeats WHERE device_id = ? AND record_id = ?"
    assert fleet.wait_count(sql, VICTIM, beat_id, want=1) == 1
    # What was dropped is said: Mosquitto's notice, in fleet-server's log.
    _wait(
        "the broker's drop notice",
        lambda: (
            "Outgoing messages are being dropped for client fleet:ingest" in fleet.log.read_text()
        ),
    )


def test_the_readme_states_the_bound_the_code_computes_at_the_defaults() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    defaults = MosquittoConfig()
    ingest = defaults.client_memory_bound(RECEIVE_MAXIMUM) / MIB
    any_client = defaults.client_memory_bound(65535) / MIB
    assert f"**{ingest:.0f} MiB**" in readme
    assert f"{any_client:.0f} MiB in all" in readme
    assert f"announces Receive Maximum {RECEIVE_MAXIMUM}," in readme
    with pytest.raises(ValueError, match="receive_maximum 0"):
        defaults.client_memory_bound(0)
