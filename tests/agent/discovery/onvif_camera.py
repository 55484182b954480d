"""An ONVIF camera on a real link, for tests: two network namespaces the test makes, the
gateway's (interface ``ea``) and the camera's (interface ``eb``), joined by a veth pair
with IPv4 (192.0.2.1 and .2) and IPv6 link-local addresses. In the camera's namespace: a
WS-Discovery responder on 239.255.255.250:3702 and [ff02::c]:3702 (recording the TTL and
hop limit each probe arrived with) and an HTTP server answering GetCapabilities,
GetProfiles and GetStreamUri with canned ONVIF SOAP, WS-UsernameToken checked. The agent's
commands run in the gateway's namespace through ``ip netns exec``."""

from __future__ import annotations

import base64
import ctypes
import hashlib
import http.server
import os
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GROUP, GROUP6, PORT = "239.255.255.250", "ff02::c", 3702
GW4, CAM4 = "192.0.2.1", "192.0.2.2"
CLONE_NEWNET = 0x40000000
USER, PASSWORD = "admin", "s3cret-pw"
ENDPOINT = "urn:uuid:5f0c1e2a-0000-4000-8000-00000000ca01"
IP_RECVTTL = getattr(socket, "IP_RECVTTL", 12)
IPV6_RECVHOPLIMIT = getattr(socket, "IPV6_RECVHOPLIMIT", 51)
IPV6_HOPLIMIT = getattr(socket, "IPV6_HOPLIMIT", 52)
TRICKLE_MAX_BYTES = 600
"""A trickling camera gives up after this many bytes (a test's thread ends)."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=10, capture_output=True)


def in_netns(name: str, make: Callable[[], object]) -> object:
    """Run ``make`` on a thread that entered netns ``name``; sockets it opens stay there."""
    out: dict[str, object] = {}

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                out["error"] = OSError(ctypes.get_errno(), "setns")
                return
        finally:
            os.close(fd)
        try:
            out["value"] = make()
        except Exception as exc:
            out["error"] = exc

    t = threading.Thread(target=enter)
    t.start()
    t.join(10)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


ENV = (
    '<?xml version="1.0" encoding="UTF-8"?><s:Envelope '
    'xmlns:s="http://www.w3.org/2003/05/soap-envelope" '
    'xmlns:tds="http://www.onvif.org/ver10/device/wsdl" '
    'xmlns:trt="http://www.onvif.org/ver10/media/wsdl" '
    'xmlns:tt="http://www.onvif.org/ver10/schema"><s:Body>{}</s:Body></s:Envelope>'
)


def _profile(token: str, name: str, width: int, height: int) -> str:
    return (
        f'<trt:Profiles token="{token}"><tt:Name>{name}</tt:Name>'
        "<tt:VideoEncoderConfiguration><tt:Encoding>H264</tt:Encoding><tt:Resolution>"
        f"<tt:Width>{width}</tt:Width><tt:Height>{height}</tt:Height></tt:Resolution>"
        "</tt:VideoEncoderConfiguration></trt:Profiles>"
    )


# the sub-stream first, so that "highest resolution" is chosen, not "first"
PROFILES = (
    "<trt:GetProfilesResponse>"
    + _profile("sub_tok", "SubStream", 640, 360)
    + _profile("main_tok", "MainStream", 2560, 1440)
    + _profile("mid_tok", "ThirdStream", 1280, 720)
    + "</trt:GetProfilesResponse>"
)
FAULT = (
    "<s:Fault><s:Code><s:Value>s:Sender</s:Value><s:Subcode><s:Value>ter:NotAuthorized"
    '</s:Value></s:Subcode></s:Code><s:Reason><s:Text xml:lang="en">Sender not authorized'
    "</s:Text></s:Reason></s:Fault>"
)


def authorized(body: str) -> bool:
    """The request carries a WS-UsernameToken digest of USER and PASSWORD (and no clear
    password)."""

    def get(tag: str) -> str:
        m = re.search(rf"<wsse:{tag}[^>]*>([^<]*)</wsse:{tag}>", body)
        return m.group(1) if m else ""

    created = re.search(r"<wsu:Created>([^<]*)</wsu:Created>", body)
    if not created or get("Username") != USER:
        return False
    nonce = base64.b64decode(get("Nonce"))
    want = hashlib.sha1(nonce + created.group(1).encode() + PASSWORD.encode()).digest()  # noqa: S324 - the spec's digest
    return get("Password") == base64.b64encode(want).decode() and PASSWORD not in body


def camera_http(
    bind: tuple[object, ...],
    url_host: str,
    *,
    profiles: str = PROFILES,
    rtsp_port: int = 554,
    needs_auth: bool = True,
    trickle_s: float = 0.0,
) -> http.server.ThreadingHTTPServer:
    """The camera's device and media services; ``url_host`` is how it names itself (a
    link-local address without a zone, as cameras do); its stream URIs are
    ``rtsp://url_host:rtsp_port/<profile token>``. With ``trickle_s``, every answer, status
    line and headers included, goes out one byte each ``trickle_s`` (a camera that holds
    a client without ever going quiet long enough for a read timeout)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

        def do_POST(self) -> None:
            n = min(int(self.headers.get("Content-Length", "0")), 1 << 16)
            body = self.rfile.read(n).decode()
            port = self.server.server_address[1]
            status = 200
            if needs_auth and not authorized(body):
                status, answer = 400, FAULT
            elif "GetCapabilities" in body:
                answer = (
                    "<tds:GetCapabilitiesResponse><tds:Capabilities><tt:Media><tt:XAddr>"
                    f"http://{url_host}:{port}/onvif/media</tt:XAddr></tt:Media>"
                    "</tds:Capabilities></tds:GetCapabilitiesResponse>"
                )
            elif "GetProfiles" in body and self.path == "/onvif/media":
                answer = profiles
            elif "GetStreamUri" in body and self.path == "/onvif/media":
                token = re.search(r"<trt:ProfileToken>([^<]*)<", body)
                answer = (
                    "<trt:GetStreamUriResponse><trt:MediaUri><tt:Uri>"
                    f"rtsp://{url_host}:{rtsp_port}/{token.group(1) if token else '?'}</tt:Uri>"
                    "</trt:MediaUri></trt:GetStreamUriResponse>"
                )
            else:
                status, answer = 400, "<s:Fault/>"
            data = ENV.format(answer).encode()
            if trickle_s > 0:
                head = (
                    f"HTTP/1.1 {status} OK\r\nContent-Type: application/soap+xml\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n"
                ).encode()
                for i, byte in enumerate(head + data):
                    if i >= TRICKLE_MAX_BYTES:  # bounded: the client left long before
                        break
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return  # the client cut the connection
                    time.sleep(trickle_s)
                self.close_connection = True
                return
            self.send_response(status)
            self.send_header("Content-Type", "application/soap+xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if len(bind) == 4 else socket.AF_INET

    return Server(bind, Handler)  # type: ignore[arg-type]


def probe_match(
    relates_to: str,
    xaddr: str,
    *,
    endpoint: str = ENDPOINT,
    name: str = "Dock%20door",
    hardware: str = "DS-2",
) -> bytes:
    """A ProbeMatches answer to the probe ``relates_to``: an ONVIF video transmitter at
    ``xaddr`` (``name`` as it goes in a scope: percent-encoded)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?><e:Envelope '
        'xmlns:e="http://www.w3.org/2003/05/soap-envelope" '
        'xmlns:w="http://schemas.xmlsoap.org/ws/2004/08/addressing" '
        'xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery" '
        'xmlns:dn="http://www.onvif.org/ver10/network/wsdl"><e:Header>'
        f"<w:MessageID>urn:uuid:{uuid.uuid4()}</w:MessageID>"
        f"<w:RelatesTo>{relates_to}</w:RelatesTo>"
        "<w:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/ProbeMatches</w:Action>"
        "</e:Header><e:Body><d:ProbeMatches><d:ProbeMatch>"
        f"<w:EndpointReference><w:Address>{endpoint}</w:Address></w:EndpointReference>"
        "<d:Types>dn:NetworkVideoTransmitter</d:Types>"
        f"<d:Scopes>onvif://www.onvif.org/name/{name} onvif://www.onvif.org/hardware/{hardware}"
        f"</d:Scopes><d:XAddrs>{xaddr}</d:XAddrs><d:MetadataVersion>1</d:MetadataVersion>"
        "</d:ProbeMatch></d:ProbeMatches></e:Body></e:Envelope>"
    ).encode()


@dataclass
class Camera:
    """What the camera saw: the TTL / hop limit of each probe, by family."""

    gw: str
    cam6: str
    ns: str = ""
    """the camera's network namespace (its link is ``eb``; the gateway's is ``ea``)"""
    ttls: list[int] = field(default_factory=list)
    hop_limits: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def answer(self, socks: dict[socket.socket, str]) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select(list(socks), [], [], 0.1)
            for sock in ready:
                data, anc, _flags, addr = sock.recvmsg(65535, socket.CMSG_SPACE(4))
                for level, kind, value in anc:
                    if (level, kind) == (socket.IPPROTO_IP, socket.IP_TTL):
                        self.ttls.append(struct.unpack("=i", value[:4])[0])
                    if (level, kind) == (socket.IPPROTO_IPV6, IPV6_HOPLIMIT):
                        self.hop_limits.append(struct.unpack("=i", value[:4])[0])
                m = re.search(rb"MessageID>([^<]+)<", data)
                if m:
                    sock.sendto(probe_match(m.group(1).decode(), socks[sock]), addr)


def _responders(families: str, xaddr4: str, xaddr6: str) -> dict[socket.socket, str]:
    index = socket.if_nametoindex("eb")
    out = {}
    if "4" in families:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", PORT))
        mreqn = struct.pack("=4s4si", socket.inet_aton(GROUP), bytes(4), index)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreqn)
        s.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
        out[s] = xaddr4
    if "6" in families:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", PORT))
        group = socket.inet_pton(socket.AF_INET6, GROUP6) + struct.pack("=I", index)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, group)
        s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1)
        out[s] = xaddr6
    return out


LINK_LOCAL_WAIT_S = 20.0


def _link_local(ns: str, dev: str) -> str:
    """The link-local address of ``dev``, once it may be bound: not tentative (duplicate
    address detection still running answers a bind with EADDRNOTAVAIL; it takes longer
    on a loaded machine)."""
    deadline = time.monotonic() + LINK_LOCAL_WAIT_S
    while True:
        out = subprocess.run(
            ["ip", "-n", ns, "-6", "-o", "addr", "show", "dev", dev, "scope", "link"],
            check=True,
            timeout=10,
            capture_output=True,
            text=True,
        ).stdout
        m = re.search(r"inet6 (fe80::[0-9a-f:]+)/", out)
        if m and "tentative" not in out:
            return m.group(1)
        assert time.monotonic() < deadline, f"no usable link-local address on {dev}: {out}"
        time.sleep(0.05)


@contextmanager
def onvif_camera(families: str = "46") -> Iterator[Camera]:
    """The two namespaces and a camera answering over IPv4 and/or IPv6 (``families``)."""
    tag = uuid.uuid4().hex[:6]
    gw, cam = f"edf-gw-{tag}", f"edf-cam-{tag}"
    stops: list[Callable[[], object]] = []
    _ip("netns", "add", gw)
    try:
        _ip("netns", "add", cam)
        stops.append(lambda: _ip("netns", "del", cam))
        for ns in (gw, cam):
            subprocess.run(
                ["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"],
                check=True,
                timeout=10,
            )
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", gw, "link", "add", "ea", "type", "veth", "peer", "name", "eb", "netns", cam)
        for ns, dev, addr in ((gw, "ea", GW4), (cam, "eb", CAM4)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", gw, "route", "add", "224.0.0.0/4", "dev", "ea")
        cam6 = _link_local(cam, "eb")
        scope = int(in_netns(cam, lambda: socket.if_nametoindex("eb")))  # type: ignore[call-overload]
        xaddrs = {}
        for bind, host in (((CAM4, 0), CAM4), ((cam6, 0, 0, scope), f"[{cam6}]")):
            server = in_netns(cam, lambda b=bind, h=host: camera_http(b, h))  # type: ignore[misc]
            assert isinstance(server, http.server.ThreadingHTTPServer)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stops += [server.shutdown, server.server_close]
            xaddrs[host] = f"http://{host}:{server.server_address[1]}/onvif/device_service"
        socks = in_netns(cam, lambda: _responders(families, xaddrs[CAM4], xaddrs[f"[{cam6}]"]))
        assert isinstance(socks, dict)
        camera = Camera(gw, cam6, ns=cam)
        t = threading.Thread(target=camera.answer, args=(socks,), daemon=True)
        t.start()
        stops.append(lambda: (camera.stop.set(), t.join(5), [s.close() for s in socks]))
        yield camera
    finally:
        for stop in reversed(stops):
            stop()
        subprocess.run(["ip", "netns", "del", gw], check=False, timeout=10)


def agent(
    netns: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``edge-agent ARGS`` in ``netns`` (bounded: 60 s)."""
    return subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-m", "agent.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )
