"""The fleet server's configuration file (TOML): typed, strict, errors naming file and field.

Relative paths are taken from the config file's directory. Paths left out default to a
layout under ``[server] state_dir``: ``fleet.db``, ``ca/``, ``broker/``, ``identity/``,
``repository/`` and ``keystore/``. Secrets (the operator API token, key passphrases) are
named here, never given: they come from the environment or ``$CREDENTIALS_DIRECTORY``.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from agent.kernel.configbase import Section, dotted
from agent.kernel.errors import ConfigError
from agent.kernel.toml import load_toml_file
from fleet_server.alerts.config import AlertsSection
from fleet_server.auth.config import AuthSection
from fleet_server.broker import MosquittoConfig
from fleet_server.broker.identity import guessable_group
from fleet_server.broker.section import MAIN_SHARD, BrokerSection
from fleet_server.db import sqlite_url
from fleet_server.metrics.config import MetricsSection
from fleet_server.repository.keys import DEFAULT_PASSPHRASE_NAME
from fleet_server.retention.config import RetentionSection

DEFAULT_CONFIG = "/etc/edgefleet/fleet.toml"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_BROKER_PATHS = ("state_dir", "cafile", "crlfile", "certfile", "keyfile")
"""MosquittoConfig paths that default to the fleet's state directory layout."""


class ServerSection(Section):
    """Where the fleet server keeps its state."""

    state_dir: Path = Field(
        Path("/var/lib/edgefleet"),
        description="State directory (database, CA, broker files, repository); a relative "
        "path is taken from the config file's directory.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of the fleet-server process."
    )
    passphrase_name: str = Field(
        DEFAULT_PASSPHRASE_NAME,
        description="Name of the passphrase variables / credentials of the CA and "
        "repository keys (NAME_<ROLE>, then NAME).",
    )

    @field_validator("passphrase_name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable name")
        return value


class HttpSection(Section):
    """The HTTP API's listener and its operator authentication."""

    host: str = Field("127.0.0.1", description="Address the API binds to.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    operator_token_env: str | None = Field(
        None,
        description="Name of the environment variable (or $CREDENTIALS_DIRECTORY file) "
        "holding the operator API token ('Authorization: Bearer <token>', the operator "
        "role; for scripts and fleetctl). Without it only signed-in users reach the API "
        "(every endpoint but enrollment, /healthz and /login needs one or the other). "
        "Required on a non-loopback host.",
    )
    max_concurrency: int = Field(
        100, ge=1, le=10_000, description="Requests served at once; more are answered 503."
    )
    shutdown_timeout_s: float = Field(
        5.0, gt=0, le=300, description="How long stopping waits for requests in flight."
    )
    max_body_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="The largest request body the API takes (bytes). A larger one is "
        "answered 413 before it is read when its Content-Length says so, or as soon as "
        "the bytes streamed pass the limit when it has none (chunked).",
    )
    max_small_body_bytes: int = Field(
        64 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="The same for what anyone may send without signing in: POST /login, "
        "/logout and /api/v1/enroll (a CSR is a few KiB), and the console's form posts "
        "under /ui/ (read before the session is checked).",
    )

    @field_validator("operator_token_env")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not a variable name")
        return value

    @model_validator(mode="after")
    def _token_off_loopback(self) -> HttpSection:
        if self.operator_token_env is None and not _is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is not loopback: set operator_token_env so that "
                "operator endpoints need a token"
            )
        return self


class DatabaseSection(Section):
    """The fleet database."""

    url: str | None = Field(
        None,
        description="SQLAlchemy URL (postgresql+psycopg://HOST/DB or sqlite:///PATH); "
        "default: an SQLite file fleet.db in state_dir.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            backend = make_url(value).get_backend_name()
        except ArgumentError:
            raise ValueError(
                "not a database URL (sqlite:///PATH or postgresql+psycopg://...)"
            ) from None
        if backend not in ("sqlite", "postgresql"):
            raise ValueError(f"database {backend!r} is not supported (sqlite or postgresql)")
        return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RepositorySection(Section):
    """The bundle repository and its keystore."""

    path: Path | None = Field(
        None, description="Repository directory (default state_dir/repository)."
    )
    keystore: Path | None = Field(
        None, description="Keystore directory (default state_dir/keystore)."
    )


class CASection(Section):
    """The fleet CA."""

    path: Path | None = Field(None, description="CA directory (default state_dir/ca).")
    create: bool = Field(True, description="Create the CA at the first start if it is missing.")
    crl_refresh_before_s: int = Field(
        7 * 86_400,
        gt=0,
        description="Write a fresh CRL when the current one expires within this many seconds "
        "(an expired CRL makes the broker refuse every client).",
    )


class EnrollmentSection(Section):
    """Enrollment tokens and device certificates."""

    token_ttl_s: int = Field(
        86_400, gt=0, le=30 * 86_400, description="Default lifetime of an enrollment token."
    )
    device_cert_days: int = Field(
        365, ge=1, le=3650, description="Validity of a device certificate, days."
    )


class IngestSection(Section):
    """The MQTT ingest workers."""

    workers: int = Field(1, ge=0, le=64, description="Ingest workers in this process.")
    group: str | None = Field(
        None,
        description="Shared-subscription group ($share/<group>/...). A secret: a device "
        "that names it takes a share of every device's messages (Mosquitto 2.0 grants "
        "every subscription). Default: a name of 128 random bits the server generates "
        "and keeps in state_dir/ingest-group. A name given here must look random (a part "
        "of 16+ letters and digits, both kinds, 10 different characters) unless "
        "allow_guessable_group is set.",
    )
    allow_guessable_group: bool = Field(
        False,
        description="Accept a group that looks guessable (a test bench, a broker no device "
        "reaches); the server warns at every start.",
    )
    max_lag_s: float = Field(
        30.0,
        gt=0,
        description="Health fails when a received message waits longer than this to be stored.",
    )
    max_disconnected_s: float = Field(
        30.0, gt=0, description="Health fails when a worker is off the broker longer than this."
    )
    max_clock_skew_s: float = Field(
        86_400.0,
        gt=0,
        description="A device time further ahead of the server's clock is quarantined.",
    )
    max_clock_age_s: float = Field(
        5 * 365 * 86_400.0,
        gt=0,
        description="A device time further behind the server's clock is quarantined "
        "(long: an offline device uploads its outbox late).",
    )
    transient_attempts: int = Field(
        5,
        ge=1,
        le=100,
        description="Sink calls tried on a transient database error before the records "
        "are left unacknowledged for the broker to resend.",
    )

    @field_validator("group")
    @classmethod
    def _group(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z0-9_.-]{1,64}$", value):
            raise ValueError(f"{value!r}: 1-64 of A-Z a-z 0-9 _ . - (no / + #)")
        return value

    @model_validator(mode="after")
    def _secret_group(self) -> IngestSection:
        why = guessable_group(self.group) if self.group is not None else ""
        if why and not self.allow_guessable_group:
            raise ValueError(
                f"group {self.group!r} is guessable ({why}): a device naming it would take "
                "a share of every device's messages. Leave it out (the server generates "
                "one) or set allow_guessable_group = true"
            )
        return self


class RolloutsSection(Section):
    """The rollout reconciliation loop."""

    tick_s: float = Field(1.0, gt=0, le=3600, description="Seconds between reconciliation ticks.")


class DriftSection(Section):
    """Drift per (model version, line): the current window against a reference window
    (:mod:`fleet_server.quality.drift`)."""

    reference_hours: float = Field(
        24.0,
        gt=0,
        le=24 * 365,
        description="Hours after a version's first bucket on a line that make its "
        "reference window (unless an operator pinned one). A float: 0.05 is 3 minutes.",
    )
    window_hours: float = Field(
        24.0,
        gt=0,
        le=24 * 365,
        description="Hours before now that make the current window (never before the "
        "reference window's end).",
    )
    min_count: int = Field(
        500,
        ge=1,
        description="Decisions each window needs before drift is judged at all.",
    )
    psi_threshold: float = Field(
        0.25, gt=0, description="Drifted when any histogram's PSI is above this."
    )
    js_threshold: float = Field(
        0.2,
        gt=0,
        le=1,
        description="Drifted when any histogram's Jensen-Shannon distance is above this.",
    )
    interval_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="Seconds between two runs of the drift job in fleet-server serve.",
    )


class ClusterSection(Section):
    """Replicas of the fleet server on one PostgreSQL (docs/scaling.md): the leader runs
    the rollout reconciler, the drift job and retention."""

    replica_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="This replica's name in `fleet-server status` (default: host-pid).",
    )
    lease_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="The leader acts only within this many seconds of its last confirmed "
        "hold of the lock; a new leader waits this long before it acts.",
    )
    renew_s: float = Field(
        1.0, gt=0, le=60, description="Seconds between the leader's checks of its lock."
    )
    poll_s: float = Field(
        1.0, gt=0, le=60, description="Seconds between a follower's tries to take the lock."
    )
    report_s: float = Field(
        2.0, gt=0, le=300, description="Seconds between two reports of a replica's state."
    )

    @model_validator(mode="after")
    def _lease_outlasts_renewals(self) -> ClusterSection:
        if self.lease_s < 2 * self.renew_s:
            raise ValueError(f"lease_s {self.lease_s} must be at least 2 x renew_s")
        return self


class FleetServerConfig(Section):
    """The whole fleet server configuration file."""

    server: ServerSection = Field(default_factory=ServerSection, description="State.")
    http: HttpSection = Field(default_factory=HttpSection, description="HTTP API.")
    database: DatabaseSection = Field(default_factory=DatabaseSection, description="Database.")
    broker: BrokerSection = Field(default_factory=BrokerSection, description="MQTT broker.")
    repository: RepositorySection = Field(
        default_factory=RepositorySection, description="Bundle repository."
    )
    ca: CASection = Field(default_factory=CASection, description="Fleet CA.")
    enrollment: EnrollmentSection = Field(
        default_factory=EnrollmentSection, description="Enrollment."
    )
    ingest: IngestSection = Field(default_factory=IngestSection, description="Ingest.")
    rollouts: RolloutsSection = Field(default_factory=RolloutsSection, description="Rollouts.")
    drift: DriftSection = Field(default_factory=DriftSection, description="Drift.")
    cluster: ClusterSection = Field(default_factory=ClusterSection, description="Replicas.")
    retention: RetentionSection = Field(
        default_factory=RetentionSection, description="Retention budgets per table."
    )
    metrics: MetricsSection = Field(
        default_factory=MetricsSection, description="Prometheus metrics on GET /metrics."
    )
    auth: AuthSection = Field(default_factory=AuthSection, description="Sign-in sessions.")
    alerts: AlertsSection = Field(
        default_factory=AlertsSection, description="Alerts: rules, webhooks, deliveries."
    )

    @property
    def state_dir(self) -> Path:
        """The state directory."""
        return self.server.state_dir

    @property
    def database_url(self) -> str:
        """The database URL (the default SQLite file when none is configured)."""
        return self.database.url or sqlite_url(self.state_dir / "fleet.db")

    @property
    def ca_path(self) -> Path:
        """The CA directory."""
        return self.ca.path or self.state_dir / "ca"

    @property
    def repository_path(self) -> Path:
        """The repository directory."""
        return self.repository.path or self.state_dir / "repository"

    @property
    def keystore_path(self) -> Path:
        """The keystore directory."""
        return self.repository.keystore or self.state_dir / "keystore"

    @property
    def identity_dir(self) -> Path:
        """Where the fleet server's own MQTT client key and certificate are kept."""
        return self.state_dir / "identity"

    def mosquitto_config(self) -> MosquittoConfig:
        """The managed Mosquitto's settings, paths not given filled from the layout."""
        given = self.broker.mosquitto
        broker_dir = self.state_dir / "broker"
        layout = {
            "state_dir": broker_dir,
            "cafile": self.ca_path / "ca.crt",
            "crlfile": self.ca_path / "crl.pem",
            "certfile": broker_dir / "server.crt",
            "keyfile": broker_dir / "server.key",
        }
        missing = {k: v for k, v in layout.items() if k not in given.model_fields_set}
        return given.model_copy(update=missing)

    def shard_mosquitto_configs(self) -> dict[str, MosquittoConfig]:
        """Managed fleet: each shard's Mosquitto, ``main`` first. A shard's is the main
        one's on its own port, with its own state directory (``state_dir/broker-<name>``)
        and server certificate there; CA and CRL are the same."""
        main = self.mosquitto_config()
        configs = {MAIN_SHARD: main}
        for shard in self.broker.shards:
            if shard.port is None:
                continue
            broker_dir = self.state_dir / f"broker-{shard.name}"
            configs[shard.name] = main.model_copy(
                update={
                    "port": shard.port,
                    "state_dir": broker_dir,
                    "certfile": broker_dir / "server.crt",
                    "keyfile": broker_dir / "server.key",
                }
            )
        return configs


def _resolve(section: Any, keys: tuple[str, ...], base: Path) -> None:
    if isinstance(section, dict):
        for key in keys:
            if isinstance(section.get(key), str):
                section[key] = str(base / section[key])


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    _resolve(data.get("server"), ("state_dir",), base)
    _resolve(data.get("repository"), ("path", "keystore"), base)
    _resolve(data.get("ca"), ("path",), base)
    broker = data.get("broker")
    if isinstance(broker, dict):
        _resolve(broker.get("mosquitto"), _BROKER_PATHS, base)
        _resolve(broker.get("external"), ("ca", "cert", "key"), base)
        shards = broker.get("shards")
        for shard in shards if isinstance(shards, list) else ():
            if isinstance(shard, dict):
                _resolve(shard.get("external"), ("ca", "cert", "key"), base)
    alerts = data.get("alerts")
    hooks = alerts.get("webhooks") if isinstance(alerts, dict) else None
    for hook in hooks if isinstance(hooks, list) else ():
        _resolve(hook, ("ca_file",), base)
    db = data.get("database")
    if isinstance(db, dict) and isinstance(db.get("url"), str):
        prefix = "sqlite:///"
        url: str = db["url"]
        if url.startswith(prefix) and not url.startswith(prefix + "/"):
            db["url"] = sqlite_url(base / url.removeprefix(prefix))


def parse_config(
    data: dict[str, Any], path: str = "", base: Path | None = None
) -> FleetServerConfig:
    """Validate an already-parsed config mapping; ``base`` resolves relative paths.

    Raises:
        ConfigError: naming ``path`` and the first offending field.
    """
    if base is not None:
        _resolve_paths(data, base)
    try:
        return FleetServerConfig.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0]
        reason = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        if len(errors) > 1:
            others = "; ".join(f"{dotted(tuple(x['loc']))}: {x['msg']}" for x in errors[1:4])
            reason += f" (and {len(errors) - 1} more: {others})"
        raise ConfigError(path, dotted(tuple(first["loc"])), reason) from None


def load_config(path: Path) -> FleetServerConfig:
    """Read and validate ``path`` (TOML).

    Raises:
        ConfigError: the file is missing, not TOML, or not a valid configuration.
    """
    data = load_toml_file(Path(path))
    return parse_config(data, str(path), Path(path).resolve().parent)
