"""``edge-agent cameras``: the V4L2 devices and the ONVIF cameras on the local link, as a
dict for ``--json`` or a table for a terminal."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.discovery import genicam, onvif, safetext, wsdiscovery
from agent.setup import cameras as v4l2

log = logging.getLogger(__name__)

MAX_PARALLEL = 8
"""Cameras asked for their profiles at the same time."""
CAMERA_TEXT_CHARS = 8192
"""Longest string of a camera's answers kept (XAddrs and scopes lists are cut at it)."""
PROFILE_BUDGET_CALLS = 4
"""Reading the cameras' profiles takes at most this many ``http_timeout_s`` in all."""


def discover(
    *,
    timeout_s: float = 3.0,
    interface: str | None = None,
    ip: str = "both",
    creds: onvif.Credentials | None = None,
    http_timeout_s: float = 3.0,
    network: bool = True,
    sysfs_root: Path = v4l2.SYSFS_ROOT,
    dev_dir: Path = v4l2.DEV_DIR,
) -> dict[str, Any]:
    """Everything ``edge-agent cameras`` reports, as JSON-able data.

    Raises:
        DiscoveryError: the probe can't be sent (see :func:`wsdiscovery.probe`).
    """
    report: dict[str, Any] = {
        "v4l2": safetext.cleaned([c.to_dict() for c in v4l2.list_cameras(sysfs_root, dev_dir)]),
        "onvif": [],
        "probe": None,
    }
    if not network:  # GigE Vision discovery is a broadcast: not without the network
        return report
    with ThreadPoolExecutor(1) as gige:  # GigE Vision discovery while WS-Discovery waits
        found_genicam = gige.submit(genicam.listing)
        try:
            result = wsdiscovery.probe(timeout_s, interface, ip=ip)
        finally:
            report["genicam"] = safetext.cleaned(found_genicam.result(), CAMERA_TEXT_CHARS)
    report["probe"] = asdict(result.stats)
    # One deadline for every camera's calls, however many cameras answered and however
    # slowly each trickles its answers: the command ends within it.
    deadline = time.monotonic() + PROFILE_BUDGET_CALLS * http_timeout_s

    def profiles(match: wsdiscovery.ProbeMatch) -> dict[str, Any]:
        if not match.xaddrs:
            return onvif.CameraProfiles(error="no XAddrs in its ProbeMatch").to_dict()
        return onvif.read_profiles(
            match.xaddrs[0],
            creds,
            http_timeout_s,
            budget_s=PROFILE_BUDGET_CALLS * http_timeout_s,
            deadline=deadline,
        ).to_dict()

    if result.matches:
        with ThreadPoolExecutor(min(MAX_PARALLEL, len(result.matches))) as pool:
            read = list(pool.map(profiles, result.matches))
        # what the cameras said, one printable line per string (shown, and written into a
        # config by setup)
        answers = [{**m.to_dict(), **p} for m, p in zip(result.matches, read, strict=True)]
        report["onvif"] = safetext.cleaned(answers, CAMERA_TEXT_CHARS)
    return report


def format_report(report: dict[str, Any], not_probed: str = "--no-network") -> str:
    """The report as lines for a terminal (``not_probed``: the option that skipped the
    probe, named when it was skipped)."""
    lines = ["V4L2 devices:"]
    if not report["v4l2"]:
        lines.append("  no V4L2 devices")
    for cam in report["v4l2"]:
        head = f"  {cam['device']}  {cam['name'] or '?'}"
        if cam["error"]:
            lines.append(f"{head}  ({cam['error']})")
        elif not cam["capture"]:
            lines.append(f"{head}  (not a video capture node: {cam['driver']})")
        else:
            lines.append(f"{head}  [{cam['driver']}, {cam['bus_info']}]")
            for fmt in cam["formats"]:
                sizes = " ".join(fmt["sizes"]) or "sizes not listed"
                lines.append(f"      {fmt['fourcc']:<4} {fmt['description']}: {sizes}")
    stats = report["probe"]
    if stats is None:
        lines.append(f"ONVIF cameras: not probed ({not_probed})")
        lines.append(f"GenICam cameras: not looked for ({not_probed})")
        return "\n".join(lines) + "\n"
    lines += genicam.format_lines(report["genicam"])
    lines += _probe_lines(stats)
    if not report["onvif"]:
        lines.append("  none answered")
    for cam in report["onvif"]:
        label = " ".join(x for x in (cam["name"], cam["hardware"]) if x) or "?"
        lines.append(f"  {label}  {cam['endpoint'] or cam['sender']}")
        lines.append(f"    xaddrs: {' '.join(cam['xaddrs']) or '-'}")
        if cam["error"]:
            lines.append(f"    profiles: not read ({cam['error']})")
            continue
        if not cam["profiles"]:
            lines.append("    profiles: none")
        for p in cam["profiles"]:
            video = f"{p['encoding']} {p['width']}x{p['height']}" if p["encoding"] else "?"
            where = p["uri"] or f"no URI ({p['uri_error']})"
            lines.append(f"    {p['name'] or p['token']} [{video}]: {where}")
    return "\n".join(lines) + "\n"


def _probe_lines(stats: dict[str, Any]) -> list[str]:
    on = f" on {stats['interface']}" if stats["interface"] else ""
    skipped = stats["oversized"] + stats["unparsable"] + stats["unrelated"]
    how = []
    if "ipv4" in stats["families"]:
        how.append(f"IPv4 TTL {stats['ttl']}")
    if "ipv6" in stats["families"]:
        links = ",".join(stats["links6"]) or "no link"
        how.append(f"IPv6 hop limit {stats['hop_limit']} on {links}")
    lines = [
        f"ONVIF cameras (WS-Discovery{on}, {', '.join(how)}, {stats['elapsed_s']:.1f} s, "
        f"{stats['datagrams']} replies, {skipped} skipped):"
    ]
    lines += [f"  ({error})" for error in stats["errors"]]
    return lines
