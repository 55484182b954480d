"""Appends decisions to a DecisionLog as fast as it can, for the crash test.

Usage: python tests/agent/decisionlog/decisionlog_driver.py STATE_DIR [MAX_SECONDS]

Prints "open" once the log is open, then appends until killed (or MAX_SECONDS pass,
a bound so that a forgotten driver can't run forever). Every fifth decision is a
"reject" with a small thumbnail, so kills also land between a thumbnail file and its
row. Also home of ``make_record``, which the decision log tests share.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from agent.decisionlog import DecisionLog, DecisionLogConfig, DecisionRecord


def make_record(i: int, t: float, **fields: Any) -> DecisionRecord:
    """A decision with every field filled; ``fields`` override any of them."""
    values: dict[str, Any] = {
        "capture_time": t - 0.015,
        "decision_time": t,
        "source": f"cam-{i % 3}",
        "line": "line-1",
        "model_name": "defects",
        "model_version": "1.2.0",
        "bundle_digest": "sha256:" + "ab" * 32,
        "backend": "onnxruntime:CPUExecutionProvider",
        "config_hash": "cfg-0001",
        "input_digest": f"in-{i:08d}",
        "outputs": {"label": "ok", "score": 0.25, "n": i},
        "outcome": "pass",
        "thresholds": {"reject": 0.8, "review": 0.5},
        "latencies_ms": {"infer": 4.5, "post": 0.5},
    }
    values.update(fields)
    return DecisionRecord(**values)


def main(argv: list[str]) -> int:
    state_dir = Path(argv[1])
    max_s = float(argv[2]) if len(argv) > 2 else 30.0
    config = DecisionLogConfig(batch_size=64, flush_interval_s=0.02, queue_bound=5_000)
    image = np.full((48, 64, 3), 128, np.uint8)
    log = DecisionLog(state_dir, config, device_id="crash-driver")
    log.open()
    print("open", flush=True)
    end = time.monotonic() + max_s
    i = 0
    while time.monotonic() < end:
        t = time.time()
        if i % 5 == 0:
            record = make_record(i, t, outcome="reject", thumbnail=image.copy())
        else:
            record = make_record(i, t)
        log.append(record)
        i += 1
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
