"""The fleet under test: a real ``fleet-server serve`` (its managed Mosquitto, ingest,
rollouts, HTTP API) with a signed repository, and what the invariants read of it.

The broker listens on the LAN address devices reach (the simulated LAN's bridge, or this
machine's address on the real device's network); the API listens on loopback unless a
real device must enroll over it. Secrets (key passphrase, operator token) are made for
this run and handed to the server through its environment only.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agent.kernel.errors import EdgefleetError
from fleet_server.db import sqlite_url
from fleet_server.db.tables import decisions, devices, events, rollout_devices, telemetry
from fleet_server.repository import KeyStore, Passphrases, Repository
from hil import shell
from hil.errors import FleetSetupError, HilError
from hil.loopback import free_port

BIN = Path(sys.executable).parent
TOKEN_ENV = "EDGEFLEET_HIL_OPERATOR_TOKEN"  # noqa: S105 - the variable's name
PASSPHRASE_ENV = "EDGEFLEET_KEY_PASSPHRASE"  # noqa: S105 - the variable's name
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HealthSample:
    """A health report the fleet stored: the agent's per-run sequence number and time."""

    seq: int
    ts: float


class Fleet:
    """A fleet server run from ``root`` (see the module docstring).

    Args:
        root: directory for keys, repository, fleet.toml and the server's state.
        broker_host: address the managed Mosquitto listens on and devices are told.
        api_host: address of the HTTP API.
    """

    def __init__(self, root: Path, *, broker_host: str, api_host: str = "127.0.0.1") -> None:
        self.root = root.resolve()
        self.broker_host = broker_host
        self.api_host = api_host
        self.broker_port = free_port(broker_host)
        self.api_port = free_port(api_host)
        self.env = {
            **os.environ,
            PASSPHRASE_ENV: secrets.token_urlsafe(24),
            TOKEN_ENV: secrets.token_urlsafe(24),
        }
        self.proc: shell.Proc | None = None
        self.restarts = 0
        self._engine: sa.Engine | None = None

    @property
    def url(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"

    @property
    def config_path(self) -> Path:
        return self.root / "fleet.toml"

    # -- set up, start, stop ------------------------------------------------------------

    def prepare(self, bundles: list[Path]) -> None:
        """A fresh keystore and repository with ``bundles`` signed in, and fleet.toml.

        Raises:
            FleetSetupError: a key, the repository or a bundle can't be made.
        """
        if self.root.exists():
            shell.run(["rm", "-rf", str(self.root)])
        self.root.mkdir(parents=True)
        passphrases = Passphrases(environ={PASSPHRASE_ENV: self.env[PASSPHRASE_ENV]})
        try:
            keys = KeyStore.create(
                self.root / "keys", root_keys=1, root_threshold=1, passphrases=passphrases
            )
            repo = Repository(self.root / "repo")
            repo.init(keys)
            for bundle in bundles:
                repo.publish(bundle, keys)
        except EdgefleetError as exc:
            raise FleetSetupError(f"repository: {exc}") from exc
        self.config_path.write_text(
            f'[server]\nstate_dir = "state"\nlog_level = "warning"\n'
            f'[http]\nhost = "{self.api_host}"\nport = {self.api_port}\n'
            f'operator_token_env = "{TOKEN_ENV}"\n'
            f'[broker]\nadvertise_host = "{self.broker_host}"\n'
            f'[broker.mosquitto]\nhost = "{self.broker_host}"\nport = {self.broker_port}\n'
            "persistence = true\n"
            f'[repository]\npath = "{repo.path}"\nkeystore = "{keys.path}"\n'
            "[rollouts]\ntick_s = 0.5\n"
        )

    def start(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Start ``fleet-server serve`` and wait until /healthz says ok; the seconds it took.

        Raises:
            FleetSetupError: it exited or was not healthy in time.
        """
        argv = [str(BIN / "fleet-server"), "serve", "--config", str(self.config_path)]
        self.proc = shell.Proc(argv, self.root / "fleet.log", env=self.env, name="fleet-server")
        (self.root / "fleet.pid").write_text(f"{self.proc.pid}\n")
        start = time.monotonic()
        while not self.healthy():
            if not self.proc.alive():
                raise FleetSetupError(f"fleet-server exited: {self.proc.tail(8)}")
            if time.monotonic() - start > timeout_s:
                raise FleetSetupError(f"fleet-server not healthy in {timeout_s:g} s")
            time.sleep(0.2)
        return time.monotonic() - start

    def stop(self) -> None:
        """Stop the fleet server (SIGTERM: its Mosquitto saves its sessions)."""
        if self.proc is not None:
            self.proc.stop(30.0)
            self.proc = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def restart(self) -> float:
        """Stop and start again (ports and state kept); seconds until healthy again."""
        start = time.monotonic()
        self.stop()
        self.start()
        self.restarts += 1
        return time.monotonic() - start

    def healthy(self) -> bool:
        try:
            status, _ = self.api("GET", "/healthz", timeout_s=2.0)
        except HilError:
            return False
        return status == 200

    # -- the HTTP API -------------------------------------------------------------------

    def api(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 15.0
    ) -> tuple[int, Any]:
        """Call the API as the operator: status and parsed JSON body.

        Raises:
            HilError: nothing answered.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310
        req.add_header("Authorization", f"Bearer {self.env[TOKEN_ENV]}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw or b"null")
            except json.JSONDecodeError:
                return exc.code, raw.decode(errors="replace")
        except (OSError, json.JSONDecodeError) as exc:
            raise HilError(f"fleet API {method} {path}: {exc}") from exc

    def _ok(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        status, out = self.api(method, path, body)
        if status >= 300:
            raise FleetSetupError(f"{method} {path} answered {status}: {out}")
        return out

    def enrollment_token(self, device_id: str, labels: dict[str, str], profile: str) -> str:
        """A one-time enrollment token for ``device_id``.

        Raises:
            FleetSetupError: the API refused.
        """
        body = {"labels": labels, "profile": profile}
        return str(self._ok("POST", f"/api/v1/devices/{device_id}/tokens", body)["token"])

    def device(self, device_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self._ok("GET", f"/api/v1/devices/{device_id}")
        return out

    def create_rollout(self, bundle: str, selector: str, *, soak_s: str = "1s") -> str:
        """Start a one-wave rollout of ``bundle`` (NAME@VERSION) to ``selector``; its id.

        Raises:
            FleetSetupError: the API refused.
        """
        body = {
            "bundle": bundle,
            "selector": selector,
            "waves": "100%",
            "soak_s": soak_s,
            # one device sharing the machine's cores: p99 ratios are noise here
            "policy": {"gates": {"max_p99_ratio": None}},
        }
        return str(self._ok("POST", "/api/v1/rollouts", body)["rollout_id"])

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self._ok("GET", f"/api/v1/rollouts/{rollout_id}")
        return out

    # -- what the fleet stored (its database, read-only) --------------------------------

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            db = self.root / "state" / "fleet.db"
            self._engine = sa.create_engine(sqlite_url(db), connect_args={"timeout": 10})
        return self._engine

    def decision_ids(self, device_id: str) -> list[str]:
        """Ids of the decisions stored for the device (one row per id: the primary key)."""
        q = sa.select(decisions.c.id).where(decisions.c.device_id == device_id)
        with self.engine.connect() as conn:
            return [str(r[0]) for r in conn.execute(q)]

    def health(self, device_id: str) -> list[HealthSample]:
        """The device's stored health reports, oldest first."""
        q = (
            sa.select(telemetry.c.record_id, telemetry.c.ts)
            .where(telemetry.c.device_id == device_id)
            .where(telemetry.c.record_id.like("health:%"))
            .order_by(telemetry.c.ts)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        return [HealthSample(int(str(r[0]).split(":")[1]), float(r[1])) for r in rows]

    def event_kinds(self, device_id: str) -> dict[str, int]:
        """The device's stored events, counted by kind."""
        q = (
            sa.select(events.c.kind, sa.func.count())
            .where(events.c.device_id == device_id)
            .group_by(events.c.kind)
        )
        with self.engine.connect() as conn:
            return {str(k): int(n) for k, n in conn.execute(q)}

    def online(self, device_id: str) -> bool:
        q = sa.select(devices.c.online).where(devices.c.device_id == device_id)
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return bool(row and row[0])

    def rollout_status(self, rollout_id: str, device_id: str) -> str | None:
        q = sa.select(rollout_devices.c.status).where(
            rollout_devices.c.rollout_id == rollout_id, rollout_devices.c.device_id == device_id
        )
        with self.engine.connect() as conn:
            row = conn.execute(q).first()
        return None if row is None else str(row[0])


def stop_stale(root: Path) -> str | None:
    """Stop the fleet-server a crashed run left (its pid file under ``root``), if it is
    still that program; what was done, or None."""
    pid_file = root / "fleet.pid"
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    if not any(part.endswith(b"fleet-server") for part in cmdline):
        return None
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    return f"stopped fleet-server {pid} left by an earlier run"
