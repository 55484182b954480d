"""One install (or rollback by hand) in a process of its own, for the power-loss and
disk-full tests.

usage: install_driver.py STATE_DIR (--bundle DIR [--shadow] | --rollback NAME)
                         [--window S] [--probe default|errors] [--fsize BYTES]

``EDGEFLEET_TEST_CRASH_AT=<checkpoint>``: the process SIGKILLs itself the first time the
installer reaches that point (agent.installer.CHECKPOINTS) - a power cut there.
``--fsize``: RLIMIT_FSIZE for this process, with SIGXFSZ ignored, so a larger write
fails with EFBIG from the kernel.

stdout, one line each: ``checkpoint <name>`` as reached, ``report <json>`` per report,
then ``result <json>`` (exit 0) or ``error <json>`` (exit 3).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
from pathlib import Path


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from agent.installer import Installer, InstallerConfig, InstallError

    parser = argparse.ArgumentParser()
    parser.add_argument("state_dir")
    parser.add_argument("--bundle")
    parser.add_argument("--rollback")
    parser.add_argument("--shadow", action="store_true", help="install into the shadow slot")
    parser.add_argument("--window", type=float, default=0.3)
    parser.add_argument("--probe", choices=["default", "errors"], default="default")
    parser.add_argument("--fsize", type=int, default=0)
    args = parser.parse_args()
    if args.fsize:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize, args.fsize))
    crash_at = os.environ.get("EDGEFLEET_TEST_CRASH_AT", "")

    def checkpoint(point: str) -> None:
        print(f"checkpoint {point}", flush=True)
        if point == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def report(r: dict[str, object]) -> None:
        print(f"report {json.dumps(r)}", flush=True)

    calls = [0]

    def errors_probe() -> dict[str, float]:
        calls[0] += 1
        return {"worker_crashes": 0, "inference_errors": calls[0], "p95_ms": 1.0}

    installer = Installer(
        Path(args.state_dir),
        profile_name="x86-gateway",
        on_report=report,
        config=InstallerConfig(benchmark_runs=10, health_window_s=args.window, health_poll_s=0.1),
        checkpoint=checkpoint,
    )
    try:
        if args.rollback:
            result = installer.rollback(args.rollback)
        elif args.shadow:
            result = installer.install_shadow(Path(args.bundle), source="test")
        else:
            probe = errors_probe if args.probe == "errors" else None
            result = installer.install(Path(args.bundle), source="test", health_probe=probe)
    except InstallError as exc:
        print(f"error {json.dumps({'step': exc.step, 'reason': exc.reason})}", flush=True)
        return 3
    print(f"result {json.dumps(result.as_dict(), default=str)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
