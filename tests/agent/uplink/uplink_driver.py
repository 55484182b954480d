"""Runs an Uplink with the identity under STATE_DIR until killed, for the last-will and
outbox crash tests.

Usage: python tests/agent/uplink/uplink_driver.py STATE_DIR [MAX_SECONDS] [PORT EVENTS]

Prints "connected" once the broker accepted it; stops by itself after MAX_SECONDS (a
bound, so a forgotten driver can't run forever) and exits 0; 3 if it never connected.
With PORT and EVENTS: connects to the broker on PORT instead, queues EVENTS ``alarm``
events (ids ``e-0`` ...) at once, prints "queued N" and does not wait to be connected.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from agent.enrollment.identity import Identity
from agent.uplink import Uplink, UplinkConfig


def main(argv: list[str]) -> int:
    state_dir = Path(argv[1])
    max_s = float(argv[2]) if len(argv) > 2 else 30.0
    port = int(argv[3]) if len(argv) > 3 else None
    events = int(argv[4]) if len(argv) > 4 else 0
    identity = Identity.load(state_dir)
    if identity is None:
        print(f"no identity in {state_dir}", file=sys.stderr)
        return 2
    config = UplinkConfig(
        enabled=True,
        heartbeat_interval_s=0.2,
        health_interval_s=1.0,
        broker_port=port,
        reconnect_max_s=1,
    )
    uplink = Uplink(
        identity.device_id,
        identity,
        config,
        state=lambda: {"agent_version": "driver"},
        health=dict,
    )
    if port is not None:
        for i in range(events):
            uplink.event("alarm", {"n": i}, event_id=f"e-{i}")
        print(f"queued {events}", flush=True)
        uplink.start()
        time.sleep(max_s)
        uplink.stop()
        return 0
    uplink.start()
    if not uplink.wait_connected(10.0):
        print(f"not connected: {uplink.stats()}", file=sys.stderr)
        uplink.stop()
        return 3
    print("connected", flush=True)
    end = time.monotonic() + max_s
    while time.monotonic() < end:
        time.sleep(0.1)
    uplink.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
