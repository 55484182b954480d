"""Writes records into an outbox until killed, for the outbox's crash and disk-full tests.

Usage: python tests/agent/uplink/outbox_driver.py PATH COUNT [--fsize BYTES] [--max-bytes N]

Prints "put SEQ" after each record is committed (so the test knows what must survive),
"dropped" for a record the outbox had to drop, and "done" at the end. ``--fsize`` sets
RLIMIT_FSIZE with SIGXFSZ ignored, so a write past it fails with EFBIG: a full disk.
"""

from __future__ import annotations

import argparse
import resource
import signal
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from agent.uplink.outbox import Outbox


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", type=Path)
    parser.add_argument("count", type=int)
    parser.add_argument("--fsize", type=int)
    parser.add_argument("--max-bytes", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--reserve", type=int, default=64 * 1024)
    args = parser.parse_args(argv[1:])
    outbox = Outbox(args.path, args.max_bytes, disk_reserve_bytes=args.reserve).open()
    if args.fsize:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize, args.fsize))
    kinds = ("health", "event", "decisions")
    for i in range(args.count):
        kind = kinds[i % 3]
        ids = [f"d{i}"] if kind == "decisions" else []
        seq = outbox.put(kind, f"t/{kind}", b"x" * 2000 + str(i).encode(), ids)
        print("dropped" if seq is None else f"put {seq}", flush=True)
    print(f"done {outbox.stats()['dropped']}", flush=True)
    outbox.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
