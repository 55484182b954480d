"""``edge-agent cameras``: what cameras this device can see (V4L2 devices, GenICam cameras
through Aravis, and ONVIF cameras on the local link with their RTSP profiles).

The library (:mod:`agent.discovery.report`) does the work; this module parses the
command line and prints. Discovery is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXIT_ERROR = 2


def add_parser(sub: Any) -> None:
    """Add ``cameras`` to ``edge-agent``'s subcommands."""
    cams = sub.add_parser(
        "cameras",
        help="list the cameras this device can see: V4L2 devices, GenICam cameras (GigE "
        "Vision by broadcast, USB3 Vision) and ONVIF cameras on the "
        "local link (WS-Discovery, TTL 1) with their RTSP profiles",
        epilog="examples:\n  edge-agent cameras\n"
        "  CAM_PASSWORD=... edge-agent cameras --interface eth1 --user admin --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cams.add_argument(
        "--timeout", type=float, default=3.0, help="seconds to wait for WS-Discovery replies"
    )
    cams.add_argument("--interface", help="send the probe out of this interface only (e.g. eth1)")
    cams.add_argument(
        "--ip",
        choices=("4", "6", "both"),
        default="both",
        help="probe 239.255.255.250 (4), ff02::c on each link (6) or both at once (default)",
    )
    cams.add_argument("--user", help="ONVIF user for GetProfiles/GetStreamUri")
    cams.add_argument(
        "--password-env",
        default="CAM_PASSWORD",
        help="environment variable holding --user's password (default CAM_PASSWORD)",
    )
    cams.add_argument(
        "--http-timeout", type=float, default=3.0, help="seconds per ONVIF HTTP request"
    )
    cams.add_argument("--no-network", action="store_true", help="V4L2 only; send nothing")
    cams.add_argument("--json", action="store_true", help="print JSON")
    cams.set_defaults(func=cmd_cameras)


def cmd_cameras(args: argparse.Namespace) -> int:
    from agent.discovery import onvif, report  # noqa: PLC0415 - keep other commands light

    creds = None
    if args.user:
        password = os.environ.get(args.password_env, "")
        if not password:
            print(
                f"edge-agent: cameras: --user needs the password in ${args.password_env}",
                file=sys.stderr,
            )
            return EXIT_ERROR
        creds = onvif.Credentials(args.user, password)
    found = report.discover(
        timeout_s=args.timeout,
        interface=args.interface,
        ip=args.ip,
        creds=creds,
        http_timeout_s=args.http_timeout,
        network=not args.no_network,
    )
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        sys.stdout.write(report.format_report(found))
    return 0
