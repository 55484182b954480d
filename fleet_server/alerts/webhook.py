"""Webhook deliveries: the body, its signature, and one POST.

The scheme (docs/alerts.md has a receiver): the body is the JSON of :func:`body`; the
server sends

- ``X-Edgefleet-Timestamp``: the Unix time (whole seconds) of this try;
- ``X-Edgefleet-Signature``: ``v1=`` and the hex HMAC-SHA256, keyed with the webhook's
  secret, of the bytes ``<timestamp>.<body>`` (the timestamp's decimal digits, a dot,
  the body exactly as received);
- ``X-Edgefleet-Delivery``: the delivery's id (the same on every try of one delivery);
- ``X-Edgefleet-Event``: ``alert.firing`` or ``alert.resolved``.

A receiver recomputes the HMAC over the timestamp it got and the raw body, compares in
constant time (:func:`verify`), refuses a timestamp more than its tolerance away from
its clock (a captured request can't be replayed later), and keeps the delivery ids of
that tolerance window to refuse a replay within it. Deliveries are at least once: a
receiver that answered but whose answer was lost gets the same delivery id again.

:func:`routes` is the routing of ``[alerts]``: which webhooks an alert goes to.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import ssl
import urllib.parse
from collections.abc import Mapping

from fleet_server.alerts.config import AlertsSection, WebhookConfig, rank
from fleet_server.alerts.rules import Condition
from fleet_server.alerts.store import AlertRow, Router
from fleet_server.errors import FleetError

FORMAT = 1
TIMESTAMP_HEADER = "X-Edgefleet-Timestamp"
SIGNATURE_HEADER = "X-Edgefleet-Signature"
DELIVERY_HEADER = "X-Edgefleet-Delivery"
EVENT_HEADER = "X-Edgefleet-Event"
SCHEME = "v1"
TOLERANCE_S = 300
"""How far a receiver should let a timestamp be from its clock (the example's default)."""
MAX_ANSWER_BYTES = 4096
"""The most bytes of a receiver's answer read (only the status counts)."""
USER_AGENT = "edgefleet-fleet-server"


class DeliveryFailed(FleetError):
    """A POST did not get a 2xx.

    Attributes:
        status: the HTTP status (None: no answer).
        reason: what went wrong.
    """

    def __init__(self, status: int | None, reason: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"webhook: {reason}")


class SignatureRefused(FleetError):
    """A webhook request whose signature or timestamp a receiver must refuse.

    Attributes:
        reason: why.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"webhook signature refused: {reason}")


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256(secret, b"<timestamp>." + body)>``."""
    mac = hmac.new(secret, str(int(timestamp)).encode() + b"." + body, hashlib.sha256)
    return f"{SCHEME}={mac.hexdigest()}"


def verify(
    secret: bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance_s: float = TOLERANCE_S,
) -> int:
    """Check a request as a receiver must; returns its timestamp.

    ``headers`` is looked up case-insensitively.

    Raises:
        SignatureRefused: a header missing or malformed, the timestamp too far from
            ``now``, or the signature not the body's.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    stamp = lower.get(TIMESTAMP_HEADER.lower())
    given = lower.get(SIGNATURE_HEADER.lower())
    if stamp is None or given is None:
        raise SignatureRefused(f"{TIMESTAMP_HEADER} and {SIGNATURE_HEADER} are both needed")
    if not stamp.isdigit() or len(stamp) > 12:
        raise SignatureRefused(f"{TIMESTAMP_HEADER} {stamp[:20]!r} is not Unix seconds")
    timestamp = int(stamp)
    if abs(now - timestamp) > tolerance_s:
        raise SignatureRefused(
            f"timestamp {timestamp} is {now - timestamp:+.0f} s from now (tolerance "
            f"{tolerance_s:g} s): a replay, or a clock off"
        )
    expected = signature(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), given.strip().encode()):
        raise SignatureRefused("the signature is not the body's (a wrong secret, or altered)")
    return timestamp


def body(alert: AlertRow, event: str, delivery_id: str) -> bytes:
    """The JSON a webhook gets: ``format``, ``event`` (firing or resolved), ``delivery_id``
    and the whole ``alert`` (its state now: a late firing delivery may carry an alert
    resolved since)."""
    doc = {"format": FORMAT, "event": event, "delivery_id": delivery_id, "alert": alert.to_dict()}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def headers(secret: bytes, timestamp: int, data: bytes, event: str, delivery_id: str
            ) -> dict[str, str]:  # fmt: skip
    """The headers of one try."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        TIMESTAMP_HEADER: str(int(timestamp)),
        SIGNATURE_HEADER: signature(secret, timestamp, data),
        DELIVERY_HEADER: delivery_id,
        EVENT_HEADER: f"alert.{event}",
    }


def post(hook: WebhookConfig, data: bytes, head: Mapping[str, str]) -> int:
    """POST ``data`` to the webhook; its status when 2xx. No redirect is followed.

    Raises:
        DeliveryFailed: no connection, no answer within ``timeout_s``, or not a 2xx.
    """
    parts = urllib.parse.urlsplit(hook.url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname or ""
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=str(hook.ca_file) if hook.ca_file else None)
        conn = http.client.HTTPSConnection(
            host, parts.port, timeout=hook.timeout_s, context=context
        )
    else:
        conn = http.client.HTTPConnection(host, parts.port, timeout=hook.timeout_s)
    try:
        conn.request("POST", path, body=data, headers=dict(head))
        answer = conn.getresponse()
        answer.read(MAX_ANSWER_BYTES)
        status = int(answer.status)
    except TimeoutError:
        raise DeliveryFailed(None, f"no answer within {hook.timeout_s:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryFailed(None, f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    if not 200 <= status < 300:
        raise DeliveryFailed(status, f"answered {status}")
    return status


def routes(section: AlertsSection) -> Router:
    """Which webhooks a condition's alert goes to (see :mod:`fleet_server.alerts.config`)."""
    by_rule = section.rules.by_name()

    def route(c: Condition) -> list[str]:
        rule = by_rule.get(c.rule)
        named = None if rule is None else rule.webhooks
        out = []
        for hook in section.webhooks:
            if named is not None and hook.name not in named:
                continue
            if hook.rules and c.rule not in hook.rules:
                continue
            if hook.sites and not set(hook.sites) & set(c.sites):
                continue
            if rank(c.severity) < rank(hook.min_severity):
                continue
            out.append(hook.name)
        return out

    return route


__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TOLERANCE_S",
    "DeliveryFailed",
    "SignatureRefused",
    "body",
    "headers",
    "post",
    "routes",
    "signature",
    "verify",
]
