"""``edge-agent cameras`` against an ONVIF camera written here: a WS-Discovery responder (a
UDP socket joined to 239.255.255.250:3702) and a small HTTP server answering
GetCapabilities, GetProfiles and GetStreamUri with canned ONVIF SOAP. Each test makes its
own network namespace (only ``lo``, multicast on), so the real group and port are used
without touching the host's network or another test's responder; the command runs in it
through ``ip netns exec`` as a subprocess."""

from __future__ import annotations

import http.server
import json
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from tests.agent.discovery import onvif_camera
from tests.agent.discovery.onvif_camera import IP_RECVTTL, PASSWORD, REPO, USER, in_netns

GROUP, PORT = "239.255.255.250", 3702


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"edf-disc-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "set", "lo", "up", "multicast", "on"], check=True, timeout=10
        )
        subprocess.run(
            ["ip", "-n", name, "route", "add", "224.0.0.0/4", "dev", "lo"], check=True, timeout=10
        )
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=10)


# ---- the camera's HTTP side ---------------------------------------------------------------

PROFILES = (
    '<trt:GetProfilesResponse><trt:Profiles token="main_tok" fixed="true"><tt:Name>MainStream'
    '</tt:Name><tt:VideoEncoderConfiguration token="v0"><tt:Name>v0</tt:Name>'
    "<tt:Encoding>H264</tt:Encoding><tt:Resolution><tt:Width>1920</tt:Width><tt:Height>1080"
    "</tt:Height></tt:Resolution></tt:VideoEncoderConfiguration></trt:Profiles>"
    '<trt:Profiles token="sub_tok"><tt:Name>SubStream</tt:Name><tt:VideoEncoderConfiguration>'
    "<tt:Encoding>H264</tt:Encoding><tt:Resolution><tt:Width>640</tt:Width><tt:Height>360"
    "</tt:Height></tt:Resolution></tt:VideoEncoderConfiguration></trt:Profiles>"
    "</trt:GetProfilesResponse>"
)


def camera_http(
    needs_auth: bool, profiles: str = PROFILES, trickle_s: float = 0.0
) -> http.server.ThreadingHTTPServer:
    return onvif_camera.camera_http(
        ("127.0.0.1", 0),
        "127.0.0.1",
        profiles=profiles,
        rtsp_port=8554,
        needs_auth=needs_auth,
        trickle_s=trickle_s,
    )


# ---- the camera's WS-Discovery side -------------------------------------------------------


def probe_match(relates_to: str, xaddr: str, name: str = "Line%203%20cam") -> bytes:
    return onvif_camera.probe_match(
        relates_to, xaddr, endpoint="urn:uuid:cam-1", name=name, hardware="IPC-T1"
    )


def utf16_dtd_match(relates_to: str, xaddr: str) -> bytes:
    """A well-formed ProbeMatch of another camera, in UTF-16, whose DTD declares an entity
    its name uses: a byte search for ``<!DOCTYPE`` does not see it."""
    text = onvif_camera.probe_match(
        relates_to, xaddr, endpoint="urn:uuid:dtd-cam", name="&big;", hardware="X"
    ).decode()
    text = text.replace('encoding="UTF-8"?>', 'encoding="UTF-16"?><!DOCTYPE e:Envelope ['
                        '<!ENTITY a "aaaaaaaaaa"><!ENTITY big "&a;&a;&a;&a;">]>', 1)  # fmt: skip
    return text.encode("utf-16")


GARBAGE = [
    b"\x00\xff not xml at all",
    b"<a>" * 20000,  # oversized (60 kB)
    b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;">]>'
    b"<l>&b;</l>",
    b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body/></s:Envelope>',
    b"<unclosed><tag>",
]


@dataclass
class Responder:
    """Answers each Probe; records the TTL each probe arrived with."""

    sock: socket.socket
    xaddr: str
    garbage: bool = False
    name: str = "Line%203%20cam"
    ttls: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def serve(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready:
                continue
            data, anc, _flags, addr = self.sock.recvmsg(65535, socket.CMSG_SPACE(4))
            for level, kind, value in anc:
                if level == socket.IPPROTO_IP and kind == socket.IP_TTL:
                    self.ttls.append(struct.unpack("=i", value[:4])[0])
            m = re.search(rb"MessageID>([^<]+)<", data)
            if not m:
                continue
            if self.garbage:
                for g in GARBAGE:
                    self.sock.sendto(g, addr)
                self.sock.sendto(utf16_dtd_match(m.group(1).decode(), self.xaddr), addr)
            self.sock.sendto(probe_match(m.group(1).decode(), self.xaddr, self.name), addr)


def responder_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", PORT))
    mreqn = struct.pack("=4s4si", socket.inet_aton(GROUP), bytes(4), socket.if_nametoindex("lo"))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreqn)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVTTL, 1)
    return s


@pytest.fixture
def camera(netns: str) -> Iterator[Callable[..., Responder]]:
    stops: list[Callable[[], None]] = []

    def start(
        *,
        needs_auth: bool = False,
        garbage: bool = False,
        xaddr: str | None = None,
        name: str = "Line%203%20cam",
        profiles: str = PROFILES,
        trickle_s: float = 0.0,
    ) -> Responder:
        server = in_netns(netns, lambda: camera_http(needs_auth, profiles, trickle_s))
        assert isinstance(server, http.server.ThreadingHTTPServer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stops.append(server.shutdown)
        stops.append(server.server_close)
        port = server.server_address[1]
        sock = in_netns(netns, responder_socket)
        assert isinstance(sock, socket.socket)
        r = Responder(sock, xaddr or f"http://127.0.0.1:{port}/onvif/device_service", garbage, name)
        t = threading.Thread(target=r.serve, daemon=True)
        t.start()
        stops.append(lambda: (r.stop.set(), t.join(5), sock.close()))
        return r

    yield start
    for stop in stops:
        stop()


def cameras(
    netns: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return onvif_camera.agent(netns, "cameras", *args, env=env)


def test_cameras_json_lists_an_onvif_camera_with_its_profiles_and_rtsp_uris(
    netns: str, camera: Callable[..., Responder]
) -> None:
    responder = camera()
    run = cameras(netns, "--json", "--timeout", "1.5")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    [cam] = report["onvif"]
    assert cam["endpoint"] == "urn:uuid:cam-1"
    assert cam["name"] == "Line 3 cam"
    assert cam["hardware"] == "IPC-T1"
    assert cam["xaddrs"] == [responder.xaddr]
    assert cam["error"] == ""
    assert cam["media_xaddr"].endswith("/onvif/media")
    main, sub = cam["profiles"]
    assert (main["name"], main["encoding"], main["width"], main["height"]) == (
        "MainStream",
        "H264",
        1920,
        1080,
    )
    assert main["uri"] == "rtsp://127.0.0.1:8554/main_tok"
    assert sub["uri"] == "rtsp://127.0.0.1:8554/sub_tok"
    assert report["probe"]["matches"] == 1
    assert report["v4l2"] == []


def test_the_probe_leaves_with_a_multicast_ttl_of_one(
    netns: str, camera: Callable[..., Responder]
) -> None:
    responder = camera()
    run = cameras(netns, "--json", "--timeout", "1", "--interface", "lo")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["probe"]["ttl"] == 1
    # the probe is sent twice (SOAP-over-UDP repeat); each arrived with TTL 1
    assert responder.ttls
    assert set(responder.ttls) == {1}


def test_garbage_oversized_and_dtd_replies_are_counted_and_skipped(
    netns: str, camera: Callable[..., Responder]
) -> None:
    camera(garbage=True)
    run = cameras(netns, "--json", "--timeout", "1.5")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert [c["endpoint"] for c in report["onvif"]] == ["urn:uuid:cam-1"]
    assert report["onvif"][0]["profiles"][0]["uri"].startswith("rtsp://")
    stats = report["probe"]
    assert stats["oversized"] >= 1
    assert stats["unparsable"] >= 4  # not XML, DTD, UTF-16 DTD, unclosed
    assert stats["unrelated"] >= 1  # an envelope that is no ProbeMatches
    assert stats["duplicates"] >= 1  # the repeated probe's second answer


def test_a_camera_that_wants_credentials_is_listed_unread_without_them_and_read_with_them(
    netns: str, camera: Callable[..., Responder]
) -> None:
    responder = camera(needs_auth=True)
    run = cameras(netns, "--timeout", "1")
    assert run.returncode == 0, run.stderr
    assert f"xaddrs: {responder.xaddr}" in run.stdout
    assert "profiles: not read (unauthorized)" in run.stdout
    good = cameras(netns, "--timeout", "1", "--user", USER, env={"CAM_PASSWORD": PASSWORD})
    assert good.returncode == 0, good.stderr
    assert "MainStream [H264 1920x1080]: rtsp://127.0.0.1:8554/main_tok" in good.stdout
    assert "SubStream [H264 640x360]: rtsp://127.0.0.1:8554/sub_tok" in good.stdout


def test_a_camera_whose_http_never_answers_is_listed_with_the_reason(
    netns: str, camera: Callable[..., Responder]
) -> None:
    def silent() -> socket.socket:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepted by the kernel, never answered
        return s

    mute = in_netns(netns, silent)
    assert isinstance(mute, socket.socket)
    try:
        xaddr = f"http://127.0.0.1:{mute.getsockname()[1]}/onvif/device_service"
        camera(xaddr=xaddr)
        run = cameras(netns, "--json", "--timeout", "1", "--http-timeout", "0.5")
    finally:
        mute.close()
    assert run.returncode == 0, run.stderr
    [cam] = json.loads(run.stdout)["onvif"]
    assert cam["xaddrs"] == [xaddr]
    assert cam["profiles"] == []
    assert "timed out" in cam["error"]


def test_nothing_answering_ends_the_probe_at_its_timeout_and_says_so(netns: str) -> None:
    run = cameras(netns, "--timeout", "1")  # bounded by subprocess timeout=60 in cameras()
    assert run.returncode == 0, run.stderr
    assert "no V4L2 devices" in run.stdout
    assert "none answered" in run.stdout
    report = json.loads(cameras(netns, "--json", "--timeout", "0.5").stdout)
    assert report["onvif"] == []
    assert report["probe"]["elapsed_s"] >= 0.5  # it listened for its whole timeout


def test_an_unknown_interface_is_a_one_line_error() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "cameras", "--interface", "nosuch0", "--timeout", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.strip() == "edge-agent: camera discovery: no network interface 'nosuch0'"


def test_no_network_lists_v4l2_only_and_sends_nothing() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "cameras", "--no-network", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"v4l2": [], "onvif": [], "probe": None}


def test_a_dtd_in_utf16_is_refused_like_one_in_utf8(
    netns: str, camera: Callable[..., Responder]
) -> None:
    """The UTF-16 ProbeMatch is well-formed and relates to the probe: only its DTD keeps
    the camera it names out of the report."""
    camera(garbage=True)
    run = cameras(netns, "--json", "--timeout", "1.5")
    assert run.returncode == 0, run.stderr
    endpoints = [c["endpoint"] for c in json.loads(run.stdout)["onvif"]]
    assert endpoints == ["urn:uuid:cam-1"]


def test_a_camera_that_trickles_its_answers_is_cut_off_at_the_http_timeout(
    netns: str, camera: Callable[..., Responder]
) -> None:
    """One byte every 50 ms never lets a read time out: the whole exchange has a deadline,
    and all of a camera's calls one budget, so the command ends and says why."""
    camera(trickle_s=0.05)
    run = cameras(netns, "--json", "--timeout", "1", "--http-timeout", "0.5")
    assert run.returncode == 0, run.stderr
    [cam] = json.loads(run.stdout)["onvif"]
    assert cam["profiles"] == []
    assert cam["error"] == "timed out: no whole answer in 0.5 s"


HOSTILE_PROFILES = PROFILES.replace(
    "<tt:Name>MainStream</tt:Name>",
    "<tt:Name>Main&#10;ONVIF cameras: forged line&#x202E;gpj.exe&#x9B;31m</tt:Name>",
)


def test_camera_supplied_text_is_shown_on_one_line_with_its_controls_escaped(
    netns: str, camera: Callable[..., Responder]
) -> None:
    """A name scope with a line break, a C1 CSI and a bidi override (percent-encoded, as
    scopes are), and a profile name with the same as XML character references."""
    camera(name="Dock%0Aforged%20line%C2%9B%E2%80%AEcam", profiles=HOSTILE_PROFILES)
    run = cameras(netns, "--timeout", "1")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert not [ln for ln in lines if ln.lstrip().startswith(("forged", "ONVIF cameras: forged"))]
    assert "  Dock\\x0aforged line\\x9b\\u202ecam IPC-T1  urn:uuid:cam-1" in lines
    main = [ln for ln in lines if "main_tok" in ln]
    assert main == [
        "    Main\\x0aONVIF cameras: forged line\\u202egpj.exe\\x9b31m [H264 1920x1080]: "
        "rtsp://127.0.0.1:8554/main_tok"
    ]
    assert not any(c in run.stdout for c in ("\u202e", "\x9b"))
    report = json.loads(cameras(netns, "--json", "--timeout", "1").stdout)
    assert report["onvif"][0]["name"] == "Dock\\x0aforged line\\x9b\\u202ecam"
