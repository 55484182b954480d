"""The ONVIF media calls discovery needs, as SOAP 1.2 over HTTP: GetCapabilities (where the
media service is), GetProfiles and GetStreamUri (RTP-Unicast over RTSP) for each profile.

With credentials every request carries a WS-UsernameToken with PasswordDigest
(``Base64(SHA-1(nonce + created + password))``, the ONVIF Core spec's scheme); the password
never goes on the wire. Every request has a deadline for the whole exchange (connect,
headers and body: a camera that trickles its answer a byte at a time is cut off there, its
socket shut down) and a response size cap, and responses are parsed by
:mod:`agent.discovery.xmlsafe`. A camera that can't be read is reported with
the reason, never raised. A link-local IPv6 address the camera names without a zone (its
media service, its RTSP URIs) gets the zone of the device service's address.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit
from xml.etree.ElementTree import Element
from xml.sax.saxutils import escape

from agent.discovery import xmlsafe
from agent.discovery.errors import UntrustedXMLError
from agent.discovery.linklocal import with_zone, zone

NS_SOAP = "http://www.w3.org/2003/05/soap-envelope"
NS_DEVICE = "http://www.onvif.org/ver10/device/wsdl"
NS_MEDIA = "http://www.onvif.org/ver10/media/wsdl"
NS_SCHEMA = "http://www.onvif.org/ver10/schema"
NS_WSSE = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd"
NS_WSU = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
DIGEST_TYPE_URI = (
    "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0"
    "#PasswordDigest"
)
BASE64_BINARY = (
    "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-soap-message-security-1.0#Base64Binary"
)
MAX_RESPONSE_BYTES = 1024 * 1024
MAX_PROFILES = 32


class OnvifCallError(Exception):
    """One SOAP call failed; ``reason`` is short and shown to the user."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Credentials:
    """A camera user and its password (from the environment, never the command line)."""

    username: str
    password: str = field(repr=False)


@dataclass
class Profile:
    """One media profile: its token, name, video encoding and size, and RTSP URI ("" with
    ``uri_error`` when GetStreamUri failed for it)."""

    token: str
    name: str
    encoding: str = ""
    width: int = 0
    height: int = 0
    uri: str = ""
    uri_error: str = ""


@dataclass
class CameraProfiles:
    """What the camera's media service said: profiles, or why they were not read."""

    media_xaddr: str = ""
    profiles: list[Profile] = field(default_factory=list)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields."""
        return asdict(self)


def username_token(creds: Credentials, nonce: bytes, created: str) -> str:
    """The ``wsse:Security`` header for ``creds`` with this nonce and creation time."""
    digest = hashlib.sha1(nonce + created.encode() + creds.password.encode()).digest()  # noqa: S324 - the spec's digest
    return (
        f'<wsse:Security xmlns:wsse="{NS_WSSE}" xmlns:wsu="{NS_WSU}" s:mustUnderstand="1">'
        f"<wsse:UsernameToken><wsse:Username>{escape(creds.username)}</wsse:Username>"
        f'<wsse:Password Type="{DIGEST_TYPE_URI}">{base64.b64encode(digest).decode()}'
        f"</wsse:Password>"
        f'<wsse:Nonce EncodingType="{BASE64_BINARY}">{base64.b64encode(nonce).decode()}'
        f"</wsse:Nonce><wsu:Created>{created}</wsu:Created></wsse:UsernameToken>"
        "</wsse:Security>"
    )


def envelope(body: str, creds: Credentials | None) -> bytes:
    """A SOAP 1.2 envelope around ``body``, with a UsernameToken when ``creds`` is given."""
    header = ""
    if creds is not None:
        created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        header = f"<s:Header>{username_token(creds, os.urandom(16), created)}</s:Header>"
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="{NS_SOAP}" '
        f'xmlns:tds="{NS_DEVICE}" xmlns:trt="{NS_MEDIA}" xmlns:tt="{NS_SCHEMA}">'
        f"{header}<s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


class _Deadline:
    """Shuts down the sockets it watches when ``seconds`` have passed: the one bound on a
    whole HTTP exchange (a socket timeout bounds each read, not a trickle of them)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = max(0.0, seconds)
        self.fired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(self.seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
            fired = self.fired
        if fired:
            _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: nothing left to cut
        sock.shutdown(socket.SHUT_RDWR)


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """An opener whose connections are watched by ``deadline``."""

    class Http(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            deadline.watch(self.sock)

    class Https(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            deadline.watch(self.sock)

    class HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Http, req)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Https, req, context=getattr(self, "_context", None))

    return urllib.request.build_opener(HttpHandler(), HttpsHandler())


def _post(req: urllib.request.Request, timeout_s: float) -> tuple[int, bytes]:
    """Status and body of ``req``, the whole exchange within ``timeout_s``.

    Raises:
        OnvifCallError: unreachable, too slow, or 401.
    """
    deadline = _Deadline(timeout_s)
    status = 200
    try:
        with _opener(deadline).open(req, timeout=max(timeout_s, 0.001)) as resp:
            data = resp.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            data = exc.read(MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException):
            data = b""
        finally:
            exc.close()
        if status == 401 and not deadline.fired:
            raise OnvifCallError("unauthorized") from exc
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        if deadline.fired:
            raise OnvifCallError(f"timed out: no whole answer in {timeout_s:g} s") from exc
        reason = getattr(exc, "reason", exc)
        raise OnvifCallError(f"unreachable: {reason}") from exc
    finally:
        deadline.cancel()
    if deadline.fired:  # what was read before the cut is not the answer
        raise OnvifCallError(f"timed out: no whole answer in {timeout_s:g} s")
    return status, data


def call(url: str, body: str, creds: Credentials | None, timeout_s: float) -> Element:
    """POST ``body`` to ``url`` and return the response's SOAP Body; the whole exchange
    within ``timeout_s``.

    Raises:
        OnvifCallError: not http(s), unreachable, too slow, an HTTP error or a SOAP fault
            ("unauthorized" for 401 or a NotAuthorized fault), or a response that is not
            SOAP this module accepts.
    """
    if urlsplit(url).scheme not in ("http", "https"):
        raise OnvifCallError(f"not an http(s) address: {url[:100]}")
    req = urllib.request.Request(  # noqa: S310 - scheme checked above
        url,
        data=envelope(body, creds),
        headers={"Content-Type": "application/soap+xml; charset=utf-8"},
        method="POST",
    )
    status, data = _post(req, timeout_s)
    try:
        root = xmlsafe.parse(data, MAX_RESPONSE_BYTES)
    except UntrustedXMLError as exc:
        raise OnvifCallError(f"HTTP {status}, {exc.reason}") from exc
    soap_body = xmlsafe.child(root, "Body")
    if soap_body is None:
        raise OnvifCallError(f"HTTP {status}, not a SOAP envelope")
    fault = xmlsafe.child(soap_body, "Fault")
    if fault is not None:
        codes = " ".join(xmlsafe.text(v) for v in xmlsafe.descendants(fault, "Value"))
        if "NotAuthorized" in codes:
            raise OnvifCallError("unauthorized")
        reason = xmlsafe.text(xmlsafe.child(fault, "Reason", "Text"), 200)
        raise OnvifCallError(f"SOAP fault {codes or '?'}: {reason}".strip())
    if status != 200:
        raise OnvifCallError(f"HTTP {status}")
    return soap_body


def media_xaddr(device_xaddr: str, creds: Credentials | None, timeout_s: float) -> str:
    """The media service's address from GetCapabilities; the device service's own address
    when the camera names none (many answer media calls there).

    Raises:
        OnvifCallError: the call failed (see :func:`call`).
    """
    body = call(
        device_xaddr,
        "<tds:GetCapabilities><tds:Category>Media</tds:Category></tds:GetCapabilities>",
        creds,
        timeout_s,
    )
    media = xmlsafe.child(body, "GetCapabilitiesResponse", "Capabilities", "Media", "XAddr")
    return with_zone(xmlsafe.text(media), zone(device_xaddr)) or device_xaddr


def parse_profiles(body: Element) -> list[Profile]:
    """The profiles of a GetProfilesResponse body (at most MAX_PROFILES)."""
    out = []
    for p in xmlsafe.descendants(body, "Profiles")[:MAX_PROFILES]:
        vec = xmlsafe.child(p, "VideoEncoderConfiguration")
        width = height = 0
        encoding = ""
        if vec is not None:
            encoding = xmlsafe.text(xmlsafe.child(vec, "Encoding"), 32)
            width = _int(xmlsafe.text(xmlsafe.child(vec, "Resolution", "Width"), 8))
            height = _int(xmlsafe.text(xmlsafe.child(vec, "Resolution", "Height"), 8))
        out.append(
            Profile(
                token=p.get("token", "")[:128],
                name=xmlsafe.text(xmlsafe.child(p, "Name"), 128),
                encoding=encoding,
                width=width,
                height=height,
            )
        )
    return out


def _int(s: str) -> int:
    return int(s) if s.isdigit() else 0


def stream_uri_body(token: str) -> str:
    """The GetStreamUri request body for RTP-Unicast over RTSP of profile ``token``."""
    return (
        "<trt:GetStreamUri><trt:StreamSetup><tt:Stream>RTP-Unicast</tt:Stream>"
        "<tt:Transport><tt:Protocol>RTSP</tt:Protocol></tt:Transport></trt:StreamSetup>"
        f"<trt:ProfileToken>{escape(token)}</trt:ProfileToken></trt:GetStreamUri>"
    )


BUDGET_SPENT = "not asked (time budget spent)"


def read_profiles(
    device_xaddr: str,
    creds: Credentials | None,
    timeout_s: float,
    budget_s: float,
    deadline: float | None = None,
) -> CameraProfiles:
    """Profiles and RTSP URIs of the camera at ``device_xaddr``; each request's whole
    exchange bounded by ``timeout_s``, and all of them by ``budget_s`` from now and the
    monotonic ``deadline`` (a request is cut at it; none starts after it). Never raises:
    what failed is in ``error`` (for the camera) or a profile's ``uri_error``."""
    end = time.monotonic() + budget_s
    if deadline is not None:
        end = min(end, deadline)

    def left() -> float:
        """What a call may take now. Raises OnvifCallError: the budget is spent."""
        seconds = min(timeout_s, end - time.monotonic())
        if seconds <= 0:
            raise OnvifCallError(BUDGET_SPENT)
        return seconds

    out = CameraProfiles()
    try:
        out.media_xaddr = media_xaddr(device_xaddr, creds, left())
        body = call(out.media_xaddr, "<trt:GetProfiles/>", creds, left())
        out.profiles = parse_profiles(body)
    except OnvifCallError as exc:
        out.error = exc.reason
        return out
    for p in out.profiles:
        try:
            body = call(out.media_xaddr, stream_uri_body(p.token), creds, left())
        except OnvifCallError as exc:
            p.uri_error = exc.reason
            continue
        uris = xmlsafe.descendants(body, "Uri")
        uri = xmlsafe.text(uris[0] if uris else None)
        if uri.startswith(("rtsp://", "rtsps://")):
            p.uri = with_zone(uri, zone(device_xaddr))
        else:
            p.uri_error = f"not an rtsp:// URI: {uri[:100]!r}"
    return out
