"""Serves repository files to devices over MQTT, in chunks of at most 256 KiB.

Answers every device's fetch requests (:func:`agent.wire.topics.fetch_request_filter`) on
that device's own response topic, by the protocol of :mod:`agent.wire.fetch`. Only files
under ``<repo>/metadata`` and ``<repo>/targets`` are served; ``..``, absolute paths and
links that leave those folders are refused. The server trusts nothing a device sends and
devices trust nothing it sends: they verify every byte against signed metadata.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from agent.kernel.mqttguard import MqttGuard
from agent.wire import topics
from agent.wire.fetch import (
    MAX_CHUNK,
    STATUS_ERROR,
    STATUS_NOT_FOUND,
    STATUS_OK,
    FetchProtocolError,
    FetchResponse,
    check_path,
    decode_request,
    request_id_of,
    response_properties,
)
from fleet_server.errors import FleetError
from fleet_server.health import PartHealth

log = logging.getLogger(__name__)

RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 10
RECENT = 1024


class FileServerError(FleetError):
    """The file server can't start, or refuses a request.

    Attributes:
        reason: what is wrong.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"file server: {reason}")


@dataclass(frozen=True)
class Served:
    """One answered request (kept in :attr:`ServerStats.recent`)."""

    device_id: str
    path: str
    offset: int
    size: int
    status: str


@dataclass
class ServerStats:
    """Counters of the file server."""

    requests: int = 0
    chunks: int = 0
    bytes: int = 0
    max_chunk: int = 0
    not_found: int = 0
    refused: int = 0
    failed: int = 0
    """Requests whose handler raised (answered with an error when the id was readable)."""
    publish_failures: int = 0
    recent: deque[Served] = field(default_factory=lambda: deque(maxlen=RECENT))


class MqttFileServer:
    """Answers fetch requests from ``repo_dir`` through the broker at ``host:port``.

    Args:
        repo_dir: the repository (``metadata/`` and ``targets/`` below it).
        host, port: the fleet broker.
    """

    def __init__(
        self,
        repo_dir: Path,
        host: str,
        port: int,
        *,
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        keepalive_s: int = 30,
        tls_context: ssl.SSLContext | None = None,
        check_s: float = 1.0,
    ) -> None:
        self.repo_dir = Path(repo_dir)
        self.host, self.port = host, port
        self.keepalive_s = keepalive_s
        self.stats = ServerStats()
        self._ready = threading.Event()
        self._started = False
        self._last_error = ""
        cid = client_id or f"fleet-file-server-{uuid.uuid4().hex[:8]}"
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5)
        if username:
            client.username_pw_set(username, password)
        if tls_context is not None:
            client.tls_set_context(tls_context)
        client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
        guard = MqttGuard("file-server", check_s=check_s)
        client.on_connect = guard.wrap("on_connect", self._on_connect)
        client.on_disconnect = guard.wrap("on_disconnect", self._on_disconnect)
        client.on_subscribe = guard.wrap("on_subscribe", self._on_subscribe)
        client.on_message = guard.wrap("on_message", self._on_message, answer=self._answer_failure)
        self.guard = guard
        self._client = client

    @property
    def ready(self) -> bool:
        """Whether connected and subscribed to the fetch requests."""
        return self._ready.is_set()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until connected and subscribed; whether it is."""
        return self._ready.wait(timeout_s)

    def start(self, timeout_s: float = 10.0) -> None:
        """Connect, subscribe, and keep reconnecting in the background.

        Raises:
            FileServerError: the repository has no metadata/ folder, or not subscribed
                within ``timeout_s`` (the server is stopped again).
        """
        if not (self.repo_dir / "metadata").is_dir():
            raise FileServerError(f"{self.repo_dir} has no metadata/ folder")
        if self._started:
            return
        self._started = True
        self.guard.start(
            self._client,
            lambda: self._client.connect_async(
                self.host, self.port, self.keepalive_s, clean_start=True
            ),
            on_restart=self._ready.clear,
        )
        if not self._ready.wait(timeout_s):
            self.stop()
            raise FileServerError(
                f"not subscribed on {self.host}:{self.port} within {timeout_s:g} s "
                f"{self._last_error}".strip()
            )

    def stop(self) -> None:
        """Disconnect and stop the network thread; idempotent."""
        if not self._started:
            return
        self._started = False
        self.guard.stop()
        self._client.disconnect()
        self._client.loop_stop()
        self._ready.clear()

    def read_chunk(self, path: str, offset: int, max_len: int) -> tuple[bytes, int]:
        """At most ``max_len`` bytes of the repository file ``path`` from ``offset``, and
        the file's size.

        Raises:
            FileNotFoundError: no such regular file.
            FileServerError: the path is not served, or the offset is past the end.
            OSError: the file can't be read.
        """
        try:
            rel = check_path(path)
        except FetchProtocolError as exc:
            raise FileServerError(exc.reason) from exc
        top = (self.repo_dir / rel.split("/", 1)[0]).resolve(strict=True)
        real = (self.repo_dir / rel).resolve(strict=True)
        if not real.is_relative_to(top):
            raise FileServerError(f"{path!r} resolves outside {top.name}/")
        if not real.is_file():
            raise FileNotFoundError(path)
        with real.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size:
                raise FileServerError(f"offset {offset} is past the end of {path} ({size})")
            f.seek(offset)
            return f.read(min(max_len, MAX_CHUNK)), size

    def health(self) -> PartHealth:
        """Ok while the network thread runs and the server is connected and subscribed;
        the detail counts requests served and failed."""
        stats = self.stats
        detail: dict[str, Any] = {
            "connected": self.ready,
            "requests": stats.requests,
            "chunks": stats.chunks,
            "refused": stats.refused,
            "not_found": stats.not_found,
            "failed": stats.failed,
            "publish_failures": stats.publish_failures,
            **self.guard.snapshot(),
        }
        if self._last_error:
            detail["error"] = self._last_error
        return PartHealth(self._started and self.ready and self.guard.thread_alive, detail)

    # -- paho callbacks (network thread) ------------------------------------------

    def _answer_failure(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        """After the handler raised: an error answer when the request's id can be read."""
        self.stats.failed += 1
        device_id = topics.device_of(msg.topic)
        request_id = request_id_of(bytes(msg.payload))
        if request_id is not None:
            self._answer(
                device_id,
                "",
                FetchResponse(request_id, STATUS_ERROR, reason="the server failed on this request"),
            )

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.stats.requests += 1
        payload = bytes(msg.payload)
        try:
            device_id = topics.device_of(msg.topic)
        except ValueError as exc:
            self.stats.refused += 1
            log.warning("file server: %s", exc)
            return
        try:
            request = decode_request(payload)
        except FetchProtocolError as exc:
            self.stats.refused += 1
            log.warning("file server: device %s: %s", device_id, exc.reason)
            request_id = request_id_of(payload)
            if request_id is not None:
                self._answer(
                    device_id, "", FetchResponse(request_id, STATUS_ERROR, reason=exc.reason)
                )
            return
        try:
            data, total = self.read_chunk(request.path, request.offset, request.max)
            response = FetchResponse(request.id, STATUS_OK, request.offset, total, data)
        except FileNotFoundError:
            self.stats.not_found += 1
            response = FetchResponse(request.id, STATUS_NOT_FOUND, reason=request.path)
        except FileServerError as exc:
            self.stats.refused += 1
            log.warning("file server: device %s: %s", device_id, exc.reason)
            response = FetchResponse(request.id, STATUS_ERROR, reason=exc.reason)
        except OSError as exc:
            log.error("file server: reading %s: %s", request.path, exc)  # noqa: TRY400
            response = FetchResponse(request.id, STATUS_ERROR, reason="read failed")
        self._answer(device_id, request.path, response)

    def _answer(self, device_id: str, path: str, response: FetchResponse) -> None:
        size = len(response.data)
        info = self._client.publish(
            topics.fetch_response(device_id),
            response.data,
            qos=1,
            properties=response_properties(response),
        )
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.stats.publish_failures += 1
            log.warning(
                "file server: answer to %s not sent: %s", device_id, mqtt.error_string(info.rc)
            )
            return
        if response.status == STATUS_OK:
            self.stats.chunks += 1
            self.stats.bytes += size
            self.stats.max_chunk = max(self.stats.max_chunk, size)
        self.stats.recent.append(Served(device_id, path, response.offset, size, response.status))

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        if reason.is_failure:
            self._last_error = f"(broker refused the connection: {reason})"
            log.error("file server: broker %s:%d refused: %s", self.host, self.port, reason)
            return
        result, _ = client.subscribe(topics.fetch_request_filter(), qos=1)
        if result != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._last_error = f"(subscribe failed: {mqtt.error_string(result)})"
            log.error("file server: subscribe failed: %s", mqtt.error_string(result))

    def _on_subscribe(
        self, _client: mqtt.Client, _userdata: Any, _mid: int, codes: list[ReasonCode], _p: Any
    ) -> None:
        failed = [str(code) for code in codes if code.is_failure]
        if failed:
            self._last_error = f"(subscription refused: {', '.join(failed)})"
            log.error("file server: subscription refused: %s", failed)
            return
        self._last_error = ""
        self._ready.set()

    def _on_disconnect(
        self, _client: mqtt.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _props: Any
    ) -> None:
        was_up = self._ready.is_set()
        self._ready.clear()
        if was_up and self._started:
            log.warning("file server: lost broker %s:%d: %s", self.host, self.port, reason)
