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
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode

from agent.kernel.mqtt import Delivery, MqttSession, SessionOptions
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
        share_group: subscribe as a member of this shared-subscription group
            (``$share/<group>/...``): each request goes to one server of the group, so
            several replicas answer it once. A secret, like the ingest group
            (:func:`fleet_server.broker.identity.files_group`).
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
        share_group: str | None = None,
    ) -> None:
        self.repo_dir = Path(repo_dir)
        self.host, self.port = host, port
        self.keepalive_s = keepalive_s
        self.stats = ServerStats()
        self._started = False
        self.session = MqttSession(
            "file-server",
            SessionOptions(
                host=host,
                port=port,
                client_id=client_id or f"fleet-file-server-{uuid.uuid4().hex[:8]}",
                keepalive_s=keepalive_s,
                clean_start=True,
                tls=tls_context,
                username=username,
                password=password,
                reconnect_min_s=RECONNECT_MIN_S,
                reconnect_max_s=RECONNECT_MAX_S,
                check_s=check_s,
            ),
        )
        self.guard = self.session.guard
        requests = topics.fetch_request_filter()
        self.topic_filter = (
            requests if share_group is None else topics.shared(share_group, requests)
        )
        self._requests = self.session.subscribe(
            self.topic_filter,
            self._on_message,
            qos=1,
            answer=self._answer_failure,
        )

    @property
    def _client(self) -> mqtt.Client:
        return self.session.client

    @property
    def _last_error(self) -> str:
        return self._requests.error or self.session.last_error

    @property
    def ready(self) -> bool:
        """Whether connected and subscribed to the fetch requests."""
        return self._requests.granted.is_set()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until connected and subscribed; whether it is."""
        return self._requests.granted.wait(timeout_s)

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
        self.session.start()
        if not self.wait_ready(timeout_s):
            error = self._last_error
            self.stop()
            raise FileServerError(
                f"not subscribed on {self.host}:{self.port} within {timeout_s:g} s "
                f"{f'({error})' if error else ''}".strip()
            )

    def stop(self) -> None:
        """Disconnect and stop the network thread; idempotent."""
        if not self._started:
            return
        self._started = False
        self.session.stop()

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

    def _answer_failure(self, msg: mqtt.MQTTMessage) -> None:
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

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
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
        delivery = self.session.publish(
            topics.fetch_response(device_id),
            response.data,
            qos=1,
            properties=response_properties(response),
        )
        if delivery.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.stats.publish_failures += 1
            log.warning(
                "file server: answer to %s not sent: %s",
                device_id,
                mqtt.error_string(delivery.rc),
            )
            return
        delivery.add_done_callback(self._answered)
        if response.status == STATUS_OK:
            self.stats.chunks += 1
            self.stats.bytes += size
            self.stats.max_chunk = max(self.stats.max_chunk, size)
        self.stats.recent.append(Served(device_id, path, response.offset, size, response.status))

    def _answered(self, delivery: Delivery) -> None:
        if delivery.refused:  # the broker would not take the answer (ACL, quota)
            self.stats.publish_failures += 1
