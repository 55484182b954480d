"""RTSP cameras as they behave: transport, credentials from a secret, and why a stream failed.

OpenCV's FFmpeg backend says only "can't open" or "no frame". To give each failure its
reason, a failed open is followed by one bounded request over a plain socket (RTSP
``DESCRIBE``; for an HTTP/MJPEG camera, ``GET`` read up to the end of the headers) whose
status line tells 401 (unauthorized) from 404 (not found) from a refused connection.

The transport is an FFmpeg option, and OpenCV reads FFmpeg options only from the
process-wide ``OPENCV_FFMPEG_CAPTURE_OPTIONS`` variable at open time: :class:`FfmpegOptions`
sets it for the opens in progress and makes an open that needs other options wait until
those are done.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, urlsplit, urlunsplit

from agent.capture.config import CameraConfig
from agent.errors import CaptureError
from agent.kernel.secrets import read_secret

FAILURES = (
    "refused",
    "unreachable",
    "unauthorized",
    "not_found",
    "timeout",
    "stalled",
    "ended",
    "misconfigured",
    "unavailable",
    "unknown",
)
"""The reason words a camera failure is counted under (``CameraStats.failures``)."""

OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_STATUS = re.compile(rb"^(?:RTSP|HTTP)/1\.\d (\d{3})")
_PROBE_MAX_BYTES = 16384
_DEFAULT_PORTS = {"rtsp": 554, "http": 80}


class SourceFailure(CaptureError):
    """A capture failure with its reason word.

    Attributes:
        failure: one of :data:`FAILURES`.
    """

    def __init__(self, source: str, failure: str, reason: str) -> None:
        super().__init__(source, reason)
        self.failure = failure


def failure_of(error: BaseException) -> str:
    """The reason word of any capture error (``unknown`` when it has none)."""
    return getattr(error, "failure", "unknown")


def password(config: CameraConfig) -> str:
    """The camera's password from its secret (``password_env``); "" when it has none.

    Raises:
        SourceFailure: ``password_env`` names a secret that is not there (unauthorized).
    """
    if not config.password_env:
        return ""
    secret = read_secret(config.password_env)
    if secret is None:
        raise SourceFailure(
            config.name,
            "unauthorized",
            f"secret {config.password_env} (password_env) is neither in "
            "$CREDENTIALS_DIRECTORY nor in the environment",
        )
    return secret


def plain_zone(url: str) -> str:
    """``url`` with an IPv6 zone written as FFmpeg and the socket calls read it.

    A link-local camera address carries its interface as a zone, which RFC 6874 writes
    ``[fe80::1%25eth0]`` in a URI (``edge-agent cameras`` and ``setup`` write it so).
    FFmpeg does not read that form ("Port missing in uri"), but opens ``[fe80::1%eth0]``.
    """
    return _ZONE.sub(r"[\1%\2]", url, count=1)


_ZONE = re.compile(r"\[([0-9A-Fa-f:.]+)%25([^\]]+)\]")


def stream_url(config: CameraConfig) -> str:
    """``config.stream_uri`` with the user and password put in, for the open only (never
    logged), and an IPv6 zone as FFmpeg reads it (:func:`plain_zone`).

    Raises:
        SourceFailure: the password's secret is missing.
    """
    if not config.username:
        return plain_zone(config.stream_uri)
    parts = urlsplit(plain_zone(config.stream_uri))
    cred = quote(config.username, safe="")
    secret = password(config)
    if secret:
        cred += ":" + quote(secret, safe="")
    return urlunsplit(parts._replace(netloc=f"{cred}@{parts.netloc}"))


def ffmpeg_options(config: CameraConfig) -> str:
    """The FFmpeg options string for an RTSP camera's transport ("" for auto)."""
    if config.transport == "auto":
        return ""
    return f"rtsp_transport;{config.transport}"


class FfmpegOptions:
    """Holds ``OPENCV_FFMPEG_CAPTURE_OPTIONS`` at one value while opens that need it run;
    opens that need the same value run together, another value waits its turn."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value: str | None = None
        self._users = 0

    @contextmanager
    def use(self, value: str, timeout_s: float) -> Iterator[None]:
        """Set the variable to ``value`` (unset for "") for the block.

        Raises:
            CaptureError: other opens held another value for longer than ``timeout_s``.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._users == 0 or self._value == value, timeout_s):
                raise CaptureError("ffmpeg", f"waited {timeout_s:g} s to set {OPTIONS_ENV}")
            if self._users == 0:
                if value:
                    os.environ[OPTIONS_ENV] = value
                else:
                    os.environ.pop(OPTIONS_ENV, None)
                self._value = value
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()


def probe(config: CameraConfig, timeout_s: float) -> tuple[str, str]:
    """Ask the camera for its stream (RTSP ``DESCRIBE``, HTTP ``GET`` of the headers) and
    tell why an open failed: ``(failure, detail)``; one connection (two with
    authentication), all within ``timeout_s``. ``rtsps://`` and ``https://`` are not
    probed (``unknown``)."""
    parts = urlsplit(plain_zone(config.stream_uri))
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return "unknown", "not probed"
    return _probe(config, parts.hostname, parts.port or _DEFAULT_PORTS[scheme], timeout_s)


def _probe(config: CameraConfig, host: str, port: int, timeout_s: float) -> tuple[str, str]:
    parts = urlsplit(plain_zone(config.stream_uri))
    deadline = time.monotonic() + timeout_s
    url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    http = parts.scheme.lower() == "http"
    method, target = (
        ("GET", urlunsplit(("", "", parts.path or "/", parts.query, "")))
        if http
        else ("DESCRIBE", url)
    )
    user = config.username or (parts.username or "")
    try:
        secret = password(config)
        status, headers = _request(host, port, method, target, "", deadline)
        if status == 401 and user:
            auth = _authorization(headers, user, secret, method, target)
            status, headers = _request(host, port, method, target, auth, deadline)
    except SourceFailure as e:
        return e.failure, e.reason
    except ConnectionRefusedError:
        return "refused", "connection refused"
    except TimeoutError:  # before OSError, of which it is one
        return "timeout", f"no answer within {timeout_s:g} s"
    except OSError as e:
        return "unreachable", str(e)
    return _verdict(status, headers, http=http)


def _verdict(status: int, headers: str, *, http: bool) -> tuple[str, str]:
    failure = {401: "unauthorized", 403: "unauthorized", 404: "not_found"}.get(status, "unknown")
    protocol = "HTTP" if http else "RTSP"
    if not status:
        return failure, f"no {protocol} answer"
    if http and status == 200:  # served, but not as a stream FFmpeg reads
        return failure, f"HTTP 200 with {_header(headers, 'content-type') or 'no content type'}"
    return failure, f"{protocol} {status}"


def _header(headers: str, name: str) -> str:
    for line in headers.split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    return ""


def _request(
    host: str, port: int, method: str, target: str, authorization: str, deadline: float
) -> tuple[int, str]:
    if method == "GET":
        host_header = f"[{host}]" if ":" in host else host
        request = f"GET {target} HTTP/1.1\r\nHost: {host_header}:{port}\r\nConnection: close\r\n"
    else:
        request = f"{method} {target} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n"
    if authorization:
        request += f"Authorization: {authorization}\r\n"
    request += "User-Agent: edgefleet\r\n\r\n"
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    with socket.create_connection((host, port), timeout=left) as sock:
        sock.sendall(request.encode())
        data = b""
        while b"\r\n\r\n" not in data and len(data) < _PROBE_MAX_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    match = _STATUS.match(data)
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    return (int(match.group(1)) if match else 0), head


def _authorization(headers: str, user: str, secret: str, method: str, url: str) -> str:
    """The ``Authorization`` header answering the server's challenge (Basic or Digest)."""
    challenge = ""
    for line in headers.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "www-authenticate":
            challenge = value.strip()
            if challenge.lower().startswith("digest"):
                break
    if not challenge.lower().startswith("digest"):
        return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
    fields = dict(re.findall(r'(\w+)="?([^",]*)"?', challenge))
    realm, nonce = fields.get("realm", ""), fields.get("nonce", "")

    def md5(text: str) -> str:
        return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()

    response = md5(f"{md5(f'{user}:{realm}:{secret}')}:{nonce}:{md5(f'{method}:{url}')}")
    return (
        f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{url}", '
        f'response="{response}"'
    )
