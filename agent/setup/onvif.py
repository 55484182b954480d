"""``edge-agent setup --camera onvif:CAMERA``: a camera chosen by what WS-Discovery found.

``CAMERA`` is the camera's endpoint reference (``urn:uuid:...``, or the uuid alone) or the
address it answers on: the host of one of its XAddrs or the address its ProbeMatch came
from (``192.168.1.64``, ``fe80::1%eth0``, ``2001:db8::64``). One probe (bounded by
``--discover-timeout``) serves every ``onvif:`` camera given; the camera's profiles are then
read with ``--camera-user`` and the password named by ``--camera-password-env``.

The written camera is ``kind = "rtsp"`` with the highest-resolution profile's RTSP URI as
``uri`` and, when a profile of lower resolution has one, the lowest's as ``detect_uri`` (the
agent decodes the sub-stream); ``username`` and ``password_env`` name the credentials, the
password itself is never written. A camera not found, or whose profiles can't be read, is a
:class:`~agent.setup.errors.SetupError` naming it and the reason, before anything is written.
"""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.discovery import onvif, report
from agent.discovery.errors import DiscoveryError, ProbeNotSent
from agent.kernel.secrets import credential_file, read_secret
from agent.setup.errors import SetupError
from agent.setup.writer import CameraEntry

PREFIX = "onvif:"
DEFAULT_TIMEOUT_S = 3.0
HTTP_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Discovery:
    """How setup looks for ONVIF cameras and logs in to them."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    interface: str | None = None
    ip: str = "both"
    user: str = ""
    password_env: str = ""
    credentials_dir: Path | None = None


def credentials(d: Discovery) -> onvif.Credentials | None:
    """The ONVIF credentials: ``user`` with the secret named ``password_env``, read from
    ``$CREDENTIALS_DIRECTORY``, the environment, or the agent's credentials directory.

    Raises:
        SetupError: a user without ``--camera-password-env``, or a secret that is not set.
    """
    if not d.user:
        return None
    if not d.password_env:
        raise SetupError("--camera-user", "needs --camera-password-env VAR (the password's name)")
    password = read_secret(d.password_env)
    if password is None and d.credentials_dir is not None:
        path = credential_file(d.credentials_dir, d.password_env)
        password = path.read_text(encoding="utf-8").strip() if path else None
    if not password:
        where = f"${d.password_env}, $CREDENTIALS_DIRECTORY/{d.password_env}"
        if d.credentials_dir is not None:
            where += f" or {d.credentials_dir / d.password_env}"
        raise SetupError(f"--camera-password-env {d.password_env}", f"not set (looked in {where})")
    return onvif.Credentials(d.user, password)


def discover(
    d: Discovery, v4l2: bool = True, *, unsent_ok: bool = False, **paths: Any
) -> dict[str, Any]:
    """What ``edge-agent cameras`` reports, bounded by ``d.timeout_s`` (plus the profile
    reads, each bounded by HTTP_TIMEOUT_S). With ``unsent_ok``, a probe that could not
    leave (no route to either group: a network without a default route) is no error: the
    local cameras are listed, ``probe`` is None and ``skipped`` says why.

    Raises:
        SetupError: credentials missing (see :func:`credentials`), or the probe can't be
            sent (a network interface that does not exist, no route to either group).
    """
    creds = credentials(d)
    try:
        found = report.discover(
            timeout_s=d.timeout_s,
            interface=d.interface,
            ip=d.ip,
            creds=creds,
            http_timeout_s=HTTP_TIMEOUT_S,
            **paths,
        )
    except ProbeNotSent as exc:
        if not unsent_ok:
            raise SetupError("camera discovery", exc.reason) from None
        found = report.discover(network=False, **paths)
        found["skipped"] = f"no probe could be sent: {exc.reason}"
    except DiscoveryError as exc:
        raise SetupError("camera discovery", exc.reason) from None
    if not v4l2:
        found["v4l2"] = []
    return found


def _host(value: str) -> str:
    """An address in comparable form: no brackets, lower case, the zone kept."""
    value = value.strip().lower().removeprefix("[").removesuffix("]").replace("%25", "%")
    address, _, zone = value.partition("%")
    with contextlib.suppress(ValueError):  # a host name stays as it is
        address = str(ipaddress.ip_address(address))
    return f"{address}%{zone}" if zone else address


def matches(ref: str, cam: dict[str, Any]) -> bool:
    """Whether ``onvif:ref`` names this discovered camera (endpoint or an address of it;
    an address given without a zone matches that address on any link)."""
    endpoint = cam["endpoint"].lower()
    if ref.lower() in (endpoint, endpoint.removeprefix("urn:uuid:")):
        return True
    want = _host(ref)
    hosts = [_host(urlsplit(x).netloc.rpartition("@")[2].rsplit(":", 1)[0]) for x in cam["xaddrs"]]
    hosts.append(_host(cam["sender"].rsplit(":", 1)[0]))
    if "%" not in want:
        hosts = [h.partition("%")[0] for h in hosts]
    return want in hosts


def _area(p: dict[str, Any]) -> int:
    return int(p["width"]) * int(p["height"])


def streams(cam: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The main stream (highest resolution with an RTSP URI) and the detect sub-stream
    (lowest resolution, when lower than the main's), or ValueError with the reason."""
    if cam["error"]:
        raise ValueError(f"profiles not read ({cam['error']})")
    usable = [p for p in cam["profiles"] if p["uri"]]
    if not usable:
        why = "; ".join(f"{p['token']}: {p['uri_error']}" for p in cam["profiles"][:4])
        raise ValueError(f"no profile with an RTSP URI ({why or 'no profiles'})")
    ranked = sorted(usable, key=_area)
    main, low = ranked[-1], ranked[0]
    return main, (low if _area(low) < _area(main) and low["uri"] != main["uri"] else None)


def _describe(p: dict[str, Any]) -> str:
    return f"{p['name'] or p['token']} {p['encoding'] or '?'} {p['width']}x{p['height']}"


def entries(refs: list[tuple[str, str]], d: Discovery) -> dict[str, CameraEntry]:
    """The config entry of each ``(name, "onvif:REF")``, keyed by name; one probe for all.

    Raises:
        SetupError: a camera not found or whose streams can't be read, named with why.
    """
    found = discover(d, v4l2=False, network=True)
    seen = [c["endpoint"] or c["sender"] for c in found["onvif"]]
    out = {}
    for name, value in refs:
        ref = value[len(PREFIX) :].strip()
        what = f"--camera {value}"
        if not ref:
            raise SetupError(what, "give the camera's endpoint (urn:uuid:...) or address")
        hits = [c for c in found["onvif"] if matches(ref, c)]
        if not hits:
            answered = ", ".join(seen[:8]) or "no camera answered"
            raise SetupError(what, f"not found by WS-Discovery in {d.timeout_s:g} s ({answered})")
        if len(hits) > 1:
            ids = ", ".join(c["endpoint"] for c in hits[:8])
            raise SetupError(what, f"names {len(hits)} cameras ({ids}); give the endpoint")
        cam = hits[0]
        try:
            main, low = streams(cam)
        except ValueError as exc:
            raise SetupError(what, f"{cam['endpoint'] or cam['sender']}: {exc}") from None
        label = " ".join(x for x in (cam["name"], cam["hardware"]) if x) or "ONVIF camera"
        note = f"ONVIF {label} {cam['endpoint']}; uri: {_describe(main)}"
        if low is not None:
            note += f"; detect_uri: {_describe(low)}"
        out[name] = CameraEntry(
            name,
            "rtsp",
            main["uri"],
            note=note,
            detect_uri=low["uri"] if low else "",
            username=d.user,
            password_env=d.password_env if d.user else "",
        )
    return out
