"""Sending the deliveries that are due: one signed POST each, retried with backoff, then
the dead letters.

A try that gets a 2xx marks the delivery ``delivered``. Any other answer, or none, counts
a try: the next comes ``backoff_s`` later, doubled after each (at most
``max_backoff_s``), and after ``attempts`` tries the delivery is ``dead``, listed in the
console and by ``fleetctl alerts dead-letters`` until an operator sends it again or
retention removes its alert. A delivery to a webhook no longer configured is dead at
once. Only the leader sends (``should_go_on``), one delivery at a time, each try with
its own timestamp and signature.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from fleet_server.alerts import store
from fleet_server.alerts.config import AlertsSection, DeliverySection, WebhookConfig
from fleet_server.alerts.webhook import DeliveryFailed, body, headers, post

log = logging.getLogger(__name__)

Post = Callable[[WebhookConfig, bytes, Mapping[str, str]], int]


def backoff_s(delivery: DeliverySection, tries: int) -> float:
    """Seconds after the ``tries``-th failed try before the next."""
    return float(min(delivery.max_backoff_s, delivery.backoff_s * 2 ** max(0, tries - 1)))


@dataclass
class DeliveryStats:
    """Counts since start (the health probe's detail)."""

    sent: int = 0
    failed_tries: int = 0
    dead: int = 0
    last_error: str = ""
    by_webhook: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, webhook: str, what: str) -> None:
        per = self.by_webhook.setdefault(webhook, {"sent": 0, "failed_tries": 0, "dead": 0})
        per[what] += 1


class Deliverer:
    """Sends the due deliveries of ``engine`` to the webhooks of ``section`` with their
    secrets (name -> key)."""

    def __init__(
        self,
        engine: Engine,
        section: AlertsSection,
        secrets: Mapping[str, bytes],
        *,
        post: Post = post,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.section = section
        self.secrets = dict(secrets)
        self.hooks = {w.name: w for w in section.webhooks}
        self.post = post
        self.clock = clock
        self.stats = DeliveryStats()

    def run_once(self, should_go_on: Callable[[], bool] = lambda: True) -> int:
        """Try every delivery due now (at most ``[alerts.delivery] batch``); how many
        were tried. Stops between two when ``should_go_on()`` turns False."""
        cfg = self.section.delivery
        due = store.due_deliveries(self.engine, self.clock(), cfg.batch)
        tried = 0
        for d in due:
            if not should_go_on():
                break
            self.send(d)
            tried += 1
        return tried

    def send(self, d: store.DeliveryRow) -> bool:
        """One try of ``d``; whether it was delivered."""
        cfg = self.section.delivery
        hook = self.hooks.get(d.webhook)
        secret = self.secrets.get(d.webhook)
        tries = d.attempts + 1
        if hook is None or secret is None:
            self._failed(
                d, tries, None, f"webhook {d.webhook!r} is no longer configured", dead=True
            )
            return False
        data = body(d.alert, d.event, d.delivery_id)
        now = self.clock()
        try:
            status = self.post(hook, data, headers(secret, int(now), data, d.event, d.delivery_id))
        except DeliveryFailed as exc:
            self._failed(d, tries, exc.status, exc.reason, dead=tries >= cfg.attempts)
            return False
        store.mark_delivered(self.engine, d.delivery_id, attempts=tries, status=status,
                             now=self.clock())  # fmt: skip
        self.stats.sent += 1
        self.stats.count(d.webhook, "sent")
        return True

    def _failed(self, d: store.DeliveryRow, tries: int, status: int | None, reason: str, *,
                dead: bool) -> None:  # fmt: skip
        now = self.clock()
        next_at = None if dead else now + backoff_s(self.section.delivery, tries)
        store.mark_failed(self.engine, d.delivery_id, attempts=tries, status=status,
                          error=reason, next_at=next_at, now=now)  # fmt: skip
        self.stats.failed_tries += 1
        self.stats.count(d.webhook, "failed_tries")
        self.stats.last_error = f"{d.webhook}: {reason}"
        if dead:
            self.stats.dead += 1
            self.stats.count(d.webhook, "dead")
            log.warning(
                "alerts: delivery %s (%s of alert %d) to %s is dead after %d tries: %s",
                d.delivery_id, d.event, d.alert.alert_id, d.webhook, tries, reason,
            )  # fmt: skip
        else:
            log.info("alerts: delivery %s to %s failed (try %d): %s; again in %.1f s",
                     d.delivery_id, d.webhook, tries, reason, (next_at or now) - now)  # fmt: skip


__all__ = ["Deliverer", "DeliveryStats", "backoff_s"]
