"""The transports python-tuf's ngclient downloads through: a local directory (side-load
from removable media) and MQTT (request/response on the device's own topics).

Both map ``edgefleet:/<path>`` to a repository path (:func:`agent.wire.fetch.url_path`),
raise :class:`tuf.api.exceptions.DownloadHTTPError` with 404 for a missing file (the
ngclient stops looking for newer roots on it) and wrap every other failure in
:class:`tuf.api.exceptions.DownloadError`, also while the bytes are iterated. The signed
maximum length is enforced by the ngclient, which stops reading at it.
"""

from __future__ import annotations

import logging
import queue
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from tuf.api.exceptions import DownloadError, DownloadHTTPError, SlowRetrievalError
from tuf.ngclient.fetcher import FetcherInterface

from agent.kernel.mqtt import MqttSession, SessionOptions, Subscription
from agent.mqtt_config import LocalMqttConfig
from agent.wire import topics
from agent.wire.fetch import (
    MAX_CHUNK,
    STATUS_NOT_FOUND,
    STATUS_OK,
    FetchProtocolError,
    FetchRequest,
    FetchResponse,
    decode_response,
    encode_request,
    url_path,
)

log = logging.getLogger(__name__)

NOT_FOUND = 404
RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 5
_RESPONSE_QUEUE = 16  # one request is in flight at a time; more is stale or hostile
_POLL_S = 0.05


def _repository_path(url: str) -> str:
    try:
        return url_path(url)
    except FetchProtocolError as exc:
        raise DownloadError(exc.reason) from exc


class LocalDirFetcher(FetcherInterface):
    """Reads ``edgefleet:/<path>`` from ``<root_dir>/<path>`` (a repository copy on a USB
    stick, say); a path resolving outside ``metadata/`` or ``targets/`` is refused.
    """

    def __init__(self, root_dir: Path, *, chunk_size: int = MAX_CHUNK) -> None:
        self.root = Path(root_dir)
        self.chunk_size = chunk_size
        self.requests = 0
        self.bytes_read = 0

    def _fetch(self, url: str) -> Iterator[bytes]:
        self.requests += 1
        rel = _repository_path(url)
        path = self.root / rel
        try:
            real = path.resolve(strict=True)
            top = (self.root / rel.split("/", 1)[0]).resolve(strict=True)
        except FileNotFoundError:
            raise DownloadHTTPError(f"{rel}: no such file in {self.root}", NOT_FOUND) from None
        except (OSError, RuntimeError) as exc:
            raise DownloadError(f"{rel}: cannot resolve: {exc}") from exc
        if not real.is_relative_to(top):
            raise DownloadError(f"{rel}: resolves outside {top}")
        if not real.is_file():
            raise DownloadHTTPError(f"{rel}: not a regular file", NOT_FOUND)
        return self._chunks(rel, real)

    def _chunks(self, rel: str, real: Path) -> Iterator[bytes]:
        try:
            with real.open("rb") as f:
                while chunk := f.read(self.chunk_size):
                    self.bytes_read += len(chunk)
                    yield chunk
        except OSError as exc:
            raise DownloadError(f"{rel}: read failed: {exc.strerror or exc}") from exc


def _tls(
    context: ssl.SSLContext | None,
    ca: Path | str | None,
    cert: Path | str | None,
    key: Path | str | None,
) -> ssl.SSLContext | None:
    """The TLS context: ``context``, or one made of the three files (TLS 1.2 at least,
    host name checked), or None.

    Raises:
        ValueError: some but not all files, or files and ``context`` both.
        OSError: a file can't be loaded (ssl.SSLError is one).
    """
    files = (ca, cert, key)
    if all(f is None for f in files):
        return context
    if context is not None or any(f is None for f in files):
        raise ValueError("give tls_ca, tls_cert and tls_key together, or tls_context")
    made = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    made.minimum_version = ssl.TLSVersion.TLSv1_2
    made.load_cert_chain(str(cert), str(key))
    return made


class _Retry(Exception):
    """The request got no answer (timeout, connection lost): ask again from the offset."""


@dataclass
class FetchStats:
    """Counters of an MQTT fetcher (each loop has a metric)."""

    files: int = 0
    chunks: int = 0
    bytes: int = 0
    retries: int = 0
    resumes: int = 0
    disconnects: int = 0
    stale_responses: int = 0
    bad_responses: int = 0
    dropped_responses: int = 0


class MqttFetcher(FetcherInterface):
    """Downloads repository files over MQTT in chunks of at most 256 KiB.

    One request is in flight at a time. A chunk not answered within ``timeout_s`` or a
    lost connection makes the fetcher ask again from the last offset it received (after
    the reconnect), up to ``max_retries`` times and ``deadline_s`` per file.

    Args:
        host, port: the fleet broker.
        device_id: this device; its fetch topics are its own (broker ACL).
        timeout_s: wait for the connection, and for each chunk.
        max_retries: requests asked again per file before giving up.
        deadline_s: the most time one file may take (then SlowRetrievalError).
        chunk_size: bytes asked per request (at most 256 KiB).
        tls_ca, tls_cert, tls_key: TLS with a client certificate (the device identity:
            :class:`agent.enrollment.identity.Identity` ``ca_path``, ``cert_path``, ``key_path``).
        session: fetch through this session (see :meth:`on_session`); the connection
            arguments are then not used.

    Raises:
        ValueError: a bad chunk size, some but not all TLS files, or TLS files and
            ``tls_context`` both; OSError (ssl.SSLError): a TLS file can't be loaded.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        device_id: str,
        timeout_s: float = 10.0,
        max_retries: int = 8,
        deadline_s: float = 600.0,
        chunk_size: int = MAX_CHUNK,
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        keepalive_s: int = 30,
        tls_context: ssl.SSLContext | None = None,
        tls_ca: Path | str | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
        session: MqttSession | None = None,
    ) -> None:
        if not 1 <= chunk_size <= MAX_CHUNK:
            raise ValueError(f"chunk_size {chunk_size} is not in [1, {MAX_CHUNK}]")
        self.device_id = device_id
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.deadline_s = deadline_s
        self.chunk_size = chunk_size
        self.keepalive_s = keepalive_s
        self.stats = FetchStats()
        self._request_topic = topics.fetch_request(device_id)
        self._response_topic = topics.fetch_response(device_id)
        self._lock = threading.Lock()  # one request in flight
        self._responses: queue.Queue[FetchResponse] = queue.Queue(_RESPONSE_QUEUE)
        self._started = False
        self._sub: Subscription | None = None
        self._listener: Any = None
        self._granted = threading.Event()
        self._owns_session = session is None
        if session is None:
            session = MqttSession(
                f"fetcher {device_id}",
                SessionOptions(
                    host=host,
                    port=port,
                    client_id=client_id or f"edge-agent-{device_id}-fetch-{uuid.uuid4().hex}",
                    keepalive_s=keepalive_s,
                    clean_start=True,
                    tls=_tls(tls_context, tls_ca, tls_cert, tls_key),
                    username=username,
                    password=password,
                    reconnect_min_s=RECONNECT_MIN_S,
                    reconnect_max_s=RECONNECT_MAX_S,
                ),
            )
        self.session = session
        self.host, self.port = session.options.host, session.options.port
        self.guard = session.guard

    @classmethod
    def on_session(cls, session: MqttSession, *, device_id: str, **options: Any) -> MqttFetcher:
        """A fetcher on a session somebody else owns (the device's one fleet session):
        it registers its response subscription there and takes it out on :meth:`close`,
        and never starts or stops the session."""
        return cls(
            session.options.host,
            session.options.port,
            device_id=device_id,
            session=session,
            **options,
        )

    @classmethod
    def from_config(cls, config: LocalMqttConfig, *, device_id: str, **options: Any) -> MqttFetcher:
        """A fetcher on the broker of ``config`` (host, port, user, password, keepalive)."""
        return cls(
            config.host,
            config.port,
            device_id=device_id,
            client_id=f"{config.client_id_prefix}-{device_id}-fetch-{uuid.uuid4().hex}",
            username=config.username,
            password=config.password(),
            keepalive_s=config.keepalive_s,
            **options,
        )

    def start(self) -> None:
        """Subscribe to this device's fetch responses, connecting in the background
        (an own session); idempotent."""
        if self._started:
            return
        self._started = True
        self._granted.clear()
        self._listener = self.session.add_listener(on_down=self._on_down)
        self._sub = self.session.subscribe(
            self._response_topic, self._on_message, qos=1, on_suback=self._on_suback
        )
        if self._owns_session:
            self.session.start()

    def close(self) -> None:
        """Unsubscribe (disconnect, on an own session); idempotent."""
        if not self._started:
            return
        self._started = False
        self.session.remove_listener(self._listener)
        self.session.unsubscribe([self._response_topic])
        self._sub = None
        self._granted.clear()
        if self._owns_session:
            self.session.stop()

    def __enter__(self) -> MqttFetcher:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def ready(self) -> bool:
        """Whether connected and subscribed to this device's fetch responses."""
        return self._granted.is_set()

    @property
    def _last_error(self) -> str:
        sub = self._sub
        error = (sub.error if sub is not None else "") or self.session.last_error
        return f"({error})" if error else ""

    def _fetch(self, url: str) -> Iterator[bytes]:
        path = _repository_path(url)
        self.start()
        self.stats.files += 1
        return self._chunks(path)

    def _chunks(self, path: str) -> Iterator[bytes]:
        deadline = time.monotonic() + self.deadline_s
        offset, total, tries = 0, -1, 0
        while offset < total or total < 0:
            if time.monotonic() >= deadline:
                raise SlowRetrievalError(
                    f"{path}: {offset} of {total} bytes after {self.deadline_s:g} s"
                )
            try:
                with self._lock:
                    resp = self._request(path, offset, deadline)
            except _Retry as exc:
                tries += 1
                self.stats.retries += 1
                if offset > 0:
                    self.stats.resumes += 1
                log.warning("fetch %s at offset %d: %s (try %d)", path, offset, exc, tries)
                if time.monotonic() >= deadline:
                    raise SlowRetrievalError(
                        f"{path}: {offset} of {total} bytes after {self.deadline_s:g} s ({exc})"
                    ) from None
                if tries > self.max_retries:
                    raise DownloadError(
                        f"{path}: gave up at offset {offset} after {tries} tries: {exc}"
                    ) from None
                continue
            if resp.status == STATUS_NOT_FOUND:
                raise DownloadHTTPError(f"{path}: not found ({resp.reason})", NOT_FOUND)
            if resp.status != STATUS_OK:
                raise DownloadError(f"{path}: the file server failed: {resp.reason}")
            if total >= 0 and resp.total != total:
                raise DownloadError(f"{path}: the file changed size ({total} -> {resp.total})")
            if resp.offset != offset or len(resp.data) > self.chunk_size:
                raise DownloadError(
                    f"{path}: asked {self.chunk_size} bytes at {offset}, got "
                    f"{len(resp.data)} at {resp.offset}"
                )
            total = resp.total
            if not resp.data and offset < total:
                raise DownloadError(f"{path}: empty chunk at {offset} of {total}")
            offset += len(resp.data)
            self.stats.chunks += 1
            self.stats.bytes += len(resp.data)
            if resp.data:
                yield resp.data

    def _request(self, path: str, offset: int, deadline: float) -> FetchResponse:
        """Send one request and wait for its response.

        Raises:
            _Retry: not connected in time, the connection dropped, or no answer in time.
            DownloadError: paho or the broker refused the request.
        """
        wait = min(self.timeout_s, max(deadline - time.monotonic(), 0.0))
        if not self._granted.wait(wait):
            raise _Retry(f"not connected to {self.host}:{self.port} {self._last_error}".strip())
        generation = self.session.generation
        request = FetchRequest(id=uuid.uuid4().hex, path=path, offset=offset, max=self.chunk_size)
        delivery = self.session.publish(self._request_topic, encode_request(request), qos=1)
        if delivery.rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
            raise _Retry("connection lost while sending the request")
        if delivery.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise DownloadError(
                f"{path}: paho refused the request: {mqtt.error_string(delivery.rc)}"
            )
        end = min(time.monotonic() + self.timeout_s, deadline)
        while True:
            if delivery.refused:
                raise DownloadError(f"{path}: the broker refused the request: {delivery.reason}")
            lost = generation != self.session.generation or not self._granted.is_set()
            remaining = end - time.monotonic()
            if lost:
                raise _Retry("connection lost while waiting for the chunk")
            if remaining <= 0:
                raise _Retry(f"no answer in time (timeout {self.timeout_s:g} s)")
            try:
                resp = self._responses.get(timeout=min(_POLL_S, remaining))
            except queue.Empty:
                continue
            if resp.id == request.id:
                return resp
            self.stats.stale_responses += 1

    # -- session callbacks (network thread) ----------------------------------------

    def _on_suback(self, granted: bool, reason: str) -> None:
        if granted:
            self._granted.set()
        else:
            self._granted.clear()
            log.error("fetcher: %s", reason)

    def _on_down(self, reason: str) -> None:
        was_up = self._granted.is_set()
        self._granted.clear()
        if was_up:
            self.stats.disconnects += 1
        if was_up and self._started:
            log.warning("fetcher: %s", reason)

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        try:
            resp = decode_response(bytes(msg.payload), msg.properties)
        except FetchProtocolError as exc:
            self.stats.bad_responses += 1
            log.warning("fetcher: bad response on %s: %s", msg.topic, exc.reason)
            return
        try:
            self._responses.put_nowait(resp)
        except queue.Full:
            self.stats.dropped_responses += 1
            log.warning("fetcher: response queue full; dropped response %s", resp.id)
