"""Answers and chunks of a remote action, through the device's MQTT session, within a
rate.

Each message is published with QoS 1 and waited for (the broker's PUBACK, at most
:data:`ACK_TIMEOUT_S`): one chunk in flight at a time, so a request never holds more
than a chunk of the device's memory or of paho's queue, and a link that went down
ends the upload with a failure that says which chunk. A token bucket holding one chunk
keeps the uploads of remote actions under ``[remote] rate_kb_s``; the decision uploads
and health reports of the uplink share the link and are not starved.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt

from agent.kernel.mqtt import MqttSession
from agent.wire import topics
from agent.wire.actions import (
    ENCODING_BASE64,
    ENCODING_TEXT,
    ActionChunk,
    ActionResult,
)
from agent.wire.codec import encode

ACK_TIMEOUT_S = 15.0


class UploadFailed(Exception):
    """A message of the upload was not taken by the broker (link down, refused).

    Attributes:
        reason: what failed.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


Publish = Callable[[str, bytes], None]
"""Publish one payload on a topic, QoS 1, and wait for the broker; raises UploadFailed."""


def session_publisher(session: MqttSession, stop: threading.Event) -> Publish:
    """:data:`Publish` over ``session``."""

    def publish(topic: str, payload: bytes) -> None:
        delivery = session.publish(topic, payload, qos=1)
        if not delivery.queued:
            raise UploadFailed(f"not sent: {mqtt.error_string(delivery.rc)}")
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while not delivery.wait(0.2):
            if stop.is_set() or time.monotonic() >= deadline:
                raise UploadFailed(f"the broker did not acknowledge in {ACK_TIMEOUT_S:g} s")
        if delivery.refused:
            raise UploadFailed(f"the broker refused it: {delivery.reason}")

    return publish


class TokenBucket:
    """At most ``rate`` bytes a second on average, bursts of ``capacity`` bytes."""

    def __init__(
        self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.capacity = capacity
        self._tokens = capacity
        self._clock = clock
        self._at = clock()
        self.waited_s = 0.0

    def delay(self, n: int) -> float:
        """Take ``n`` bytes; how long to wait before sending them."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= n
        if self._tokens >= 0:
            return 0.0
        wait = -self._tokens / self.rate
        self.waited_s += wait
        return wait


@dataclass
class Upload:
    """The answers and chunks of one request."""

    publish: Publish
    device_id: str
    request_id: str
    action: str
    counter: int | None
    chunk_bytes: int
    bucket: TokenBucket
    stop: threading.Event
    chunks: int = 0
    sent_bytes: int = 0
    _sha: Any = field(default_factory=hashlib.sha256)

    @property
    def sha256(self) -> str:
        return str(self._sha.hexdigest())

    def answer(self, status: str, reason: str = "", **detail: Any) -> None:
        """Publish an answer (``accepted``, ``running``, ``ok``, ``refused``, ``failed``);
        a final one carries the chunk count, bytes and digest of all that was sent.

        Raises:
            UploadFailed: the broker did not take it.
        """
        result = ActionResult(
            device_id=self.device_id,
            request_id=self.request_id,
            status=status,
            action=self.action,
            counter=self.counter,
            reason=reason[:2000],
            ts=time.time(),
            chunks=self.chunks,
            bytes=self.sent_bytes,
            sha256=self.sha256 if self.chunks else "",
            detail=detail,
        )
        self.publish(topics.action_result(self.device_id), encode(result))

    def _send(self, data: bytes, encoding: str) -> None:
        wait = self.bucket.delay(len(data))
        if wait > 0 and self.stop.wait(wait):
            raise UploadFailed("the agent is stopping")
        text = (
            data.decode("utf-8") if encoding == ENCODING_TEXT else base64.b64encode(data).decode()
        )
        chunk = ActionChunk(
            device_id=self.device_id,
            request_id=self.request_id,
            seq=self.chunks,
            encoding=encoding,
            data=text,
            ts=time.time(),
        )
        self.publish(topics.action_chunk(self.device_id), encode(chunk))
        self.chunks += 1
        self.sent_bytes += len(data)
        self._sha.update(data)

    def text(self, lines: Iterable[str], budget: int) -> tuple[int, bool]:
        """Send ``lines`` in chunks of whole lines, at most ``budget`` bytes; (lines sent,
        whether some were left out for the budget). A line longer than a chunk is cut."""
        sent, cut, buf = 0, False, bytearray()
        for line in lines:
            data = _whole_utf8((line + "\n").encode("utf-8", errors="replace")[: self.chunk_bytes])
            if len(data) > budget:
                cut = True
                break
            if buf and len(buf) + len(data) > self.chunk_bytes:
                self._send(bytes(buf), ENCODING_TEXT)
                buf.clear()
            buf += data
            budget -= len(data)
            sent += 1
        if buf:
            self._send(bytes(buf), ENCODING_TEXT)
        return sent, cut

    def binary(self, data: bytes) -> None:
        """Send ``data`` in chunks (base64)."""
        for start in range(0, len(data), self.chunk_bytes):
            self._send(data[start : start + self.chunk_bytes], ENCODING_BASE64)


def _whole_utf8(data: bytes) -> bytes:
    """``data`` without a UTF-8 sequence cut at its end (a line cut to a chunk)."""
    return data.decode("utf-8", errors="ignore").encode("utf-8")
