"""``edge-agent setup``: a fresh install made a configured device in one command.

Examples::

    edge-agent setup --list-cameras
    edge-agent setup --camera /dev/video0 --bundle /media/usb/cls
    printf '%s\\n' "$TOKEN" | edge-agent setup --camera /dev/video0 --bundle /media/usb/cls \\
        --fleet https://fleet.example:8080 --token -

The library (:mod:`agent.setup.device`) raises; this module prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.setup import dropin
from agent.setup.cameras import DEV_DIR, SYSFS_ROOT, format_cameras, list_cameras

if TYPE_CHECKING:
    from agent.setup.options import SetupReport

EXIT_ERROR = 2
DEFAULT_CONFIG = "/etc/edgefleet/agent.toml"
DEFAULT_STATE_DIR = "/var/lib/edgefleet/agent"
DEFAULT_CREDENTIALS = "/etc/edgefleet/credentials/agent"
DEFAULT_HTTP_PORT = 9464
FROM_STDIN = "-"
_MAX_TOKEN = 4096

EPILOG = """examples:
  edge-agent setup --list-cameras
  edge-agent setup --camera /dev/video0 --bundle /media/usb/cls
  edge-agent setup --camera rtsp://10.0.0.21/stream1 --profile jetson-orin --bundle b/cls
  CAM_PASSWORD=... edge-agent setup --list-cameras --camera-user admin \
      --camera-password-env CAM_PASSWORD
  CAM_PASSWORD=... edge-agent setup --camera onvif:192.168.1.64 --camera-user admin \
      --camera-password-env CAM_PASSWORD --bundle /media/usb/cls
  edge-agent setup --camera test --bundle bundles/cls --config a.toml --state-dir state \\
      --credentials-dir creds --systemd-dropin-dir '' --force
  printf '%s\\n' "$TOKEN" | edge-agent setup --camera /dev/video0 --bundle /media/usb/cls \\
      --fleet http://fleet.example:8080 --token -
  edge-agent setup --force --camera rtsp://10.0.0.22/stream1   # another camera, all else kept
  edge-agent setup --camera genicam:40012345 --bundle /media/usb/cls   # a GigE Vision camera

--camera takes a V4L2 device (/dev/video0, or 0), an rtsp:// or http:// (MJPEG) URL, an
ONVIF camera found by WS-Discovery (onvif:ADDRESS or onvif:urn:uuid:ENDPOINT, as
--list-cameras shows them: its best profile becomes uri, its lowest detect_uri), a GenICam
camera (genicam:SERIAL, or its Aravis id or address), a video
file, a directory of images, or `test` (a generated pattern); without it, every V4L2
capture device found. The camera password is never written: --camera-password-env names
the secret (environment variable, or a file of that name in the credentials directory).
--bundle is copied into the state directory and run by one
pipeline per camera; a signed bundle of the same name from the fleet or a side-load takes
over. An existing config is refused without --force; with it, setup writes the files
again and keeps what no option changes: --camera replaces the cameras (setup's own
pipelines follow them), --bundle the pipelines, --fleet enables [uplink] and [bundles];
every other section and key stays (the report names them), and an enrollment with the
same fleet and device id is kept: --fleet URL alone needs no new token. Where a kept
pipeline would lose its camera, setup refuses and changes nothing.
"""


def add_parser(sub: Any) -> None:
    """Add ``setup`` to ``edge-agent``'s subcommands."""
    p = sub.add_parser(
        "setup",
        help="configure this device: profile, cameras, config, enrollment, systemd limits",
        description="Turn a fresh install into a configured device: choose the firmware "
        "profile, find the cameras, write the config (0640) and the service's resource "
        "drop-in, enroll with the fleet, and check the result.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"(default {DEFAULT_CONFIG})")
    p.add_argument(
        "--state-dir",
        help=f"(default: the existing config's, else {DEFAULT_STATE_DIR})",
    )
    p.add_argument(
        "--profile",
        help="firmware profile name or TOML path (default: the existing config's, else auto)",
    )
    p.add_argument(
        "--camera",
        action="append",
        default=[],
        metavar="DEVICE_OR_URL",
        help="a camera (repeat for more); default: every V4L2 capture device found",
    )
    p.add_argument("--bundle", metavar="DIR", help="a bundle directory for the pipelines")
    p.add_argument(
        "--fleet",
        metavar="URL",
        help="enroll with this fleet server (an enrollment with it is kept, no --token)",
    )
    p.add_argument("--token", help="the one-time enrollment token, or - to read stdin")
    p.add_argument(
        "--device-id", help="this device's id (default: the existing config's, else the host name)"
    )
    p.add_argument(
        "--http-port",
        type=int,
        help=f"local /healthz and /metrics port (default: the existing config's, else "
        f"{DEFAULT_HTTP_PORT})",
    )
    p.add_argument(
        "--credentials-dir",
        default=DEFAULT_CREDENTIALS,
        help=f"secrets' directory, made 0700 (default {DEFAULT_CREDENTIALS})",
    )
    p.add_argument(
        "--systemd-dropin-dir",
        default=str(dropin.DEFAULT_DIR),
        help=f"where {dropin.FILE_NAME} goes; '' for none (default {dropin.DEFAULT_DIR})",
    )
    p.add_argument(
        "--owner", help="the service's user (default: edgefleet if it exists, else yours)"
    )
    p.add_argument(
        "--list-cameras",
        action="store_true",
        help="only list the cameras: V4L2 devices and ONVIF cameras (WS-Discovery)",
    )
    p.add_argument("--camera-user", default="", help="the cameras' user (ONVIF and RTSP)")
    p.add_argument(
        "--camera-password-env",
        default="",
        metavar="VAR",
        help="the secret holding --camera-user's password (environment variable or "
        "credentials file); written as password_env, the password never is",
    )
    p.add_argument(
        "--discover-timeout",
        type=float,
        default=3.0,
        metavar="S",
        help="seconds to wait for WS-Discovery replies (default 3)",
    )
    p.add_argument(
        "--no-discover", action="store_true", help="--list-cameras: do not probe the network"
    )
    p.add_argument("--discover-interface", help="probe out of this interface only (e.g. eth1)")
    p.add_argument(
        "--discover-ip",
        choices=("4", "6", "both"),
        default="both",
        help="WS-Discovery over IPv4, IPv6 or both at once (default)",
    )
    p.add_argument(
        "--sysfs-root", default=str(SYSFS_ROOT), help=f"the sysfs to list (default {SYSFS_ROOT})"
    )
    p.add_argument(
        "--dev-dir", default=str(DEV_DIR), help=f"where device nodes are (default {DEV_DIR})"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write over an existing config, keeping what no option changes",
    )
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.set_defaults(func=cmd_setup)


def _token_reader(token: str | None) -> Callable[[], str]:
    def read() -> str:
        if token is None:
            return ""
        if token == FROM_STDIN:
            return sys.stdin.readline(_MAX_TOKEN).strip()
        return token

    return read


def _print_report(report: SetupReport) -> None:
    print(f"profile {report.profile} ({report.profile_reason})")
    if not report.cameras:
        print("cameras: none configured (no cameras found; give --camera)")
    for cam in report.cameras:
        print(f"camera {cam['name']}: {cam['kind']} {cam['uri']}".rstrip())
    for line in report.done:
        print(line)
    if report.enrolled:
        e = report.enrolled
        print(
            f"fleet {e['server']}: broker {e['broker']}, certificate until {e['certificate_until']}"
        )
    for warning in report.warnings:
        print(f"edge-agent: setup: warning: {warning}", file=sys.stderr)
    for problem in report.problems:
        print(f"edge-agent: setup: {problem}", file=sys.stderr)
    if not report.problems:
        print(f"check-config: {report.config}: ok")
    for step in report.next_steps:
        print(f"next: {step}")


def _list_cameras(args: argparse.Namespace, sysfs: Path, dev: Path) -> int:
    """V4L2 devices and, unless --no-discover, ONVIF cameras with their RTSP profiles."""
    if args.no_discover:
        found: dict[str, Any] = {
            "v4l2": [c.to_dict() for c in list_cameras(sysfs, dev)],
            "onvif": [],
            "probe": None,
        }
    else:
        from agent.discovery.report import format_report  # noqa: PLC0415
        from agent.setup import onvif  # noqa: PLC0415 - discovery only when asked for

        d = onvif.Discovery(
            args.discover_timeout,
            args.discover_interface,
            args.discover_ip,
            args.camera_user,
            args.camera_password_env,
            Path(args.credentials_dir),
        )
        found = onvif.discover(d, sysfs_root=sysfs, dev_dir=dev, unsent_ok=True)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if args.no_discover:
        sys.stdout.write(format_cameras(list_cameras(sysfs, dev)))
        print("ONVIF cameras: not probed (--no-discover)")
        return 0
    if "skipped" in found:
        print(
            f"edge-agent: setup: warning: camera discovery skipped: {found['skipped']}",
            file=sys.stderr,
        )
        sys.stdout.write(format_report(found, not_probed=f"discovery skipped, {found['skipped']}"))
        return 0
    sys.stdout.write(format_report(found))
    for cam in found["onvif"]:
        print(f"choose: --camera onvif:{cam['endpoint'] or cam['sender']}")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    sysfs, dev = Path(args.sysfs_root), Path(args.dev_dir)
    if args.list_cameras:
        return _list_cameras(args, sysfs, dev)
    from agent.setup.device import setup_device  # noqa: PLC0415 - keep edge-agent light
    from agent.setup.options import SetupOptions  # noqa: PLC0415 - keep edge-agent light

    if args.token is not None and args.fleet is None:
        print(
            "edge-agent: setup: --token needs --fleet (the server it enrolls with)", file=sys.stderr
        )
        return EXIT_ERROR
    given = {"state_dir": args.state_dir, "profile": args.profile, "http_port": args.http_port}
    opts = SetupOptions(
        config=Path(args.config),
        state_dir=Path(args.state_dir or DEFAULT_STATE_DIR).absolute(),
        profile=args.profile or "auto",
        cameras=tuple(args.camera),
        bundle=Path(args.bundle) if args.bundle else None,
        fleet=args.fleet,
        credentials_dir=Path(args.credentials_dir),
        dropin_dir=Path(args.systemd_dropin_dir) if args.systemd_dropin_dir else None,
        device_id=args.device_id,
        http_port=DEFAULT_HTTP_PORT if args.http_port is None else args.http_port,
        owner=args.owner,
        force=args.force,
        sysfs_root=sysfs,
        dev_dir=dev,
        camera_user=args.camera_user,
        camera_password_env=args.camera_password_env,
        discover_timeout_s=args.discover_timeout,
        discover_interface=args.discover_interface,
        discover_ip=args.discover_ip,
        given=frozenset(k for k, v in given.items() if v is not None),
    )
    report = setup_device(opts, _token_reader(args.token))
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        _print_report(report)
    return EXIT_ERROR if report.problems else 0
