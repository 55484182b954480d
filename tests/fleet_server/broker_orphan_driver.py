"""Starts a ManagedBroker from a MosquittoConfig JSON file and waits to be killed: a
fleet server that dies without stopping its broker.

Usage: python tests/fleet_server/broker_orphan_driver.py CONFIG_JSON
Prints "running PID" once Mosquitto listens.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fleet_server.broker import ManagedBroker, MosquittoConfig


def main(argv: list[str]) -> int:
    config = MosquittoConfig.model_validate_json(Path(argv[1]).read_text())
    broker = ManagedBroker(config)
    broker.start()
    print(f"running {broker.pid}", flush=True)
    time.sleep(60)
    broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
