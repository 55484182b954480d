"""The ``[alerts]`` section of the fleet server's configuration (docs/alerts.md).

```toml
[alerts]
interval_s = 30                       # the leader evaluates every rule this often

[alerts.rules.device_offline]
after_minutes = 15
webhooks = ["plant-a-ops"]            # unset: every webhook whose filters take it

[[alerts.webhooks]]
name = "plant-a-ops"
url = "https://hooks.example.com/edgefleet"
secret_env = "EDGEFLEET_WEBHOOK_PLANT_A"  # a credential's name, never the secret
sites = ["plant-a"]                   # only alerts about devices of this site
```

A rule is one kind of condition the leader looks for (:mod:`fleet_server.alerts.rules`);
each has ``enabled``, ``severity`` and ``webhooks`` (None: every webhook; ``[]``: the
console and ``fleetctl alerts`` only), and its own thresholds. A webhook takes an alert
when the rule routes to it, the alert's rule is in its ``rules`` (empty: any), one of the
alert's sites is in its ``sites`` (empty: any alert, site or not) and the alert is at
least ``min_severity``.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent.kernel.configbase import Section

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_DAYS = 3650.0


def rank(severity: str) -> int:
    """``info`` 0, ``warning`` 1, ``critical`` 2 (an unknown word ranks lowest)."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


def _severity(default: Severity) -> Severity:
    return Field(default, description="info, warning or critical.")


def _webhooks() -> list[str] | None:
    return Field(
        None,
        description="Webhooks (names of [[alerts.webhooks]]) this rule's alerts go to; "
        "unset: every webhook whose own filters take them; []: none (console and "
        "fleetctl only).",
    )


class Rule(Section):
    """What every rule has."""

    enabled: bool = Field(True, description="Look for this condition.")
    severity: Severity = _severity("warning")
    webhooks: list[str] | None = _webhooks()


class GateStoppedRule(Rule):
    """``rollout_gate_stopped``: a rollout paused or rolling back because a gate failed;
    resolved when it is resumed, cancelled or its rollback finished."""

    severity: Severity = _severity("critical")


class RolledBackRule(Rule):
    """``rollout_rolled_back``: a rollout that ended rolled back (by a gate or an
    operator); resolved ``hold_minutes`` after it ended."""

    severity: Severity = _severity("critical")
    hold_minutes: float = Field(
        60.0,
        gt=0,
        le=MAX_DAYS * 1440,
        description="Minutes the alert stays firing after the rollback ended.",
    )


class AwaitingApprovalRule(Rule):
    """``rollout_awaiting_approval``: a wave passed and the next waits for an operator's
    approval; resolved once approved (or the rollout left that phase)."""

    severity: Severity = _severity("info")
    after_minutes: float = Field(
        0.0, ge=0, le=MAX_DAYS * 1440, description="Minutes it has waited before it fires."
    )


class StuckRule(Rule):
    """``device_stuck_reverting``: a device whose revert can't finish (``stuck`` in a
    rollout); resolved when an operator resolved it or the revert finished."""

    severity: Severity = _severity("critical")


class OfflineRule(Rule):
    """``device_offline``: a device whose session ended (its last will) longer than
    ``after_minutes`` ago and has not come back; a device never connected is not offline."""

    after_minutes: float = Field(
        15.0, gt=0, le=MAX_DAYS * 1440, description="Minutes offline before it fires."
    )


class DriftRule(Rule):
    """``drift``: the drift job flagged a (model version, line) as drifted; resolved when
    it clears the flag."""


class BacklogRule(Rule):
    """``review_backlog``: decisions a device sent for review (outcome ``review``) in the
    last ``window_hours`` that nobody has reviewed, per line, over ``max_pending``."""

    max_pending: int = Field(
        500, ge=1, le=10**9, description="Unreviewed decisions on one line before it fires."
    )
    window_hours: float = Field(
        24.0,
        gt=0,
        le=24 * 90,
        description="Only decisions of the last this many hours count (bounds the query).",
    )


class StationRule(Rule):
    """``station_deadline_missed`` / ``station_overruns``: a station's count (from its
    device's health reports) rose by at least ``min_count`` within ``window_minutes``;
    resolved when a window passes with less."""

    min_count: int = Field(1, ge=1, le=10**9, description="The rise that fires.")
    window_minutes: float = Field(
        15.0, gt=0, le=1440, description="The window the rise is measured over."
    )


class DiskRule(Rule):
    """``disk_over_budget``: a device's state directory uses more than its disk budget
    (``[agent] disk_budget_mb``, as its health reports say), or its data disk has less
    than ``min_free_mb`` free."""

    min_free_mb: float = Field(
        512.0,
        ge=0,
        le=16 * 1024 * 1024,
        description="Free MiB on the device's data disk below which it fires (0: only the "
        "budget counts).",
    )


class CertificateRule(Rule):
    """``certificate_expiry``: a device's certificate (of a device not revoked) or one of
    the server's (the fleet CA, the managed brokers', the server's MQTT identities)
    expires within ``within_days``."""

    within_days: float = Field(30.0, gt=0, le=MAX_DAYS, description="Days before expiry.")


class TufRule(Rule):
    """``tuf_expiry``: a role of the bundle repository (root, targets, snapshot,
    timestamp) has less than ``min_left`` of its validity period left (``fleetctl repo
    refresh`` re-signs the online roles at half; root is re-signed offline)."""

    severity: Severity = _severity("critical")
    min_left: float = Field(
        0.25, gt=0, lt=1, description="The share of the role's validity period left."
    )


class RulesSection(Section):
    """Every rule, by name."""

    rollout_gate_stopped: GateStoppedRule = Field(
        default_factory=GateStoppedRule, description="A gate stopped a rollout."
    )
    rollout_rolled_back: RolledBackRule = Field(
        default_factory=RolledBackRule, description="A rollout ended rolled back."
    )
    rollout_awaiting_approval: AwaitingApprovalRule = Field(
        default_factory=AwaitingApprovalRule, description="A rollout waits for approval."
    )
    device_stuck_reverting: StuckRule = Field(
        default_factory=StuckRule, description="A device can't finish its revert."
    )
    device_offline: OfflineRule = Field(
        default_factory=OfflineRule, description="A device offline longer than N minutes."
    )
    drift: DriftRule = Field(default_factory=DriftRule, description="Drift on a line.")
    review_backlog: BacklogRule = Field(
        default_factory=BacklogRule, description="Unreviewed decisions on a line over N."
    )
    station_deadline_missed: StationRule = Field(
        default_factory=lambda: StationRule(min_count=5),
        description="A station's missed deadlines (default: 5 in 15 minutes).",
    )
    station_overruns: StationRule = Field(
        default_factory=lambda: StationRule(min_count=5),
        description="A station's overruns (default: 5 in 15 minutes).",
    )
    disk_over_budget: DiskRule = Field(
        default_factory=DiskRule, description="A device's disk over its budget."
    )
    certificate_expiry: CertificateRule = Field(
        default_factory=CertificateRule, description="A certificate near expiry."
    )
    tuf_expiry: TufRule = Field(
        default_factory=TufRule, description="A repository role near expiry."
    )

    def by_name(self) -> dict[str, Rule]:
        """Every rule, by its name."""
        return {name: getattr(self, name) for name in type(self).model_fields}


RULE_NAMES: tuple[str, ...] = tuple(RulesSection.model_fields)


class WebhookConfig(Section):
    """One receiver of alerts: an HTTP(S) URL that gets a signed POST per firing and per
    resolved alert it takes (docs/alerts.md has the signature scheme)."""

    name: str = Field(description="The webhook's name (rules route by it).")
    url: str = Field(description="http:// or https:// URL the alerts are POSTed to.")
    secret_env: str = Field(
        description="Name of the environment variable (or $CREDENTIALS_DIRECTORY file) "
        "holding the HMAC-SHA256 key (at least 16 characters); never the key itself."
    )
    rules: list[str] = Field(
        default_factory=list, description="Only these rules' alerts (empty: any rule)."
    )
    sites: list[str] = Field(
        default_factory=list,
        description="Only alerts about these sites (a device's site label; a rollout's, a "
        "line's devices'); empty: every alert, with a site or not.",
    )
    min_severity: Severity = Field("info", description="Only alerts at least this severe.")
    timeout_s: float = Field(
        5.0, gt=0, le=60, description="Seconds one POST may take (connect and answer)."
    )
    ca_file: Path | None = Field(
        None, description="CA bundle for an https:// URL with a private CA (default: the system's)."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r}: 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("the URL must not hold a user or password (sign with secret_env)")
        return value

    @field_validator("secret_env")
    @classmethod
    def _env(cls, value: str) -> str:
        if not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable name")
        return value

    @field_validator("rules")
    @classmethod
    def _rules(cls, value: list[str]) -> list[str]:
        unknown = [r for r in value if r not in RULE_NAMES]
        if unknown:
            raise ValueError(f"unknown rule(s) {unknown}; rules are {', '.join(RULE_NAMES)}")
        return value


class DeliverySection(Section):
    """Retries of a webhook POST that failed (no answer, or not a 2xx)."""

    attempts: int = Field(
        8, ge=1, le=100, description="POSTs tried before the delivery goes to the dead letters."
    )
    backoff_s: float = Field(
        5.0, gt=0, le=3600, description="Seconds before the first retry; doubled each time."
    )
    max_backoff_s: float = Field(
        600.0, gt=0, le=86_400, description="The longest wait between two tries."
    )
    poll_s: float = Field(
        1.0, gt=0, le=60, description="Seconds between two looks for deliveries that are due."
    )
    batch: int = Field(
        50, ge=1, le=10_000, description="Deliveries tried per look (the rest wait for the next)."
    )


class AlertsSection(Section):
    """Alerts on fleet events, evaluated by the leader, delivered to signed webhooks."""

    enabled: bool = Field(True, description="Evaluate the rules in fleet-server serve.")
    interval_s: float = Field(
        30.0, gt=0, le=3600, description="Seconds between two evaluations of the rules."
    )
    slow_interval_s: float = Field(
        3600.0,
        gt=0,
        le=86_400,
        description="Seconds between two looks at certificates and repository metadata "
        "(they change by days; reading every device's certificate is the costly part).",
    )
    rules: RulesSection = Field(default_factory=RulesSection, description="The rules.")
    webhooks: list[WebhookConfig] = Field(
        default_factory=list, description="Receivers of signed alert POSTs."
    )
    delivery: DeliverySection = Field(
        default_factory=DeliverySection, description="Retries and dead letters."
    )

    @model_validator(mode="after")
    def _routes(self) -> AlertsSection:
        names = [w.name for w in self.webhooks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"webhook name(s) {twice} used more than once")
        for rule_name, rule in self.rules.by_name().items():
            unknown = [w for w in rule.webhooks or [] if w not in names]
            if unknown:
                raise ValueError(
                    f"rules.{rule_name}.webhooks names {unknown}, not a webhook of "
                    f"[[alerts.webhooks]] ({', '.join(names) or 'none configured'})"
                )
        return self


__all__ = [
    "RULE_NAMES",
    "SEVERITIES",
    "AlertsSection",
    "DeliverySection",
    "RulesSection",
    "Severity",
    "WebhookConfig",
    "rank",
]
